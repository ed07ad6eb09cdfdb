#include "engine/cpu/matmul.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cpu/kernel_table.h"

namespace tandem::cpu {
namespace {

constexpr int64_t kRowTile = 16;  // weight rows per tile (a few KB: stays in L1 across all of M)
static_assert(kRowTile == kPackedRows, "a work item is one packed tile");
constexpr int64_t kMTile = 4;     // activation rows per inner call (register accumulators)

bool Quantized(const MatMulParams& p) { return p.packed != nullptr || IsQuantized(p.w_type); }

absl::Status Validate(const MatMulParams& p) {
  if (p.m < 0 || p.n < 0 || p.k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("MatMul: negative size M=", p.m, " N=", p.n, " K=", p.k));
  }
  if (p.packed != nullptr && (p.packed->n() != p.n || p.packed->k() != p.k)) {
    return absl::InvalidArgumentError(absl::StrCat("MatMul: packed weights are ", p.packed->n(),
                                                   " x ", p.packed->k(), ", the product ", p.n,
                                                   " x ", p.k));
  }
  // (Packed weights hold whole blocks by construction.)
  if (p.packed == nullptr && p.k % DTypeBlockElements(p.w_type) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("MatMul: K=", p.k, " is not a multiple of ",
                                                   DTypeBlockElements(p.w_type), " for ",
                                                   DTypeName(p.w_type)));
  }
  if (p.m == 0 || p.n == 0) return absl::OkStatus();
  if ((p.x == nullptr && p.k > 0) || (p.packed == nullptr && p.w == nullptr) || p.y == nullptr) {
    return absl::InvalidArgumentError("MatMul: null pointer");
  }
  if ((p.m > 1 && p.x_stride < p.k) || (p.m > 1 && p.y_stride < p.n)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MatMul: strides x=", p.x_stride, " y=", p.y_stride, " below K=", p.k, " / N=", p.n));
  }
  if (p.packed != nullptr) return absl::OkStatus();
  const int64_t packed = *DTypeStorageBytes(p.w_type, p.k);
  if (p.w_row_bytes != 0 && p.w_row_bytes < packed) {
    return absl::InvalidArgumentError(
        absl::StrCat("MatMul: w_row_bytes=", p.w_row_bytes, " below a row's ", packed, " bytes"));
  }
  return absl::OkStatus();
}

// Asks for the 64-byte lines of `range` into the L2 cache (prefetcht1 on x86).
void PrefetchRange(const MemoryRange& range) {
  const uintptr_t start = reinterpret_cast<uintptr_t>(range.data);
  const uintptr_t begin = start & ~uintptr_t{63};
  const uintptr_t end = start + static_cast<uintptr_t>(range.bytes);
  for (uintptr_t line = begin; line < end; line += 64) {
    __builtin_prefetch(reinterpret_cast<const void*>(line), /*rw=*/0, /*locality=*/2);
  }
}

}  // namespace

absl::Status MatMul(const MatMulParams& p, const KernelContext& context) {
  return MatMulShared(absl::MakeConstSpan(&p, 1), context);
}

