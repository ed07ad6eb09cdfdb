// y = x · Wᵀ on the CPU, for float activations and weights of any DType.
//
// Weights are row-major [N, K] as stored in GGUF / safetensors: row n holds the K inputs of output
// n (for quantized types, K / 32 consecutive blocks). For quantized weights each activation row is
// first quantized to int8 blocks (BlockQ8Act, like ggml's q8_0 / q8_1) once per call, and the dot
// products run in integers (AVX2 vpmaddubsw, AVX512-VNNI vpdpbusd); the result then differs from
// the exact product of the dequantized weights with x by at most
//   Σ_blocks (max|x_block| / 254) · Σ_{k in block} |w_k|   (plus float rounding).
//
// Work is split over N across the thread pool. Each thread walks its rows in tiles of 16 weight
// rows and, for each tile, over all M activation rows 4 at a time, so every weight row is read
// from memory once per call however large M is. With AVX-512, Q4_0 / Q4_1 rows go through the
// kernel two at a time (rows 2j and 2j + 1 of a tile share each 512-bit register), with results
// bit-identical to one row at a time.
//
// Weights repacked by PackedWeights (packed_weights.h) go through the packed kernels instead,
// 16 rows at a time for all M; see that header for their exact arithmetic, which differs in
// rounding from the row kernels'.
//
// Thread-safe: concurrent calls are fine. The quantized activations go to a per-calling-thread
// scratch buffer that is kept between calls (M · K / 32 · 40 bytes at its largest).
#ifndef TANDEM_ENGINE_CPU_MATMUL_H_
#define TANDEM_ENGINE_CPU_MATMUL_H_

#include <cstdint>
#include <optional>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/core/dtype.h"
#include "engine/cpu/kernel_context.h"
#include "engine/cpu/packed_weights.h"

namespace tandem::cpu {

struct MatMulParams {
  const float* x = nullptr;  // [M, K], row i at x + i * x_stride
  int64_t x_stride = 0;      // floats between rows of x (>= K)
  const void* w = nullptr;   // [N, K] in w_type; row n at (const char*)w + n * w_row_bytes
  DType w_type = DType::kF32;
  int64_t w_row_bytes = 0;  // 0: packed rows (DTypeStorageBytes(w_type, K))
  float* y = nullptr;       // [M, N], row i at y + i * y_stride; must not alias x or w
  int64_t y_stride = 0;     // floats between rows of y (>= N)
  int64_t m = 0;            // M: activation rows (1 for decode)
  int64_t n = 0;            // N: output features
  int64_t k = 0;            // K: input features; whole blocks of w_type (32 or 256 elements)
  // When set, the weights come from here (n() == N and k() == K) and w, w_type and w_row_bytes
  // are not read.
  const PackedWeights* packed = nullptr;
};

// Computes y[i, n] = Σ_k x[i, k] · W[n, k]. INVALID_ARGUMENT when a size is negative, K is not a
// whole number of blocks, a stride is too small, a pointer is null (with a nonzero size) or the
// packed weights' shape is not N × K.
[[nodiscard]] absl::Status MatMul(const MatMulParams& params, const KernelContext& context = {});

// Memory that a later kernel will read: `bytes` bytes from `data`.
struct MemoryRange {
  const void* data = nullptr;
  int64_t bytes = 0;
};

// Work MatMulShared can do alongside its products.
struct MatMulExtras {
  // Writes rows [begin, end) of the products' x (the elementwise step that makes them: a norm,
  // SwiGLU). When set, MatMulShared calls it over all M rows, split across the pool, each range
  // followed at once by its quantization on the same thread, and only then reads x: work that
  // would otherwise run on one thread while the others wait, done in parallel while the rows are
  // still in that thread's cache.
  std::optional<absl::FunctionRef<void(int64_t begin, int64_t end)>> prepare_rows = std::nullopt;
  // Ranges to bring into the L2 cache while the products run, spread over the weight tiles (tile
  // i of n asks for ranges [i·r/n, (i+1)·r/n)). With several activation rows the products are
  // bound by arithmetic, not memory, so a kernel that runs next can have its data streamed in on
  // the spare bandwidth (the forward pass uses it for the KV rows that attention is about to
  // read). Only a hint: the ranges are never dereferenced.
  absl::Span<const MemoryRange> prefetch = {};
};

// Several products of the same activations (Q/K/V, or gate/up): y_j = x · W_jᵀ for every
// params[j], in one pass over the thread pool with x quantized once. Each y_j is bit-identical to
// MatMul(params[j]) (with x as prepare_rows leaves it). INVALID_ARGUMENT as MatMul, or when the
// entries differ in x, x_stride, m or k (prepare_rows is not called then).
[[nodiscard]] absl::Status MatMulShared(absl::Span<const MatMulParams> params,
                                        const KernelContext& context = {},
                                        const MatMulExtras& extras = {});

}  // namespace tandem::cpu

#endif  // TANDEM_ENGINE_CPU_MATMUL_H_
