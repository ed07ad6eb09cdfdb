#include "engine/cpu/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cpu/elementwise.h"
#include "engine/cpu/kernel_table.h"

namespace tandem::cpu {
namespace {

absl::Status Validate(const PagedAttentionParams& p) {
  if (p.num_tokens < 0 || p.head_dim <= 0 || p.block_size <= 0 || p.num_kv_heads <= 0 ||
      p.num_heads <= 0 || p.num_heads % p.num_kv_heads != 0 || p.window < 0 ||
      !(p.softcap >= 0.0f)) {
    return absl::InvalidArgumentError(
        "PagedAttention: need head_dim, block_size, num_kv_heads > 0, num_heads a multiple of "
        "num_kv_heads, window >= 0 and softcap >= 0");
  }
  if (p.num_tokens > 0 &&
      (p.q == nullptr || p.out == nullptr || p.k_cache == nullptr || p.v_cache == nullptr ||
       p.block_tables == nullptr || p.token_seq == nullptr || p.token_pos == nullptr)) {
    return absl::InvalidArgumentError("PagedAttention: null pointer");
  }
  if (p.kv_type != DType::kF32 && p.kv_type != DType::kF16) {
    return absl::InvalidArgumentError(absl::StrCat("PagedAttention: KV dtype ",
                                                   DTypeName(p.kv_type), " (F32 or F16)"));
  }
  return absl::OkStatus();
}

// The first cache position a token at `pos` attends to.
int64_t FirstPosition(const PagedAttentionParams& p, int64_t pos) {
  return p.window > 0 ? std::max<int64_t>(0, pos - p.window + 1) : 0;
}

float Scale(const PagedAttentionParams& p) {
  return p.scale != 0.0f ? p.scale : 1.0f / std::sqrt(static_cast<float>(p.head_dim));
}

// Offset of (cache position `pos` of `seq`, kv-head g) in the caches.
int64_t CacheOffset(const PagedAttentionParams& p, int64_t seq, int64_t pos, int64_t g) {
  const int64_t block = p.block_tables[seq * p.max_blocks_per_seq + pos / p.block_size];
  return block * p.block_stride + (pos % p.block_size) * p.token_stride + g * p.kv_head_stride;
}

// Element `offset` of a cache as T (float for F32 caches, uint16_t for F16 ones).
template <typename T>
const T* At(const void* cache, int64_t offset) {
  return static_cast<const T*>(cache) + offset;
}

// Cache row `offset` (head_dim elements) as floats: in place for F32, widened into `buf` for F16.
const float* RowF32(const PagedAttentionParams& p, const KernelTable& kt, const void* cache,
                    int64_t offset, float* buf) {
  if (p.kv_type == DType::kF32) return At<float>(cache, offset);
  kt.f16_to_f32(At<uint16_t>(cache, offset), buf, p.head_dim);
  return buf;
}

// The reference's read of one cache element, exactly widened.
double ElementAt(const PagedAttentionParams& p, const void* cache, int64_t offset) {
  return p.kv_type == DType::kF32 ? *At<float>(cache, offset)
                                  : HalfToFloat(*At<uint16_t>(cache, offset));
}

// work(begin, end) over [0, items), on the pool when there is one.
void RunItems(const KernelContext& context, int64_t items,
              absl::FunctionRef<void(int64_t, int64_t)> work) {
  if (context.pool != nullptr) {
    context.pool->ParallelFor(items, work);
  } else {
    work(0, items);
  }
}

}  // namespace

absl::Status PagedAttention(const PagedAttentionParams& p, const KernelContext& context) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  const KernelTable& kt = KernelTableFor(context.isa.value_or(ActiveIsa()));
  const int64_t group = p.num_heads / p.num_kv_heads;
  const float scale = Scale(p);
  const int64_t d = p.head_dim;

