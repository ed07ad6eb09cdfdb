// Rotary position embedding, applied in place to query or key heads.
#ifndef TANDEM_ENGINE_CPU_ROPE_H_
#define TANDEM_ENGINE_CPU_ROPE_H_

#include <cstdint>

namespace tandem::cpu {

enum class RopeStyle {
  // Pairs (2i, 2i + 1): GPT-J style, what llama.cpp calls "normal" and what Llama weights in GGUF
  // expect (the converter permutes Q/K rows for it).
  kInterleaved,
  // Pairs (i, i + rotary_dim / 2): GPT-NeoX "rotate half", what Hugging Face Llama weights expect.
  kNeox,
};

struct RopeParams {
  // [num_tokens, num_heads, head_dim]: head h of token t at x + t * token_stride + h * head_stride.
  float* x = nullptr;
  int64_t token_stride = 0;  // floats
  int64_t head_stride = 0;   // floats
  int64_t num_tokens = 0;
  int64_t num_heads = 0;
  int64_t head_dim = 0;
  int64_t rotary_dim = 0;  // leading elements of each head that rotate; even, <= head_dim
  const int32_t* positions = nullptr;  // [num_tokens]
  const float* inv_freq = nullptr;  // [rotary_dim / 2]: pair i turns by positions[t] * inv_freq[i]
  RopeStyle style = RopeStyle::kInterleaved;
  // Optional [num_tokens][rotary_dim / 2][2]: (cos θ, sin θ) of each token's pairs, as RopeCosSin
  // computes them for the same positions and frequencies. A forward pass computes them once for
  // its Q and K of every layer; without them Rope computes its own (the same values).
  const float* cos_sin = nullptr;
  // Multiplies cos θ and sin θ (LongRoPE's attention factor): a rotation that also scales by it.
  // Used only when Rope computes its own angles; RopeCosSin takes the same scale.
  float scale = 1.0f;
};

// Rotates each pair (a, b) of every head to (a cos θ - b sin θ, a sin θ + b cos θ). Angles are
// computed in double, so large positions keep their precision.
void Rope(const RopeParams& params);

// (cos θ, sin θ) * scale for θ = positions[t] * inv_freq[i], into
// cos_sin[(t * rotary_dim / 2 + i) * 2].
void RopeCosSin(const int32_t* positions, int64_t num_tokens, const float* inv_freq,
                int64_t rotary_dim, float* cos_sin, float scale = 1.0f);

// The standard frequencies: inv_freq[i] = theta^(-2i / rotary_dim) for i < rotary_dim / 2.
// Scaled variants (Llama 3's, NTK, LongRoPE's per-pair divisors) are computed by the caller into
// the same array.
void RopeInvFreq(double theta, int64_t rotary_dim, float* inv_freq);

}  // namespace tandem::cpu

#endif  // TANDEM_ENGINE_CPU_ROPE_H_
