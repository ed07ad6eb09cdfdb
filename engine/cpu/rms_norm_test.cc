#include "engine/cpu/rms_norm.h"

#include <cmath>
#include <random>
#include <vector>

#include "engine/cpu/kernel_test_util.h"
#include "gtest/gtest.h"

namespace tandem::cpu {
namespace {

TEST(RmsNormTest, MatchesDoubleReferenceWithAndWithoutResidual) {
  std::mt19937 rng(11);
  for (bool fused : {false, true}) {
    for (int64_t dim : {1, 17, 576}) {
      const int64_t rows = 3, stride = dim + 4;
      const std::vector<float> x = testing::RandomFloats(rng, rows * stride, -3.0f, 3.0f);
      const std::vector<float> w = testing::RandomFloats(rng, dim);
      std::vector<float> residual = testing::RandomFloats(rng, rows * stride);
      const std::vector<float> residual_before = residual;
      std::vector<float> out(rows * dim);
      RmsNorm({.x = x.data(),
               .x_stride = stride,
               .residual = fused ? residual.data() : nullptr,
               .residual_stride = stride,
               .weight = w.data(),
               .out = out.data(),
               .out_stride = dim,
               .rows = rows,
               .dim = dim,
               .eps = 1e-6f});
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<double> v(dim);
        double ss = 0.0;
        for (int64_t i = 0; i < dim; ++i) {
          v[i] = x[r * stride + i] + (fused ? residual_before[r * stride + i] : 0.0);
          ss += v[i] * v[i];
          if (fused) {
            EXPECT_FLOAT_EQ(residual[r * stride + i], static_cast<float>(v[i]));
          }
        }
        const double inv = 1.0 / std::sqrt(ss / dim + 1e-6);
        for (int64_t i = 0; i < dim; ++i) {
          // Three float roundings of values of size |v·inv·w| (<= ~sqrt(dim) * 3).
          EXPECT_NEAR(out[r * dim + i], v[i] * inv * w[i],
                      1e-6 * (1.0 + std::fabs(v[i] * inv * w[i])));
        }
      }
    }
  }
}

}  // namespace
}  // namespace tandem::cpu
