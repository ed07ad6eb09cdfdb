#include "engine/cuda/elementwise.h"

#include <cuda_fp16.h>

#include <climits>
#include <cstdint>

namespace tandem::cuda {
namespace {

constexpr int kWarpSize = 32;
// Threads of the kernels that stream rows without a reduction.
constexpr int kRowThreads = 256;
// Largest grid dimensions used (x and y).
constexpr int64_t kMaxGridX = INT_MAX;
constexpr int64_t kMaxGridY = 65535;
// The largest rotary_dim: a token's (cos θ, sin θ) pairs fit in shared memory (32 KiB).
constexpr int64_t kMaxRotaryDim = 8192;

// ---- Host helpers ----------------------------------------------------------------------------

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Rounds n up to a whole number of warps, within [32, max_threads].
unsigned WarpsFor(int64_t n, int max_threads) {
  const int64_t rounded = (n + kWarpSize - 1) / kWarpSize * kWarpSize;
  if (rounded < kWarpSize) return kWarpSize;
  return static_cast<unsigned>(rounded > max_threads ? max_threads : rounded);
}

unsigned GridX(int64_t items) {
  return static_cast<unsigned>(items < kMaxGridX ? items : kMaxGridX);
}

// ---- Device helpers --------------------------------------------------------------------------

// kVec floats, loaded and stored as one access (16 bytes for kVec = 4).
template <int kVec>
struct alignas(4 * kVec) Floats {
  float v[kVec];
};

template <int kVec>
__device__ __forceinline__ Floats<kVec> LoadFloats(const float* base, int64_t i) {
  return reinterpret_cast<const Floats<kVec>*>(base)[i];
}

template <int kVec>
__device__ __forceinline__ void StoreFloats(float* base, int64_t i, const Floats<kVec>& f) {
  reinterpret_cast<Floats<kVec>*>(base)[i] = f;
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

// The sum of v over the block, in every thread; blockDim.x a multiple of 32. The order of the
// additions depends only on blockDim.x, so a row's result does not depend on the batch.
__device__ float BlockSum(float v) {
  __shared__ float partial[32];
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  v = WarpSum(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = static_cast<int>(blockDim.x) / kWarpSize;
  const float total = WarpSum(lane < warps ? partial[lane] : 0.0f);  // every warp, the same sum
  __syncthreads();  // partial is free again for the next call
  return total;
}

__device__ __forceinline__ float HalfBitsToFloat(uint16_t bits) {
  return __half2float(__ushort_as_half(bits));
}

__device__ __forceinline__ uint16_t FloatToHalfBits(float f) {
  return __half_as_ushort(__float2half_rn(f));
}

// (cos θ, sin θ) with θ = position * inv_freq, in double as cpu::RopeCosSin computes them.
__device__ __forceinline__ float2 CosSin(int32_t position, float inv_freq) {
  const double theta = static_cast<double>(position) * static_cast<double>(inv_freq);
  double s, c;
  sincos(theta, &s, &c);
  return make_float2(static_cast<float>(c), static_cast<float>(s));
}

// Fills cs[0, half) with token t's (cos θ, sin θ), from the table when there is one. The caller
// synchronizes before reading.
__device__ __forceinline__ void TokenCosSin(int64_t t, int half, int32_t position,
                                            const float* inv_freq, const float* cos_sin,
                                            float2* cs) {
  for (int i = static_cast<int>(threadIdx.x); i < half; i += static_cast<int>(blockDim.x)) {
    if (cos_sin != nullptr) {
      const float* entry = cos_sin + (t * half + i) * 2;
      cs[i] = make_float2(entry[0], entry[1]);
    } else {
      cs[i] = CosSin(position, inv_freq[i]);
    }
  }
}

// (a, b) -> (a cos θ - b sin θ, a sin θ + b cos θ), every operation rounded on its own (no FMA),
// as the CPU's scalar loop computes it.
__device__ __forceinline__ float2 Rotate(float a, float b, float2 cs) {
  return make_float2(__fsub_rn(__fmul_rn(a, cs.x), __fmul_rn(b, cs.y)),
                     __fadd_rn(__fmul_rn(a, cs.y), __fmul_rn(b, cs.x)));
}

// The two elements of pair i within a head: (lo, lo + partner).
struct PairIndex {
  int lo;
  int hi;
};
__device__ __forceinline__ PairIndex Pair(RopeStyle style, int i, int half) {
  return style == RopeStyle::kInterleaved ? PairIndex{2 * i, 2 * i + 1} : PairIndex{i, i + half};
}

// ---- RmsNorm ---------------------------------------------------------------------------------

template <int kVec>
__global__ void RmsNormKernel(RmsNormParams p) {
  const int64_t vecs = p.dim / kVec;
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const float* x = p.x + row * p.x_stride;
    float* residual = p.residual != nullptr ? p.residual + row * p.residual_stride : nullptr;
    float* out = p.out + row * p.out_stride;
    float sum_sq = 0.0f;
    for (int64_t i = threadIdx.x; i < vecs; i += blockDim.x) {
      Floats<kVec> v = LoadFloats<kVec>(x, i);
      if (residual != nullptr) {
        const Floats<kVec> r = LoadFloats<kVec>(residual, i);
#pragma unroll
        for (int j = 0; j < kVec; ++j) v.v[j] = __fadd_rn(r.v[j], v.v[j]);
        StoreFloats<kVec>(residual, i, v);
      }
#pragma unroll
      for (int j = 0; j < kVec; ++j) sum_sq = fmaf(v.v[j], v.v[j], sum_sq);
    }
    const float total = BlockSum(sum_sq);
    const float inv =
        static_cast<float>(1.0 / sqrt(static_cast<double>(total) / static_cast<double>(p.dim) +
                                      static_cast<double>(p.eps)));
    // Each thread reads back only the elements it wrote above (residual) or read (x, which out
    // may alias), so no synchronization is needed.
    const float* src = residual != nullptr ? residual : x;
    for (int64_t i = threadIdx.x; i < vecs; i += blockDim.x) {
      Floats<kVec> v = LoadFloats<kVec>(src, i);
      const Floats<kVec> w = LoadFloats<kVec>(p.weight, i);
#pragma unroll
      for (int j = 0; j < kVec; ++j) v.v[j] = __fmul_rn(__fmul_rn(v.v[j], inv), w.v[j]);
      StoreFloats<kVec>(out, i, v);
    }
  }
}

// ---- RoPE ------------------------------------------------------------------------------------

__global__ void RopeKernel(RopeParams p) {
  extern __shared__ float2 rope_cs[];
  const int half = static_cast<int>(p.rotary_dim / 2);
  const int units = static_cast<int>(p.num_heads) * half;
  for (int64_t t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
    TokenCosSin(t, half, p.cos_sin != nullptr ? 0 : p.positions[t], p.inv_freq, p.cos_sin, rope_cs);
    __syncthreads();
    float* token = p.x + t * p.token_stride;
    for (int u = static_cast<int>(threadIdx.x); u < units; u += static_cast<int>(blockDim.x)) {
      const int h = u / half;
      const int i = u - h * half;
      float* head = token + h * p.head_stride;
      const PairIndex pair = Pair(p.style, i, half);
      const float2 r = Rotate(head[pair.lo], head[pair.hi], rope_cs[i]);
      head[pair.lo] = r.x;
      head[pair.hi] = r.y;
    }
    __syncthreads();  // rope_cs is rewritten for the next token
  }
}

__global__ void RopeCosSinKernel(RopeCosSinParams p) {
  const int64_t half = p.rotary_dim / 2;
  const int64_t n = p.num_tokens * half;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = k / half;
    const float2 cs = CosSin(p.positions[t], p.inv_freq[k - t * half]);
    p.cos_sin[2 * k] = cs.x;
    p.cos_sin[2 * k + 1] = cs.y;
  }
}

// ---- KV cache write --------------------------------------------------------------------------

// Cache elements: float, or IEEE half bits.
template <typename CacheT>
__device__ __forceinline__ CacheT ToCache(float f);
template <>
__device__ __forceinline__ float ToCache<float>(float f) {
  return f;
}
template <>
__device__ __forceinline__ uint16_t ToCache<uint16_t>(float f) {
  return FloatToHalfBits(f);
}

template <typename CacheT>
__global__ void WriteKvCacheKernel(KvCacheWriteParams p) {
  extern __shared__ float2 kv_cs[];
  const int head_dim = static_cast<int>(p.head_dim);
  const int heads = static_cast<int>(p.num_kv_heads);
  const int half = static_cast<int>(p.rotary_dim / 2);
  const int rotary_dim = 2 * half;
  const int plain = head_dim - rotary_dim;  // elements of K per head that do not rotate
  const int tid = static_cast<int>(threadIdx.x);
  const int threads = static_cast<int>(blockDim.x);
  for (int64_t t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
    const int32_t pos = p.token_pos[t];
    if (pos < 0) continue;  // padding; the same for the whole block
    const int64_t block =
        p.block_tables[p.token_seq[t] * p.max_blocks_per_seq + pos / p.block_size];
    const int64_t offset = block * p.block_stride + (pos % p.block_size) * p.token_stride;
    CacheT* k_cache = static_cast<CacheT*>(p.k_cache) + offset;
    CacheT* v_cache = static_cast<CacheT*>(p.v_cache) + offset;
    const float* k = p.k + t * p.k_stride;
    const float* v = p.v + t * p.v_stride;
    float* k_out = p.k_out != nullptr ? p.k_out + t * p.k_out_stride : nullptr;

    if (half > 0) {
      TokenCosSin(t, half, pos, p.inv_freq, p.cos_sin, kv_cs);
      __syncthreads();
      for (int u = tid; u < heads * half; u += threads) {
        const int g = u / half;
        const int i = u - g * half;
        const PairIndex pair = Pair(p.style, i, half);
        const float* head = k + g * head_dim;
        const float2 r = Rotate(head[pair.lo], head[pair.hi], kv_cs[i]);
        CacheT* dst = k_cache + g * p.kv_head_stride;
        dst[pair.lo] = ToCache<CacheT>(r.x);
        dst[pair.hi] = ToCache<CacheT>(r.y);
        if (k_out != nullptr) {
          k_out[g * head_dim + pair.lo] = r.x;
          k_out[g * head_dim + pair.hi] = r.y;
        }
      }
    }
    for (int u = tid; u < heads * plain; u += threads) {
      const int g = u / plain;
      const int d = rotary_dim + (u - g * plain);
      const float value = k[g * head_dim + d];
      k_cache[g * p.kv_head_stride + d] = ToCache<CacheT>(value);
      if (k_out != nullptr) k_out[g * head_dim + d] = value;
    }
    for (int u = tid; u < heads * head_dim; u += threads) {
      const int g = u / head_dim;
      const int d = u - g * head_dim;
      v_cache[g * p.kv_head_stride + d] = ToCache<CacheT>(v[u]);
    }
    if (half > 0) __syncthreads();  // kv_cs is rewritten for the next token
  }
}

// ---- SiluMul, Add, AddBias: rows streamed by a (rows, column chunks) grid ----------------------

// The rows and column chunks (of kVec floats each) of a [rows, vecs] grid-stride loop.
#define TANDEM_FOR_ROWS_AND_VECS(rows, vecs)                                                  \
  for (int64_t row = blockIdx.x; row < (rows); row += gridDim.x)                              \
    for (int64_t i = blockIdx.y * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (vecs); \
         i += static_cast<int64_t>(gridDim.y) * blockDim.x)

template <int kVec>
__global__ void SiluMulKernel(SiluMulParams p) {
  TANDEM_FOR_ROWS_AND_VECS(p.rows, p.dim / kVec) {
    const Floats<kVec> g = LoadFloats<kVec>(p.gate + row * p.gate_stride, i);
    const Floats<kVec> u = LoadFloats<kVec>(p.up + row * p.up_stride, i);
    Floats<kVec> o;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      // gate / (1 + exp(-gate)) * up, in the CPU's order.
      o.v[j] = __fmul_rn(__fdiv_rn(g.v[j], __fadd_rn(1.0f, expf(-g.v[j]))), u.v[j]);
    }
    StoreFloats<kVec>(p.out + row * p.out_stride, i, o);
  }
}

template <int kVec>
__global__ void AddKernel(AddParams p) {
  TANDEM_FOR_ROWS_AND_VECS(p.rows, p.dim / kVec) {
    const Floats<kVec> a = LoadFloats<kVec>(p.a + row * p.a_stride, i);
    const Floats<kVec> b = LoadFloats<kVec>(p.b + row * p.b_stride, i);
    Floats<kVec> o;
#pragma unroll
    for (int j = 0; j < kVec; ++j) o.v[j] = __fadd_rn(a.v[j], b.v[j]);
    StoreFloats<kVec>(p.out + row * p.out_stride, i, o);
  }
}

template <int kVec>
__global__ void AddBiasKernel(AddBiasParams p) {
  TANDEM_FOR_ROWS_AND_VECS(p.rows, p.dim / kVec) {
    float* y = p.y + row * p.y_stride;
    Floats<kVec> o = LoadFloats<kVec>(y, i);
    const Floats<kVec> b = LoadFloats<kVec>(p.bias, i);
#pragma unroll
    for (int j = 0; j < kVec; ++j) o.v[j] = __fadd_rn(o.v[j], b.v[j]);
    StoreFloats<kVec>(y, i, o);
  }
}

#undef TANDEM_FOR_ROWS_AND_VECS

// The launch shape of a [rows, vecs] stream.
struct RowGrid {
  dim3 grid;
  dim3 block;
};
RowGrid RowGridFor(int64_t rows, int64_t vecs) {
  const unsigned threads = WarpsFor(vecs, kRowThreads);
  const int64_t chunks = (vecs + threads - 1) / threads;
  return {dim3(GridX(rows), static_cast<unsigned>(chunks < kMaxGridY ? chunks : kMaxGridY)),
          dim3(threads)};
}

// ---- Embedding gather ------------------------------------------------------------------------

template <WeightType kType>
__device__ __forceinline__ float Dequantize(const unsigned char* row, int64_t i);

// The storage block of a quantized row that holds element i.
template <WeightType kType>
__device__ __forceinline__ const unsigned char* QuantBlock(const unsigned char* row, int64_t i) {
  return row + i / kWeightQuantBlock * WeightBlockBytes(kType);
}

template <>
__device__ __forceinline__ float Dequantize<WeightType::kF32>(const unsigned char* row, int64_t i) {
  return reinterpret_cast<const float*>(row)[i];
}
template <>
__device__ __forceinline__ float Dequantize<WeightType::kF16>(const unsigned char* row, int64_t i) {
  return HalfBitsToFloat(reinterpret_cast<const uint16_t*>(row)[i]);
}
template <>
__device__ __forceinline__ float Dequantize<WeightType::kBF16>(const unsigned char* row,
                                                               int64_t i) {
  return __uint_as_float(static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(row)[i]) << 16);
}
// Q8_0: d: f16; qs: int8[32].
template <>
__device__ __forceinline__ float Dequantize<WeightType::kQ8_0>(const unsigned char* row,
                                                               int64_t i) {
  const unsigned char* block = QuantBlock<WeightType::kQ8_0>(row, i);
  const float d = HalfBitsToFloat(*reinterpret_cast<const uint16_t*>(block));
  const int j = static_cast<int>(i % kWeightQuantBlock);
  return __fmul_rn(d, static_cast<float>(static_cast<signed char>(block[2 + j])));
}
// Element j of a 4-bit block: the low nibble of byte j for j < 16, else the high one of j - 16.
__device__ __forceinline__ int Nibble(const unsigned char* qs, int64_t i) {
  const int j = static_cast<int>(i % kWeightQuantBlock);
  return j < 16 ? (qs[j] & 0x0F) : (qs[j - 16] >> 4);
}
// Q4_0: d: f16; qs: uint8[16].
template <>
__device__ __forceinline__ float Dequantize<WeightType::kQ4_0>(const unsigned char* row,
                                                               int64_t i) {
  const unsigned char* block = QuantBlock<WeightType::kQ4_0>(row, i);
  const float d = HalfBitsToFloat(*reinterpret_cast<const uint16_t*>(block));
  return __fmul_rn(d, static_cast<float>(Nibble(block + 2, i) - 8));
}
// Q4_1: d: f16, m: f16; qs: uint8[16].
template <>
__device__ __forceinline__ float Dequantize<WeightType::kQ4_1>(const unsigned char* row,
                                                               int64_t i) {
  const unsigned char* block = QuantBlock<WeightType::kQ4_1>(row, i);
  const float d = HalfBitsToFloat(reinterpret_cast<const uint16_t*>(block)[0]);
  const float m = HalfBitsToFloat(reinterpret_cast<const uint16_t*>(block)[1]);
  const float q = static_cast<float>(Nibble(block + 4, i));
  return __fadd_rn(__fmul_rn(d, q), m);  // d * q + m, not fused, as DequantizeReference
}

