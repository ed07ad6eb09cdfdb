#include "engine/cuda/paged_attention.h"

#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace tandem::cuda {
namespace {

constexpr int kThreads = 128;  // per thread block: 4 warps
constexpr int kWarps = kThreads / 32;
constexpr int kKeys = kAttentionKeysPerTile;
constexpr float kLog2e = 1.4426950408889634f;
constexpr size_t kWorkspaceAlign = 256;

// How a tile of ROWS rows and head dim D is spread over the 128 threads. Warp w owns rows
// [w * kRowsPerWarp, (w + 1) * kRowsPerWarp) in every phase (scores, softmax, P·V), so after the
// K/V tile is in shared memory each warp runs on its own (__syncwarp only) and may skip the tile.
template <int D, int ROWS>
struct TileShape {
  static constexpr int kRowsPerWarp = ROWS / kWarps;  // 16 (wide) or 4 (narrow)
  static constexpr int kStride = D + 4;               // floats per row of q_s, k_s, v_s (banks)
  static constexpr int kPStride = kKeys + 1;          // floats per row of p_s

  // Scores: a thread computes kSr rows x kSk keys: rows tr * kSr + i, keys tk + j * kTk.
  static constexpr int kSk = ROWS == kAttentionWideRows ? 4 : 2;
  static constexpr int kTk = kKeys / kSk;
  static constexpr int kTr = kThreads / kTk;
  static constexpr int kSr = ROWS / kTr;
  // P·V: a thread owns kOr rows x kOd dims: rows to * kOr + i, dims (td + c * kTd) * 4 + 0..3.
  static constexpr int kOd = (ROWS == kAttentionNarrowRows && D == 64) ? 4 : 8;
  static constexpr int kTd = D / kOd;
  static constexpr int kTo = kThreads / kTd;
  static constexpr int kOr = ROWS / kTo;
  // Softmax: kTpr consecutive lanes per row.
  static constexpr int kTpr = kThreads / ROWS;

  static_assert(ROWS % kWarps == 0 && kTr * kSr == ROWS && kTo * kOr == ROWS);
  static_assert(32 / kTk * kSr == kRowsPerWarp, "score rows must stay within a warp");
  static_assert(32 / kTd * kOr == kRowsPerWarp, "output rows must stay within a warp");
  static_assert(32 / kTpr == kRowsPerWarp, "softmax rows must stay within a warp");
  static_assert(kOd % 4 == 0 && D % 4 == 0);

  // Shared memory, in floats: q_s [ROWS][kStride] | k_s, v_s [kKeys][kStride] | p_s
  // [ROWS][kPStride] | row_m, row_l, row_alpha [ROWS] | row_pos [ROWS] (int).
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + ROWS * kStride;
  static constexpr int kV = kK + kKeys * kStride;
  static constexpr int kP = kV + kKeys * kStride;
  static constexpr int kM = kP + ROWS * kPStride;
  static constexpr int kL = kM + ROWS;
  static constexpr int kAlpha = kL + ROWS;
  static constexpr int kPos = kAlpha + ROWS;
  static constexpr size_t kSmemBytes = static_cast<size_t>(kPos + ROWS) * sizeof(float);
};

__device__ __forceinline__ float* SharedFloats() {
  extern __shared__ float4 tandem_paged_attention_smem[];
  return reinterpret_cast<float*>(tandem_paged_attention_smem);
}

// Two IEEE halves (element 0 in the low bits) as floats.
__device__ __forceinline__ float2 HalfPair(uint32_t w) {
  return make_float2(__half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xffffu))),
                     __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16))));
}

__device__ __forceinline__ float4 AsFloat4(uint4 u) {
  return make_float4(__uint_as_float(u.x), __uint_as_float(u.y), __uint_as_float(u.z),
                     __uint_as_float(u.w));
}

__device__ __forceinline__ void StoreFloat4(float* at, float4 v) {
  *reinterpret_cast<float4*>(at) = v;
}