  const bool f16 = p.kv_type == DType::kF16;
  if ((f16 ? kt.attend64_f16 != nullptr : kt.attend64 != nullptr) && d == 64 &&
      group <= kAttendMaxHeads && p.softcap == 0.0f) {
    // One item per (run, KV head): a run is up to kAttendMaxRows tokens of one sequence at
    // consecutive positions (a prompt chunk's) where the table has the tile kernel, else one
    // token; its tokens' query heads share every key and value load. The tile kernel's rows all
    // start at position 0, so a run's tokens must all lie within the sliding window's reach of it.
    const bool tiles = f16 ? kt.attend64_rows_f16 != nullptr : kt.attend64_rows != nullptr;
    struct Run {
      int64_t first = 0, rows = 0;
    };
    std::vector<Run> runs;
    runs.reserve(static_cast<size_t>(p.num_tokens));
    for (int64_t t = 0; t < p.num_tokens;) {
      int64_t rows = 1;
      while (tiles && rows < kAttendMaxRows && t + rows < p.num_tokens &&
             p.token_seq[t + rows] == p.token_seq[t] &&
             p.token_pos[t + rows] == p.token_pos[t] + rows &&
             FirstPosition(p, p.token_pos[t + rows]) == 0) {
        ++rows;
      }
      runs.push_back({t, rows});
      t += rows;
    }
    static constexpr float kZeros[64] = {};
    static constexpr uint16_t kZeroHalves[64] = {};
    auto work = [&](int64_t begin, int64_t end) {
      thread_local std::vector<const void*> keys, values;
      for (int64_t item = begin; item < end; ++item) {
        const Run run = runs[static_cast<size_t>(item / p.num_kv_heads)];
        const int64_t g = item % p.num_kv_heads;
        const int64_t t = run.first;
        const int64_t seq = p.token_seq[t];
        const int64_t first_ctx = static_cast<int64_t>(p.token_pos[t]) + 1;
        const int64_t end = first_ctx + run.rows - 1;  // the run's last token's, exclusive
        // A run of more than one token starts at 0 (see above); a single token at its window.
        const int64_t lo = FirstPosition(p, p.token_pos[t]);
        const int64_t ctx = end - lo;  // positions attended to, from lo
        const int64_t padded = (ctx + kAttendChunk - 1) / kAttendChunk * kAttendChunk;
        keys.resize(static_cast<size_t>(padded));
        values.resize(static_cast<size_t>(padded));
        // CacheOffset without a division per position: block by block.
        const int64_t bytes = f16 ? 2 : 4;
        const int64_t head_offset = g * p.kv_head_stride * bytes;
        const char* const k_head = static_cast<const char*>(p.k_cache) + head_offset;
        const char* const v_head = static_cast<const char*>(p.v_cache) + head_offset;
        const int32_t* const table = p.block_tables + seq * p.max_blocks_per_seq;
        for (int64_t b = lo / p.block_size, start = b * p.block_size; start < end;
             start += p.block_size, ++b) {
          const int64_t block_offset = table[b] * p.block_stride * bytes;
          const int64_t first = std::max(start, lo) - start;
          const int64_t slots = std::min(p.block_size, end - start);
          for (int64_t j = first; j < slots; ++j) {
            const int64_t offset = block_offset + j * p.token_stride * bytes;
            keys[start + j - lo] = k_head + offset;
            values[start + j - lo] = v_head + offset;
          }
        }
        const void* zeros = f16 ? static_cast<const void*>(kZeroHalves) : kZeros;
        std::fill(keys.begin() + ctx, keys.end(), zeros);
        std::fill(values.begin() + ctx, values.end(), zeros);
        const float* q = p.q + t * p.q_token_stride + g * group * d;
        float* out = p.out + t * p.out_token_stride + g * group * d;
        if (run.rows > 1 && f16) {
          kt.attend64_rows_f16(q, p.q_token_stride, run.rows, group,
                               reinterpret_cast<const uint16_t* const*>(keys.data()),
                               reinterpret_cast<const uint16_t* const*>(values.data()), first_ctx,
                               scale, out, p.out_token_stride);
        } else if (run.rows > 1) {
          kt.attend64_rows(q, p.q_token_stride, run.rows, group,
                           reinterpret_cast<const float* const*>(keys.data()),
                           reinterpret_cast<const float* const*>(values.data()), first_ctx, scale,
                           out, p.out_token_stride);
        } else if (f16) {
          kt.attend64_f16(q, d, group, reinterpret_cast<const uint16_t* const*>(keys.data()),
                          reinterpret_cast<const uint16_t* const*>(values.data()), ctx, scale,
                          out, d);
        } else {
          kt.attend64(q, d, group, reinterpret_cast<const float* const*>(keys.data()),
                      reinterpret_cast<const float* const*>(values.data()), ctx, scale, out, d);
        }
      }
    };
    RunItems(context, static_cast<int64_t>(runs.size()) * p.num_kv_heads, work);
    return absl::OkStatus();
  }

