#include "engine/cpu/rope.h"

#include <cmath>

namespace tandem::cpu {

namespace {

inline void CosSin(int32_t position, float inv_freq, float scale, float* cs) {
  const double theta = static_cast<double>(position) * static_cast<double>(inv_freq);
  cs[0] = static_cast<float>(std::cos(theta)) * scale;
  cs[1] = static_cast<float>(std::sin(theta)) * scale;
}

}  // namespace

void RopeCosSin(const int32_t* positions, int64_t num_tokens, const float* inv_freq,
                int64_t rotary_dim, float* cos_sin, float scale) {
  const int64_t half = rotary_dim / 2;
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      CosSin(positions[t], inv_freq[i], scale, cos_sin + (t * half + i) * 2);
    }
  }
}

void Rope(const RopeParams& p) {
  const int64_t half = p.rotary_dim / 2;
  // Pair i is (lo + i * lo_step, lo + i * lo_step + partner).
  const int64_t step = p.style == RopeStyle::kInterleaved ? 2 : 1;
  const int64_t partner = p.style == RopeStyle::kInterleaved ? 1 : half;
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      float own[2];
      const float* cs = own;
      if (p.cos_sin != nullptr) {
        cs = p.cos_sin + (t * half + i) * 2;
      } else {
        CosSin(p.positions[t], p.inv_freq[i], p.scale, own);
      }
      const float c = cs[0], s = cs[1];
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