template <WeightType kType>
__global__ void EmbeddingGatherKernel(EmbeddingGatherParams p, int64_t row_bytes) {
  for (int64_t t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
    const int32_t id = p.token_ids[t];
    float* out = p.out + t * p.out_stride;
    if (id < 0 || id >= p.vocab_size) {
      for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) out[i] = 0.0f;
      continue;
    }
    const unsigned char* row = static_cast<const unsigned char*>(p.table) + id * row_bytes;
    for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) {
      out[i] = Dequantize<kType>(row, i);
    }
  }
}

// Bytes of one table row of `dim` elements, or -1 when dim does not fit the type.
int64_t RowBytes(WeightType type, int64_t dim) {
  if (WeightBlockBytes(type) == 0 || dim % WeightBlockElements(type) != 0) return -1;
  return WeightRowBytes(type, dim);
}

template <WeightType kType>
cudaError_t LaunchEmbeddingGather(const EmbeddingGatherParams& p, int64_t row_bytes,
                                  cudaStream_t stream) {
  EmbeddingGatherKernel<kType>
      <<<GridX(p.num_tokens), WarpsFor(p.dim, kRowThreads), 0, stream>>>(p, row_bytes);
  return cudaGetLastError();
}

}  // namespace

// ---- Entry points ----------------------------------------------------------------------------

