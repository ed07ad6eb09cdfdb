#include "engine/cpu/matmul.h"

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "engine/cpu/kernel_test_util.h"
#include "gtest/gtest.h"

namespace tandem::cpu {
namespace {

using testing::RandomFloats;
using testing::RandomWeights;

struct Shape {
  int64_t m, n, k;
};

// Every combination of the odd sizes the brief asks for, K in whole quant blocks; float types also
// get K values that leave a SIMD tail.
// A K that is whole blocks of every type the tests pair with `type`: 32, or 256 for the K-quants.
int64_t KUnit(DType type) { return std::max<int64_t>(kQuantBlock, DTypeBlockElements(type)); }

std::vector<Shape> Shapes(DType type) {
  std::vector<int64_t> ks = {32 * 3, 32 * 7, 576};
  if (KUnit(type) == kSuperBlock) ks = {256, 256 * 3, 1536};
  if (!IsQuantized(type)) ks.insert(ks.end(), {1, 37, 83});
  std::vector<Shape> shapes;
  for (int64_t m : {1, 2, 7, 33}) {
    for (int64_t n : {1, 3, 17, 65}) {
      for (int64_t k : ks) shapes.push_back({m, n, k});
    }
  }
  return shapes;
}

// Per weight element, the largest magnitude any single term of the kernels' sums can have
// (d·code and the offset or min, for the types that split them), so float-rounding bounds cover
// every partial sum.
std::vector<double> TermBound(DType type, const uint8_t* w, const std::vector<float>& deq,
                              int64_t count) {
  std::vector<double> a(static_cast<size_t>(count));
  const int64_t block = DTypeBlockElements(type);
  for (int64_t i = 0; i < count; ++i) {
    double bound = std::fabs(deq[i]);
    const int64_t b = i / block;
    if (type == DType::kQ4_0) {
      bound = 16.0 * std::fabs(HalfToFloat(reinterpret_cast<const BlockQ4_0*>(w)[b].d));
    } else if (type == DType::kQ5_0) {
      bound = 32.0 * std::fabs(HalfToFloat(reinterpret_cast<const BlockQ5_0*>(w)[b].d));
    } else if (type == DType::kQ4_1) {
      const BlockQ4_1& blk = reinterpret_cast<const BlockQ4_1*>(w)[b];
      bound = 15.0 * std::fabs(HalfToFloat(blk.d)) + std::fabs(HalfToFloat(blk.m));
    } else if (type == DType::kQ5_1) {
      const BlockQ5_1& blk = reinterpret_cast<const BlockQ5_1*>(w)[b];
      bound = 31.0 * std::fabs(HalfToFloat(blk.d)) + std::fabs(HalfToFloat(blk.m));
    } else if (type == DType::kQ4_K || type == DType::kQ5_K) {
      const uint8_t* blk = w + b * DTypeBlockBytes(type);
      uint16_t d, dmin;
      std::memcpy(&d, blk, 2);
      std::memcpy(&dmin, blk + 2, 2);
      int sc, m;
      KQuantScaleMin(blk + 4, static_cast<int>(i % kSuperBlock / kQuantBlock), &sc, &m);
      const double max_code = type == DType::kQ5_K ? 31.0 : 15.0;
      bound = max_code * std::fabs(HalfToFloat(d)) * sc + std::fabs(HalfToFloat(dmin)) * m;
    } else if (type == DType::kQ6_K) {
      const BlockQ6_K& blk = reinterpret_cast<const BlockQ6_K*>(w)[b];
      bound = 32.0 * std::fabs(HalfToFloat(blk.d) * blk.scales[i % kSuperBlock / 16]);
    }
    a[i] = bound;
  }
  return a;
}

class MatMulTest : public ::testing::TestWithParam<std::tuple<DType, Isa>> {};

// For every shape: (1) the scalar kernel against a double-precision dot over DequantizeReference'd
// weights, within the activation-quantization bound; (2) the ISA under test against the scalar
// kernel, within float-rounding error.
TEST_P(MatMulTest, MatchesReferenceOnOddSizes) {
  const auto [type, isa] = GetParam();
  if (!IsaSupported(isa, HostCpuFeatures())) GTEST_SKIP() << IsaName(isa) << " not on this CPU";
  std::mt19937 rng(1234);
  for (const Shape& s : Shapes(type)) {
    SCOPED_TRACE(::testing::Message() << "M=" << s.m << " N=" << s.n << " K=" << s.k);
    const std::vector<uint8_t> w = RandomWeights(rng, type, s.n, s.k);
    std::vector<float> deq(static_cast<size_t>(s.n * s.k));
    DequantizeReference(type, w.data(), deq.data(), s.n * s.k);
    const std::vector<double> term = TermBound(type, w.data(), deq, s.n * s.k);
    const int64_t x_stride = s.k + 3;  // padded rows: strides are honoured
    const std::vector<float> x = RandomFloats(rng, s.m * x_stride, -2.0f, 2.0f);
    const int64_t y_stride = s.n + 1;
    std::vector<float> y_scalar(static_cast<size_t>(s.m * y_stride), -1.0f);
    std::vector<float> y_isa(static_cast<size_t>(s.m * y_stride), -1.0f);
    MatMulParams p{.x = x.data(),
                   .x_stride = x_stride,
                   .w = w.data(),
                   .w_type = type,
                   .y = y_scalar.data(),
                   .y_stride = y_stride,
                   .m = s.m,
                   .n = s.n,
                   .k = s.k};
    ASSERT_TRUE(MatMul(p, {.isa = Isa::kScalar}).ok());
    p.y = y_isa.data();
    ASSERT_TRUE(MatMul(p, {.isa = isa}).ok());

    // Float rounding: a sum of K terms carries at most ~K·ε of Σ|terms| per evaluation order;
    // two orders (scalar, SIMD) differ by at most twice that. Padded by 64 for the per-block
    // scale products.
    const double rounding = (2.0 * static_cast<double>(s.k) + 64.0) * FLT_EPSILON;
    for (int64_t i = 0; i < s.m; ++i) {
      const float* xi = x.data() + i * x_stride;
      for (int64_t n = 0; n < s.n; ++n) {
        double exact = 0.0, terms = 0.0, quant_bound = 0.0;
        for (int64_t k = 0; k < s.k; ++k) {
          exact += static_cast<double>(deq[n * s.k + k]) * xi[k];
          terms += term[n * s.k + k] * std::fabs(xi[k]);
        }
        if (IsQuantized(type)) {
          // x is rounded to d·q with d = max|x_block| / 127: |error| <= d / 2 per element.
          for (int64_t b = 0; b < s.k / kQuantBlock; ++b) {  // activation blocks
            double amax = 0.0, wsum = 0.0;
            for (int64_t k = b * kQuantBlock; k < (b + 1) * kQuantBlock; ++k) {
              amax = std::max(amax, static_cast<double>(std::fabs(xi[k])));
              wsum += std::fabs(deq[n * s.k + k]);
            }
            quant_bound += amax / 127.0 * 0.5001 * wsum;
          }
        }
        const float scalar = y_scalar[i * y_stride + n];
        const float got = y_isa[i * y_stride + n];
        ASSERT_NEAR(scalar, exact, quant_bound + rounding * terms + 1e-30)
            << "scalar vs double reference at m=" << i << " n=" << n;
        ASSERT_NEAR(got, scalar, rounding * terms + 1e-30)
            << IsaName(isa) << " vs scalar at m=" << i << " n=" << n;
      }
      // Padding columns are left alone.
      ASSERT_EQ(y_isa[i * y_stride + s.n], -1.0f);
    }
  }
}

// Threads split N; each output is computed by the same code, so the result is bit-identical.
TEST_P(MatMulTest, ThreadedEqualsSingleThreaded) {
  const auto [type, isa] = GetParam();
  if (!IsaSupported(isa, HostCpuFeatures())) GTEST_SKIP() << IsaName(isa) << " not on this CPU";
  std::mt19937 rng(99);
  ThreadPool pool({.num_threads = 3});
  const int64_t m = 33, n = 161, k = KUnit(type) * 7;
  const std::vector<uint8_t> w = RandomWeights(rng, type, n, k);
  const std::vector<float> x = RandomFloats(rng, m * k);
  std::vector<float> y1(static_cast<size_t>(m * n)), y2(static_cast<size_t>(m * n));
  MatMulParams p{.x = x.data(),
                 .x_stride = k,
                 .w = w.data(),
                 .w_type = type,
                 .y = y1.data(),
                 .y_stride = n,
                 .m = m,
                 .n = n,
                 .k = k};
  ASSERT_TRUE(MatMul(p, {.isa = isa}).ok());
  p.y = y2.data();
  ASSERT_TRUE(MatMul(p, {.pool = &pool, .isa = isa}).ok());
  EXPECT_EQ(y1, y2);
}

// Batch invariance: a row's result does not depend on how many other rows share the call or
// where it sits among them, bit for bit. Batching requests together must not change their output.
TEST_P(MatMulTest, RowsDoNotDependOnTheBatch) {
  const auto [type, isa] = GetParam();
  if (!IsaSupported(isa, HostCpuFeatures())) GTEST_SKIP() << IsaName(isa) << " not on this CPU";
  std::mt19937 rng(7);
  const int64_t m = 11, n = 37, k = KUnit(type) * 5;
  const std::vector<uint8_t> w = RandomWeights(rng, type, n, k);
  const std::vector<float> x = RandomFloats(rng, m * k);
  std::vector<float> batched(static_cast<size_t>(m * n));
  MatMulParams p{.x = x.data(), .x_stride = k, .w = w.data(), .w_type = type,
                 .y = batched.data(), .y_stride = n, .m = m, .n = n, .k = k};
  ASSERT_TRUE(MatMul(p, {.isa = isa}).ok());
  testing::ExpectRowsEqualAlone(p, {.isa = isa}, batched);
}

// MatMulShared (Q/K/V in one call, mixed weight types, on the pool) equals one MatMul per
// product, bit for bit.
TEST_P(MatMulTest, SharedEqualsSeparateCalls) {
  const auto [type, isa] = GetParam();
  if (!IsaSupported(isa, HostCpuFeatures())) GTEST_SKIP() << IsaName(isa) << " not on this CPU";
  std::mt19937 rng(11);
  const int64_t m = 7, k = KUnit(type) * 6;
  const int64_t ns[] = {37, 16, 65};
  const DType types[] = {type, DType::kQ8_0, DType::kF32};
  const std::vector<float> x = RandomFloats(rng, m * k);
  ThreadPool pool({.num_threads = 3});
  std::vector<std::vector<uint8_t>> w;
  std::vector<std::vector<float>> shared, separate;
  std::vector<MatMulParams> params;
  for (int j = 0; j < 3; ++j) {
    w.push_back(RandomWeights(rng, types[j], ns[j], k));
    shared.emplace_back(static_cast<size_t>(m * ns[j]));
    separate.emplace_back(static_cast<size_t>(m * ns[j]));
  }
  for (int j = 0; j < 3; ++j) {
    params.push_back({.x = x.data(), .x_stride = k, .w = w[j].data(), .w_type = types[j],
                      .y = shared[j].data(), .y_stride = ns[j], .m = m, .n = ns[j], .k = k});
  }
  ASSERT_TRUE(MatMulShared(params, {.pool = &pool, .isa = isa}).ok());
  for (int j = 0; j < 3; ++j) {
    MatMulParams one = params[j];
    one.y = separate[j].data();
    ASSERT_TRUE(MatMul(one, {.isa = isa}).ok());
    EXPECT_EQ(shared[j], separate[j]) << "product " << j;
  }
  // Prefetch ranges (more of them than tiles, one unaligned, one empty) change nothing.
  const std::vector<float> other = RandomFloats(rng, 4096);
  std::vector<MemoryRange> ranges;
  for (int i = 0; i < 40; ++i) ranges.push_back({other.data() + 100 * i, 400});
  ranges.push_back({reinterpret_cast<const char*>(other.data()) + 3, 61});
  ranges.push_back({other.data(), 0});
  std::vector<std::vector<float>> prefetched = shared;
  for (int j = 0; j < 3; ++j) params[j].y = prefetched[j].data();
  ASSERT_TRUE(MatMulShared(params, {.pool = &pool, .isa = isa}, {.prefetch = ranges}).ok());
  ASSERT_TRUE(
      MatMulShared(params, {.isa = isa}, {.prefetch = absl::MakeConstSpan(ranges).first(1)}).ok());
  EXPECT_EQ(prefetched, shared);
  params[1].m = m - 1;
  EXPECT_EQ(MatMulShared(params, {.isa = isa}).code(), absl::StatusCode::kInvalidArgument);
}

// prepare_rows writes x inside MatMulShared, each row once, before any product reads it: the
// result equals products of the x it wrote.
TEST_P(MatMulTest, PrepareRowsWritesXBeforeItIsRead) {
  const auto [type, isa] = GetParam();
  if (!IsaSupported(isa, HostCpuFeatures())) GTEST_SKIP() << IsaName(isa) << " not on this CPU";
  std::mt19937 rng(12);
  const int64_t m = 9, k = KUnit(type) * 5, n = 40;
  const std::vector<float> source = RandomFloats(rng, m * k);
  const std::vector<uint8_t> w = RandomWeights(rng, type, n, k);
  ThreadPool pool({.num_threads = 3});
  for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
    std::vector<float> x(static_cast<size_t>(m * k), std::nanf("")), y(static_cast<size_t>(m * n));
    std::vector<std::atomic<int>> calls(static_cast<size_t>(m));
    auto prepare = [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        calls[static_cast<size_t>(i)].fetch_add(1);
        for (int64_t j = 0; j < k; ++j) x[i * k + j] = 2.0f * source[i * k + j];
      }
    };
    const MatMulParams params{.x = x.data(), .x_stride = k, .w = w.data(), .w_type = type,
                              .y = y.data(), .y_stride = n, .m = m, .n = n, .k = k};
    ASSERT_TRUE(MatMulShared({params}, {.pool = p, .isa = isa}, {.prepare_rows = prepare}).ok());
    for (const std::atomic<int>& c : calls) EXPECT_EQ(c.load(), 1);
    std::vector<float> expected(y.size());
    MatMulParams plain = params;
    plain.y = expected.data();
    ASSERT_TRUE(MatMul(plain, {.isa = isa}).ok());  // x as prepare left it
    EXPECT_EQ(y, expected);
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypesAllIsas, MatMulTest,
                         ::testing::Combine(::testing::ValuesIn(kAllDTypes),
                                            ::testing::ValuesIn(kAllIsas)),
                         [](const auto& info) {
                           return testing::IsaDTypeName(std::get<1>(info.param),
                                                        std::get<0>(info.param));
                         });

TEST(MatMulValidationTest, RejectsBadShapes) {
  std::vector<float> x(64), y(4);
  std::vector<uint8_t> w(1024);
  MatMulParams p{.x = x.data(),
                 .x_stride = 40,
                 .w = w.data(),
                 .w_type = DType::kQ4_1,
                 .y = y.data(),
                 .y_stride = 1,
                 .m = 1,
                 .n = 1,
                 .k = 40};
  EXPECT_EQ(MatMul(p).code(), absl::StatusCode::kInvalidArgument);  // K not whole blocks
  p.k = 32;
  p.w_row_bytes = 10;  // below one row's 20 bytes
  EXPECT_EQ(MatMul(p).code(), absl::StatusCode::kInvalidArgument);
  p.w_row_bytes = 0;
  p.m = -1;
  EXPECT_EQ(MatMul(p).code(), absl::StatusCode::kInvalidArgument);
  p.m = 2;
  p.x_stride = 16;  // rows overlap
  EXPECT_EQ(MatMul(p).code(), absl::StatusCode::kInvalidArgument);
  p.m = 1;
  p.w = nullptr;
  EXPECT_EQ(MatMul(p).code(), absl::StatusCode::kInvalidArgument);
}

// Rows further apart than their packed size (a weight slice of a wider tensor).
TEST(MatMulTest2, HonoursWeightRowStride) {
  std::mt19937 rng(7);
  const int64_t n = 5, k = 64, packed = *DTypeStorageBytes(DType::kQ8_0, k);
  const std::vector<uint8_t> wide = RandomWeights(rng, DType::kQ8_0, n, 2 * k);
  std::vector<uint8_t> dense(static_cast<size_t>(n * packed));
  for (int64_t r = 0; r < n; ++r) {
    std::memcpy(dense.data() + r * packed, wide.data() + r * 2 * packed, packed);
  }
  const std::vector<float> x = RandomFloats(rng, k);
  std::vector<float> y1(n), y2(n);
  MatMulParams p{.x = x.data(),
                 .w = dense.data(),
                 .w_type = DType::kQ8_0,
                 .y = y1.data(),
                 .m = 1,
                 .n = n,
                 .k = k};
  ASSERT_TRUE(MatMul(p).ok());
  p.w = wide.data();
  p.w_row_bytes = 2 * packed;
  p.y = y2.data();
  ASSERT_TRUE(MatMul(p).ok());
  EXPECT_EQ(y1, y2);
}

}  // namespace
}  // namespace tandem::cpu
