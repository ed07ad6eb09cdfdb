#include "engine/cpu/elementwise.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "engine/cpu/kernel_test_util.h"
#include "gtest/gtest.h"

namespace tandem::cpu {
namespace {

TEST(SiluMulTest, MatchesDoubleOnFusedGateUpBuffer) {
  std::mt19937 rng(3);
  const int64_t rows = 3, dim = 37;
  const std::vector<float> gu = testing::RandomFloats(rng, rows * 2 * dim, -8.0f, 8.0f);
  std::vector<float> out(rows * dim);
  SiluMul({.gate = gu.data(),
           .up = gu.data() + dim,
           .out = out.data(),
           .gate_stride = 2 * dim,
           .up_stride = 2 * dim,
           .out_stride = dim,
           .rows = rows,
           .dim = dim});
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < dim; ++i) {
      const double g = gu[r * 2 * dim + i], u = gu[r * 2 * dim + dim + i];
      const double want = g / (1.0 + std::exp(-g)) * u;
      EXPECT_NEAR(out[r * dim + i], want, 1e-6 * (1.0 + std::fabs(want)));
    }
  }
}

// Every ISA's loop (a vector exp on AVX2 / AVX-512), with SIMD tails and gates far into both
// saturated ends of the sigmoid.
TEST(SiluMulTest, EveryIsaMatchesDouble) {
  std::mt19937 rng(5);
  for (Isa isa : kAllIsas) {
    if (!IsaSupported(isa, HostCpuFeatures())) continue;
    for (int64_t dim : {1, 7, 8, 29, 576}) {
      SCOPED_TRACE(::testing::Message() << IsaName(isa) << " dim=" << dim);
      std::vector<float> g = testing::RandomFloats(rng, dim, -12.0f, 12.0f);
      const std::vector<float> u = testing::RandomFloats(rng, dim, -3.0f, 3.0f);
      const float extremes[] = {-100.0f, 100.0f, -87.0f, 40.0f, 0.0f, -0.0f, 1e-20f};
      for (int64_t i = 0; i < dim && i < 7; ++i) g[i * (dim / 7 + 1) % dim] = extremes[i];
      std::vector<float> out(dim);
      SiluMul({.gate = g.data(), .up = u.data(), .out = out.data(), .gate_stride = dim,
               .up_stride = dim, .out_stride = dim, .rows = 1, .dim = dim},
              KernelContext{.pool = nullptr, .isa = isa});
      for (int64_t i = 0; i < dim; ++i) {
        const double gd = g[i], want = gd / (1.0 + std::exp(-gd)) * u[i];
        EXPECT_NEAR(out[i], want, 1e-6 * std::fabs(want) + 1e-30) << "g=" << g[i];
      }
    }
  }
}

// GeGLU against the tanh-approximated GELU written out in double, on gates far into both tails.
TEST(GeluTanhMulTest, MatchesDouble) {
  std::mt19937 rng(7);
  const int64_t rows = 3, dim = 45;
  const std::vector<float> gate = testing::RandomFloats(rng, rows * dim, -12.0f, 12.0f);
  const std::vector<float> up = testing::RandomFloats(rng, rows * dim, -3.0f, 3.0f);
  std::vector<float> out(rows * dim);
  GeluTanhMul({.gate = gate.data(), .up = up.data(), .out = out.data(), .gate_stride = dim,
               .up_stride = dim, .out_stride = dim, .rows = rows, .dim = dim});
  const double pi = std::acos(-1.0);
  for (int64_t i = 0; i < rows * dim; ++i) {
    const double x = gate[i];
    const double gelu = 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / pi) * (x + 0.044715 * x * x * x)));
    const double want = gelu * up[i];
    EXPECT_NEAR(out[i], want, 1e-5 * (1.0 + std::fabs(want))) << "x " << x;
  }
}

TEST(SoftCapTest, MatchesDoubleAndStaysWithinTheCap) {
  std::mt19937 rng(9);
  std::vector<float> x = testing::RandomFloats(rng, 101, -200.0f, 200.0f);
  const std::vector<float> in = x;
  SoftCap(x.data(), static_cast<int64_t>(x.size()), 30.0f);
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = 30.0 * std::tanh(static_cast<double>(in[i]) / 30.0);
    EXPECT_NEAR(x[i], want, 1e-5 * 30.0) << in[i];
    EXPECT_LE(std::fabs(x[i]), 30.0f);
  }
}

TEST(SoftmaxTest, MatchesDoubleAndHandlesMaskedRows) {
  std::mt19937 rng(4);
  const int64_t rows = 3, cols = 33, stride = 40;
  std::vector<float> x = testing::RandomFloats(rng, rows * stride, -20.0f, 20.0f);
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < cols; ++i) x[2 * stride + i] = ninf;  // a fully masked row
  x[1 * stride + 5] = ninf;                                     // one masked entry
  const std::vector<float> before = x;
  Softmax(x.data(), rows, cols, stride);
  for (int64_t r = 0; r < 2; ++r) {
    double max = -1e300, sum = 0.0;
    for (int64_t i = 0; i < cols; ++i)
      max = std::max(max, static_cast<double>(before[r * stride + i]));
    for (int64_t i = 0; i < cols; ++i) sum += std::exp(before[r * stride + i] - max);
    for (int64_t i = 0; i < cols; ++i) {
      EXPECT_NEAR(x[r * stride + i], std::exp(before[r * stride + i] - max) / sum, 1e-6);
    }
    EXPECT_EQ(x[r * stride + cols], before[r * stride + cols]);  // padding untouched
  }
  EXPECT_EQ(x[1 * stride + 5], 0.0f);
  for (int64_t i = 0; i < cols; ++i) EXPECT_EQ(x[2 * stride + i], 0.0f);
}

TEST(AddTest, AddsInPlace) {
  std::vector<float> a = {1, 2, 3}, b = {0.5f, -2, 10};
  Add(a.data(), b.data(), a.data(), 3);
  EXPECT_EQ(a, (std::vector<float>{1.5f, 0, 13}));
}

}  // namespace
}  // namespace tandem::cpu
