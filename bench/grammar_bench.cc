// grammar_bench: what grammar-constrained decoding (response_format) costs. LocalEngine decode
// tokens/s on the default model with and without a JSON Schema, and the per-step mask cost alone.
//
//   build/<preset>/bin/grammar_bench [--threads=2] [--repetitions=5] [--batches=1,8]
//
// Decode rows: B sequences of a random 128-token prompt, then --decode_steps greedy steps
// (ignore_eos), timed by GenerationStats::decode_seconds. The constrained run uses kSchema, whose
// minItems keeps the output unfinished for far more than --decode_steps tokens, so both runs
// decode the same number of steps; the model's greedy choice among the allowed tokens varies the
// grammar states it passes through, as real outputs do. Runs alternate (plain, schema, plain, ...)
// so that a noisy host moves both alike; the table shows medians with min..max.
//
// Mask rows: one TokenConstraint fed the tokens of a JSON text that matches kSchema, timing
// AllowedTokens() (xgrammar's FillNextTokenBitmask) per token; and Sampler::Sample with a mask
// taken mid-text against without, on random logits of the model's vocabulary size.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/flags.h"
#include "common/status_macros.h"
#include "engine/grammar/token_constraint.h"
#include "engine/model/model_path.h"
#include "engine/runtime/local_engine.h"
#include "engine/sampling/sampler.h"

ABSL_FLAG(std::string, model, "", "Model file (GGUF); empty: the default model");
ABSL_FLAG(int32_t, threads, 2, "Kernel threads, the calling thread included");
ABSL_FLAG(int32_t, repetitions, 5, "Runs per row (each constrained and unconstrained)");
ABSL_FLAG(int32_t, decode_steps, 64, "Decode steps per run");
ABSL_FLAG(std::string, batches, "1,8", "Decode batch sizes; empty: only the mask row");

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

// Records of a realistic shape (objects, strings, integers, enums, nested arrays); minItems makes
// every valid output far longer than the benchmark's steps.
constexpr const char* kSchema = R"({
  "type": "object",
  "properties": {
    "records": {
      "type": "array", "minItems": 200,
      "items": {
        "type": "object",
        "properties": {
          "name": {"type": "string"},
          "age": {"type": "integer"},
          "role": {"enum": ["admin", "user", "guest"]},
          "tags": {"type": "array", "items": {"type": "string"}}
        },
        "required": ["name", "age", "role", "tags"]
      }
    }
  },
  "required": ["records"]
})";

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string Figure(const std::vector<double>& v, const char* format) {
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return absl::StrFormat(format, Median(v), *lo, *hi);
}

// Decodes; with `outputs`, also the tokens each request generated.
absl::StatusOr<GenerationStats> Decode(LocalEngine& engine, int64_t batch, int64_t steps,
                                       bool constrained, std::mt19937& rng,
                                       std::vector<std::vector<int32_t>>* outputs = nullptr) {
  std::vector<GenerationRequest> requests(static_cast<size_t>(batch));
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(engine.config().vocab_size - 1));
  for (GenerationRequest& r : requests) {
    r.prompt.resize(128);
    for (int32_t& t : r.prompt) t = id(rng);
    r.sampling.temperature = 0.0f;
    r.sampling.ignore_eos = true;
    r.sampling.max_tokens = steps + 1;
    if (constrained) {
      r.sampling.response_format = {.kind = sampling::ResponseFormat::Kind::kJsonSchema,
                                    .text = kSchema};
    }
  }
  GenerationStats stats;
  if (outputs != nullptr) outputs->assign(requests.size(), {});
  RETURN_IF_ERROR(engine.Generate(
      requests,
      [outputs](const GenerationDelta& d) {
        if (outputs != nullptr) (*outputs)[d.index].push_back(d.token);
      },
      &stats));
  return stats;
}

