#include "engine/cuda/matmul.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>

namespace tandem::cuda {
namespace {

// ---- Decoding weights ------------------------------------------------------------------------
// Rows of every type start on a 2-byte boundary (weight_type.h), so the decoders read 2-byte
// words (4-byte ones for F32); they work on global and shared memory alike.

__device__ __forceinline__ uint32_t Load16(const unsigned char* p) {
  return *reinterpret_cast<const uint16_t*>(p);
}

__device__ __forceinline__ float HalfBitsToFloat(uint32_t bits) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
}

__device__ __forceinline__ float Bf16BitsToFloat(uint32_t bits) {
  return __uint_as_float(bits << 16);
}

// Elements [e, e + 4) of a row segment that starts on a block boundary. REQUIRES: e % 4 == 0 and
// e + 4 <= the segment's length. For quantized types a quad never straddles a block.
template <WeightType T>
__device__ __forceinline__ float4 DecodeQuad(const unsigned char* row, int e) {
  if constexpr (T == WeightType::kF32) {
    const float* f = reinterpret_cast<const float*>(row) + e;
    return make_float4(f[0], f[1], f[2], f[3]);
  } else if constexpr (T == WeightType::kF16 || T == WeightType::kBF16) {
    const unsigned char* p = row + 2 * e;
    auto convert = [](uint32_t bits) {
      return T == WeightType::kF16 ? HalfBitsToFloat(bits) : Bf16BitsToFloat(bits);
    };
    return make_float4(convert(Load16(p)), convert(Load16(p + 2)), convert(Load16(p + 4)),
                       convert(Load16(p + 6)));
  } else if constexpr (T == WeightType::kQ8_0) {
    const unsigned char* block = row + (e / 32) * 34;
    const float d = HalfBitsToFloat(Load16(block));
    const int o = e % 32;
    const uint32_t q = Load16(block + 2 + o) | Load16(block + 4 + o) << 16;
    return make_float4(d * static_cast<float>(static_cast<int8_t>(q)),
                       d * static_cast<float>(static_cast<int8_t>(q >> 8)),
                       d * static_cast<float>(static_cast<int8_t>(q >> 16)),
                       d * static_cast<float>(static_cast<int8_t>(q >> 24)));
  } else {  // Q4_0, Q4_1: element o is the low nibble of qs[o] (o < 16), else the high one of
            // qs[o - 16]
    constexpr int kBlockBytes = T == WeightType::kQ4_0 ? 18 : 20;
    constexpr int kQs = T == WeightType::kQ4_0 ? 2 : 4;
    const unsigned char* block = row + (e / 32) * kBlockBytes;
    const float d = HalfBitsToFloat(Load16(block));
    const int o = e % 32;
    const int j = o % 16;
    const int shift = o < 16 ? 0 : 4;
    const uint32_t q = (Load16(block + kQs + j) | Load16(block + kQs + 2 + j) << 16) >> shift;
    const float n0 = static_cast<float>(q & 15), n1 = static_cast<float>((q >> 8) & 15);
    const float n2 = static_cast<float>((q >> 16) & 15), n3 = static_cast<float>((q >> 24) & 15);
    if constexpr (T == WeightType::kQ4_0) {
      return make_float4(d * (n0 - 8.0f), d * (n1 - 8.0f), d * (n2 - 8.0f), d * (n3 - 8.0f));
    } else {
      const float m = HalfBitsToFloat(Load16(block + 2));
      return make_float4(fmaf(d, n0, m), fmaf(d, n1, m), fmaf(d, n2, m), fmaf(d, n3, m));
    }
  }
}

// As DecodeQuad, for the last quad of a float-type row whose length `valid` is not a multiple of
// 4: elements at or past `valid` read as 0. Quantized rows are whole blocks, never partial.
template <WeightType T>
__device__ __forceinline__ float4 DecodePartialQuad(const unsigned char* row, int e, int valid) {
  if constexpr (IsQuantized(T)) {
    return DecodeQuad<T>(row, e);
  } else {
    float v[4];
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      if (e + t >= valid) {
        v[t] = 0.0f;
      } else if constexpr (T == WeightType::kF32) {
        v[t] = reinterpret_cast<const float*>(row)[e + t];
      } else if constexpr (T == WeightType::kF16) {
        v[t] = HalfBitsToFloat(Load16(row + 2 * (e + t)));
      } else {
        v[t] = Bf16BitsToFloat(Load16(row + 2 * (e + t)));
      }
    }
    return make_float4(v[0], v[1], v[2], v[3]);
  }
}