__device__ __forceinline__ float4 LoadFloat4(const float* at) {
  return *reinterpret_cast<const float4*>(at);
}

// Thread blocks per multiprocessor the register budget is cut for (at most 128 registers for
// four): narrow tiles (decode, memory bound) want several resident blocks to keep loads in
// flight. An F32 cache with head_dim 128 holds 64 prefetch registers per thread and spills below
// ~180, so it gets two; wide tiles are bound by shared memory to two (D = 128) anyway.
constexpr int MinBlocksPerSm(int d, int rows, bool f16) {
  return rows != kAttentionNarrowRows ? 1 : (f16 || d == 64) ? 4 : 2;
}

// One tile of rows (blockIdx.x: its work item) for one KV head (blockIdx.y) over the item's KV
// range, FlashAttention-2 style. kF16: the cache holds IEEE halves, else floats.
template <int D, int ROWS, bool kF16>
__global__ void __launch_bounds__(kThreads, MinBlocksPerSm(D, ROWS, kF16))
    AttendTilesKernel(const PagedAttentionParams p, const AttentionWorkItem* __restrict__ items,
                      float* __restrict__ partial_acc, float* __restrict__ partial_ml,
                      float scale_log2) {
  using S = TileShape<D, ROWS>;
  float* const smem = SharedFloats();
  float* const q_s = smem + S::kQ;
  float* const k_s = smem + S::kK;
  float* const v_s = smem + S::kV;
  float* const p_s = smem + S::kP;
  float* const row_m = smem + S::kM;
  float* const row_l = smem + S::kL;
  float* const row_alpha = smem + S::kAlpha;
  int* const row_pos = reinterpret_cast<int*>(smem + S::kPos);

  const AttentionWorkItem item = items[blockIdx.x];
  const int g = static_cast<int>(blockIdx.y);
  const int group = static_cast<int>(p.num_heads / p.num_kv_heads);
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;

  // The rows: positions (-1 for padding rows, which every key masks) and the scaled queries.
  for (int r = tid; r < ROWS; r += kThreads) {
    int pos = -1;
    if (r < item.rows) pos = p.token_pos[item.first_token + (item.row_begin + r) / group];
    row_pos[r] = pos;
    row_m[r] = -INFINITY;
    row_l[r] = 0.0f;
  }
  for (int e = tid; e < ROWS * D; e += kThreads) {
    const int r = e / D;
    const int d = e % D;
    float x = 0.0f;
    if (r < item.rows) {
      const int f = item.row_begin + r;
      const int64_t t = item.first_token + f / group;
      const int64_t h = static_cast<int64_t>(g) * group + f % group;
      x = p.q[t * p.q_token_stride + h * D + d] * scale_log2;
    }
    q_s[r * S::kStride + d] = x;
  }

  // K/V tiles: 16-byte loads, consecutive threads along a key's head_dim (coalesced), held in
  // registers while the previous tile is computed.
  constexpr int kElementBytes = kF16 ? 2 : 4;
  constexpr int kVec = 16 / kElementBytes;  // elements per load
  constexpr int kChunksPerKey = D / kVec;
  constexpr int kLoads = kKeys * kChunksPerKey / kThreads;
  static_assert(kKeys * kChunksPerKey % kThreads == 0);
  const char* const k_head = static_cast<const char*>(p.k_cache) +
                             static_cast<int64_t>(g) * p.kv_head_stride * kElementBytes;
  const char* const v_head = static_cast<const char*>(p.v_cache) +
                             static_cast<int64_t>(g) * p.kv_head_stride * kElementBytes;
  const int32_t* const table =
      p.block_tables + static_cast<int64_t>(item.seq) * p.max_blocks_per_seq;
  const int block_size = static_cast<int>(p.block_size);  // positions are int32
  uint4 k_reg[kLoads];
  uint4 v_reg[kLoads];
  auto load_tile = [&](int start) {
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int c = tid + i * kThreads;
      const int pos = start + c / kChunksPerKey;
      if (pos < item.kv_end) {
        const int64_t block = table[pos / block_size];
        const int64_t element = block * p.block_stride + (pos % block_size) * p.token_stride +
                                (c % kChunksPerKey) * kVec;
        k_reg[i] = __ldg(reinterpret_cast<const uint4*>(k_head + element * kElementBytes));
        v_reg[i] = __ldg(reinterpret_cast<const uint4*>(v_head + element * kElementBytes));
      } else {
        // Past the range: zeros, never the cache (its slots there may hold anything).
        k_reg[i] = make_uint4(0, 0, 0, 0);
        v_reg[i] = make_uint4(0, 0, 0, 0);
      }
    }
  };
  auto store_tile = [&]() {
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int c = tid + i * kThreads;
      const int at = (c / kChunksPerKey) * S::kStride + (c % kChunksPerKey) * kVec;
      if constexpr (kF16) {
        const float2 k0 = HalfPair(k_reg[i].x), k1 = HalfPair(k_reg[i].y);
        const float2 k2 = HalfPair(k_reg[i].z), k3 = HalfPair(k_reg[i].w);
        const float2 v0 = HalfPair(v_reg[i].x), v1 = HalfPair(v_reg[i].y);
        const float2 v2 = HalfPair(v_reg[i].z), v3 = HalfPair(v_reg[i].w);
        StoreFloat4(k_s + at, make_float4(k0.x, k0.y, k1.x, k1.y));
        StoreFloat4(k_s + at + 4, make_float4(k2.x, k2.y, k3.x, k3.y));
        StoreFloat4(v_s + at, make_float4(v0.x, v0.y, v1.x, v1.y));
        StoreFloat4(v_s + at + 4, make_float4(v2.x, v2.y, v3.x, v3.y));
      } else {
        StoreFloat4(k_s + at, AsFloat4(k_reg[i]));
        StoreFloat4(v_s + at, AsFloat4(v_reg[i]));
      }
    }
  };

  __syncthreads();  // row_pos, row_m, row_l, q_s
  // The largest position among this warp's rows: key tiles past it are skipped by the warp.
  int warp_max_pos = -1;
  for (int r = warp * S::kRowsPerWarp; r < (warp + 1) * S::kRowsPerWarp; ++r) {
    warp_max_pos = max(warp_max_pos, row_pos[r]);
  }

  const int tk = tid % S::kTk;  // scores
  const int tr = tid / S::kTk;
  const int srow = tid / S::kTpr;  // softmax
  const int spart = tid % S::kTpr;
  const int td = tid % S::kTd;  // P·V
  const int to = tid / S::kTd;
  float acc[S::kOr][S::kOd];