cudaError_t RmsNorm(const RmsNormParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.dim < 0) return cudaErrorInvalidValue;
  if (p.rows == 0 || p.dim == 0) return cudaSuccess;
  if (p.x == nullptr || p.weight == nullptr || p.out == nullptr) return cudaErrorInvalidValue;
  const bool vec4 =
      p.dim % 4 == 0 && p.x_stride % 4 == 0 && p.out_stride % 4 == 0 && Aligned16(p.x) &&
      Aligned16(p.out) && Aligned16(p.weight) &&
      (p.residual == nullptr || (p.residual_stride % 4 == 0 && Aligned16(p.residual)));
  // One block per row, a thread per 16-byte (or 4-byte) piece up to 1024 threads.
  if (vec4) {
    RmsNormKernel<4><<<GridX(p.rows), WarpsFor(p.dim / 4, 1024), 0, stream>>>(p);
  } else {
    RmsNormKernel<1><<<GridX(p.rows), WarpsFor(p.dim, 1024), 0, stream>>>(p);
  }
  return cudaGetLastError();
}

cudaError_t Rope(const RopeParams& p, cudaStream_t stream) {
  if (p.num_tokens < 0 || p.num_heads < 0 || p.rotary_dim < 0 || p.rotary_dim % 2 != 0 ||
      p.rotary_dim > p.head_dim || p.rotary_dim > kMaxRotaryDim ||
      p.num_heads * (p.rotary_dim / 2) > INT_MAX) {
    return cudaErrorInvalidValue;
  }
  if (p.num_tokens == 0 || p.num_heads == 0 || p.rotary_dim == 0) return cudaSuccess;
  if (p.x == nullptr ||
      (p.cos_sin == nullptr && (p.positions == nullptr || p.inv_freq == nullptr))) {
    return cudaErrorInvalidValue;
  }
  const int64_t half = p.rotary_dim / 2;
  RopeKernel<<<GridX(p.num_tokens), WarpsFor(p.num_heads * half, kRowThreads),
               static_cast<size_t>(half) * sizeof(float2), stream>>>(p);
  return cudaGetLastError();
}

