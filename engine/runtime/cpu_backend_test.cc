#include "engine/runtime/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/version.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

// The default model, downloaded by scripts/setup.sh.
const LoadedModel& DefaultModel() {
  static const LoadedModel* model = [] {
    auto loaded = LoadGgufModel(absl::StrCat(kSourceDir, "/models/SmolLM2-135M-Instruct.Q4_1.gguf"));
    CHECK(loaded.ok()) << loaded.status();
    return new LoadedModel(std::move(*loaded));
  }();
  return *model;
}

struct Harness {
  std::unique_ptr<CpuBackend> forward;
  std::unique_ptr<KvStorage> kv;
};

Harness MakeHarness(int64_t block_size = 16, int64_t num_blocks = 64, bool prefetch_kv = true) {
  Harness h;
  auto forward = CpuBackend::Create(
      &DefaultModel(),
      {.num_threads = 2, .block_size = block_size, .prefetch_kv = prefetch_kv});
  CHECK(forward.ok()) << forward.status();
  h.forward = std::move(*forward);
  auto kv = KvStorage::Create(h.forward->KvLayoutFor(num_blocks));
  CHECK(kv.ok()) << kv.status();
  h.kv = std::move(*kv);
  return h;
}

const std::vector<int32_t> kPromptA = {1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365,
                                       3437, 314, 2, 198, 1, 4093, 198, 2683, 2113, 281};
const std::vector<int32_t> kPromptB = {504, 3458, 282, 4649, 314, 3724, 30, 216, 4093, 15};

// Blocks first .. first+n-1 of the pool (these tests place sequences by hand).
std::vector<int32_t> Blocks(int32_t first, int64_t n) {
  std::vector<int32_t> blocks(static_cast<size_t>(n));
  std::iota(blocks.begin(), blocks.end(), first);
  return blocks;
}

// Logits after the last token of `tokens`, prefilled in chunks of `chunk` tokens.
std::vector<float> PrefillLogits(Harness& h, const std::vector<int32_t>& tokens, size_t chunk) {
  const int64_t bs = h.kv->layout().block_size;
  const std::vector<int32_t> blocks = Blocks(0, (static_cast<int64_t>(tokens.size()) + bs - 1) / bs);
  StepOutput out;
  for (size_t start = 0; start < tokens.size(); start += chunk) {
    const size_t n = std::min(chunk, tokens.size() - start);
    StepBatch batch;
    batch.sequences.push_back(StepSequence{
        .tokens = absl::MakeConstSpan(tokens).subspan(start, n),
        .start_position = static_cast<int64_t>(start),
        .block_table = blocks,
        .compute_logits = start + n == tokens.size()});
    CHECK_OK(h.forward->Step(batch, h.kv.get(), &out));
  }
  return std::vector<float>(out.logits.begin(), out.logits.begin() + out.vocab_size);
}

int64_t Argmax(const std::vector<float>& v) {
  return std::max_element(v.begin(), v.end()) - v.begin();
}

void ExpectClose(const std::vector<float>& a, const std::vector<float>& b, float tol) {
  ASSERT_EQ(a.size(), b.size());
  float worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  EXPECT_LE(worst, tol);
  EXPECT_EQ(Argmax(a), Argmax(b));
}

TEST(CpuBackendTest, LogitsAreFiniteAndVaried) {
  Harness h = MakeHarness();
  const std::vector<float> logits = PrefillLogits(h, kPromptA, kPromptA.size());
  ASSERT_EQ(static_cast<int64_t>(logits.size()), DefaultModel().config.vocab_size);
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));
  const auto [lo, hi] = std::minmax_element(logits.begin(), logits.end());
  EXPECT_GT(*hi - *lo, 5.0f);  // a real distribution, not a constant
}

// Chunked prefill and token-by-token decoding go through the paged cache; they must give the same
// logits as one prefill of the whole prompt. Each row is computed independently, so the only
// differences are float summation orders inside attention.
TEST(CpuBackendTest, ChunkingAndDecodingMatchOneShotPrefill) {
  Harness h = MakeHarness();
  const std::vector<float> whole = PrefillLogits(h, kPromptA, kPromptA.size());
  for (size_t chunk : {1, 3, 7, 16}) {
    SCOPED_TRACE(absl::StrCat("chunk ", chunk));
    ExpectClose(PrefillLogits(h, kPromptA, chunk), whole, 1e-3f);
  }
}