absl::Status MatMulShared(absl::Span<const MatMulParams> params, const KernelContext& context,
                          const MatMulExtras& extras) {
  if (params.empty()) return absl::OkStatus();
  const MatMulParams& first = params[0];
  for (const MatMulParams& p : params) {
    if (absl::Status s = Validate(p); !s.ok()) return s;
    if (p.x != first.x || p.x_stride != first.x_stride || p.m != first.m || p.k != first.k) {
      return absl::InvalidArgumentError("MatMulShared: the products differ in x, x_stride, m or k");
    }
  }
  const int64_t m = first.m, k = first.k;
  if (m == 0) return absl::OkStatus();
  if (k == 0) {
    if (extras.prepare_rows) (*extras.prepare_rows)(0, m);
    for (const MatMulParams& p : params) {
      for (int64_t i = 0; i < m; ++i) std::fill_n(p.y + i * p.y_stride, p.n, 0.0f);
    }
    return absl::OkStatus();
  }
  const KernelTable& table = KernelTableFor(context.isa.value_or(ActiveIsa()));

  // Activations in the forms the row kernels take: the float rows as given, and int8 blocks when
  // any weight is quantized (once for all products).
  const int64_t nb = k / kQuantBlock;
  thread_local std::vector<BlockQ8Act> quantized;  // reused across calls on this thread
  thread_local std::vector<int32_t> block_sums;    // Σ codes per block, for kQ8x16 kernels
  thread_local std::vector<int32_t> half_sums;     // Σ codes per 16-element half, for kQ6x16
  const bool any_quantized = std::any_of(params.begin(), params.end(), Quantized);
  auto any_packed_as = [&](PackedFormat format) {
    return std::any_of(params.begin(), params.end(), [&](const MatMulParams& p) {
      return p.packed != nullptr && p.packed->format() == format;
    });
  };
  const bool any_q8_packed = any_packed_as(PackedFormat::kQ8x16);
  const bool any_q6_packed = any_packed_as(PackedFormat::kQ6x16);
  if (any_quantized) {
    if (static_cast<int64_t>(quantized.size()) < m * nb) quantized.resize(m * nb);
    if (any_q8_packed && static_cast<int64_t>(block_sums.size()) < m * nb) {
      block_sums.resize(m * nb);
    }
    if (any_q6_packed && static_cast<int64_t>(half_sums.size()) < 2 * m * nb) {
      half_sums.resize(2 * m * nb);
    }
  }
  if (any_quantized || extras.prepare_rows) {
    // The workers write into this thread's buffers (captured by pointer).
    BlockQ8Act* q = quantized.data();
    int32_t* sums = any_q8_packed ? block_sums.data() : nullptr;
    int32_t* halves = any_q6_packed ? half_sums.data() : nullptr;
    auto prepare_and_quantize = [&](int64_t begin, int64_t end) {
      if (extras.prepare_rows) (*extras.prepare_rows)(begin, end);
      if (!any_quantized) return;
      for (int64_t i = begin; i < end; ++i) {
        table.quantize_q8_act(first.x + i * first.x_stride, q + i * nb, k,
                              sums != nullptr ? sums + i * nb : nullptr);
        if (halves == nullptr) continue;
        for (int64_t b = i * nb; b < (i + 1) * nb; ++b) {
          for (int h = 0; h < 2; ++h) {
            int32_t sum = 0;
            for (int j = 16 * h; j < 16 * h + 16; ++j) sum += q[b].qs[j];
            halves[2 * b + h] = sum;
          }
        }
      }
    };
    // Quantizing a few rows alone is cheaper than a pass over the pool.
    if (context.pool != nullptr && (m >= 16 || extras.prepare_rows)) {
      context.pool->ParallelFor(m, prepare_and_quantize);
    } else {
      prepare_and_quantize(0, m);
    }
  }
  const BlockQ8Act* xq = quantized.data();
  const int32_t* xsum = block_sums.data();
  const int32_t* xhalves = half_sums.data();

  // Work items are tiles of kRowTile weight rows, numbered across the products in order.
  constexpr int64_t kMaxProducts = 8;
  if (params.size() > static_cast<size_t>(kMaxProducts)) {
    return absl::InvalidArgumentError(
        absl::StrCat("MatMulShared: at most ", kMaxProducts, " products, got ", params.size()));
  }
  int64_t tile_begin[kMaxProducts + 1] = {0};
  for (size_t j = 0; j < params.size(); ++j) {
    tile_begin[j + 1] = tile_begin[j] + (params[j].n + kRowTile - 1) / kRowTile;
  }
  const int64_t num_tiles = tile_begin[params.size()];
  const absl::Span<const MemoryRange> prefetch = extras.prefetch;
  const int64_t num_ranges = static_cast<int64_t>(prefetch.size());
  auto tiles = [&](int64_t t_begin, int64_t t_end) {
    size_t j = 0;
    for (int64_t t = t_begin; t < t_end; ++t) {
      while (t >= tile_begin[j + 1]) ++j;
      for (int64_t r = t * num_ranges / num_tiles; r < (t + 1) * num_ranges / num_tiles; ++r) {
        PrefetchRange(prefetch[static_cast<size_t>(r)]);
      }
      const MatMulParams& p = params[j];
      if (p.packed != nullptr) {
        const int format = static_cast<int>(p.packed->format());
        const PackedDotFn dot = PackedKernelsAreNative(table, format)
                                    ? table.packed_dot[format]
                                    : ScalarKernelTable().packed_dot[format];
        const int64_t tile = t - tile_begin[j];
        const int64_t n0 = tile * kRowTile;
        const int32_t* sums = p.packed->format() == PackedFormat::kQ6x16 ? xhalves : xsum;
        dot(p.packed->tile(tile), nb, xq, sums, nb, m, p.y + n0, p.y_stride,
            std::min(kRowTile, p.n - n0));
        continue;
      }
      const int type = static_cast<int>(p.w_type);
      const RowDotFn row_dot = table.row_dot[type] != nullptr ? table.row_dot[type]
                                                              : ScalarKernelTable().row_dot[type];
      const RowDot2Fn row_dot2 =
          table.row_dot2 != nullptr ? table.row_dot2[static_cast<int>(p.w_type)] : nullptr;
      const bool quant = IsQuantized(p.w_type);
      const void* xa = quant ? static_cast<const void*>(xq) : static_cast<const void*>(p.x);
      const int64_t xa_stride = quant ? nb : p.x_stride;
      const size_t x_elem_bytes = quant ? sizeof(BlockQ8Act) : sizeof(float);
      const int64_t w_row_bytes =
          p.w_row_bytes != 0 ? p.w_row_bytes : *DTypeStorageBytes(p.w_type, p.k);
      const char* w = static_cast<const char*>(p.w);
      const int64_t n0 = (t - tile_begin[j]) * kRowTile;
      const int64_t n1 = std::min(p.n, n0 + kRowTile);
      for (int64_t i = 0; i < m; i += kMTile) {
        const int64_t mi = std::min(kMTile, m - i);
        const void* xi = static_cast<const char*>(xa) + i * xa_stride * x_elem_bytes;
        // Rows n0, n0 + 2, ... start pairs (n0 is a multiple of kRowTile), so whether a row goes
        // through the two-row kernel depends on its index alone.
        int64_t n = n0;
        if (row_dot2 != nullptr) {
          for (; n + 2 <= n1; n += 2) {
            row_dot2(w + n * w_row_bytes, w_row_bytes, xi, xa_stride, mi, k,
                     p.y + i * p.y_stride + n, p.y_stride);
          }
        }
        for (; n < n1; ++n) {
          row_dot(w + n * w_row_bytes, xi, xa_stride, mi, k, p.y + i * p.y_stride + n, p.y_stride);
        }
      }
    }
  };
  if (context.pool != nullptr) {
    context.pool->ParallelFor(num_tiles, tiles);
  } else {
    tiles(0, num_tiles);
  }
  return absl::OkStatus();
}

}  // namespace tandem::cpu
