// y = x · Wᵀ on the GPU, for float activations and weights of any WeightType: the CUDA
// counterpart of engine/cpu/matmul.h, with the same parameters (device pointers instead of host
// ones) and the same weight layout, as ggml stores a GGUF matrix of shape {k, n}: n rows of k
// elements, one row per output feature, each row k / 32 consecutive blocks for quantized types
// (weight_type.h).
//
// Three paths; MatMul() picks one with SelectMatMulPath():
//  - GEMV (m <= kGemvMaxRows: decode batches). Each CTA owns 4 rows of W; its 4 warps split k and
//    stream their share of those rows through shared memory with 16-byte cp.async loads (3 stages
//    per warp), so W is read once per call whatever its block layout (34-, 18- and 20-byte
//    blocks are not 16-byte aligned; the loads cover whole 16-byte granules and the decode skips
//    the bytes before the row). Quantized blocks are dequantized inside the dot product, x is read
//    as float4 through the read-only cache and each x quad is used for the CTA's 4 rows;
//    accumulation is in float, the k-split partial sums are added in a fixed order, so results
//    are deterministic. MatMulGemv called with more rows runs them 8 at a time (W read once per 8).
//  - cuBLAS (F16 / BF16 weights, m > kGemvMaxRows, a context with a handle and a large enough
//    workspace): x is converted to half / bfloat16 into the workspace, then cublasGemmEx with
//    float accumulation and float output.
//  - Tiled (everything else with m > kGemvMaxRows): 64 x 64 output tiles, 32 k-elements at a time;
//    x and the dequantized W tile go through shared memory as half (bfloat16 for BF16 weights)
//    into WMMA tensor-core products with float accumulation. F32 weights take a plain tiled
//    FMA kernel in float instead (exact inputs).
// Which path is faster where has not been measured: it must be, on the GPU, and written down in
// docs/performance.md before anyone tunes the rule. Open questions: the GEMV / tiled crossover in
// m (the GEMV reads W once per 8 rows of x); tiled vs cuBLAS for F16 / BF16; whether the GEMV
// reaches HBM bandwidth at m = 1 (its stages, rows per CTA and register caps are first guesses),
// and how far below it falls at m = 8, where each lane reads m float4 of x (through L1 / L2) per
// quad of 4 weight rows and does 16 m FMAs, so x traffic and arithmetic may bound it before W
// does; the tiled kernel's speed (no double buffering, 64 x 64 tiles).
//
// Precision. GEMV and the F32 tiled kernel compute in float from exact inputs: the result is the
// product of the exactly dequantized W with x up to float accumulation. The tensor-core paths
// round x to half (or bfloat16 for BF16 weights) and, for quantized weights, the dequantized
// values d * q (+ m) to half, before float accumulation: a relative error up to about 2^-10
// (half) or 2^-8 (bfloat16) of Σ_k |x_k · w_k|. Half inputs overflow past 65504: activations or
// weights that large need F32 weights or the GEMV path. matmul_check.cu states each path's
// tolerance.
//
// Conventions (as engine/cuda/elementwise.h): pointers are device pointers; strides count
// elements (w_row_bytes counts bytes); the caller keeps everything valid until the stream has run
// the work. A call enqueues its kernels on `stream` and returns cudaGetLastError() after the last
// launch; cudaErrorInvalidValue, without launching, for parameters that cannot be run;
// cudaSuccess, without launching, when m or n is 0 (k == 0 writes zeros). Kernels allocate
// nothing and keep no state: calls without cuBLAS are thread-safe; a MatMulContext is used by one
// host thread at a time, and its workspace by one stream at a time.
//
// Requires sm_80 or newer (cp.async, bfloat16 WMMA).
#ifndef TANDEM_ENGINE_CUDA_MATMUL_H_
#define TANDEM_ENGINE_CUDA_MATMUL_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "engine/cuda/cuda_check.h"
#include "engine/cuda/weight_type.h"

