#include "engine/cpu/paged_attention.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "engine/cpu/kernel_test_util.h"
#include "gtest/gtest.h"

namespace tandem::cpu {
namespace {

using testing::RandomFloats;

// A batch over a paged cache: sequences of lengths not multiple of the block size, physical
// blocks shuffled, and every cache slot past a sequence's length filled with NaN so any read
// beyond the causal window poisons the output.
struct Batch {
  int64_t block_size = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0;
  std::vector<float> q = {}, k_cache = {}, v_cache = {}, out = {};
  std::vector<uint16_t> k_half = {}, v_half = {};  // the caches in F16 (Params(DType::kF16))
  std::vector<int32_t> block_tables = {}, token_seq = {}, token_pos = {};
  int64_t max_blocks = 0;

  // The same batch over an F16 cache: the float caches rounded to half (NaN stays NaN).
  PagedAttentionParams Params(DType kv_type) {
    PagedAttentionParams p = Params();
    if (kv_type == DType::kF16) {
      k_half.resize(k_cache.size());
      v_half.resize(v_cache.size());
      for (size_t i = 0; i < k_cache.size(); ++i) {
        k_half[i] = FloatToHalf(k_cache[i]);
        v_half[i] = FloatToHalf(v_cache[i]);
      }
      p.k_cache = k_half.data();
      p.v_cache = v_half.data();
      p.kv_type = DType::kF16;
    }
    return p;
  }

  PagedAttentionParams Params() {
    const int64_t token_stride = num_kv_heads * head_dim + 5;  // padded slots
    return PagedAttentionParams{.q = q.data(),
                                .q_token_stride = num_heads * head_dim + 2,
                                .out = out.data(),
                                .out_token_stride = num_heads * head_dim,
                                .k_cache = k_cache.data(),
                                .v_cache = v_cache.data(),
                                .block_stride = block_size * token_stride,
                                .token_stride = token_stride,
                                .kv_head_stride = head_dim,
                                .block_size = block_size,
                                .block_tables = block_tables.data(),
                                .max_blocks_per_seq = max_blocks,
                                .token_seq = token_seq.data(),
                                .token_pos = token_pos.data(),
                                .num_tokens = static_cast<int64_t>(token_seq.size()),
                                .num_heads = num_heads,
                                .num_kv_heads = num_kv_heads,
                                .head_dim = head_dim};
  }
};

// Mixed step: decode tokens (seq 0 at 0, seq 2 at 39) around a prefill chunk of seq 1
// (positions 12..16) and a chunk of seq 3 that ends before the cache does (20..24 of 33).
const std::vector<int64_t> kSeqLens = {1, 17, 40, 33};
const std::vector<std::pair<int32_t, int32_t>> kTokens = {
    {1, 12}, {0, 0}, {1, 13}, {1, 14}, {2, 39}, {1, 15}, {1, 16}, {3, 20}, {3, 21}, {3, 24}};

// `key_scale` widens the scores' spread (peaked softmax weights).
Batch MakeBatch(int64_t block_size, int64_t group, int64_t head_dim, std::mt19937& rng,
                const std::vector<int64_t>& seq_lens = kSeqLens,
                const std::vector<std::pair<int32_t, int32_t>>& tokens = kTokens,
                float key_scale = 2.0f) {
  Batch b{
      .block_size = block_size, .num_heads = 2 * group, .num_kv_heads = 2, .head_dim = head_dim};
  for (int64_t len : seq_lens) {
    b.max_blocks = std::max(b.max_blocks, (len + block_size - 1) / block_size);
  }
  const int64_t num_blocks = b.max_blocks * static_cast<int64_t>(seq_lens.size()) + 3;
  std::vector<int32_t> physical(static_cast<size_t>(num_blocks));
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), rng);
  b.block_tables.assign(static_cast<size_t>(b.max_blocks * seq_lens.size()), -1);
  size_t next = 0;
  for (size_t s = 0; s < seq_lens.size(); ++s) {
    for (int64_t i = 0; i < (seq_lens[s] + block_size - 1) / block_size; ++i) {
      b.block_tables[s * b.max_blocks + i] = physical[next++];
    }
  }
  PagedAttentionParams p = b.Params();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  b.k_cache.assign(static_cast<size_t>(num_blocks * p.block_stride), nan);
  b.v_cache.assign(b.k_cache.size(), nan);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (size_t s = 0; s < seq_lens.size(); ++s) {
    for (int64_t pos = 0; pos < seq_lens[s]; ++pos) {
      const int64_t block = b.block_tables[s * b.max_blocks + pos / block_size];
      for (int64_t g = 0; g < b.num_kv_heads; ++g) {
        const int64_t off =
            block * p.block_stride + (pos % block_size) * p.token_stride + g * p.kv_head_stride;
        for (int64_t d = 0; d < head_dim; ++d) {
          b.k_cache[off + d] = key_scale * dist(rng);
          b.v_cache[off + d] = dist(rng);
        }
      }
    }
  }
  for (auto [seq, pos] : tokens) {
    b.token_seq.push_back(seq);
    b.token_pos.push_back(pos);
  }
  p = b.Params();
  b.q = RandomFloats(rng, p.num_tokens * p.q_token_stride);
  b.out.assign(static_cast<size_t>(p.num_tokens * p.out_token_stride), nan);
  return b;
}

