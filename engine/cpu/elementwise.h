// Small row-wise ops of the forward pass: SwiGLU's gate, softmax, addition, and the F16 KV cache's
// conversion. All shapes are rows of contiguous elements. SiluMul and the conversion run the
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
