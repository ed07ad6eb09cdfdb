#include "engine/cpu/rope.h"

#include <cmath>

namespace tandem::cpu {

void Rope(const RopeParams& p) {
  const int64_t half = p.rotary_dim / 2;
  // Pair i is (lo + i * lo_step, lo + i * lo_step + partner).
  const int64_t step = p.style == RopeStyle::kInterleaved ? 2 : 1;
  const int64_t partner = p.style == RopeStyle::kInterleaved ? 1 : half;
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const double pos = static_cast<double>(p.positions[t]);
    for (int64_t i = 0; i < half; ++i) {
      const double theta = pos * static_cast<double>(p.inv_freq[i]);
      const float c = static_cast<float>(std::cos(theta));
      const float s = static_cast<float>(std::sin(theta));
      for (int64_t h = 0; h < p.num_heads; ++h) {
        float* head = p.x + t * p.token_stride + h * p.head_stride;
        const float a = head[i * step];
        const float b = head[i * step + partner];
        head[i * step] = a * c - b * s;
        head[i * step + partner] = a * s + b * c;
      }
    }
  }
}

void RopeInvFreq(double theta, int64_t rotary_dim, float* inv_freq) {
  for (int64_t i = 0; i < rotary_dim / 2; ++i) {
    inv_freq[i] = static_cast<float>(
        std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(rotary_dim)));
  }
}

}  // namespace tandem::cpu