cudaError_t RopeCosSin(const RopeCosSinParams& p, cudaStream_t stream) {
  if (p.num_tokens < 0 || p.rotary_dim < 0 || p.rotary_dim % 2 != 0) return cudaErrorInvalidValue;
  const int64_t n = p.num_tokens * (p.rotary_dim / 2);
  if (n == 0) return cudaSuccess;
  if (p.positions == nullptr || p.inv_freq == nullptr || p.cos_sin == nullptr) {
    return cudaErrorInvalidValue;
  }
  const int64_t blocks = (n + kRowThreads - 1) / kRowThreads;
  RopeCosSinKernel<<<GridX(blocks), kRowThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t WriteKvCache(const KvCacheWriteParams& p, cudaStream_t stream) {
  if (p.num_tokens < 0 || p.num_kv_heads < 0 || p.head_dim < 0 || p.rotary_dim < 0 ||
      p.rotary_dim % 2 != 0 || p.rotary_dim > p.head_dim || p.rotary_dim > kMaxRotaryDim ||
      p.num_kv_heads * p.head_dim > INT_MAX) {
    return cudaErrorInvalidValue;
  }
  if (p.cache_type != KvCacheType::kF32 && p.cache_type != KvCacheType::kF16) {
    return cudaErrorInvalidValue;
  }
  if (p.num_tokens == 0 || p.num_kv_heads == 0 || p.head_dim == 0) return cudaSuccess;
  if (p.k == nullptr || p.v == nullptr || p.k_cache == nullptr || p.v_cache == nullptr ||
      p.block_tables == nullptr || p.token_seq == nullptr || p.token_pos == nullptr ||
      p.block_size <= 0) {
    return cudaErrorInvalidValue;
  }
  if (p.rotary_dim > 0 && p.cos_sin == nullptr && p.inv_freq == nullptr) {
    return cudaErrorInvalidValue;
  }
  const unsigned threads = WarpsFor(p.num_kv_heads * p.head_dim, kRowThreads);
  const size_t shared = static_cast<size_t>(p.rotary_dim / 2) * sizeof(float2);
  if (p.cache_type == KvCacheType::kF16) {
    WriteKvCacheKernel<uint16_t><<<GridX(p.num_tokens), threads, shared, stream>>>(p);
  } else {
    WriteKvCacheKernel<float><<<GridX(p.num_tokens), threads, shared, stream>>>(p);
  }
  return cudaGetLastError();
}

cudaError_t SiluMul(const SiluMulParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.dim < 0) return cudaErrorInvalidValue;
  if (p.rows == 0 || p.dim == 0) return cudaSuccess;
  if (p.gate == nullptr || p.up == nullptr || p.out == nullptr) return cudaErrorInvalidValue;
  const bool vec4 = p.dim % 4 == 0 && p.gate_stride % 4 == 0 && p.up_stride % 4 == 0 &&
                    p.out_stride % 4 == 0 && Aligned16(p.gate) && Aligned16(p.up) &&
                    Aligned16(p.out);
  const RowGrid g = RowGridFor(p.rows, vec4 ? p.dim / 4 : p.dim);
  if (vec4) {
    SiluMulKernel<4><<<g.grid, g.block, 0, stream>>>(p);
  } else {
    SiluMulKernel<1><<<g.grid, g.block, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

cudaError_t EmbeddingGather(const EmbeddingGatherParams& p, cudaStream_t stream) {
  const int64_t row_bytes = RowBytes(p.type, p.dim);
  if (p.num_tokens < 0 || p.dim < 0 || p.vocab_size < 0 || row_bytes < 0) {
    return cudaErrorInvalidValue;
  }
  if (p.num_tokens == 0 || p.dim == 0) return cudaSuccess;
  if (p.token_ids == nullptr || p.out == nullptr || (p.table == nullptr && p.vocab_size > 0)) {
    return cudaErrorInvalidValue;
  }
  switch (p.type) {
    case WeightType::kF32:
      return LaunchEmbeddingGather<WeightType::kF32>(p, row_bytes, stream);
    case WeightType::kF16:
      return LaunchEmbeddingGather<WeightType::kF16>(p, row_bytes, stream);
    case WeightType::kBF16:
      return LaunchEmbeddingGather<WeightType::kBF16>(p, row_bytes, stream);
    case WeightType::kQ8_0:
      return LaunchEmbeddingGather<WeightType::kQ8_0>(p, row_bytes, stream);
    case WeightType::kQ4_0:
      return LaunchEmbeddingGather<WeightType::kQ4_0>(p, row_bytes, stream);
    case WeightType::kQ4_1:
      return LaunchEmbeddingGather<WeightType::kQ4_1>(p, row_bytes, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t AddBias(const AddBiasParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.dim < 0) return cudaErrorInvalidValue;
  if (p.rows == 0 || p.dim == 0) return cudaSuccess;
  if (p.y == nullptr || p.bias == nullptr) return cudaErrorInvalidValue;
  const bool vec4 = p.dim % 4 == 0 && p.y_stride % 4 == 0 && Aligned16(p.y) && Aligned16(p.bias);
  const RowGrid g = RowGridFor(p.rows, vec4 ? p.dim / 4 : p.dim);
  if (vec4) {
    AddBiasKernel<4><<<g.grid, g.block, 0, stream>>>(p);
  } else {
    AddBiasKernel<1><<<g.grid, g.block, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

cudaError_t Add(const AddParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.dim < 0) return cudaErrorInvalidValue;
  if (p.rows == 0 || p.dim == 0) return cudaSuccess;
  if (p.a == nullptr || p.b == nullptr || p.out == nullptr) return cudaErrorInvalidValue;
  const bool vec4 = p.dim % 4 == 0 && p.a_stride % 4 == 0 && p.b_stride % 4 == 0 &&
                    p.out_stride % 4 == 0 && Aligned16(p.a) && Aligned16(p.b) && Aligned16(p.out);
  const RowGrid g = RowGridFor(p.rows, vec4 ? p.dim / 4 : p.dim);
  if (vec4) {
    AddKernel<4><<<g.grid, g.block, 0, stream>>>(p);
  } else {
    AddKernel<1><<<g.grid, g.block, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace tandem::cuda