// x[0..4) from a row of activations with `avail` (>= 1) readable elements from p; past them 0.
// `vector`: p is 16-byte aligned (x and x_stride allow it and p is at a multiple of 4).
__device__ __forceinline__ float4 LoadXQuad(const float* p, int64_t avail, bool vector) {
  if (vector && avail >= 4) return __ldg(reinterpret_cast<const float4*>(p));
  return make_float4(__ldg(p), avail > 1 ? __ldg(p + 1) : 0.0f, avail > 2 ? __ldg(p + 2) : 0.0f,
                     avail > 3 ? __ldg(p + 3) : 0.0f);
}

__device__ __forceinline__ float Dot4(float4 a, float4 b, float acc) {
  return fmaf(a.w, b.w, fmaf(a.z, b.z, fmaf(a.y, b.y, fmaf(a.x, b.x, acc))));
}

// ---- cp.async ----------------------------------------------------------------------------------

// Copies 16 bytes from global `src` (16-byte aligned) to shared `dst` (16-byte aligned), reading
// only the first `bytes` (1..16) and zero-filling the rest.
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, int bytes) {
  const unsigned shared = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  const size_t global = __cvta_generic_to_global(src);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared), "l"(global),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most `kPending` of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// ---- GEMV ------------------------------------------------------------------------------------

constexpr int kGemvWarps = 4;   // warps per CTA; they split k
constexpr int kGemvRows = 4;    // rows of W per CTA
constexpr int kGemvStages = 3;  // cp.async stages per warp
constexpr int kMaxSharedProducts = 3;

// Elements of a row per pipeline stage: 512 to 640 bytes, a multiple of 128 elements (32 lanes x
// 4) and of the block.
__host__ __device__ constexpr int GemvChunk(WeightType type) {
  switch (type) {
    case WeightType::kF32:
      return 128;
    case WeightType::kF16:
    case WeightType::kBF16:
      return 256;
    case WeightType::kQ8_0:
      return 512;
    case WeightType::kQ4_0:
    case WeightType::kQ4_1:
      return 1024;
  }
  return 0;
}

struct GemvProduct {
  const unsigned char* w = nullptr;  // [n, k], row j at w + j * w_row_bytes
  int64_t w_row_bytes = 0;
  float* y = nullptr;  // [m, n], row i at y + i * y_stride
  int64_t y_stride = 0;
  int64_t n = 0;
  int64_t first_block = 0;  // the first CTA of this product
};

struct GemvArgs {
  const float* x = nullptr;  // [M, k], row i at x + i * x_stride
  int64_t x_stride = 0;
  int64_t k = 0;
  bool x_vector = false;  // x and x_stride allow float4 loads
  int count = 0;          // products in use, 1..kMaxSharedProducts, each with n > 0
  GemvProduct products[kMaxSharedProducts];
};

// Each CTA computes y[0..M, j0 .. j0 + 4) for 4 consecutive rows j0.. of one product's W (the
// products' CTAs follow one another: first_block). Its warp w takes chunks w, w + 4, w + 8, ... of
// those rows (GemvChunk elements each) and copies each chunk of the 4 rows into a shared stage of
// its own with cp.async (the 16-byte granules that cover the chunk: the first may begin before it,
// the last is read only up to its end and zero-filled) while it computes on earlier chunks. Lane l
// handles elements 4 (l + 32 q) .. + 4 of a chunk: it decodes them for the 4 rows, then for each
// row of x one float4 of x feeds all 4. Lanes, then warps, are summed in a fixed order at the end.
//
// Register caps (minimum CTAs per SM): 8 for M = 1 (64 registers), 6 for M = 2, 4 beyond (128);
// without them ptxas unrolls the chunk loop into 200+ registers. Shared memory (26 to 32 KB per
// CTA) allows 7 or 8 CTAs per SM on Hopper.
__host__ __device__ constexpr int GemvMinBlocks(int m) { return m == 1 ? 8 : m == 2 ? 6 : 4; }

