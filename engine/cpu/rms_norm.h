// RMSNorm, optionally fused with the residual add that precedes it in a pre-norm block.
#ifndef TANDEM_ENGINE_CPU_RMS_NORM_H_
#define TANDEM_ENGINE_CPU_RMS_NORM_H_

#include <cstdint>

namespace tandem::cpu {

struct RmsNormParams {
  const float* x = nullptr;  // [rows, dim], row r at x + r * x_stride
  int64_t x_stride = 0;
  float* residual = nullptr;  // nullable [rows, dim], row stride residual_stride; in/out, see below
  int64_t residual_stride = 0;
  const float* weight = nullptr;  // [dim]
  float* out = nullptr;           // [rows, dim], row stride out_stride; may alias x
  int64_t out_stride = 0;
  int64_t rows = 0;
  int64_t dim = 0;
  float eps = 1e-5f;
};

// Without residual: out = x / sqrt(mean(x²) + eps) * weight.
// With residual:    residual += x; out = residual / sqrt(mean(residual²) + eps) * weight
//                   (the residual stream is updated in place, as in vLLM's fused_add_rms_norm).
// The sum of squares is accumulated in double.
void RmsNorm(const RmsNormParams& params);

}  // namespace tandem::cpu

#endif  // TANDEM_ENGINE_CPU_RMS_NORM_H_
