#include "engine/cpu/rms_norm.h"

#include <cmath>

namespace tandem::cpu {

void RmsNorm(const RmsNormParams& p) {
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* x = p.x + r * p.x_stride;
    float* out = p.out + r * p.out_stride;
    const float* src = x;
    if (p.residual != nullptr) {
      float* res = p.residual + r * p.residual_stride;
      for (int64_t i = 0; i < p.dim; ++i) res[i] += x[i];
      src = res;
    }
    double sum_sq = 0.0;
    for (int64_t i = 0; i < p.dim; ++i) sum_sq += static_cast<double>(src[i]) * src[i];
    const float inv = static_cast<float>(
        1.0 / std::sqrt(sum_sq / static_cast<double>(p.dim) + static_cast<double>(p.eps)));
    for (int64_t i = 0; i < p.dim; ++i) out[i] = src[i] * inv * p.weight[i];
  }
}

}  // namespace tandem::cpu
