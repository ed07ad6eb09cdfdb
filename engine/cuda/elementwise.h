// The row-wise and element-wise CUDA kernels of the forward pass: RMSNorm (optionally fused with
// the residual add before it), RoPE, the paged KV cache's write (optionally rotating K on the
// way), SwiGLU's SiluMul, the embedding gather and additions. Each computes what its CPU
// counterpart does (engine/cpu/rms_norm.h, rope.h, elementwise.h, engine/core/dtype.h's
// DequantizeReference, and the cache write of CpuBackend::Attention), within the tolerance that
// elementwise_check.cu states for it.
//
// Conventions of every entry point:
//  - Pointers are device pointers (float ones at least 4-byte aligned); strides count elements,
//    not bytes. The caller keeps them valid until the stream has run the work.
//  - The call enqueues one kernel on `stream` and returns cudaGetLastError() after the launch;
//    cudaErrorInvalidValue, without launching, for parameters that cannot be run (negative sizes,
//    null pointers with work to do, an unsupported type); cudaSuccess, without launching, when
//    there is nothing to do. Shapes beyond that (ids within the vocabulary, positions within the
//    block tables) are the caller's contract, checked one layer up.
//  - Nothing is allocated and no state is kept: calls are thread-safe; results are deterministic
//    (a row's result does not depend on the other rows or on the batch size).
//  - Wider (16-byte) loads are used where pointers and strides allow; results do not depend on it.
//
// Headers under engine/cuda include nothing of the project but each other (cuda_check.h, and
// weight_type.h for WeightType) and the CPU kernels' plain parameter headers (engine/cpu/rms_norm.h,
// engine/cpu/rope.h: <cstdint> only), so they build on a bare GPU machine (scripts/gpu_check.sh).
#ifndef TANDEM_ENGINE_CUDA_ELEMENTWISE_H_
#define TANDEM_ENGINE_CUDA_ELEMENTWISE_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/cpu/rms_norm.h"
#include "engine/cpu/rope.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/weight_type.h"