template <WeightType T, int M>
__global__ void __launch_bounds__(kGemvWarps * 32, GemvMinBlocks(M))
    GemvKernel(const GemvArgs args) {
  constexpr int kChunk = GemvChunk(T);
  constexpr int kChunkBytes = static_cast<int>(WeightRowBytes(T, kChunk));
  constexpr int kStageBytes = kChunkBytes + 32;  // room for the granules before and after
  constexpr int kQuadsPerLane = kChunk / 128;
  static_assert(kChunkBytes % 16 == 0 && kChunk % 128 == 0, "chunks are whole granules");
  __shared__ __align__(16) unsigned char stages[kGemvWarps][kGemvStages][kGemvRows][kStageBytes];
  __shared__ float partial[kGemvWarps][kGemvRows][M];

  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t block = blockIdx.x;
  GemvProduct p = args.products[0];
  if (args.count > 1 && block >= args.products[1].first_block) p = args.products[1];
  if (args.count > 2 && block >= args.products[2].first_block) p = args.products[2];
  const int64_t row0 = (block - p.first_block) * kGemvRows;
  const int rows = static_cast<int>(min(static_cast<int64_t>(kGemvRows), p.n - row0));
  const int64_t k = args.k;
  const int64_t row_bytes = WeightRowBytes(T, k);
  const int64_t chunks = (k + kChunk - 1) / kChunk;
  const int64_t my_chunks = warp < chunks ? (chunks - warp + kGemvWarps - 1) / kGemvWarps : 0;

  // The first byte of chunk c of row r of this CTA, in global memory.
  auto chunk_start = [&](int r, int64_t c) {
    return p.w + (row0 + r) * p.w_row_bytes + c * kChunkBytes;
  };

  auto issue = [&](int64_t step) {
    const int64_t c = warp + step * kGemvWarps;
    const int64_t len = min(static_cast<int64_t>(kChunkBytes), row_bytes - c * kChunkBytes);
    for (int r = 0; r < rows; ++r) {
      const uintptr_t src = reinterpret_cast<uintptr_t>(chunk_start(r, c));
      // The granule holding the first byte lies in the same allocation (allocations are at least
      // 16-byte aligned); the last granule is read only up to the chunk's end.
      const uintptr_t first = src & ~static_cast<uintptr_t>(15);
      const uintptr_t end = src + static_cast<uintptr_t>(len);
      const int granules = static_cast<int>((end - first + 15) / 16);
      unsigned char* dst = stages[warp][step % kGemvStages][r];
      for (int g = lane; g < granules; g += 32) {
        const uintptr_t at = first + 16 * static_cast<uintptr_t>(g);
        CpAsync16(dst + 16 * g, reinterpret_cast<const void*>(at),
                  static_cast<int>(min(static_cast<uintptr_t>(16), end - at)));
      }
    }
  };

  float acc[kGemvRows][M];
#pragma unroll
  for (int r = 0; r < kGemvRows; ++r) {
#pragma unroll
    for (int i = 0; i < M; ++i) acc[r][i] = 0.0f;
  }

  auto compute = [&](int64_t step) {
    const int64_t c = warp + step * kGemvWarps;
    const int64_t e0 = c * kChunk;  // the chunk's first element
    const int valid = static_cast<int>(min(static_cast<int64_t>(kChunk), k - e0));
    const unsigned char* w[kGemvRows];
#pragma unroll
    for (int r = 0; r < kGemvRows; ++r) {
      const int skip =
          r < rows ? static_cast<int>(reinterpret_cast<uintptr_t>(chunk_start(r, c)) & 15) : 0;
      w[r] = stages[warp][step % kGemvStages][r] + skip;
    }
#pragma unroll 2
    for (int q = 0; q < kQuadsPerLane; ++q) {
      const int e = 4 * (lane + 32 * q);
      if (e >= valid) break;
      const bool full = e + 4 <= valid;
      float4 wq[kGemvRows];
#pragma unroll
      for (int r = 0; r < kGemvRows; ++r) {
        wq[r] = r >= rows ? make_float4(0.0f, 0.0f, 0.0f, 0.0f)
                : full    ? DecodeQuad<T>(w[r], e)
                          : DecodePartialQuad<T>(w[r], e, valid);
      }
#pragma unroll
      for (int i = 0; i < M; ++i) {
        const float4 xq = LoadXQuad(args.x + i * args.x_stride + e0 + e, valid - e, args.x_vector);
#pragma unroll
        for (int r = 0; r < kGemvRows; ++r) acc[r][i] = Dot4(wq[r], xq, acc[r][i]);
      }
    }
  };

  for (int s = 0; s < kGemvStages - 1; ++s) {
    if (s < my_chunks) issue(s);
    CpAsyncCommit();
  }
  for (int64_t step = 0; step < my_chunks; ++step) {
    if (step + kGemvStages - 1 < my_chunks) issue(step + kGemvStages - 1);
    CpAsyncCommit();
    CpAsyncWait<kGemvStages - 1>();  // this step's group has landed
    __syncwarp();
    compute(step);
    __syncwarp();  // every lane is done with the stage before it is refilled
  }

#pragma unroll
  for (int r = 0; r < kGemvRows; ++r) {
#pragma unroll
    for (int i = 0; i < M; ++i) {
      float v = acc[r][i];
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
      if (lane == 0) partial[warp][r][i] = v;
    }
  }
  __syncthreads();
  if (threadIdx.x < kGemvRows * M) {
    const int r = static_cast<int>(threadIdx.x) / M;
    const int i = static_cast<int>(threadIdx.x) % M;
    if (r < rows) {
      float sum = partial[0][r][i];
#pragma unroll
      for (int wi = 1; wi < kGemvWarps; ++wi) sum += partial[wi][r][i];
      p.y[i * p.y_stride + row0 + r] = sum;
    }
  }
}

