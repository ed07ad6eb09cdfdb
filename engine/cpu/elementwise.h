// Small row-wise ops of the forward pass: SwiGLU's and GeGLU's gates, softmax, soft-capping,
// addition, and the F16 KV cache's conversion. All shapes are rows of contiguous elements. SiluMul and the conversion run the
// kernel table's loops; the others are portable C++ that the compiler vectorizes.
#ifndef TANDEM_ENGINE_CPU_ELEMENTWISE_H_
#define TANDEM_ENGINE_CPU_ELEMENTWISE_H_

#include <cstdint>

#include "engine/cpu/kernel_context.h"

namespace tandem::cpu {

struct SiluMulParams {
  const float* gate = nullptr;  // [rows, dim], row stride gate_stride
  const float* up = nullptr;    // [rows, dim], row stride up_stride
  float* out = nullptr;         // [rows, dim], row stride out_stride; may alias gate or up
  int64_t gate_stride = 0;
  int64_t up_stride = 0;
  int64_t out_stride = 0;
  int64_t rows = 0;
  int64_t dim = 0;
};
// out = gate * sigmoid(gate) * up (SwiGLU). A fused [rows, 2 * dim] gate|up buffer is passed as
// gate = buf, up = buf + dim, both strides 2 * dim. On the calling thread (context.pool is not
// used), with context.isa's kernel: within a few ulp of the scalar one.
void SiluMul(const SiluMulParams& params, const KernelContext& context = {});

// out = gelu(gate) * up (GeGLU, Gemma's FFN) with GELU's tanh approximation,
// gelu(x) = x / 2 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3))); the same shapes as SiluMul.
// Portable C++ on the calling thread.
void GeluTanhMul(const SiluMulParams& params);

// In place: x[i] = cap * tanh(x[i] / cap) for i < n (Gemma 2's soft-capping). REQUIRES: cap > 0.
void SoftCap(float* x, int64_t n, float cap);

// In place, per row: x = exp(x - max) / Σ exp(x - max). x: [rows, cols], row stride `stride`.
// A row of all -inf becomes all zeros.
void Softmax(float* x, int64_t rows, int64_t cols, int64_t stride);

// float -> IEEE half for n elements (the F16 KV cache's writes), with context.isa's kernel (F16C
// where the CPU has it); equal to engine/core's FloatToHalf bit for bit (round to nearest even).
void FloatsToHalves(const float* src, uint16_t* dst, int64_t n, const KernelContext& context = {});

// out[i] = a[i] + b[i] for i < n; out may alias a or b.
void Add(const float* a, const float* b, float* out, int64_t n);

}  // namespace tandem::cpu

#endif  // TANDEM_ENGINE_CPU_ELEMENTWISE_H_
