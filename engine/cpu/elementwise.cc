#include "engine/cpu/elementwise.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tandem::cpu {

void SiluMul(const SiluMulParams& p) {
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* g = p.gate + r * p.gate_stride;
    const float* u = p.up + r * p.up_stride;
    float* o = p.out + r * p.out_stride;
    for (int64_t i = 0; i < p.dim; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
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
