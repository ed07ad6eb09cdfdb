// Test tool: runs Tandem's CPU forward pass on a token sequence and writes what a reference
// implementation is compared against.
//
//   logits_tool MODEL TOKENS OUT [GREEDY_STEPS] [BLOCK_SIZE] [KV_DTYPE] [CHUNK] [MLP_ROWS]
//
// MODEL is a GGUF file or a Hugging Face model directory (config.json and *.safetensors).
// KV_DTYPE is the cache's element type, f16 (the engine's default) or f32.
//
// TOKENS is a comma-separated list of token ids. Writes OUT as float32 [len(TOKENS), vocab]: the
// logits after every position (teacher forcing: the tokens are fed one step each, through the
// paged KV cache) and prints one line of JSON, {"vocab": V, "greedy": [ids...]}, with
// GREEDY_STEPS greedy tokens continuing TOKENS. With CHUNK > 1 the tokens are fed CHUNK per step
// (a prefill in chunks); only each chunk's last row of OUT holds logits, the others are NaN.
// MLP_ROWS is CpuBackend::Options::mlp_rows_per_pass (0: the default).
#include <cstdio>
#include <algorithm>
#include <fstream>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "engine/runtime/cpu_backend.h"

namespace tandem {
namespace {

absl::Status Run(int argc, char** argv) {
  if (argc < 4) {
    return absl::InvalidArgumentError(
        "usage: logits_tool MODEL TOKENS OUT [GREEDY] [BLOCK] [KV_DTYPE]");
  }
  std::vector<int32_t> tokens;
  for (absl::string_view part : absl::StrSplit(argv[2], ',', absl::SkipEmpty())) {
    int32_t id;
    if (!absl::SimpleAtoi(part, &id)) return absl::InvalidArgumentError("bad token id");
    tokens.push_back(id);
  }
  int greedy = 0, block_size = 16;
  if (argc > 4 && !absl::SimpleAtoi(argv[4], &greedy)) return absl::InvalidArgumentError("GREEDY");
  if (argc > 5 && !absl::SimpleAtoi(argv[5], &block_size)) return absl::InvalidArgumentError("BLOCK");
  if (tokens.empty()) return absl::InvalidArgumentError("no tokens");
  ASSIGN_OR_RETURN(const DType kv_dtype, ParseKvDType(argc > 6 ? argv[6] : "f16"));
  int chunk = 1;
  if (argc > 7 && (!absl::SimpleAtoi(argv[7], &chunk) || chunk < 1)) {
    return absl::InvalidArgumentError("CHUNK");
  }

  int mlp_rows = 0;
  if (argc > 8 && !absl::SimpleAtoi(argv[8], &mlp_rows)) {
    return absl::InvalidArgumentError("MLP_ROWS");
  }

  ASSIGN_OR_RETURN(LoadedModel model, LoadModel(argv[1]));
  ASSIGN_OR_RETURN(auto forward,
                   CpuBackend::Create(&model, {.block_size = block_size, .kv_dtype = kv_dtype,
                                               .mlp_rows_per_pass = mlp_rows}));
  const int64_t total = static_cast<int64_t>(tokens.size()) + greedy;
  ASSIGN_OR_RETURN(auto kv, KvStorage::Create(forward->KvLayoutFor(total / block_size + 1)));
  std::vector<int32_t> blocks(static_cast<size_t>(total / block_size + 1));
  std::iota(blocks.begin(), blocks.end(), 0);
  const int64_t vocab = model.config.vocab_size;

  std::ofstream out(argv[3], std::ios::binary);
  std::vector<float> all(tokens.size() * static_cast<size_t>(vocab),
                         std::numeric_limits<float>::quiet_NaN());
  StepOutput step_out;
  for (size_t i = 0; i < tokens.size(); i += static_cast<size_t>(chunk)) {
    const size_t n = std::min(tokens.size() - i, static_cast<size_t>(chunk));
    StepBatch batch;
    batch.sequences.push_back(StepSequence{.tokens = absl::MakeConstSpan(tokens).subspan(i, n),
                                           .start_position = static_cast<int64_t>(i),
                                           .block_table = blocks});
    RETURN_IF_ERROR(forward->Step(batch, kv.get(), &step_out));
    std::copy(step_out.logits.begin(), step_out.logits.end(),
              all.begin() + static_cast<int64_t>(i + n - 1) * vocab);
  }
  out.write(reinterpret_cast<const char*>(all.data()),
            static_cast<std::streamsize>(all.size() * sizeof(float)));
  if (!out) return absl::InternalError("cannot write the logits file");

  std::vector<int32_t> generated;
  std::vector<float> last(all.end() - vocab, all.end());
  for (int g = 0; g < greedy; ++g) {
    const int32_t next = static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin());
    generated.push_back(next);
    const std::vector<int32_t> one = {next};
    StepBatch batch;
    batch.sequences.push_back(StepSequence{
        .tokens = one,
        .start_position = static_cast<int64_t>(tokens.size()) + g,
        .block_table = blocks});
    RETURN_IF_ERROR(forward->Step(batch, kv.get(), &step_out));
    last.assign(step_out.logits.begin(), step_out.logits.end());
  }
  std::printf("{\"vocab\": %lld, \"greedy\": [%s]}\n", static_cast<long long>(vocab),
              absl::StrJoin(generated, ", ").c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  const absl::Status status = tandem::Run(argc, argv);
  if (!status.ok()) {
    std::fprintf(stderr, "logits_tool: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
