#include "engine/cpu/matmul.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cpu/kernel_table.h"

namespace tandem::cpu {
namespace {

constexpr int64_t kRowTile = 16;  // weight rows per tile (a few KB: stays in L1 across all of M)
constexpr int64_t kMTile = 4;     // activation rows per inner call (register accumulators)

absl::Status Validate(const MatMulParams& p) {
  if (p.m < 0 || p.n < 0 || p.k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("MatMul: negative size M=", p.m, " N=", p.n, " K=", p.k));
  }
  if (IsQuantized(p.w_type) && p.k % kQuantBlock != 0) {
    return absl::InvalidArgumentError(absl::StrCat("MatMul: K=", p.k, " is not a multiple of ",
                                                   kQuantBlock, " for ", DTypeName(p.w_type)));
  }
  if (p.m == 0 || p.n == 0) return absl::OkStatus();
  if ((p.x == nullptr && p.k > 0) || p.w == nullptr || p.y == nullptr) {
    return absl::InvalidArgumentError("MatMul: null pointer");
  }
  if ((p.m > 1 && p.x_stride < p.k) || (p.m > 1 && p.y_stride < p.n)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MatMul: strides x=", p.x_stride, " y=", p.y_stride, " below K=", p.k, " / N=", p.n));
  }
  const int64_t packed = *DTypeStorageBytes(p.w_type, p.k);
  if (p.w_row_bytes != 0 && p.w_row_bytes < packed) {
    return absl::InvalidArgumentError(
        absl::StrCat("MatMul: w_row_bytes=", p.w_row_bytes, " below a row's ", packed, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status MatMul(const MatMulParams& p, const KernelContext& context) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  if (p.m == 0 || p.n == 0) return absl::OkStatus();
  if (p.k == 0) {
    for (int64_t i = 0; i < p.m; ++i) std::fill_n(p.y + i * p.y_stride, p.n, 0.0f);
    return absl::OkStatus();
  }
  const KernelTable& table = KernelTableFor(context.isa.value_or(ActiveIsa()));
  const RowDotFn row_dot = table.row_dot[static_cast<int>(p.w_type)];
  const int64_t w_row_bytes =
      p.w_row_bytes != 0 ? p.w_row_bytes : *DTypeStorageBytes(p.w_type, p.k);

  // Activations in the form the row kernel takes: the float rows as given, or int8 blocks.
  const void* xa = p.x;
  int64_t xa_stride = p.x_stride;
  thread_local std::vector<BlockQ8Act> quantized;  // reused across calls on this thread
  if (IsQuantized(p.w_type)) {
    const int64_t nb = p.k / kQuantBlock;
    if (static_cast<int64_t>(quantized.size()) < p.m * nb) quantized.resize(p.m * nb);
    BlockQ8Act* q = quantized.data();
    auto quantize = [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) QuantizeRowQ8Act(p.x + i * p.x_stride, q + i * nb, p.k);
    };
    if (context.pool != nullptr && p.m >= 16) {
      context.pool->ParallelFor(p.m, quantize);
    } else {
      quantize(0, p.m);
    }
    xa = q;
    xa_stride = nb;
  }
  const size_t x_elem_bytes = IsQuantized(p.w_type) ? sizeof(BlockQ8Act) : sizeof(float);

  auto rows = [&](int64_t n_begin, int64_t n_end) {
    const char* w = static_cast<const char*>(p.w);
    for (int64_t n0 = n_begin; n0 < n_end; n0 += kRowTile) {
      const int64_t n1 = std::min(n_end, n0 + kRowTile);
      for (int64_t i = 0; i < p.m; i += kMTile) {
        const int64_t mi = std::min(kMTile, p.m - i);
        const void* xi = static_cast<const char*>(xa) + i * xa_stride * x_elem_bytes;
        for (int64_t n = n0; n < n1; ++n) {
          row_dot(w + n * w_row_bytes, xi, xa_stride, mi, p.k, p.y + i * p.y_stride + n,
                  p.y_stride);
        }
      }
    }
  };
  if (context.pool != nullptr) {
    context.pool->ParallelFor(p.n, rows, /*min_grain=*/kRowTile);
  } else {
    rows(0, p.n);
  }
  return absl::OkStatus();
}

}  // namespace tandem::cpu