template <WeightType T, int M>
cudaError_t LaunchGemv(const GemvArgs& args, unsigned blocks, cudaStream_t stream) {
  GemvKernel<T, M><<<blocks, kGemvWarps * 32, 0, stream>>>(args);
  return cudaGetLastError();
}

template <WeightType T>
cudaError_t LaunchGemvRows(const GemvArgs& args, int m, unsigned blocks, cudaStream_t stream) {
  switch (m) {
    case 1:
      return LaunchGemv<T, 1>(args, blocks, stream);
    case 2:
      return LaunchGemv<T, 2>(args, blocks, stream);
    case 3:
      return LaunchGemv<T, 3>(args, blocks, stream);
    case 4:
      return LaunchGemv<T, 4>(args, blocks, stream);
    case 5:
      return LaunchGemv<T, 5>(args, blocks, stream);
    case 6:
      return LaunchGemv<T, 6>(args, blocks, stream);
    case 7:
      return LaunchGemv<T, 7>(args, blocks, stream);
    case 8:
      return LaunchGemv<T, 8>(args, blocks, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

static_assert(kGemvMaxRows == 8, "LaunchGemvRows instantiates M = 1..8");

cudaError_t LaunchGemvTyped(WeightType type, const GemvArgs& args, int m, unsigned blocks,
                            cudaStream_t stream) {
  switch (type) {
    case WeightType::kF32:
      return LaunchGemvRows<WeightType::kF32>(args, m, blocks, stream);
    case WeightType::kF16:
      return LaunchGemvRows<WeightType::kF16>(args, m, blocks, stream);
    case WeightType::kBF16:
      return LaunchGemvRows<WeightType::kBF16>(args, m, blocks, stream);
    case WeightType::kQ8_0:
      return LaunchGemvRows<WeightType::kQ8_0>(args, m, blocks, stream);
    case WeightType::kQ4_0:
      return LaunchGemvRows<WeightType::kQ4_0>(args, m, blocks, stream);
    case WeightType::kQ4_1:
      return LaunchGemvRows<WeightType::kQ4_1>(args, m, blocks, stream);
  }
  return cudaErrorInvalidValue;
}

bool XAllowsVectors(const float* x, int64_t x_stride) {
  return reinterpret_cast<uintptr_t>(x) % 16 == 0 && x_stride % 4 == 0;
}

int64_t RowBytesOf(const MatMulParams& p) {
  return p.w_row_bytes != 0 ? p.w_row_bytes : WeightRowBytes(p.w_type, p.k);
}

// REQUIRES: every params[j] valid with m, n > 0; 1 <= count <= kMaxSharedProducts; all share x,
// x_stride, m, k and w_type.
cudaError_t RunGemv(const MatMulParams* params, int count, cudaStream_t stream) {
  const MatMulParams& first = params[0];
  for (int64_t i0 = 0; i0 < first.m; i0 += kGemvMaxRows) {
    const int m = static_cast<int>(std::min(kGemvMaxRows, first.m - i0));
    GemvArgs args;
    args.x = first.x + i0 * first.x_stride;
    args.x_stride = first.x_stride;
    args.k = first.k;
    args.x_vector = XAllowsVectors(first.x, first.x_stride);
    args.count = count;
    int64_t blocks = 0;
    for (int j = 0; j < count; ++j) {
      const MatMulParams& p = params[j];
      GemvProduct& product = args.products[j];
      product.w = static_cast<const unsigned char*>(p.w);
      product.w_row_bytes = RowBytesOf(p);
      product.y = p.y + i0 * p.y_stride;
      product.y_stride = p.y_stride;
      product.n = p.n;
      product.first_block = blocks;
      blocks += (p.n + kGemvRows - 1) / kGemvRows;
    }
    if (blocks > INT_MAX) return cudaErrorInvalidValue;
    TANDEM_CUDA_TRY(LaunchGemvTyped(first.w_type, args, m, static_cast<unsigned>(blocks), stream));
  }
  return cudaSuccess;
}

// ---- Tiled kernels (large m) -----------------------------------------------------------------

struct TiledArgs {
  const float* x = nullptr;  // [m, k], row i at x + i * x_stride
  int64_t x_stride = 0;
  const unsigned char* w = nullptr;  // [n, k], row j at w + j * w_row_bytes
  int64_t w_row_bytes = 0;
  float* y = nullptr;  // [m, n], row i at y + i * y_stride
  int64_t y_stride = 0;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  bool x_vector = false;  // x and x_stride allow float4 loads
};

constexpr int kTileM = 64;              // rows of x per CTA
constexpr int kTileN = 64;              // rows of W (output features) per CTA
constexpr int kTileK = 32;              // elements of k per step: one quantization block
constexpr int kTileLd = kTileK + 8;     // shared row pitch of the x and W tiles (elements)
constexpr int kTileOutLd = kTileN + 8;  // shared row pitch of the output tile (floats)
constexpr int kTiledMmaThreads = 128;   // 2 x 2 warps, 32 x 32 outputs each

template <WeightType T>
using MmaInput = std::conditional_t<T == WeightType::kBF16, __nv_bfloat16, __half>;

template <typename In>
__device__ __forceinline__ In FromFloat(float v) {
  if constexpr (std::is_same_v<In, __half>) {
    return __float2half_rn(v);
  } else {
    return __float2bfloat16_rn(v);
  }
}

template <typename In>
__device__ __forceinline__ void StoreQuad(In* dst, float4 v) {
  dst[0] = FromFloat<In>(v.x);
  dst[1] = FromFloat<In>(v.y);
  dst[2] = FromFloat<In>(v.z);
  dst[3] = FromFloat<In>(v.w);
}

// CTA (bx, by) computes y[64 by .. + 64, 64 bx .. + 64]. Each step the 128 threads convert a
// 64 x 32 tile of x (4 quads each) and dequantize a 64 x 32 tile of W (thread t: row t / 2,
// elements 16 (t % 2) .. + 16) into shared memory as In, then each warp multiplies its 32 x 32
// corner with 2 x 2 WMMA 16x16x16 fragments in float. The output goes through shared memory so
// that partial tiles are written within bounds.
template <WeightType T>
__global__ void __launch_bounds__(kTiledMmaThreads) TiledMmaKernel(const TiledArgs a) {
  using namespace nvcuda;
  using In = MmaInput<T>;
  __shared__ __align__(128) In xs[kTileM * kTileLd];
  __shared__ __align__(128) In ws[kTileN * kTileLd];
  __shared__ __align__(128) float out[kTileM * kTileOutLd];

  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kTileM;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kTileN;
  const int warp_m = (warp / 2) * 32;
  const int warp_n = (warp % 2) * 32;

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
  }

  const int w_tile_row = tid / 2;
  const int w_tile_col = (tid % 2) * 16;
  const unsigned char* w_row =
      col0 + w_tile_row < a.n ? a.w + (col0 + w_tile_row) * a.w_row_bytes : nullptr;

  for (int64_t k0 = 0; k0 < a.k; k0 += kTileK) {
    const int valid = static_cast<int>(min(static_cast<int64_t>(kTileK), a.k - k0));
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const int q = tid + kTiledMmaThreads * t;
      const int r = q / (kTileK / 4);
      const int c = (q % (kTileK / 4)) * 4;
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (row0 + r < a.m && c < valid) {
        v = LoadXQuad(a.x + (row0 + r) * a.x_stride + k0 + c, valid - c, a.x_vector);
      }
      StoreQuad(xs + r * kTileLd + c, v);
    }
    const unsigned char* w_step = w_row != nullptr ? w_row + WeightRowBytes(T, k0) : nullptr;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const int e = w_tile_col + 4 * t;
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (w_step != nullptr && e < valid) {
        v = e + 4 <= valid ? DecodeQuad<T>(w_step, e) : DecodePartialQuad<T>(w_step, e, valid);
      }
      StoreQuad(ws + w_tile_row * kTileLd + e, v);
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kTileK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, In, wmma::row_major> af[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, In, wmma::col_major> bf[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        wmma::load_matrix_sync(af[i], xs + (warp_m + 16 * i) * kTileLd + kk, kTileLd);
      }
      // B = Wᵀ (k x n): column j of B is row j of the W tile, so W's tile read column-major.
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        wmma::load_matrix_sync(bf[j], ws + (warp_n + 16 * j) * kTileLd + kk, kTileLd);
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], af[i], bf[j], acc[i][j]);
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      wmma::store_matrix_sync(out + (warp_m + 16 * i) * kTileOutLd + warp_n + 16 * j, acc[i][j],
                              kTileOutLd, wmma::mem_row_major);
    }
  }
  __syncthreads();
  for (int idx = tid; idx < kTileM * kTileN; idx += kTiledMmaThreads) {
    const int r = idx / kTileN;
    const int c = idx % kTileN;
    if (row0 + r < a.m && col0 + c < a.n)
      a.y[(row0 + r) * a.y_stride + col0 + c] = out[r * kTileOutLd + c];
  }
}