TEST(CpuBackendTest, BlockSizeDoesNotChangeTheResult) {
  Harness h16 = MakeHarness(16);
  Harness h1 = MakeHarness(1, 64);
  Harness h5 = MakeHarness(5, 64);
  const std::vector<float> ref = PrefillLogits(h16, kPromptB, kPromptB.size());
  ExpectClose(PrefillLogits(h1, kPromptB, 4), ref, 1e-3f);
  ExpectClose(PrefillLogits(h5, kPromptB, 3), ref, 1e-3f);
}

// A step mixing a prefill chunk of one sequence with a decode token of another gives each the
// logits it gets alone.
TEST(CpuBackendTest, MixedBatchMatchesSequencesAlone) {
  Harness h = MakeHarness();
  const std::vector<float> alone_a = PrefillLogits(h, kPromptA, kPromptA.size());
  const std::vector<float> alone_b = PrefillLogits(h, kPromptB, kPromptB.size());

  const std::vector<int32_t> blocks_a = Blocks(10, 2);
  const std::vector<int32_t> blocks_b = Blocks(12, 2);
  StepOutput out;
  // B's prompt except its last token first, alone.
  StepBatch first;
  first.sequences.push_back({.tokens = absl::MakeConstSpan(kPromptB).first(kPromptB.size() - 1),
                             .start_position = 0, .block_table = blocks_b, .compute_logits = false});
  ASSERT_TRUE(h.forward->Step(first, h.kv.get(), &out).ok());
  EXPECT_TRUE(out.logits.empty());
  // Then all of A's prompt together with B's last token (a decode-like step).
  StepBatch mixed;
  mixed.sequences.push_back({.tokens = kPromptA, .start_position = 0, .block_table = blocks_a});
  mixed.sequences.push_back({.tokens = absl::MakeConstSpan(kPromptB).last(1),
                             .start_position = static_cast<int64_t>(kPromptB.size()) - 1,
                             .block_table = blocks_b});
  ASSERT_TRUE(h.forward->Step(mixed, h.kv.get(), &out).ok());
  ASSERT_EQ(out.logits.size(), 2 * alone_a.size());
  ExpectClose(std::vector<float>(out.Logits(0), out.Logits(0) + out.vocab_size), alone_a, 1e-3f);
  ExpectClose(std::vector<float>(out.Logits(1), out.Logits(1) + out.vocab_size), alone_b, 1e-3f);
}

// Asking for the KV rows ahead (Options::prefetch_kv) is only a cache hint: decode batches large
// enough to use it, with sequences crossing block boundaries, give the same logits bit for bit.
TEST(CpuBackendTest, KvPrefetchDoesNotChangeTheResult) {
  Harness with = MakeHarness(16, 64, /*prefetch_kv=*/true);
  Harness without = MakeHarness(16, 64, /*prefetch_kv=*/false);
  const std::vector<size_t> prompt_lengths = {15, 16, 20, 9, 1};
  ASSERT_GE(static_cast<int64_t>(prompt_lengths.size()), CpuBackend::kPrefetchKvMinTokens);
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<int32_t>> blocks;
  for (size_t n : prompt_lengths) {
    tokens.emplace_back(kPromptA.begin(), kPromptA.begin() + static_cast<int64_t>(n));
    blocks.push_back(Blocks(static_cast<int32_t>(4 * blocks.size()), 4));
  }
  for (int step = 0; step < 4; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    StepBatch batch;
    for (size_t s = 0; s < tokens.size(); ++s) {
      const int64_t length = static_cast<int64_t>(tokens[s].size());
      // Step 0 prefills each prompt; then one token each.
      const int64_t start = step == 0 ? 0 : length - 1;
      batch.sequences.push_back(
          {.tokens = absl::MakeConstSpan(tokens[s]).subspan(static_cast<size_t>(start)),
           .start_position = start,
           .block_table = blocks[s]});
    }
    StepOutput out_with, out_without;
    const absl::Status status = with.forward->Step(batch, with.kv.get(), &out_with);
    ASSERT_TRUE(status.ok()) << status;
    ASSERT_TRUE(without.forward->Step(batch, without.kv.get(), &out_without).ok());
    ASSERT_EQ(out_with.logits, out_without.logits);
    for (size_t s = 0; s < tokens.size(); ++s) {
      tokens[s].push_back(static_cast<int32_t>(
          std::max_element(out_with.Logits(static_cast<int64_t>(s)),
                           out_with.Logits(static_cast<int64_t>(s)) + out_with.vocab_size) -
          out_with.Logits(static_cast<int64_t>(s))));
    }
  }
}