namespace tandem::cuda {

struct MatMulParams {
  const float* x = nullptr;  // [m, k], row i at x + i * x_stride
  int64_t x_stride = 0;      // floats between rows of x (>= k)
  // [n, k] in w_type; row j at (const char*)w + j * w_row_bytes. At least 2-byte aligned (4 for
  // F32), as is w_row_bytes. The GEMV copies whole 16-byte granules: it may read up to 15 bytes
  // before w (never past the last row's data), so the granule holding w's first byte must be
  // readable, as it is for any pointer into a cudaMalloc allocation.
  const void* w = nullptr;
  WeightType w_type = WeightType::kF32;
  int64_t w_row_bytes = 0;  // 0: packed rows (WeightRowBytes(w_type, k))
  float* y = nullptr;       // [m, n], row i at y + i * y_stride; must not alias x or w
  int64_t y_stride = 0;     // floats between rows of y (>= n)
  int64_t m = 0;            // activation rows (1 for a single decode step)
  int64_t n = 0;            // output features
  int64_t k = 0;            // input features; a multiple of 32 for quantized w_type
};

// What the cuBLAS path needs, created once per device and host thread and kept across calls.
struct MatMulContext {
  cublasHandle_t cublas = nullptr;  // owned through Create/DestroyMatMulContext; null: no cuBLAS
  // Device memory for x converted to half / bfloat16: MatMulWorkspaceBytes(m, k) bytes for an
  // m x k product (2-byte aligned at least; 256 is best). Owned by the caller. Null or too small:
  // the tiled kernel runs instead of cuBLAS.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// Creates context->cublas (cublasCreate on the current device); the workspace fields are left as
// they are. cudaErrorMemoryAllocation / cudaErrorNotSupported / cudaErrorUnknown on failure.
cudaError_t CreateMatMulContext(MatMulContext* context);
// Destroys context->cublas (if any) and sets it to null; the workspace stays the caller's.
void DestroyMatMulContext(MatMulContext* context);

// Bytes of workspace the cuBLAS path needs for an m x k activation: m * k * 2.
size_t MatMulWorkspaceBytes(int64_t m, int64_t k);

enum class MatMulPath { kGemv, kCublas, kTiled };

// Up to this many activation rows go through the GEMV kernel.
inline constexpr int64_t kGemvMaxRows = 8;

// The dispatch rule of MatMul():
//   m <= kGemvMaxRows                                              -> kGemv
//   F16 / BF16 weights, context.cublas set, context.workspace_bytes
//     >= MatMulWorkspaceBytes(m, k), k > 0, sizes within int       -> kCublas
//   otherwise                                                      -> kTiled
// REQUIRES: params valid (MatMul would not return cudaErrorInvalidValue).
MatMulPath SelectMatMulPath(const MatMulParams& params, const MatMulContext& context);

// Computes y[i, j] = Σ_k x[i, k] · W[j, k] through the path SelectMatMulPath() names.
cudaError_t MatMul(const MatMulParams& params, const MatMulContext& context, cudaStream_t stream);

// Several products of the same activations (Q/K/V, or gate/up): y_j = x · W_jᵀ for each of the
// `count` params. When they share x, x_stride, m, k and w_type, 1 <= count <= 3 and m <=
// kGemvMaxRows, one GEMV launch covers all of them, reading x once per CTA and filling the GPU
// better than three small launches; otherwise each runs as MatMul(params[j]). Either way each y_j
// is bit-identical to MatMul(params[j], context, stream). cudaErrorInvalidValue (nothing
// launched) when any params[j] is invalid or count < 0.
cudaError_t MatMulShared(const MatMulParams* params, int count, const MatMulContext& context,
                         cudaStream_t stream);

// The paths themselves, for the checks and for benchmarks; MatMul() is what the backend calls.
// MatMulGemv takes any m (8 rows at a time); MatMulTiled any m; MatMulCublas F16 / BF16 weights
// only, and a context with a handle and a workspace of MatMulWorkspaceBytes(m, k)
// (cudaErrorInvalidValue otherwise).
cudaError_t MatMulGemv(const MatMulParams& params, cudaStream_t stream);
cudaError_t MatMulTiled(const MatMulParams& params, cudaStream_t stream);
cudaError_t MatMulCublas(const MatMulParams& params, const MatMulContext& context,
                         cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_ENGINE_CUDA_MATMUL_H_