constexpr int kFmaTile = 64;      // rows of x and of W per CTA
constexpr int kFmaTileK = 16;     // elements of k per step
constexpr int kFmaThreads = 256;  // 16 x 16 threads, 4 x 4 outputs each

// F32 weights: the same tiling in float with FMAs, exact inputs. Thread (ty, tx) computes rows
// 4 ty .. + 4 of x against rows 4 tx .. + 4 of W; both tiles are stored k-major in shared memory
// so that each step reads one float4 of each.
__global__ void __launch_bounds__(kFmaThreads) TiledFmaKernel(const TiledArgs a) {
  __shared__ __align__(16) float xs[kFmaTileK][kFmaTile + 4];
  __shared__ __align__(16) float ws[kFmaTileK][kFmaTile + 4];

  const int tid = static_cast<int>(threadIdx.x);
  const int tx = tid % 16;
  const int ty = tid / 16;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kFmaTile;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kFmaTile;
  const int load_row = tid / 4;        // 0..63
  const int load_col = (tid % 4) * 4;  // 0, 4, 8, 12
  const unsigned char* w_row =
      col0 + load_row < a.n ? a.w + (col0 + load_row) * a.w_row_bytes : nullptr;

  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < a.k; k0 += kFmaTileK) {
    const int valid = static_cast<int>(min(static_cast<int64_t>(kFmaTileK), a.k - k0));
    float4 xv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (row0 + load_row < a.m && load_col < valid) {
      xv = LoadXQuad(a.x + (row0 + load_row) * a.x_stride + k0 + load_col, valid - load_col,
                     a.x_vector);
    }
    float4 wv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (w_row != nullptr && load_col < valid) {
      const unsigned char* w_step = w_row + 4 * k0;
      wv = load_col + 4 <= valid ? DecodeQuad<WeightType::kF32>(w_step, load_col)
                                 : DecodePartialQuad<WeightType::kF32>(w_step, load_col, valid);
    }
    xs[load_col + 0][load_row] = xv.x;
    xs[load_col + 1][load_row] = xv.y;
    xs[load_col + 2][load_row] = xv.z;
    xs[load_col + 3][load_row] = xv.w;
    ws[load_col + 0][load_row] = wv.x;
    ws[load_col + 1][load_row] = wv.y;
    ws[load_col + 2][load_row] = wv.z;
    ws[load_col + 3][load_row] = wv.w;
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kFmaTileK; ++kk) {
      const float4 av = *reinterpret_cast<const float4*>(&xs[kk][4 * ty]);
      const float4 bv = *reinterpret_cast<const float4*>(&ws[kk][4 * tx]);
      const float a4[4] = {av.x, av.y, av.z, av.w};
      const float b4[4] = {bv.x, bv.y, bv.z, bv.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a4[i], b4[j], acc[i][j]);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t r = row0 + 4 * ty + i;
    if (r >= a.m) break;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t c = col0 + 4 * tx + j;
      if (c < a.n) a.y[r * a.y_stride + c] = acc[i][j];
    }
  }
}