#pragma unroll
  for (int i = 0; i < S::kOr; ++i) {
#pragma unroll
    for (int k = 0; k < S::kOd; ++k) acc[i][k] = 0.0f;
  }

  if (item.kv_begin < item.kv_end) load_tile(item.kv_begin);
  for (int start = item.kv_begin; start < item.kv_end; start += kKeys) {
    __syncthreads();  // every warp is done with the previous tile's k_s, v_s, p_s
    store_tile();
    __syncthreads();
    if (start + kKeys < item.kv_end) load_tile(start + kKeys);
    if (start > warp_max_pos) continue;  // warp-uniform: no row of this warp sees these keys

    // Scores (log2 domain) into p_s, -inf where masked.
    {
      float s[S::kSr][S::kSk];
#pragma unroll
      for (int i = 0; i < S::kSr; ++i) {
#pragma unroll
        for (int j = 0; j < S::kSk; ++j) s[i][j] = 0.0f;
      }
#pragma unroll 4
      for (int d = 0; d < D; d += 4) {
        float4 qv[S::kSr];
        float4 kv[S::kSk];
#pragma unroll
        for (int i = 0; i < S::kSr; ++i) {
          qv[i] = LoadFloat4(q_s + (tr * S::kSr + i) * S::kStride + d);
        }
#pragma unroll
        for (int j = 0; j < S::kSk; ++j) {
          kv[j] = LoadFloat4(k_s + (tk + j * S::kTk) * S::kStride + d);
        }
#pragma unroll
        for (int i = 0; i < S::kSr; ++i) {
#pragma unroll
          for (int j = 0; j < S::kSk; ++j) {
            s[i][j] = fmaf(qv[i].x, kv[j].x, s[i][j]);
            s[i][j] = fmaf(qv[i].y, kv[j].y, s[i][j]);
            s[i][j] = fmaf(qv[i].z, kv[j].z, s[i][j]);
            s[i][j] = fmaf(qv[i].w, kv[j].w, s[i][j]);
          }
        }
      }
#pragma unroll
      for (int i = 0; i < S::kSr; ++i) {
        const int r = tr * S::kSr + i;
        const int limit = min(row_pos[r], item.kv_end - 1);
#pragma unroll
        for (int j = 0; j < S::kSk; ++j) {
          const int key = tk + j * S::kTk;
          p_s[r * S::kPStride + key] = start + key <= limit ? s[i][j] : -INFINITY;
        }
      }
    }
    __syncwarp();

    // Online softmax per row: new max, rescale factor, probabilities in place, running sum.
    {
      float* const row = p_s + srow * S::kPStride;
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = spart; j < kKeys; j += S::kTpr) tile_max = fmaxf(tile_max, row[j]);
#pragma unroll
      for (int off = S::kTpr / 2; off > 0; off /= 2) {
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, off));
      }
      const float old_max = row_m[srow];
      const float new_max = fmaxf(old_max, tile_max);
      // Still -inf: every key so far is masked for this row; its probabilities and sum stay 0.
      const float base = new_max == -INFINITY ? 0.0f : new_max;
      float sum = 0.0f;