class PagedAttentionTest
    : public ::testing::TestWithParam<std::tuple<Isa, int64_t, int64_t, int64_t>> {};

// Long contexts (several 32-position chunks, partial last chunks of 1..31 positions), every GQA
// group size the AVX-512 head_dim-64 kernel takes and one past it (7: the generic loop), and
// scores spread wide enough that the softmax is peaked and the running maximum moves.
TEST(PagedAttentionLongTest, MatchesTheReferenceOverManyChunks) {
  const std::vector<int64_t> lens = {301, 64, 33, 97};
  const std::vector<std::pair<int32_t, int32_t>> tokens = {
      {0, 300}, {1, 63}, {2, 32}, {3, 95}, {3, 96}, {0, 31}, {0, 160}, {1, 16}};
  for (int64_t group : {1, 2, 3, 4, 5, 6, 7}) {
    for (float key_scale : {0.5f, 6.0f}) {
      std::mt19937 rng(static_cast<uint32_t>(group * 7 + key_scale));
      Batch batch = MakeBatch(16, group, 64, rng, lens, tokens, key_scale);
      for (DType kv_type : {DType::kF32, DType::kF16}) {
        PagedAttentionParams p = batch.Params(kv_type);
        std::vector<float> expected(batch.out.size());
        p.out = expected.data();
        ASSERT_TRUE(PagedAttentionReference(p).ok());
        for (Isa isa : kAllIsas) {
          if (!IsaSupported(isa, HostCpuFeatures())) continue;
          std::vector<float> got(batch.out.size(), std::numeric_limits<float>::quiet_NaN());
          p.out = got.data();
          ASSERT_TRUE(PagedAttention(p, {.isa = isa}).ok());
          for (size_t i = 0; i < got.size(); ++i) {
            // A convex combination of |v| <= 1 over <= 301 positions: 1e-5 covers the rounding
            // of the float sums and of a ~2-ulp exp (the reference reads the same halves).
            ASSERT_NEAR(got[i], expected[i], 1e-5f)
                << IsaName(isa) << " " << DTypeName(kv_type) << " group " << group
                << " key_scale " << key_scale << " element " << i << " (token "
                << i / p.out_token_stride << ")";
          }
        }
      }
    }
  }
}

