#include "engine/cpu/kernel_table.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "engine/cpu/kernel_test_util.h"
#include "gtest/gtest.h"

namespace tandem::cpu {
namespace {

TEST(KernelTableTest, DispatchesToTheRequestedIsaOrTheBestBelowIt) {
  const CpuFeatures& host = HostCpuFeatures();
  EXPECT_EQ(KernelTableFor(Isa::kScalar).isa, Isa::kScalar);
  for (Isa isa : kAllIsas) {
    const Isa got = KernelTableFor(isa).isa;
    EXPECT_TRUE(IsaSupported(got, host));
    EXPECT_LE(static_cast<int>(got), static_cast<int>(isa));
    if (IsaSupported(isa, host)) {
      EXPECT_EQ(got, isa);
    }
  }
}

// Activation quantization: |x - d·q| <= d / 2, s = d·Σq, q in [-127, 127], zero blocks stay zero.
TEST(KernelTableTest, QuantizeRowQ8ActErrorIsHalfAStep) {
  std::mt19937 rng(8);
  std::vector<float> x = testing::RandomFloats(rng, 96, -5.0f, 5.0f);
  for (int i = 64; i < 96; ++i) x[i] = 0.0f;
  std::vector<BlockQ8Act> q(3);
  QuantizeRowQ8Act(x.data(), q.data(), 96);
  for (int b = 0; b < 3; ++b) {
    int sum = 0;
    for (int i = 0; i < kQuantBlock; ++i) {
      EXPECT_GE(q[b].qs[i], -127);
      EXPECT_LE(std::fabs(x[b * 32 + i] - q[b].d * q[b].qs[i]), 0.5001f * q[b].d + 1e-30f);
      sum += q[b].qs[i];
    }
    EXPECT_FLOAT_EQ(q[b].s, q[b].d * static_cast<float>(sum));
  }
  EXPECT_EQ(q[2].d, 0.0f);
}

// Every table quantizes activations exactly as the scalar reference does (codes, scales, sums):
// the integer dot products of the SIMD kernels are tested against the scalar ones on the same
// blocks, so any difference here would change results by ISA. Rows mix scales from 1e-30 to 1e30,
// zero blocks, codes that fall exactly half-way between integers (round to even), a NaN and an
// infinity.
TEST(KernelTableTest, QuantizeQ8ActIsBitIdenticalOnEveryIsa) {
  std::mt19937 rng(10);
  const int64_t nb = 24, k = nb * kQuantBlock;
  std::vector<float> x = testing::RandomFloats(rng, k, -1.0f, 1.0f);
  for (int64_t b = 0; b < nb; ++b) {
    const float scale = std::pow(10.0f, static_cast<float>(b % 13) * 5.0f - 30.0f);
    for (int i = 0; i < kQuantBlock; ++i) x[b * kQuantBlock + i] *= scale;
  }
  for (int i = 0; i < kQuantBlock; ++i) x[3 * kQuantBlock + i] = 0.0f;
  // Block 4: max 127 makes d = 1, so x·(1/d) = x exactly: half-way codes round to even.
  for (int i = 0; i < kQuantBlock; ++i) x[4 * kQuantBlock + i] = -15.5f + static_cast<float>(i);
  x[4 * kQuantBlock] = 127.0f;
  x[5 * kQuantBlock + 7] = std::numeric_limits<float>::quiet_NaN();
  x[6 * kQuantBlock + 9] = -std::numeric_limits<float>::infinity();
  std::vector<BlockQ8Act> want(nb);
  std::vector<int32_t> want_sums(nb);
  ScalarKernelTable().quantize_q8_act(x.data(), want.data(), k, want_sums.data());
  EXPECT_EQ(want[4].qs[1], -14);  // -14.5 -> -14
  EXPECT_EQ(want[4].qs[2], -14);  // -13.5 -> -14
  for (Isa isa : kAllIsas) {
    if (!IsaSupported(isa, HostCpuFeatures())) continue;
    SCOPED_TRACE(IsaName(isa));
    std::vector<BlockQ8Act> got(nb);
    std::vector<int32_t> got_sums(nb, -1);
    KernelTableFor(isa).quantize_q8_act(x.data(), got.data(), k, got_sums.data());
    for (int64_t b = 0; b < nb; ++b) {
      SCOPED_TRACE(::testing::Message() << "block " << b);
      EXPECT_EQ(std::memcmp(&got[b], &want[b], sizeof(BlockQ8Act)), 0);
      EXPECT_EQ(got_sums[b], want_sums[b]);
    }
    // Without sums, the blocks are the same.
    std::vector<BlockQ8Act> plain(nb);
    KernelTableFor(isa).quantize_q8_act(x.data(), plain.data(), k, nullptr);
    EXPECT_EQ(std::memcmp(plain.data(), want.data(), nb * sizeof(BlockQ8Act)), 0);
  }
}

// The F16 row conversions of every table equal the scalar HalfToFloat / FloatToHalf bit for bit:
// every one of the 65536 halves widened, and floats that probe each rounding case narrowed (ties
// to even, subnormal results, the overflow threshold, signed zeros, infinities).
TEST(KernelTableTest, F16RowsMatchTheScalarConversions) {
  std::vector<uint16_t> halves(65536);
  for (uint32_t i = 0; i < halves.size(); ++i) halves[i] = static_cast<uint16_t>(i);
  std::vector<float> floats;
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> bits(0, 0xFFFFFFFFu);
  for (int i = 0; i < 20000; ++i) {
    const uint32_t b = bits(rng);
    float f;
    std::memcpy(&f, &b, sizeof(f));
    if (!std::isnan(f)) floats.push_back(f);
  }
  for (uint32_t h = 0; h < 0x7C00; h += 7) {  // exact halves and the midpoints next to them
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    const float next = HalfToFloat(static_cast<uint16_t>(h + 1));
    floats.insert(floats.end(), {f, -f, (f + next) / 2, -(f + next) / 2});
  }
  floats.insert(floats.end(), {65519.0f, 65520.0f, 1e-8f, 2.9802322e-8f, 5.9604645e-8f, 0.0f,
                               -0.0f, std::numeric_limits<float>::infinity(), 1e30f, -1e30f});
  const int64_t nf = static_cast<int64_t>(floats.size());
  std::vector<float> want_f(halves.size());
  std::vector<uint16_t> want_h(floats.size());
  ScalarKernelTable().f16_to_f32(halves.data(), want_f.data(), 65536);
  ScalarKernelTable().f32_to_f16(floats.data(), want_h.data(), nf);
  for (Isa isa : kAllIsas) {
    if (!IsaSupported(isa, HostCpuFeatures())) continue;
    SCOPED_TRACE(IsaName(isa));
    const KernelTable& kt = KernelTableFor(isa);
    std::vector<float> got_f(halves.size());
    kt.f16_to_f32(halves.data(), got_f.data(), 65536 - 3);  // a tail
    kt.f16_to_f32(halves.data() + 65533, got_f.data() + 65533, 3);
    for (size_t i = 0; i < halves.size(); ++i) {
      if (std::isnan(want_f[i])) {
        EXPECT_TRUE(std::isnan(got_f[i])) << "half " << i;
      } else {
        EXPECT_EQ(std::memcmp(&got_f[i], &want_f[i], sizeof(float)), 0) << "half " << i;
      }
    }
    std::vector<uint16_t> got_h(floats.size());
    kt.f32_to_f16(floats.data(), got_h.data(), nf);
    for (int64_t i = 0; i < nf; ++i) {
      ASSERT_EQ(got_h[i], want_h[i]) << "float " << floats[i];
    }
  }
}

// The attention helpers of every ISA against the scalar ones, with SIMD tails (odd n).
TEST(KernelTableTest, DotAxpyScaleMatchScalar) {
  std::mt19937 rng(9);
  const KernelTable& ref = ScalarKernelTable();
  for (Isa isa : kAllIsas) {
    if (!IsaSupported(isa, HostCpuFeatures())) continue;
    const KernelTable& kt = KernelTableFor(isa);
    for (int64_t n : {1, 7, 17, 64, 100}) {
      SCOPED_TRACE(::testing::Message() << IsaName(isa) << " n=" << n);
      const std::vector<float> a = testing::RandomFloats(rng, n), b = testing::RandomFloats(rng, n);
      // Float sums of n terms of size <= 1: orders differ by at most 2·n·ε·n.
      EXPECT_NEAR(kt.dot_f32(a.data(), b.data(), n), ref.dot_f32(a.data(), b.data(), n),
                  2e-7 * static_cast<double>(n * n));
      std::vector<float> y1 = b, y2 = b;
      kt.axpy_f32(0.75f, a.data(), y1.data(), n);
      ref.axpy_f32(0.75f, a.data(), y2.data(), n);
      for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(y1[i], y2[i], 4e-7);  // one FMA rounding apart
      kt.scale_f32(-1.5f, y1.data(), n);
      ref.scale_f32(-1.5f, y2.data(), n);
      for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(y1[i], y2[i], 8e-7);
    }
  }
}

// The two-row kernels equal the one-row kernel bit for bit (same roundings in the same order), so
// pairing rows changes no result; for every M the row kernels take (1..4, and a tail).
TEST(KernelTableTest, TwoRowKernelsEqualTheOneRowKernel) {
  for (Isa isa : kAllIsas) {
    if (!IsaSupported(isa, HostCpuFeatures())) continue;
    const KernelTable& table = KernelTableFor(isa);
    if (table.row_dot2 == nullptr) continue;
    for (DType type : kAllDTypes) {
      const RowDot2Fn pair = table.row_dot2[static_cast<int>(type)];
      if (pair == nullptr) continue;
      std::mt19937 rng(5);
      const int64_t k = 32 * 7, nb = k / kQuantBlock;
      const int64_t row_bytes = *DTypeStorageBytes(type, k);
      const std::vector<uint8_t> w = testing::RandomWeights(rng, type, 2, k);
      for (int64_t m : {1, 2, 3, 4, 7}) {
        const std::vector<float> x = testing::RandomFloats(rng, m * k);
        std::vector<BlockQ8Act> xq(static_cast<size_t>(m * nb));
        for (int64_t i = 0; i < m; ++i) QuantizeRowQ8Act(x.data() + i * k, xq.data() + i * nb, k);
        std::vector<float> paired(static_cast<size_t>(m * 2)), single(static_cast<size_t>(m * 2));
        pair(w.data(), row_bytes, xq.data(), nb, m, k, paired.data(), 2);
        for (int64_t n = 0; n < 2; ++n) {
          table.row_dot[static_cast<int>(type)](w.data() + n * row_bytes, xq.data(), nb, m, k,
                                                single.data() + n, 2);
        }
        EXPECT_EQ(paired, single) << IsaName(isa) << " " << DTypeName(type) << " m=" << m;
      }
    }
  }
}

}  // namespace
}  // namespace tandem::cpu