namespace tandem::cuda {

// ---------------------------------------------------------------------------------------------
// RMSNorm, as cpu::RmsNorm.

// The CPU kernel's parameters, with device pointers: out may alias x (not residual).
using RmsNormParams = cpu::RmsNormParams;

// Without residual: out = x / sqrt(mean(x²) + eps) * weight.
// With residual:    residual += x; out = residual / sqrt(mean(residual²) + eps) * weight
//                   (the residual stream is updated in place, as in vLLM's fused_add_rms_norm).
// One block per row; the sum of squares is accumulated in float (warp shuffles, then across
// warps), the scale 1 / sqrt(...) computed in double as on the CPU.
cudaError_t RmsNorm(const RmsNormParams& params, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------
// Rotary position embedding, as cpu::Rope.

// The CPU kernel's parameters, with device pointers: x is rotated in place; rotary_dim is at
// most 8192 here; with cos_sin, positions and inv_freq are not read.
using RopeStyle = cpu::RopeStyle;
using RopeParams = cpu::RopeParams;

// Rotates each pair (a, b) of every head to (a cos θ - b sin θ, a sin θ + b cos θ), each product
// and difference rounded as the CPU's scalar code rounds it (no fused multiply-add). θ, cos θ and
// sin θ are computed in double and rounded to float, so large positions keep their precision.
// One block per token.
cudaError_t Rope(const RopeParams& params, cudaStream_t stream);

struct RopeCosSinParams {
  const int32_t* positions = nullptr;  // [num_tokens]
  int64_t num_tokens = 0;
  const float* inv_freq = nullptr;  // [rotary_dim / 2]
  int64_t rotary_dim = 0;           // even
  float* cos_sin = nullptr;         // [num_tokens, rotary_dim / 2, 2]: (cos θ, sin θ)
};

// cos_sin[(t * rotary_dim / 2 + i) * 2 + {0, 1}] = (cos θ, sin θ), θ = positions[t] * inv_freq[i]
// in double, as cpu::RopeCosSin.
cudaError_t RopeCosSin(const RopeCosSinParams& params, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------
// The paged KV cache's write: this step's K and V rows stored into their slots.
//
// The cache (docs/kv_layout.md) is kv[num_blocks][num_layers][2 (K, V)][block_size][num_kv_heads]
// [head_dim]; for one layer l, with k_cache = K of layer l in block 0 and v_cache = V of layer l
// in block 0 (k_cache + kv_stride elements), element d of kv-head g at slot j of physical block b
// is
//   k_cache[b * block_stride + j * token_stride + g * kv_head_stride + d]   (same for v_cache)
// with block_stride = num_layers * 2 * block_size * num_kv_heads * head_dim, token_stride =
// num_kv_heads * head_dim and kv_head_stride = head_dim for that layout (any strides work).

struct KvCacheWriteParams {
  const float* k = nullptr;  // [num_tokens, num_kv_heads, head_dim], token t at k + t * k_stride
  int64_t k_stride = 0;      // heads contiguous within a token (head g at + g * head_dim)
  const float* v = nullptr;  // [num_tokens, num_kv_heads, head_dim], token stride v_stride
  int64_t v_stride = 0;

  void* k_cache = nullptr;  // one layer's K, as above: float (F32) or IEEE half bits (F16)
  void* v_cache = nullptr;  // that layer's V, same strides
  KvCacheType cache_type = KvCacheType::kF16;  // F16 rounds to nearest even
  int64_t block_stride = 0;                  // elements
  int64_t token_stride = 0;                  // elements
  int64_t kv_head_stride = 0;                // elements
  int64_t block_size = 0;                    // tokens per block

  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq] physical block ids
  int64_t max_blocks_per_seq = 0;
  // [num_tokens] row of block_tables; token t goes to slot token_pos[t] % block_size of block
  // block_tables[token_seq[t] * max_blocks_per_seq + token_pos[t] / block_size].
  const int32_t* token_seq = nullptr;
  // [num_tokens] positions; a negative one marks a padding token, which is skipped.
  const int32_t* token_pos = nullptr;

  int64_t num_tokens = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;

  // RoPE on K on the way into the cache (V is never rotated): off when rotary_dim is 0, else as
  // Rope with these fields and token_pos as the positions (cos_sin nullable, as in RopeParams).
  int64_t rotary_dim = 0;
  const float* inv_freq = nullptr;
  const float* cos_sin = nullptr;
  RopeStyle style = RopeStyle::kInterleaved;
  // Nullable [num_tokens, num_kv_heads, head_dim], token stride k_out_stride: also receives K as
  // stored (rotated, before any rounding to half), e.g. to dump Kcur. May be k itself.
  float* k_out = nullptr;
  int64_t k_out_stride = 0;
};

// Stores K and V of every non-padding token, F32 as is or F16 by __float2half_rn (round to
// nearest even: what the CPU's FloatsToHalves gives, bit for bit but for NaN payloads), rotating
// K first when rotary_dim > 0. Other slots are not touched. Two tokens must not share a slot.
// One block per token.
cudaError_t WriteKvCache(const KvCacheWriteParams& params, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------
// SwiGLU's gate, as cpu::SiluMul.

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

// out = gate / (1 + exp(-gate)) * up, with IEEE division and expf (within 2 ulp of exp). A fused
// [rows, 2 * dim] gate|up buffer is passed as gate = buf, up = buf + dim, strides 2 * dim.
cudaError_t SiluMul(const SiluMulParams& params, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------
// Embedding gather.

struct EmbeddingGatherParams {
  // [vocab_size, dim] elements of `type` in ggml storage (weight_type.h), rows back to back: row
  // r starts at byte r * WeightRowBytes(type, dim). At least 4-byte aligned for F32, 2-byte
  // aligned otherwise.
  const void* table = nullptr;
  WeightType type = WeightType::kF32;
  int64_t vocab_size = 0;
  int64_t dim = 0;  // a multiple of WeightBlockElements(type) (32 for the quantized types)
  const int32_t* token_ids = nullptr;  // [num_tokens]
  int64_t num_tokens = 0;
  float* out = nullptr;  // [num_tokens, dim], row stride out_stride
  int64_t out_stride = 0;
};

// out row t = row token_ids[t] of the table, dequantized as DequantizeReference does (bit for
// bit but for NaN payloads). REQUIRES: 0 <= token_ids[t] < vocab_size; an id outside that range (a broken caller)
// yields a row of zeros instead of a read out of bounds. One block per token.
cudaError_t EmbeddingGather(const EmbeddingGatherParams& params, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------
// Additions (exact: one float addition per element, as cpu::Add).

struct AddBiasParams {
  float* y = nullptr;  // [rows, dim], row stride y_stride; in/out
  int64_t y_stride = 0;
  const float* bias = nullptr;  // [dim]
  int64_t rows = 0;
  int64_t dim = 0;
};

// y[r, i] += bias[i] (the Q/K/V projections' biases).
cudaError_t AddBias(const AddBiasParams& params, cudaStream_t stream);

struct AddParams {
  const float* a = nullptr;  // [rows, dim], row stride a_stride
  const float* b = nullptr;  // [rows, dim], row stride b_stride
  float* out = nullptr;      // [rows, dim], row stride out_stride; may alias a or b
  int64_t a_stride = 0;
  int64_t b_stride = 0;
  int64_t out_stride = 0;
  int64_t rows = 0;
  int64_t dim = 0;
};

// out = a + b (x += y is a = out = x, b = y: the residual add).
cudaError_t Add(const AddParams& params, cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_ENGINE_CUDA_ELEMENTWISE_H_