// Sliding-window attention (Mistral's): each token sees only its last `window` positions, in a
// prompt chunk that crosses the window's edge (tile runs must stop there), decode tokens, head_dim
// 64 (the AVX kernels) and 32 (the generic loop). Against the reference with the same window, and
// with every cache position a decode token must not see set to NaN, so a read outside the window
// poisons its output.
TEST(PagedAttentionWindowTest, SeesOnlyTheWindow) {
  const std::vector<int64_t> lens = {41, 64, 33, 97};
  std::vector<std::pair<int32_t, int32_t>> tokens;
  for (int32_t pos = 0; pos < 41; ++pos) tokens.push_back({0, pos});  // a whole prompt
  tokens.insert(tokens.end(), {{1, 63}, {2, 32}, {3, 96}});             // one token each
  for (int64_t window : {1, 7, 24, 40, 100}) {
    for (int64_t head_dim : {64, 32}) {
      for (int64_t group : {1, 3, 7}) {
        std::mt19937 rng(static_cast<uint32_t>(window * 100 + head_dim + group));
        Batch batch = MakeBatch(16, group, head_dim, rng, lens, tokens, 4.0f);
        // Sequences 1..3 have one token, at their last position: poison what precedes its window.
        PagedAttentionParams p = batch.Params();
        for (int32_t s = 1; s < 4; ++s) {
          const int64_t last = lens[s] - 1;
          for (int64_t pos = 0; pos < last - window + 1; ++pos) {
            const int64_t block = batch.block_tables[s * batch.max_blocks + pos / 16];
            for (int64_t i = 0; i < p.token_stride; ++i) {
              const int64_t off = block * p.block_stride + (pos % 16) * p.token_stride + i;
              batch.k_cache[off] = batch.v_cache[off] = std::numeric_limits<float>::quiet_NaN();
            }
          }
        }
        for (DType kv_type : {DType::kF32, DType::kF16}) {
          p = batch.Params(kv_type);
          p.window = window;
          std::vector<float> expected(batch.out.size());
          p.out = expected.data();
          ASSERT_TRUE(PagedAttentionReference(p).ok());
          for (Isa isa : kAllIsas) {
            if (!IsaSupported(isa, HostCpuFeatures())) continue;
            std::vector<float> got(batch.out.size(), std::numeric_limits<float>::quiet_NaN());
            p.out = got.data();
            ASSERT_TRUE(PagedAttention(p, {.isa = isa}).ok());
            for (size_t i = 0; i < got.size(); ++i) {
              if (i % p.out_token_stride >= static_cast<size_t>(p.num_heads * head_dim)) continue;
              // As MatchesTheReferenceOverManyChunks (NaN fails it).
              ASSERT_NEAR(got[i], expected[i], 1e-5f)
                  << IsaName(isa) << " " << DTypeName(kv_type) << " window " << window
                  << " head_dim " << head_dim << " group " << group << " element " << i
                  << " (token " << i / p.out_token_stride << ")";
            }
          }
        }
      }
    }
  }
  // A window that reaches position 0 changes nothing.
  std::mt19937 rng(5);
  Batch batch = MakeBatch(16, 2, 64, rng, lens, tokens);
  PagedAttentionParams p = batch.Params();
  std::vector<float> full(batch.out.size()), windowed(batch.out.size());
  p.out = full.data();
  ASSERT_TRUE(PagedAttention(p).ok());
  p.window = 97;
  p.out = windowed.data();
  ASSERT_TRUE(PagedAttention(p).ok());
  EXPECT_EQ(full, windowed);
}