// ---- cuBLAS ----------------------------------------------------------------------------------

template <typename Out>
__global__ void ConvertRowsKernel(const float* x, int64_t x_stride, int64_t m, int64_t k,
                                  Out* out) {
  const int64_t total = m * k;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = idx / k;
    const int64_t j = idx - i * k;
    out[idx] = FromFloat<Out>(x[i * x_stride + j]);
  }
}

cudaError_t FromCublas(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return cudaSuccess;
    case CUBLAS_STATUS_ALLOC_FAILED:
      return cudaErrorMemoryAllocation;
    case CUBLAS_STATUS_INVALID_VALUE:
      return cudaErrorInvalidValue;
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return cudaErrorNotSupported;
    default:
      return cudaErrorUnknown;
  }
}

bool FitsInt(int64_t v) { return v <= INT_MAX; }

// Whether MatMulCublas can run `p` (valid, m and n > 0) with `context`.
bool CublasCanRun(const MatMulParams& p, const MatMulContext& context) {
  return (p.w_type == WeightType::kF16 || p.w_type == WeightType::kBF16) &&
         context.cublas != nullptr && context.workspace != nullptr &&
         reinterpret_cast<uintptr_t>(context.workspace) % 2 == 0 &&
         context.workspace_bytes >= MatMulWorkspaceBytes(p.m, p.k) && FitsInt(p.m) &&
         FitsInt(p.n) && FitsInt(p.k) && FitsInt(RowBytesOf(p) / 2) && FitsInt(p.y_stride);
}

