#include "engine/cpu/elementwise.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/cpu/kernel_table.h"

namespace tandem::cpu {

void SiluMul(const SiluMulParams& p, const KernelContext& context) {
  const SiluMulFn silu_mul = KernelTableFor(context.isa.value_or(ActiveIsa())).silu_mul;
  for (int64_t r = 0; r < p.rows; ++r) {
    silu_mul(p.gate + r * p.gate_stride, p.up + r * p.up_stride, p.out + r * p.out_stride, p.dim);
  }
}

void GeluTanhMul(const SiluMulParams& p) {
  // sqrt(2 / pi)
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  constexpr float kCubic = 0.044715f;
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* gate = p.gate + r * p.gate_stride;
    const float* up = p.up + r * p.up_stride;
    float* out = p.out + r * p.out_stride;
    for (int64_t i = 0; i < p.dim; ++i) {
      const float x = gate[i];
      const float gelu = 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * (1.0f + kCubic * x * x)));
      out[i] = gelu * up[i];
    }
  }
}

void SoftCap(float* x, int64_t n, float cap) {
  const float inv = 1.0f / cap;
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] * inv);
}

void FloatsToHalves(const float* src, uint16_t* dst, int64_t n, const KernelContext& context) {
  KernelTableFor(context.isa.value_or(ActiveIsa())).f32_to_f16(src, dst, n);
}

void Softmax(float* x, int64_t rows, int64_t cols, int64_t stride) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * stride;
    float max = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < cols; ++i) max = std::max(max, row[i]);
    if (max == -std::numeric_limits<float>::infinity()) {
      std::fill_n(row, cols, 0.0f);
      continue;
    }
    double sum = 0.0;
    for (int64_t i = 0; i < cols; ++i) {
      row[i] = std::exp(row[i] - max);
      sum += row[i];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t i = 0; i < cols; ++i) row[i] *= inv;
  }
}

void Add(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

}  // namespace tandem::cpu
