#include "engine/cpu/rope.h"

#include <cmath>
#include <random>
#include <vector>

#include "engine/cpu/kernel_test_util.h"
#include "gtest/gtest.h"

namespace tandem::cpu {
namespace {

TEST(RopeTest, InvFreqIsThetaPowers) {
  std::vector<float> f(32);
  RopeInvFreq(10000.0, 64, f.data());
  EXPECT_FLOAT_EQ(f[0], 1.0f);
  EXPECT_NEAR(f[1], std::pow(10000.0, -2.0 / 64), 1e-7);
  EXPECT_NEAR(f[31], std::pow(10000.0, -62.0 / 64), 1e-9);
}

// Both pairings against a double-precision rotation, with a partial rotary_dim, padded strides
// and large positions.
TEST(RopeTest, MatchesDoubleRotation) {
  std::mt19937 rng(5);
  for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kNeox}) {
    for (int64_t head_dim : {64, 10}) {
      const int64_t rotary_dim = head_dim == 64 ? 48 : 10;
      const int64_t num_tokens = 3, num_heads = 3;
      const int64_t head_stride = head_dim + 1, token_stride = num_heads * head_stride + 2;
      std::vector<float> inv_freq(rotary_dim / 2);
      RopeInvFreq(500000.0, rotary_dim, inv_freq.data());
      const std::vector<int32_t> positions = {0, 7, 131071};
      std::vector<float> x = testing::RandomFloats(rng, num_tokens * token_stride);
      const std::vector<float> before = x;
      Rope({.x = x.data(),
            .token_stride = token_stride,
            .head_stride = head_stride,
            .num_tokens = num_tokens,
            .num_heads = num_heads,
            .head_dim = head_dim,
            .rotary_dim = rotary_dim,
            .positions = positions.data(),
            .inv_freq = inv_freq.data(),
            .style = style});
      for (int64_t t = 0; t < num_tokens; ++t) {
        for (int64_t h = 0; h < num_heads; ++h) {
          const int64_t base = t * token_stride + h * head_stride;
          for (int64_t i = 0; i < rotary_dim / 2; ++i) {
            const int64_t a = style == RopeStyle::kInterleaved ? base + 2 * i : base + i;
            const int64_t b = style == RopeStyle::kInterleaved ? a + 1 : a + rotary_dim / 2;
            const double th = static_cast<double>(positions[t]) * inv_freq[i];
            EXPECT_NEAR(x[a], before[a] * std::cos(th) - before[b] * std::sin(th), 1e-6);
            EXPECT_NEAR(x[b], before[a] * std::sin(th) + before[b] * std::cos(th), 1e-6);
          }
          for (int64_t i = rotary_dim; i < head_dim; ++i) {
            EXPECT_EQ(x[base + i], before[base + i]);  // past rotary_dim: untouched
          }
        }
      }
    }
  }
}

// Angles computed once (RopeCosSin) rotate exactly as Rope's own, for both pairings.
TEST(RopeTest, PrecomputedAnglesGiveTheSameBits) {
  std::mt19937 rng(6);
  const int64_t head_dim = 64, rotary_dim = 64, num_tokens = 4, num_heads = 2;
  std::vector<float> inv_freq(rotary_dim / 2);
  RopeInvFreq(10000.0, rotary_dim, inv_freq.data());
  const std::vector<int32_t> positions = {0, 1, 4095, 100000};
  std::vector<float> cos_sin(num_tokens * rotary_dim);
  RopeCosSin(positions.data(), num_tokens, inv_freq.data(), rotary_dim, cos_sin.data());
  for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kNeox}) {
    const std::vector<float> x = testing::RandomFloats(rng, num_tokens * num_heads * head_dim);
    std::vector<float> own = x, shared = x;
    RopeParams p{.x = own.data(), .token_stride = num_heads * head_dim, .head_stride = head_dim,
                 .num_tokens = num_tokens, .num_heads = num_heads, .head_dim = head_dim,
                 .rotary_dim = rotary_dim, .positions = positions.data(),
                 .inv_freq = inv_freq.data(), .style = style};
    Rope(p);
    p.x = shared.data();
    p.cos_sin = cos_sin.data();
    Rope(p);
    EXPECT_EQ(own, shared);
    EXPECT_NE(own, x);
  }
}