#pragma unroll
      for (int j = spart; j < kKeys; j += S::kTpr) {
        const float e = exp2f(row[j] - base);
        row[j] = e;
        sum += e;
      }
#pragma unroll
      for (int off = S::kTpr / 2; off > 0; off /= 2) {
        sum += __shfl_xor_sync(0xffffffffu, sum, off);
      }
      if (spart == 0) {
        const float alpha = exp2f(old_max - base);  // 0 while old_max is -inf
        row_alpha[srow] = alpha;
        row_l[srow] = row_l[srow] * alpha + sum;
        row_m[srow] = new_max;
      }
    }
    __syncwarp();

    // acc = acc * alpha + P · V.
    {
#pragma unroll
      for (int i = 0; i < S::kOr; ++i) {
        const float alpha = row_alpha[to * S::kOr + i];
#pragma unroll
        for (int k = 0; k < S::kOd; ++k) acc[i][k] *= alpha;
      }
#pragma unroll 4
      for (int j = 0; j < kKeys; ++j) {
        float pr[S::kOr];
#pragma unroll
        for (int i = 0; i < S::kOr; ++i) pr[i] = p_s[(to * S::kOr + i) * S::kPStride + j];
#pragma unroll
        for (int c = 0; c < S::kOd / 4; ++c) {
          const float4 v = LoadFloat4(v_s + j * S::kStride + (td + c * S::kTd) * 4);
#pragma unroll
          for (int i = 0; i < S::kOr; ++i) {
            acc[i][c * 4 + 0] = fmaf(pr[i], v.x, acc[i][c * 4 + 0]);
            acc[i][c * 4 + 1] = fmaf(pr[i], v.y, acc[i][c * 4 + 1]);
            acc[i][c * 4 + 2] = fmaf(pr[i], v.z, acc[i][c * 4 + 2]);
            acc[i][c * 4 + 3] = fmaf(pr[i], v.w, acc[i][c * 4 + 3]);
          }
        }
      }
    }
  }
  __syncwarp();  // row_m, row_l of this warp's rows (written by other lanes)

  // The rows' results: normalized into `out`, or a chunk's partial (accumulators, max, sum).