// Gemma 2's soft-capped scores with a scale other than 1 / sqrt(head_dim), alone and with a
// window, against a plain computation written here (scores cap * tanh(scale * q·k / cap) in
// double, a full softmax, the weighted values), on every ISA; head_dim 64 would take the tile
// kernels without the cap.
TEST(PagedAttentionSoftcapTest, MatchesPlainSoftcappedSoftmax) {
  const std::vector<int64_t> lens = {41, 64, 33};
  std::vector<std::pair<int32_t, int32_t>> tokens;
  for (int32_t pos = 0; pos < 41; ++pos) tokens.push_back({0, pos});
  tokens.insert(tokens.end(), {{1, 63}, {2, 32}});
  for (int64_t head_dim : {64, 32}) {
    for (int64_t window : {0, 7}) {
      for (float cap : {1.5f, 6.0f}) {
        std::mt19937 rng(static_cast<uint32_t>(head_dim + window * 10 + cap * 100));
        Batch batch = MakeBatch(16, 2, head_dim, rng, lens, tokens, 4.0f);
        PagedAttentionParams p = batch.Params();
        p.window = window;
        p.scale = 0.3f;
        p.softcap = cap;
        const int64_t group = p.num_heads / p.num_kv_heads;
        std::vector<float> want(batch.out.size(), 0.0f);
        for (int64_t t = 0; t < p.num_tokens; ++t) {
          const int64_t seq = p.token_seq[t], pos = p.token_pos[t];
          const int64_t lo = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
          for (int64_t h = 0; h < p.num_heads; ++h) {
            const float* q = p.q + t * p.q_token_stride + h * head_dim;
            auto offset = [&](int64_t j) {
              const int64_t block = p.block_tables[seq * p.max_blocks_per_seq + j / 16];
              return block * p.block_stride + (j % 16) * p.token_stride +
                     (h / group) * p.kv_head_stride;
            };
            std::vector<double> w;
            double max = -1e300, sum = 0.0;
            for (int64_t j = lo; j <= pos; ++j) {
              double dot = 0.0;
              for (int64_t i = 0; i < head_dim; ++i) dot += q[i] * batch.k_cache[offset(j) + i];
              w.push_back(cap * std::tanh(0.3 * dot / cap));
              max = std::max(max, w.back());
            }
            for (double& x : w) sum += (x = std::exp(x - max));
            for (int64_t j = lo; j <= pos; ++j) {
              for (int64_t i = 0; i < head_dim; ++i) {
                want[t * p.out_token_stride + h * head_dim + i] +=
                    static_cast<float>(w[j - lo] / sum * batch.v_cache[offset(j) + i]);
              }
            }
          }
        }
        std::vector<float> uncapped(batch.out.size());
        PagedAttentionParams no_cap = p;
        no_cap.softcap = 0.0f;
        no_cap.out = uncapped.data();
        ASSERT_TRUE(PagedAttention(no_cap).ok());
        float change = 0.0f;
        for (size_t i = 0; i < want.size(); ++i) {
          change = std::max(change, std::fabs(uncapped[i] - want[i]));
        }
        EXPECT_GT(change, 0.05f) << "the cap does not bite: the test would not see it";
        for (Isa isa : kAllIsas) {
          if (!IsaSupported(isa, HostCpuFeatures())) continue;
          std::vector<float> got(batch.out.size());
          p.out = got.data();
          ASSERT_TRUE(PagedAttention(p, {.isa = isa}).ok());
          for (size_t i = 0; i < got.size(); ++i) {
            ASSERT_NEAR(got[i], want[i], 2e-5f)
                << IsaName(isa) << " head_dim " << head_dim << " window " << window << " cap "
                << cap << " element " << i;
          }
        }
      }
    }
  }
  PagedAttentionParams bad;
  bad.head_dim = bad.block_size = bad.num_heads = bad.num_kv_heads = 1;
  bad.softcap = -1.0f;
  EXPECT_EQ(PagedAttention(bad).code(), absl::StatusCode::kInvalidArgument);
}

// A prompt chunk's tokens go to the tile kernel (Attend64RowsFn) in runs of up to 8; each
// token's output must be bit for bit what the step gives when that token is the only one (the
// one-token kernel), for every group size, both cache types, chunks that start anywhere relative
// to the 32-position chunks, and with a pool (so that how a prompt is split never changes a
// result).
TEST(PagedAttentionTilesTest, PromptChunksEqualTheirTokensOneByOne) {
  const std::vector<int64_t> lens = {70, 45, 200, 9};
  std::vector<std::pair<int32_t, int32_t>> tokens;
  for (int32_t pos = 0; pos < 70; ++pos) tokens.push_back({0, pos});    // a whole prompt
  tokens.push_back({3, 8});                                             // a decode token
  for (int32_t pos = 20; pos < 45; ++pos) tokens.push_back({1, pos});   // across a chunk edge
  for (int32_t pos = 150; pos < 200; ++pos) tokens.push_back({2, pos});
  ThreadPool pool({.num_threads = 3});
  for (int64_t group : {1, 2, 3, 4, 5, 6, 7}) {
    std::mt19937 rng(static_cast<uint32_t>(group + 40));
    Batch batch = MakeBatch(16, group, 64, rng, lens, tokens, 6.0f);
    for (DType kv_type : {DType::kF32, DType::kF16}) {
      for (Isa isa : kAllIsas) {
        if (!IsaSupported(isa, HostCpuFeatures())) continue;
        PagedAttentionParams p = batch.Params(kv_type);
        std::vector<float> whole(batch.out.size(), std::numeric_limits<float>::quiet_NaN());
        p.out = whole.data();
        ASSERT_TRUE(PagedAttention(p, {.pool = &pool, .isa = isa}).ok());
        std::vector<float> alone(batch.out.size(), std::numeric_limits<float>::quiet_NaN());
        for (int64_t t = 0; t < p.num_tokens; ++t) {
          PagedAttentionParams one = p;
          one.q = p.q + t * p.q_token_stride;
          one.out = alone.data() + t * p.out_token_stride;
          one.token_seq = p.token_seq + t;
          one.token_pos = p.token_pos + t;
          one.num_tokens = 1;
          ASSERT_TRUE(PagedAttention(one, {.isa = isa}).ok());
        }
        for (int64_t t = 0; t < p.num_tokens; ++t) {
          for (int64_t i = 0; i < p.num_heads * p.head_dim; ++i) {
            const float a = whole[t * p.out_token_stride + i];
            const float b = alone[t * p.out_token_stride + i];
            ASSERT_EQ(std::bit_cast<uint32_t>(a), std::bit_cast<uint32_t>(b))
                << IsaName(isa) << " " << DTypeName(kv_type) << " group " << group << " token "
                << t << " (sequence " << p.token_seq[t] << " position " << p.token_pos[t]
                << ") element " << i << ": " << a << " vs " << b;
          }
        }
        // And both are the attention the reference computes.
        std::vector<float> expected(batch.out.size());
        p.out = expected.data();
        ASSERT_TRUE(PagedAttentionReference(p).ok());
        for (size_t i = 0; i < whole.size(); ++i) {
          ASSERT_NEAR(whole[i], expected[i], 1e-5f)
              << IsaName(isa) << " " << DTypeName(kv_type) << " group " << group << " element "
              << i;
        }
      }
    }
  }
}

