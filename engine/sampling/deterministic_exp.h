// exp(x) in single precision computed with + - * only, in a fixed order, so that it gives the same
// bits on every IEEE-754 machine (std::exp differs by an ulp between libm versions, which would
// make seeded sampling machine-dependent). Branch-free, so loops over it vectorize (4 lanes with
// SSE2). The file that uses it must be compiled with -ffp-contract=off
// (engine/sampling/CMakeLists.txt does so).
//
// Accuracy: relative error below 5e-7 for x in [-87, 88] (float logits carry ~6e-8 anyway);
// returns exactly 0 below -87 (where the true value is near the subnormal range) and +inf above 88.
#ifndef TANDEM_ENGINE_SAMPLING_DETERMINISTIC_EXP_H_
#define TANDEM_ENGINE_SAMPLING_DETERMINISTIC_EXP_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

namespace tandem::sampling {

inline float DeterministicExp(float x) {
  constexpr float kLog2E = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693145751953125f;  // ln2 split so that k * kLn2Hi is exact
  constexpr float kLn2Lo = 1.428606765330187e-06f;
  constexpr float kRound = 0x1.8p23f;  // adding it rounds to an integer kept in the low bits
  const float xc = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  // x = k * ln2 + r with |r| <= ln2 / 2 (Cody-Waite); k in [-126, 127].
  const float t = xc * kLog2E + kRound;
  const float k = t - kRound;
  const float r = (xc - k * kLn2Hi) - k * kLn2Lo;
  // e^r by its Taylor series to degree 7 (truncation error < 1e-8 relative for |r| <= 0.35).
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // 2^k from the low bits of t: they hold 2^22 + k, and the exponent field needs k + 127.
  uint32_t t_bits;
  std::memcpy(&t_bits, &t, sizeof(t_bits));
  const uint32_t scale_bits = (t_bits + 127u) << 23;
  float scale;
  std::memcpy(&scale, &scale_bits, sizeof(scale));
  const float y = p * scale;
  return x < -87.0f ? 0.0f : (x > 88.0f ? std::numeric_limits<float>::infinity() : y);
}

// Sum of v[0, 8), pairwise in double.
inline double BlockSum8(const float* v) {
  return ((static_cast<double>(v[0]) + v[1]) + (static_cast<double>(v[2]) + v[3])) +
         ((static_cast<double>(v[4]) + v[5]) + (static_cast<double>(v[6]) + v[7]));
}

// Sum of values[0, n) in a fixed order: consecutive blocks of 8, each summed pairwise in double,
// the block sums added left to right. The same bits everywhere, and faster than one long chain.
inline double FixedOrderSum(const float* values, size_t n) {
  double total = 0.0;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) total += BlockSum8(values + i);
  for (; i < n; ++i) total += values[i];
  return total;
}

}  // namespace tandem::sampling

#endif  // TANDEM_ENGINE_SAMPLING_DETERMINISTIC_EXP_H_