  // Keys are visited in fixed chunks of kChunk positions whatever the block size, so the online
  // softmax rescales at the same points and the result does not depend on how the cache is paged.
  constexpr int64_t kChunk = kAttendChunk;
  auto work = [&](int64_t begin, int64_t end) {
    float scores[kChunk];
    int64_t offsets[kChunk];
    std::vector<float> acc(static_cast<size_t>(d)), row(static_cast<size_t>(d));
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / p.num_heads;
      const int64_t h = item % p.num_heads;
      const int64_t g = h / group;
      const int64_t seq = p.token_seq[t];
      const int64_t ctx = static_cast<int64_t>(p.token_pos[t]) + 1;
      const float* q = p.q + t * p.q_token_stride + h * d;
      float running_max = -std::numeric_limits<float>::infinity();
      float running_sum = 0.0f;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t start = FirstPosition(p, ctx - 1); start < ctx; start += kChunk) {
        const int64_t count = std::min(kChunk, ctx - start);
        float chunk_max = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < count; ++j) {
          offsets[j] = CacheOffset(p, seq, start + j, g);
          scores[j] = kt.dot_f32(q, RowF32(p, kt, p.k_cache, offsets[j], row.data()), d) * scale;
        }
        if (p.softcap > 0.0f) SoftCap(scores, count, p.softcap);
        for (int64_t j = 0; j < count; ++j) chunk_max = std::max(chunk_max, scores[j]);
        const float new_max = std::max(running_max, chunk_max);
        const float correction = std::exp(running_max - new_max);  // 0 on the first chunk
        if (correction != 1.0f) {
          kt.scale_f32(correction, acc.data(), d);
          running_sum *= correction;
        }
        for (int64_t j = 0; j < count; ++j) {
          const float e = std::exp(scores[j] - new_max);
          running_sum += e;
          kt.axpy_f32(e, RowF32(p, kt, p.v_cache, offsets[j], row.data()), acc.data(), d);
        }
        running_max = new_max;
      }
      float* out = p.out + t * p.out_token_stride + h * d;
      const float inv = running_sum > 0.0f ? 1.0f / running_sum : 0.0f;
      for (int64_t i = 0; i < d; ++i) out[i] = acc[i] * inv;
    }
  };
  RunItems(context, p.num_tokens * p.num_heads, work);
  return absl::OkStatus();
}

absl::Status PagedAttentionReference(const PagedAttentionParams& p) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  const int64_t group = p.num_heads / p.num_kv_heads;
  const double scale = Scale(p);
  const int64_t d = p.head_dim;
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const int64_t seq = p.token_seq[t];
    const int64_t ctx = static_cast<int64_t>(p.token_pos[t]) + 1;
    for (int64_t h = 0; h < p.num_heads; ++h) {
      const int64_t g = h / group;
      const float* q = p.q + t * p.q_token_stride + h * d;
      const int64_t lo = FirstPosition(p, ctx - 1);
      std::vector<double> s(static_cast<size_t>(ctx), 0.0);
      double max = -std::numeric_limits<double>::infinity();
      for (int64_t pos = lo; pos < ctx; ++pos) {
        const int64_t k = CacheOffset(p, seq, pos, g);
        double dot = 0.0;
        for (int64_t i = 0; i < d; ++i) {
          dot += static_cast<double>(q[i]) * ElementAt(p, p.k_cache, k + i);
        }
        s[pos] = dot * scale;
        if (p.softcap > 0.0f) s[pos] = p.softcap * std::tanh(s[pos] / p.softcap);
        max = std::max(max, s[pos]);
      }
      double sum = 0.0;
      for (int64_t pos = lo; pos < ctx; ++pos) {
        s[pos] = std::exp(s[pos] - max);
        sum += s[pos];
      }
      std::vector<double> o(static_cast<size_t>(d), 0.0);
      for (int64_t pos = lo; pos < ctx; ++pos) {
        const int64_t v = CacheOffset(p, seq, pos, g);
        for (int64_t i = 0; i < d; ++i) o[i] += s[pos] / sum * ElementAt(p, p.v_cache, v + i);
      }
      float* out = p.out + t * p.out_token_stride + h * d;
      for (int64_t i = 0; i < d; ++i) out[i] = static_cast<float>(o[i]);
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::cpu
