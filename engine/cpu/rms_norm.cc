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
    // Eight independent double sums (then added in a fixed order): the same result for a row
    // whatever the batch, without one long dependent chain of additions.
    double part[8] = {};
    int64_t i = 0;
    for (; i + 8 <= p.dim; i += 8) {
      for (int j = 0; j < 8; ++j) part[j] += static_cast<double>(src[i + j]) * src[i + j];
    }
    for (; i < p.dim; ++i) part[0] += static_cast<double>(src[i]) * src[i];
    const double sum_sq =
        ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
    const float inv = static_cast<float>(
        1.0 / std::sqrt(sum_sq / static_cast<double>(p.dim) + static_cast<double>(p.eps)));
    for (int64_t d = 0; d < p.dim; ++d) out[d] = src[d] * inv * p.weight[d];
  }
}

}  // namespace tandem::cpu