TEST_P(PagedAttentionTest, MatchesNaiveSoftmaxReference) {
  const auto [isa, block_size, group, head_dim] = GetParam();
  if (!IsaSupported(isa, HostCpuFeatures())) GTEST_SKIP() << IsaName(isa) << " not on this CPU";
  std::mt19937 rng(static_cast<uint32_t>(block_size * 100 + group * 10 + head_dim));
  Batch batch = MakeBatch(block_size, group, head_dim, rng);
  ThreadPool pool({.num_threads = 3});
  for (DType kv_type : {DType::kF32, DType::kF16}) {
    PagedAttentionParams p = batch.Params(kv_type);
    std::vector<float> expected(batch.out.size());
    p.out = expected.data();
    ASSERT_TRUE(PagedAttentionReference(p).ok());
    for (ThreadPool* pool_or_null : {static_cast<ThreadPool*>(nullptr), &pool}) {
      std::vector<float> got(batch.out.size(), std::numeric_limits<float>::quiet_NaN());
      p.out = got.data();
      ASSERT_TRUE(PagedAttention(p, {.pool = pool_or_null, .isa = isa}).ok());
      // The output is a convex combination of V rows (|v| <= 1): float rounding of the online
      // softmax over <= 40 positions stays far below 2e-5 absolute.
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_NEAR(got[i], expected[i], 2e-5f) << DTypeName(kv_type) << " element " << i
                                                << " (token " << i / p.out_token_stride << ")";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, PagedAttentionTest,
                         ::testing::Combine(::testing::ValuesIn(kAllIsas),
                                            ::testing::Values(1, 16, 5), ::testing::Values(1, 3),
                                            ::testing::Values(64, 17)),
                         [](const auto& info) {
                           return std::string(IsaName(std::get<0>(info.param))) + "_bs" +
                                  std::to_string(std::get<1>(info.param)) + "_group" +
                                  std::to_string(std::get<2>(info.param)) + "_hd" +
                                  std::to_string(std::get<3>(info.param));
                         });

TEST(PagedAttentionValidationTest, RejectsInconsistentHeads) {
  PagedAttentionParams p{
      .block_size = 16, .num_tokens = 0, .num_heads = 5, .num_kv_heads = 2, .head_dim = 64};
  EXPECT_EQ(PagedAttention(p).code(), absl::StatusCode::kInvalidArgument);
  p.num_heads = 4;
  EXPECT_TRUE(PagedAttention(p).ok());  // no tokens: nothing to do
  p.num_tokens = 1;                     // ... but now the pointers are needed
  EXPECT_EQ(PagedAttention(p).code(), absl::StatusCode::kInvalidArgument);
  p.num_tokens = 0;
  p.block_size = 0;
  EXPECT_EQ(PagedAttentionReference(p).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::cpu