// A layer's output projection and MLP run over a step's rows in passes of
// Options::mlp_rows_per_pass: a 76-token step of five sequences (passes of 16 cross sequence
// boundaries and leave a 12-row remainder; the default is one pass), and the decode step after
// it, give every sequence the same logits bit for bit. Passes that read or add each other's rows
// would not.
TEST(CpuBackendTest, MlpPassesDoNotChangeTheResult) {
  auto make = [](int64_t rows_per_pass) {
    Harness h;
    auto forward = CpuBackend::Create(
        &DefaultModel(), {.num_threads = 2, .mlp_rows_per_pass = rows_per_pass});
    CHECK(forward.ok()) << forward.status();
    h.forward = std::move(*forward);
    auto kv = KvStorage::Create(h.forward->KvLayoutFor(32));
    CHECK(kv.ok()) << kv.status();
    h.kv = std::move(*kv);
    return h;
  };
  Harness one_pass = make(0);
  Harness passes = make(16);
  std::vector<std::vector<int32_t>> tokens = {
      kPromptA, kPromptB, {kPromptB.rbegin(), kPromptB.rend()}, kPromptA,
      {kPromptA.begin(), kPromptA.begin() + 16}};
  std::vector<std::vector<int32_t>> blocks;
  for (size_t s = 0; s < tokens.size(); ++s) {
    blocks.push_back(Blocks(static_cast<int32_t>(4 * s), 4));
  }
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    StepBatch batch;
    int64_t total = 0;
    for (size_t s = 0; s < tokens.size(); ++s) {
      const int64_t length = static_cast<int64_t>(tokens[s].size());
      const int64_t start = step == 0 ? 0 : length - 1;
      total += length - start;
      batch.sequences.push_back(
          {.tokens = absl::MakeConstSpan(tokens[s]).subspan(static_cast<size_t>(start)),
           .start_position = start,
           .block_table = blocks[s]});
    }
    if (step == 0) {
      ASSERT_EQ(total, 76);
    }
    StepOutput out_one, out_passes;
    const absl::Status status = one_pass.forward->Step(batch, one_pass.kv.get(), &out_one);
    ASSERT_TRUE(status.ok()) << status;
    ASSERT_TRUE(passes.forward->Step(batch, passes.kv.get(), &out_passes).ok());
    ASSERT_EQ(out_one.logits.size(), tokens.size() * static_cast<size_t>(out_one.vocab_size));
    ASSERT_EQ(out_one.logits, out_passes.logits);
    for (size_t s = 0; s < tokens.size(); ++s) {
      const float* row = out_one.Logits(static_cast<int64_t>(s));
      tokens[s].push_back(
          static_cast<int32_t>(std::max_element(row, row + out_one.vocab_size) - row));
    }
  }
}

TEST(CpuBackendTest, MlpRowsPerPassMustBeWholeTiles) {
  for (int64_t rows : {int64_t{-16}, int64_t{8}, int64_t{100}}) {
    const auto forward = CpuBackend::Create(&DefaultModel(), {.mlp_rows_per_pass = rows});
    EXPECT_EQ(forward.status().code(), absl::StatusCode::kInvalidArgument) << rows;
  }
}

TEST(CpuBackendTest, DumpNamesEveryLayerLikeLlamaCpp) {
  Harness h = MakeHarness();
  const std::vector<int32_t> blocks = Blocks(0, 1);
  std::set<std::string> names;
  StepOutput out;
  StepBatch batch;
  batch.sequences.push_back({.tokens = kPromptB, .start_position = 0, .block_table = blocks});
  ASSERT_TRUE(h.forward
                  ->Step(batch, h.kv.get(), &out,
                         [&](absl::string_view name, const float* data, int64_t rows, int64_t cols) {
                           names.insert(std::string(name));
                           EXPECT_GT(rows, 0);
                           EXPECT_GT(cols, 0);
                           EXPECT_TRUE(std::isfinite(data[rows * cols - 1]));
                         })
                  .ok());
  const int64_t layers = DefaultModel().config.num_layers;
  for (int64_t l : {int64_t{0}, layers - 1}) {
    for (const char* n : {"attn_norm", "Qcur", "Kcur", "Vcur", "kqv_out", "ffn_inp", "ffn_norm",
                          "ffn_out", "l_out"}) {
      EXPECT_TRUE(names.contains(absl::StrCat(n, "-", l))) << n << "-" << l;
    }
  }
  EXPECT_TRUE(names.contains("result_norm"));
  EXPECT_TRUE(names.contains("result_output"));
}