absl::Status Main() {
  ASSIGN_OR_RETURN(std::string model_path, ResolveModelPath(absl::GetFlag(FLAGS_model), ""));
  const int threads = absl::GetFlag(FLAGS_threads);
  const int reps = absl::GetFlag(FLAGS_repetitions);
  const int64_t steps = absl::GetFlag(FLAGS_decode_steps);
  std::vector<int64_t> batches;
  for (absl::string_view b : absl::StrSplit(absl::GetFlag(FLAGS_batches), ',', absl::SkipEmpty())) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(b, &n) || n <= 0) return absl::InvalidArgumentError("bad --batches");
    batches.push_back(n);
  }
  LocalEngine::Options options;
  options.cpu.num_threads = threads;
  options.scheduler.max_running =
      batches.empty() ? 1 : *std::max_element(batches.begin(), batches.end());
  options.kv_cache_bytes = int64_t{256} << 20;
  ASSIGN_OR_RETURN(std::unique_ptr<LocalEngine> engine, LocalEngine::Open(model_path, options));
  std::mt19937 rng(2024);

  // The first constrained request builds the vocabulary's tokenizer info and compiles the schema.
  const auto compile_start = Clock::now();
  RETURN_IF_ERROR(Decode(*engine, 1, 2, true, rng).status());
  const double first_compile = Seconds(compile_start);
  RETURN_IF_ERROR(Decode(*engine, 1, 8, false, rng).status());  // page the weights in

  std::printf("\ngrammar_bench: %s\nthreads=%d repetitions=%d, %lld greedy decode steps after "
              "128-token prompts (medians; min..max)\n\n",
              model_path.c_str(), threads, reps, static_cast<long long>(steps));
  std::printf("first constrained request (tokenizer info + schema compile + 2 tokens): %.3f s\n\n",
              first_compile);
  if (!batches.empty()) {
    std::printf("| batch | plain tok/s | JSON schema tok/s | schema / plain |\n|---|---|---|---|\n");
  }
  for (int64_t batch : batches) {
    std::vector<double> plain, constrained, ratio;
    for (int r = 0; r < reps; ++r) {
      ASSIGN_OR_RETURN(GenerationStats p, Decode(*engine, batch, steps, false, rng));
      ASSIGN_OR_RETURN(GenerationStats c, Decode(*engine, batch, steps, true, rng));
      if (c.decode_tokens != p.decode_tokens) {
        return absl::InternalError(absl::StrCat("the constrained run decoded ", c.decode_tokens,
                                                " tokens, the plain one ", p.decode_tokens));
      }
      plain.push_back(static_cast<double>(p.decode_tokens) / p.decode_seconds);
      constrained.push_back(static_cast<double>(c.decode_tokens) / c.decode_seconds);
      ratio.push_back(constrained.back() / plain.back());
    }
    std::printf("| %lld | %s | %s | %s |\n", static_cast<long long>(batch),
                Figure(plain, "%.1f [%.1f..%.1f]").c_str(),
                Figure(constrained, "%.1f [%.1f..%.1f]").c_str(),
                Figure(ratio, "%.3f [%.3f..%.3f]").c_str());
  }

  // The mask alone, on a text that matches the schema.
  grammar::GrammarVocabulary vocabulary;
  const Tokenizer& tok = engine->tokenizer();
  vocabulary.token_bytes.resize(static_cast<size_t>(engine->config().vocab_size));
  for (int32_t t = 0; t < tok.vocab_size(); ++t) {
    vocabulary.token_bytes[static_cast<size_t>(t)] = tok.TokenBytes(t, {.skip_special = true});
  }
  vocabulary.stop_token_ids = {tok.eos_id()};
  ASSIGN_OR_RETURN(auto compiler, grammar::ResponseFormatCompiler::Create(vocabulary));
  const auto compile = Clock::now();
  ASSIGN_OR_RETURN(grammar::CompiledFormat format,
                   compiler->Compile({.kind = sampling::ResponseFormat::Kind::kJsonSchema,
                                      .text = kSchema}));
  const double compile_seconds = Seconds(compile);
  // In the layout the grammar generates: ", " and ": " separators.
  std::string text = R"({"records": [)";
  for (int i = 0; i < 40; ++i) {
    text += absl::StrCat(i == 0 ? "" : ", ", R"({"name": "Person number )", i, R"(", "age": )",
                         20 + i, R"(, "role": ")", i % 3 == 0 ? "admin" : "user",
                         R"(", "tags": ["alpha", "beta )", i, R"("]})");
  }
  const std::vector<int32_t> tokens = tok.Encode(text);
  grammar::TokenConstraint constraint(format);
  std::vector<double> mask_us;
  for (int32_t t : tokens) {
    const auto start = Clock::now();
    const absl::Span<const uint32_t> allowed = constraint.AllowedTokens();
    mask_us.push_back(Seconds(start) * 1e6);
    (void)allowed;
    if (absl::Status s = constraint.Accept(t); !s.ok()) {
      return absl::InternalError(absl::StrCat("the grammar refuses the benchmark's text at token ",
                                              mask_us.size() - 1, ": ", s.message()));
    }
  }
  // The Sampler with and without a mask (one taken mid-output), greedy and random, on the
  // model's vocabulary of random logits.
  grammar::TokenConstraint mid(format);
  for (size_t i = 0; i < tokens.size() / 2; ++i) RETURN_IF_ERROR(mid.Accept(tokens[i]));
  const absl::Span<const uint32_t> mid_mask = mid.AllowedTokens();
  const std::vector<uint32_t> mask(mid_mask.begin(), mid_mask.end());
  std::vector<float> logits(static_cast<size_t>(engine->config().vocab_size));
  std::uniform_real_distribution<float> logit(-10.0f, 10.0f);
  for (float& x : logits) x = logit(rng);
  double sample_us[2][2];  // [greedy, random][plain, masked]
  for (int random = 0; random < 2; ++random) {
    sampling::SamplingOptions o;
    o.temperature = random == 1 ? 0.8f : 0.0f;
    o.seed = 1;
    ASSIGN_OR_RETURN(sampling::Sampler sampler,
                     sampling::Sampler::Create(
                         o, {.vocab_size = static_cast<int>(engine->config().vocab_size)}));
    for (int masked = 0; masked < 2; ++masked) {
      constexpr int kIterations = 2000;
      const auto start = Clock::now();
      for (int i = 0; i < kIterations; ++i) {
        ASSIGN_OR_RETURN(sampling::SampledToken t,
                         sampler.Sample(logits, masked == 1 ? absl::MakeConstSpan(mask)
                                                            : absl::Span<const uint32_t>()));
        (void)t;
      }
      sample_us[random][masked] = Seconds(start) * 1e6 / kIterations;
    }
  }
  // The masks of the states the constrained decode rows went through (the model's greedy JSON,
  // strings of random-prompt text), replayed: what a constrained step paid there.
  std::vector<double> replay_us;
  {
    std::vector<std::vector<int32_t>> outputs;
    RETURN_IF_ERROR(Decode(*engine, 4, steps, true, rng, &outputs).status());
    for (const std::vector<int32_t>& output : outputs) {
      grammar::TokenConstraint c(format);
      for (int32_t t : output) {
        const auto start = Clock::now();
        (void)c.AllowedTokens();
        replay_us.push_back(Seconds(start) * 1e6);
        RETURN_IF_ERROR(c.Accept(t));
      }
    }
  }
  double replay_total = 0;
  for (double v : replay_us) replay_total += v;
  std::vector<double> replay_sorted = replay_us;
  std::sort(replay_sorted.begin(), replay_sorted.end());
  std::vector<double> sorted = mask_us;
  std::sort(sorted.begin(), sorted.end());
  double total = 0;
  for (double v : mask_us) total += v;
  std::printf("\nschema compile (warm tokenizer info): %.1f ms\n", compile_seconds * 1e3);
  std::printf("mask per token over %zu tokens of matching JSON: mean %.1f us, median %.1f us, "
              "p99 %.1f us, max %.1f us\n",
              mask_us.size(), total / static_cast<double>(mask_us.size()), Median(mask_us),
              sorted[sorted.size() * 99 / 100], sorted.back());
  std::printf("mask per token over %zu tokens of the decode rows' outputs: mean %.1f us, median "
              "%.1f us, p99 %.1f us, max %.1f us\n",
              replay_us.size(), replay_total / static_cast<double>(replay_us.size()),
              Median(replay_us), replay_sorted[replay_sorted.size() * 99 / 100],
              replay_sorted.back());
  std::printf("Sampler::Sample per token (vocabulary %lld): greedy %.1f us plain, %.1f us masked; "
              "temperature 0.8 %.1f us plain, %.1f us masked\n",
              static_cast<long long>(engine->config().vocab_size), sample_us[0][0],
              sample_us[0][1], sample_us[1][0], sample_us[1][1]);
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  tandem::ParseFlagsWithEnvironment(
      argc, argv,
      "grammar_bench: decode tokens/s with and without a JSON Schema response_format.\n"
      "usage: grammar_bench [--threads=2] [--repetitions=5] [--batches=1,8]");
  if (absl::Status s = tandem::Main(); !s.ok()) {
    std::fprintf(stderr, "grammar_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