// ---- Validation ------------------------------------------------------------------------------

// cudaErrorInvalidValue for parameters that cannot be run; else cudaSuccess, with *nothing set
// when there is no work (m or n is 0).
cudaError_t Validate(const MatMulParams& p, bool* nothing) {
  *nothing = false;
  switch (p.w_type) {
    case WeightType::kF32:
    case WeightType::kF16:
    case WeightType::kBF16:
    case WeightType::kQ8_0:
    case WeightType::kQ4_0:
    case WeightType::kQ4_1:
      break;
    default:
      return cudaErrorInvalidValue;
  }
  if (p.m < 0 || p.n < 0 || p.k < 0 || p.k % WeightBlockElements(p.w_type) != 0) {
    return cudaErrorInvalidValue;
  }
  if (p.x_stride < p.k || p.y_stride < p.n || p.w_row_bytes < 0) return cudaErrorInvalidValue;
  if (p.w_row_bytes != 0 && p.w_row_bytes < WeightRowBytes(p.w_type, p.k)) {
    return cudaErrorInvalidValue;
  }
  const int64_t align = p.w_type == WeightType::kF32 ? 4 : 2;
  if (reinterpret_cast<uintptr_t>(p.w) % align != 0 || RowBytesOf(p) % align != 0) {
    return cudaErrorInvalidValue;
  }
  if (p.m == 0 || p.n == 0) {
    *nothing = true;
    return cudaSuccess;
  }
  if (p.y == nullptr || (p.k > 0 && (p.x == nullptr || p.w == nullptr))) {
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

TiledArgs TiledArgsOf(const MatMulParams& p) {
  TiledArgs a;
  a.x = p.x;
  a.x_stride = p.x_stride;
  a.w = static_cast<const unsigned char*>(p.w);
  a.w_row_bytes = RowBytesOf(p);
  a.y = p.y;
  a.y_stride = p.y_stride;
  a.m = p.m;
  a.n = p.n;
  a.k = p.k;
  a.x_vector = XAllowsVectors(p.x, p.x_stride);
  return a;
}

template <WeightType T>
cudaError_t LaunchTiledMma(const TiledArgs& a, cudaStream_t stream) {
  const dim3 grid(BlocksFor(a.n, kTileN), BlocksFor(a.m, kTileM));
  TiledMmaKernel<T><<<grid, kTiledMmaThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

cudaError_t CreateMatMulContext(MatMulContext* context) {
  if (context == nullptr) return cudaErrorInvalidValue;
  cublasHandle_t handle = nullptr;
  if (cudaError_t e = FromCublas(cublasCreate(&handle)); e != cudaSuccess) return e;
  context->cublas = handle;
  return cudaSuccess;
}

void DestroyMatMulContext(MatMulContext* context) {
  if (context == nullptr || context->cublas == nullptr) return;
  cublasDestroy(context->cublas);
  context->cublas = nullptr;
}

size_t MatMulWorkspaceBytes(int64_t m, int64_t k) {
  return m <= 0 || k <= 0 ? 0 : static_cast<size_t>(m) * static_cast<size_t>(k) * 2;
}

MatMulPath SelectMatMulPath(const MatMulParams& params, const MatMulContext& context) {
  if (params.m <= kGemvMaxRows) return MatMulPath::kGemv;
  if (params.k > 0 && CublasCanRun(params, context)) return MatMulPath::kCublas;
  return MatMulPath::kTiled;
}

cudaError_t MatMulGemv(const MatMulParams& params, cudaStream_t stream) {
  bool nothing = false;
  TANDEM_CUDA_TRY(Validate(params, &nothing));
  if (nothing) return cudaSuccess;
  return RunGemv(&params, 1, stream);
}

cudaError_t MatMulTiled(const MatMulParams& params, cudaStream_t stream) {
  bool nothing = false;
  TANDEM_CUDA_TRY(Validate(params, &nothing));
  if (nothing) return cudaSuccess;
  if (BlocksFor(params.m, kTileM) > 65535 || BlocksFor(params.n, kTileN) > INT_MAX) {
    return cudaErrorInvalidValue;
  }
  const TiledArgs a = TiledArgsOf(params);
  switch (params.w_type) {
    case WeightType::kF32: {
      const dim3 grid(BlocksFor(a.n, kFmaTile), BlocksFor(a.m, kFmaTile));
      TiledFmaKernel<<<grid, kFmaThreads, 0, stream>>>(a);
      return cudaGetLastError();
    }
    case WeightType::kF16:
      return LaunchTiledMma<WeightType::kF16>(a, stream);
    case WeightType::kBF16:
      return LaunchTiledMma<WeightType::kBF16>(a, stream);
    case WeightType::kQ8_0:
      return LaunchTiledMma<WeightType::kQ8_0>(a, stream);
    case WeightType::kQ4_0:
      return LaunchTiledMma<WeightType::kQ4_0>(a, stream);
    case WeightType::kQ4_1:
      return LaunchTiledMma<WeightType::kQ4_1>(a, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t MatMulCublas(const MatMulParams& params, const MatMulContext& context,
                         cudaStream_t stream) {
  bool nothing = false;
  TANDEM_CUDA_TRY(Validate(params, &nothing));
  if (nothing) return cudaSuccess;
  if (!CublasCanRun(params, context)) return cudaErrorInvalidValue;
  if (params.k == 0) {  // an empty sum; cuBLAS wants k >= 1
    return cudaMemset2DAsync(params.y, static_cast<size_t>(params.y_stride) * sizeof(float), 0,
                             static_cast<size_t>(params.n) * sizeof(float),
                             static_cast<size_t>(params.m), stream);
  }
  const bool bf16 = params.w_type == WeightType::kBF16;
  const int64_t total = params.m * params.k;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(BlocksFor(total, 256), 8192));
  if (bf16) {
    ConvertRowsKernel<<<blocks, 256, 0, stream>>>(params.x, params.x_stride, params.m, params.k,
                                                  static_cast<__nv_bfloat16*>(context.workspace));
  } else {
    ConvertRowsKernel<<<blocks, 256, 0, stream>>>(params.x, params.x_stride, params.m, params.k,
                                                  static_cast<__half*>(context.workspace));
  }
  TANDEM_CUDA_TRY(cudaGetLastError());
  TANDEM_CUDA_TRY(FromCublas(cublasSetStream(context.cublas, stream)));
  // cuBLAS is column-major: W (n rows of pitch w_row_bytes / 2) is a k x n matrix A, x in the
  // workspace (m rows of k) a k x m matrix B, y (m rows of pitch y_stride) an n x m matrix C.
  // So C = Aᵀ · B.
  const float alpha = 1.0f;
  const float beta = 0.0f;
  const cudaDataType_t in_type = bf16 ? CUDA_R_16BF : CUDA_R_16F;
  TANDEM_CUDA_TRY(FromCublas(
      cublasGemmEx(context.cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(params.n),
                   static_cast<int>(params.m), static_cast<int>(params.k), &alpha, params.w,
                   in_type, static_cast<int>(RowBytesOf(params) / 2), context.workspace, in_type,
                   static_cast<int>(params.k), &beta, params.y, CUDA_R_32F,
                   static_cast<int>(params.y_stride), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)));
  return cudaGetLastError();
}

cudaError_t MatMul(const MatMulParams& params, const MatMulContext& context, cudaStream_t stream) {
  switch (SelectMatMulPath(params, context)) {
    case MatMulPath::kGemv:
      return MatMulGemv(params, stream);
    case MatMulPath::kCublas:
      return MatMulCublas(params, context, stream);
    case MatMulPath::kTiled:
      return MatMulTiled(params, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t MatMulShared(const MatMulParams* params, int count, const MatMulContext& context,
                         cudaStream_t stream) {
  if (count < 0 || (count > 0 && params == nullptr)) return cudaErrorInvalidValue;
  bool nothing = false;
  for (int j = 0; j < count; ++j) TANDEM_CUDA_TRY(Validate(params[j], &nothing));
  // One launch for all when they share the activations, run through the GEMV and have work.
  bool fuse = count >= 1 && count <= kMaxSharedProducts;
  for (int j = 0; j < count && fuse; ++j) {
    const MatMulParams& p = params[j];
    fuse = p.x == params[0].x && p.x_stride == params[0].x_stride && p.m == params[0].m &&
           p.k == params[0].k && p.w_type == params[0].w_type && p.n > 0 && p.m > 0 &&
           SelectMatMulPath(p, context) == MatMulPath::kGemv;
  }
  if (fuse) return RunGemv(params, count, stream);
  for (int j = 0; j < count; ++j) TANDEM_CUDA_TRY(MatMul(params[j], context, stream));
  return cudaSuccess;
}

}  // namespace tandem::cuda