TEST(CpuBackendTest, BadBatchesAreInvalidArgument) {
  Harness h = MakeHarness(16, 4);
  const std::vector<int32_t> blocks = Blocks(0, 1);
  const std::vector<int32_t> out_of_vocab = {1, static_cast<int32_t>(DefaultModel().config.vocab_size)};
  const std::vector<int32_t> negative = {-1};
  const std::vector<int32_t> seventeen(17, 5);
  const std::vector<int32_t> bad_block = {99};
  const std::vector<int32_t> one = {5};
  struct Case {
    const char* what;
    StepSequence seq;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"empty tokens", {.tokens = {}, .block_table = blocks}, "no tokens"},
      {"id = vocab", {.tokens = out_of_vocab, .block_table = blocks}, "outside the vocabulary"},
      {"negative id", {.tokens = negative, .block_table = blocks}, "outside the vocabulary"},
      {"table too short", {.tokens = seventeen, .block_table = blocks}, "cannot hold"},
      {"block outside pool", {.tokens = one, .block_table = bad_block}, "outside the pool"},
      {"past the context",
       {.tokens = one, .start_position = DefaultModel().config.max_context, .block_table = blocks},
       "context length"},
  };
  for (const Case& c : cases) {
    StepBatch batch;
    batch.sequences.push_back(c.seq);
    StepOutput out;
    const absl::Status s = h.forward->Step(batch, h.kv.get(), &out);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message)) << c.what;
  }
  StepOutput out;
  EXPECT_EQ(h.forward->Step(StepBatch{}, h.kv.get(), &out).code(),
            absl::StatusCode::kInvalidArgument);
  // A pool shaped for another model.
  auto other = *KvStorage::Create(KvLayout{.num_blocks = 4, .num_layers = 2, .block_size = 16,
                                           .num_kv_heads = 3, .head_dim = 64});
  StepBatch batch;
  batch.sequences.push_back({.tokens = one, .block_table = blocks});
  EXPECT_THAT(std::string(h.forward->Step(batch, other.get(), &out).message()),
              HasSubstr("does not match the model"));
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// Each layer is reported once, in order, as soon as its K/V are final and before any later layer
// is written, so a transfer can send it while the rest of the step runs.
TEST(CpuBackendTest, LayerDoneComesAsEachLayerIsInTheCache) {
  Harness h = MakeHarness(16, 8);
  const KvLayout& l = h.kv->layout();
  std::memset(h.kv->data<std::byte>(), 0, static_cast<size_t>(l.total_bytes()));
  const std::vector<int32_t> blocks = Blocks(0, 2);
  std::vector<int64_t> reported;
  // Block 0's slice of each layer (K then V, in the pool's dtype) when reported.
  auto slice = [&](int64_t layer) {
    const auto* k = reinterpret_cast<const unsigned char*>(h.kv->KeyBlock<std::byte>(0, layer));
    return std::vector<unsigned char>(k, k + l.block_bytes());
  };
  std::vector<std::vector<unsigned char>> at_report;
  StepBatch batch;
  batch.sequences.push_back({.tokens = kPromptA, .start_position = 0, .block_table = blocks});
  batch.on_layer_done = [&](int64_t layer) {
    reported.push_back(layer);
    at_report.push_back(slice(layer));
    if (layer + 1 < l.num_layers) {
      const std::vector<unsigned char> next = slice(layer + 1);
      EXPECT_TRUE(std::all_of(next.begin(), next.end(), [](unsigned char b) { return b == 0; }))
          << "layer " << layer + 1 << " was written before layer " << layer << " was reported";
    }
  };
  StepOutput out;
  ASSERT_TRUE(h.forward->Step(batch, h.kv.get(), &out).ok());
  ASSERT_EQ(static_cast<int64_t>(reported.size()), l.num_layers);
  for (int64_t layer = 0; layer < l.num_layers; ++layer) {
    EXPECT_EQ(reported[static_cast<size_t>(layer)], layer);
    EXPECT_EQ(at_report[static_cast<size_t>(layer)], slice(layer))
        << "layer " << layer << " changed after it was reported";
  }
}

}  // namespace
}  // namespace tandem