#pragma unroll
  for (int i = 0; i < S::kOr; ++i) {
    const int r = to * S::kOr + i;
    if (r >= item.rows) continue;
    const float l = row_l[r];
    if (item.partial < 0) {
      const int f = item.row_begin + r;
      const int64_t t = item.first_token + f / group;
      const int64_t h = static_cast<int64_t>(g) * group + f % group;
      float* const out = p.out + t * p.out_token_stride + h * D;
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
      for (int c = 0; c < S::kOd / 4; ++c) {
        const int d = (td + c * S::kTd) * 4;
        out[d + 0] = acc[i][c * 4 + 0] * inv;
        out[d + 1] = acc[i][c * 4 + 1] * inv;
        out[d + 2] = acc[i][c * 4 + 2] * inv;
        out[d + 3] = acc[i][c * 4 + 3] * inv;
      }
    } else {
      const int64_t slot = static_cast<int64_t>(item.partial + r) * p.num_kv_heads + g;
#pragma unroll
      for (int c = 0; c < S::kOd / 4; ++c) {
        const int d = (td + c * S::kTd) * 4;
        StoreFloat4(partial_acc + slot * D + d, make_float4(acc[i][c * 4 + 0], acc[i][c * 4 + 1],
                                                            acc[i][c * 4 + 2], acc[i][c * 4 + 3]));
      }
      if (td == 0) {
        partial_ml[slot * 2 + 0] = row_m[r];
        partial_ml[slot * 2 + 1] = l;
      }
    }
  }
}

// Merges the chunks of split tiles: one warp per (merge row, KV head = blockIdx.y).
template <int D>
__global__ void __launch_bounds__(kThreads)
    MergeChunksKernel(const PagedAttentionParams p, const AttentionMergeRow* __restrict__ rows,
                      int num_rows, const float* __restrict__ partial_acc,
                      const float* __restrict__ partial_ml) {
  const int i = static_cast<int>(blockIdx.x) * kWarps + static_cast<int>(threadIdx.x) / 32;
  if (i >= num_rows) return;  // whole warps
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int g = static_cast<int>(blockIdx.y);
  const AttentionMergeRow row = rows[i];
  auto slot_of = [&](int c) {
    return static_cast<int64_t>(row.first_partial + c * row.chunk_stride) * p.num_kv_heads + g;
  };
  float best = -INFINITY;
  for (int c = 0; c < row.num_chunks; ++c) best = fmaxf(best, partial_ml[slot_of(c) * 2]);
  constexpr int kPerLane = D / 32;
  float acc[kPerLane] = {};
  float sum = 0.0f;
  for (int c = 0; c < row.num_chunks; ++c) {
    const int64_t slot = slot_of(c);
    const float m = partial_ml[slot * 2];
    if (m == -INFINITY) continue;  // a chunk wholly after this row's position
    const float w = exp2f(m - best);
    sum += w * partial_ml[slot * 2 + 1];
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) acc[k] += w * partial_acc[slot * D + lane + 32 * k];
  }
  const int group = static_cast<int>(p.num_heads / p.num_kv_heads);
  const int64_t h = static_cast<int64_t>(g) * group + row.head_in_group;
  float* const out = p.out + static_cast<int64_t>(row.token) * p.out_token_stride + h * D;
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) out[lane + 32 * k] = acc[k] * inv;
}

template <int D, int ROWS, bool kF16>
cudaError_t LaunchTiles(const PagedAttentionParams& p, const AttentionWorkItem* items, size_t n,
                        float* partial_acc, float* partial_ml, float scale_log2,
                        cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  constexpr size_t kSmem = TileShape<D, ROWS>::kSmemBytes;
  auto* kernel = &AttendTilesKernel<D, ROWS, kF16>;
  TANDEM_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kSmem)));
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(p.num_kv_heads));
  kernel<<<grid, kThreads, kSmem, stream>>>(p, items, partial_acc, partial_ml, scale_log2);
  return cudaGetLastError();
}