// The NeoX pairing is the interleaved one on a permuted head: (i, i + d/2) <-> (2i, 2i + 1).
TEST(RopeTest, NeoxIsInterleavedOnPermutedDims) {
  std::mt19937 rng(6);
  const int64_t d = 16;
  std::vector<float> inv_freq(d / 2);
  RopeInvFreq(10000.0, d, inv_freq.data());
  const int32_t pos = 42;
  std::vector<float> neox = testing::RandomFloats(rng, d);
  std::vector<float> inter(d);
  for (int64_t i = 0; i < d / 2; ++i) {
    inter[2 * i] = neox[i];
    inter[2 * i + 1] = neox[i + d / 2];
  }
  RopeParams p{.x = neox.data(),
               .num_tokens = 1,
               .num_heads = 1,
               .head_dim = d,
               .rotary_dim = d,
               .positions = &pos,
               .inv_freq = inv_freq.data(),
               .style = RopeStyle::kNeox};
  Rope(p);
  p.x = inter.data();
  p.style = RopeStyle::kInterleaved;
  Rope(p);
  for (int64_t i = 0; i < d / 2; ++i) {
    EXPECT_FLOAT_EQ(inter[2 * i], neox[i]);
    EXPECT_FLOAT_EQ(inter[2 * i + 1], neox[i + d / 2]);
  }
}

// LongRoPE: each pair's frequency divided by its own factor (folded into inv_freq by the caller)
// and cos/sin scaled by the attention factor, against the formula in double, both with Rope's own
// angles and with RopeCosSin's.
TEST(RopeTest, PerPairDivisorsAndScaleMatchTheFormula) {
  std::mt19937 rng(7);
  const int64_t head_dim = 32, half = head_dim / 2, num_tokens = 4, num_heads = 2;
  const double base = 10000.0;
  const float scale = 1.19f;
  std::vector<float> factors(half);
  std::uniform_real_distribution<float> spread(1.0f, 40.0f);
  for (float& f : factors) f = spread(rng);
  std::vector<float> inv_freq(half);
  RopeInvFreq(base, head_dim, inv_freq.data());
  for (int64_t i = 0; i < half; ++i) inv_freq[i] /= factors[i];
  const std::vector<int32_t> positions = {0, 3, 33, 200};
  std::vector<float> cos_sin(num_tokens * head_dim);
  RopeCosSin(positions.data(), num_tokens, inv_freq.data(), head_dim, cos_sin.data(), scale);
  const std::vector<float> x = testing::RandomFloats(rng, num_tokens * num_heads * head_dim);
  for (bool precomputed : {false, true}) {
    std::vector<float> y = x;
    Rope({.x = y.data(), .token_stride = num_heads * head_dim, .head_stride = head_dim,
          .num_tokens = num_tokens, .num_heads = num_heads, .head_dim = head_dim,
          .rotary_dim = head_dim, .positions = positions.data(), .inv_freq = inv_freq.data(),
          .style = RopeStyle::kNeox, .cos_sin = precomputed ? cos_sin.data() : nullptr,
          .scale = scale});
    for (int64_t t = 0; t < num_tokens; ++t) {
      for (int64_t h = 0; h < num_heads; ++h) {
        const int64_t o = (t * num_heads + h) * head_dim;
        for (int64_t i = 0; i < half; ++i) {
          const double th = positions[t] /
                            (factors[i] * std::pow(base, 2.0 * static_cast<double>(i) / head_dim));
          const double a = x[o + i], b = x[o + i + half];
          EXPECT_NEAR(y[o + i], scale * (a * std::cos(th) - b * std::sin(th)), 3e-5);
          EXPECT_NEAR(y[o + i + half], scale * (a * std::sin(th) + b * std::cos(th)), 3e-5);
        }
      }
    }
  }
}

}  // namespace
}  // namespace tandem::cpu