template <int D, bool kF16>
cudaError_t Run(const PagedAttentionParams& p, const AttentionPlan& plan, char* ws,
                cudaStream_t stream) {
  const float scale = p.scale != 0.0f ? p.scale : 1.0f / std::sqrt(static_cast<float>(D));
  float* const partial_acc = reinterpret_cast<float*>(ws + plan.partial_acc_offset);
  float* const partial_ml = reinterpret_cast<float*>(ws + plan.partial_ml_offset);
  // Wide tiles first: they are the longest.
  TANDEM_CUDA_TRY((LaunchTiles<D, kAttentionWideRows, kF16>(
      p, reinterpret_cast<const AttentionWorkItem*>(ws + plan.wide_offset), plan.wide_items.size(),
      partial_acc, partial_ml, scale * kLog2e, stream)));
  TANDEM_CUDA_TRY((LaunchTiles<D, kAttentionNarrowRows, kF16>(
      p, reinterpret_cast<const AttentionWorkItem*>(ws + plan.narrow_offset),
      plan.narrow_items.size(), partial_acc, partial_ml, scale * kLog2e, stream)));
  if (plan.merge_rows.empty()) return cudaSuccess;
  const int num_rows = static_cast<int>(plan.merge_rows.size());
  const dim3 grid(BlocksFor(num_rows, kWarps), static_cast<unsigned>(p.num_kv_heads));
  MergeChunksKernel<D><<<grid, kThreads, 0, stream>>>(
      p, reinterpret_cast<const AttentionMergeRow*>(ws + plan.merge_offset), num_rows, partial_acc,
      partial_ml);
  return cudaGetLastError();
}

bool SupportedHeadDim(int64_t head_dim) { return head_dim == 64 || head_dim == 128; }

int64_t RoundUp(int64_t x, int64_t multiple) { return (x + multiple - 1) / multiple * multiple; }

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// A tile before the split: rows [row_begin, row_begin + rows) of the segment at first_token.
struct Tile {
  int32_t seq;
  int32_t first_token;
  int32_t row_begin;
  int32_t rows;
  int32_t len;  // KV range [0, len)
  bool wide;
};

}  // namespace

cudaError_t PlanAttention(const AttentionPlanInput& in, const AttentionPlanOptions& options,
                          AttentionPlan* plan) {
  if (plan == nullptr || in.num_tokens < 0 || in.num_heads <= 0 || in.num_kv_heads <= 0 ||
      in.num_kv_heads > 65535 || in.num_heads % in.num_kv_heads != 0 ||
      !SupportedHeadDim(in.head_dim) || options.num_sms < 1 || options.ctas_per_sm < 1 ||
      options.min_kv_chunk < 1) {
    return cudaErrorInvalidValue;
  }
  if (in.num_tokens > 0 && (in.token_seq == nullptr || in.token_pos == nullptr)) {
    return cudaErrorInvalidValue;
  }
  const int64_t group = in.num_heads / in.num_kv_heads;
  // Rows of a segment are int32 on the device.
  if (in.num_tokens * group > std::numeric_limits<int32_t>::max()) return cudaErrorInvalidValue;
  for (int64_t t = 0; t < in.num_tokens; ++t) {
    if (in.token_seq[t] < 0 || in.token_pos[t] < 0 ||
        in.token_pos[t] == std::numeric_limits<int32_t>::max()) {
      return cudaErrorInvalidValue;
    }
  }

  *plan = AttentionPlan{};
  plan->num_tokens = in.num_tokens;
  plan->num_heads = in.num_heads;
  plan->num_kv_heads = in.num_kv_heads;
  plan->head_dim = in.head_dim;

  // 1. Segments and their tiles.
  std::vector<Tile> tiles;
  int32_t max_len = 0;
  for (int64_t t = 0; t < in.num_tokens;) {
    int64_t end = t + 1;
    while (end < in.num_tokens && in.token_seq[end] == in.token_seq[t]) ++end;
    const int64_t rows = (end - t) * group;
    const bool wide = rows > kAttentionNarrowRows;
    const int64_t per_tile = wide ? kAttentionWideRows : kAttentionNarrowRows;
    for (int64_t begin = 0; begin < rows; begin += per_tile) {
      Tile tile{};
      tile.seq = in.token_seq[t];
      tile.first_token = static_cast<int32_t>(t);
      tile.row_begin = static_cast<int32_t>(begin);
      tile.rows = static_cast<int32_t>(std::min(per_tile, rows - begin));
      tile.wide = wide;
      for (int64_t u = t + begin / group; u <= t + (begin + tile.rows - 1) / group; ++u) {
        tile.len = std::max(tile.len, in.token_pos[u] + 1);
      }
      max_len = std::max(max_len, tile.len);
      tiles.push_back(tile);
    }
    t = end;
  }

  // 2. The split: the smallest chunk (a multiple of kKeys, >= min_kv_chunk) that keeps the grid
  // within the target, when the tiles alone fall short of it.
  const int64_t kv_heads = in.num_kv_heads;
  const int64_t target = static_cast<int64_t>(options.num_sms) * options.ctas_per_sm;
  const int64_t min_chunk = RoundUp(options.min_kv_chunk, kKeys);
  const int64_t base = static_cast<int64_t>(tiles.size()) * kv_heads;
  if (base < target && max_len > min_chunk) {
    auto blocks_for = [&](int64_t chunk) {
      int64_t n = 0;
      for (const Tile& tile : tiles) n += (tile.len + chunk - 1) / chunk;
      return n * kv_heads;
    };
    // In multiples of kKeys: blocks_for(hi * kKeys) == base < target.
    int64_t lo = min_chunk / kKeys;
    int64_t hi = RoundUp(max_len, kKeys) / kKeys;
    if (blocks_for(lo * kKeys) > target) {
      while (hi - lo > 1) {  // blocks_for(lo) > target >= blocks_for(hi)
        const int64_t mid = lo + (hi - lo) / 2;
        (blocks_for(mid * kKeys) > target ? lo : hi) = mid;
      }
      lo = hi;
    }
    if (lo * kKeys < max_len) plan->kv_chunk = lo * kKeys;
  }

  // 3. Work items (and merge rows for the split tiles).
  for (const Tile& tile : tiles) {
    const int64_t chunk = plan->kv_chunk > 0 ? plan->kv_chunk : tile.len;
    const int64_t chunks = (tile.len + chunk - 1) / chunk;
    std::vector<AttentionWorkItem>& items = tile.wide ? plan->wide_items : plan->narrow_items;
    const int64_t first_partial = plan->partial_rows;
    for (int64_t c = 0; c < chunks; ++c) {
      AttentionWorkItem item;
      item.seq = tile.seq;
      item.first_token = tile.first_token;
      item.row_begin = tile.row_begin;
      item.rows = tile.rows;
      item.kv_begin = static_cast<int32_t>(c * chunk);
      item.kv_end = static_cast<int32_t>(std::min<int64_t>(tile.len, (c + 1) * chunk));
      item.partial = chunks == 1 ? -1 : static_cast<int32_t>(first_partial + c * tile.rows);
      items.push_back(item);
    }
    if (chunks == 1) continue;
    plan->partial_rows += chunks * tile.rows;
    for (int32_t r = 0; r < tile.rows; ++r) {
      const int64_t f = tile.row_begin + r;
      AttentionMergeRow row;
      row.token = static_cast<int32_t>(tile.first_token + f / group);
      row.head_in_group = static_cast<int32_t>(f % group);
      row.first_partial = static_cast<int32_t>(first_partial + r);
      row.num_chunks = static_cast<int32_t>(chunks);
      row.chunk_stride = tile.rows;
      plan->merge_rows.push_back(row);
    }
  }
  auto longest_first = [](const AttentionWorkItem& a, const AttentionWorkItem& b) {
    return a.kv_end - a.kv_begin > b.kv_end - b.kv_begin;
  };
  std::stable_sort(plan->wide_items.begin(), plan->wide_items.end(), longest_first);
  std::stable_sort(plan->narrow_items.begin(), plan->narrow_items.end(), longest_first);

  // 4. The workspace.
  size_t bytes = 0;
  auto take = [&bytes](size_t n) {
    const size_t at = bytes;
    bytes += (n + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
    return at;
  };
  plan->wide_offset = take(plan->wide_items.size() * sizeof(AttentionWorkItem));
  plan->narrow_offset = take(plan->narrow_items.size() * sizeof(AttentionWorkItem));
  plan->merge_offset = take(plan->merge_rows.size() * sizeof(AttentionMergeRow));
  const size_t partial_slots = static_cast<size_t>(plan->partial_rows * kv_heads);
  plan->partial_acc_offset = take(partial_slots * static_cast<size_t>(in.head_dim) * sizeof(float));
  plan->partial_ml_offset = take(partial_slots * 2 * sizeof(float));
  plan->workspace_bytes = bytes;
  return cudaSuccess;
}

cudaError_t UploadAttentionPlan(const AttentionPlan& plan, void* workspace, size_t workspace_bytes,
                                cudaStream_t stream) {
  if (workspace_bytes < plan.workspace_bytes ||
      (plan.workspace_bytes > 0 && (workspace == nullptr || !Aligned16(workspace)))) {
    return cudaErrorInvalidValue;
  }
  char* const ws = static_cast<char*>(workspace);
  auto copy = [&](size_t offset, const void* data, size_t n) {
    return n == 0 ? cudaSuccess
                  : cudaMemcpyAsync(ws + offset, data, n, cudaMemcpyHostToDevice, stream);
  };
  TANDEM_CUDA_TRY(copy(plan.wide_offset, plan.wide_items.data(),
                       plan.wide_items.size() * sizeof(AttentionWorkItem)));
  TANDEM_CUDA_TRY(copy(plan.narrow_offset, plan.narrow_items.data(),
                       plan.narrow_items.size() * sizeof(AttentionWorkItem)));
  TANDEM_CUDA_TRY(copy(plan.merge_offset, plan.merge_rows.data(),
                       plan.merge_rows.size() * sizeof(AttentionMergeRow)));
  return cudaSuccess;
}

cudaError_t PagedAttention(const PagedAttentionParams& p, const AttentionPlan& plan,
                           void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (p.num_tokens != plan.num_tokens || p.num_heads != plan.num_heads ||
      p.num_kv_heads != plan.num_kv_heads || p.head_dim != plan.head_dim ||
      !SupportedHeadDim(p.head_dim) || p.num_kv_heads <= 0 || p.num_heads % p.num_kv_heads != 0 ||
      (p.kv_type != KvCacheType::kF32 && p.kv_type != KvCacheType::kF16)) {
    return cudaErrorInvalidValue;
  }
  if (p.num_tokens == 0) return cudaSuccess;
  const int64_t element_bytes = p.kv_type == KvCacheType::kF16 ? 2 : 4;
  if (p.q == nullptr || p.out == nullptr || p.k_cache == nullptr || p.v_cache == nullptr ||
      p.block_tables == nullptr || p.token_pos == nullptr || p.block_size <= 0 ||
      p.block_size > std::numeric_limits<int32_t>::max() || !Aligned16(p.k_cache) ||
      !Aligned16(p.v_cache) || p.block_stride * element_bytes % 16 != 0 ||
      p.token_stride * element_bytes % 16 != 0 || p.kv_head_stride * element_bytes % 16 != 0 ||
      workspace_bytes < plan.workspace_bytes ||
      (plan.workspace_bytes > 0 && (workspace == nullptr || !Aligned16(workspace)))) {
    return cudaErrorInvalidValue;
  }
  char* const ws = static_cast<char*>(workspace);
  const bool f16 = p.kv_type == KvCacheType::kF16;
  if (p.head_dim == 64) {
    return f16 ? Run<64, true>(p, plan, ws, stream) : Run<64, false>(p, plan, ws, stream);
  }
  return f16 ? Run<128, true>(p, plan, ws, stream) : Run<128, false>(p, plan, ws, stream);
}

}  // namespace tandem::cuda
