#include "engine/cpu/packed_weights.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/cpu/kernel_table.h"

namespace tandem::cpu {

static_assert(kPackedBlockBytes<true> == 320 && kPackedBlockBytes<false> == 544,
              "the layouts packed_weights.h documents");

int64_t PackedBlockBytes(PackedFormat format) {
  return format == PackedFormat::kQ4x16 ? kPackedBlockBytes<true> : kPackedBlockBytes<false>;
}

bool PackedKernelIsNative(PackedFormat format, Isa isa) {
  return PackedKernelsAreNative(KernelTableFor(isa), static_cast<int>(format));
}

std::optional<PackedFormat> PackedWeights::FormatFor(DType type) {
  switch (type) {
    case DType::kQ4_0:
    case DType::kQ4_1:
      return PackedFormat::kQ4x16;
    case DType::kQ8_0:
      return PackedFormat::kQ8x16;
    default:
      return std::nullopt;
  }
}

absl::StatusOr<PackedWeights> PackedWeights::Pack(const void* w, DType type, int64_t n, int64_t k,
                                                  int64_t w_row_bytes) {
  const std::optional<PackedFormat> format = FormatFor(type);
  if (!format.has_value()) {
    return absl::UnimplementedError(
        absl::StrCat("PackedWeights: no packed format for ", DTypeName(type)));
  }
  if (n < 0 || k < 0 || k % kQuantBlock != 0) {
    return absl::InvalidArgumentError(absl::StrCat("PackedWeights: N=", n, " K=", k,
                                                   " (K must be a non-negative multiple of ",
                                                   kQuantBlock, ")"));
  }
  const int64_t packed_row = *DTypeStorageBytes(type, k);
  if (w_row_bytes == 0) w_row_bytes = packed_row;
  if (w_row_bytes < packed_row) {
    return absl::InvalidArgumentError(absl::StrCat("PackedWeights: w_row_bytes=", w_row_bytes,
                                                   " below a row's ", packed_row, " bytes"));
  }
  if (w == nullptr && n > 0 && k > 0) return absl::InvalidArgumentError("PackedWeights: null w");

  const int64_t nb = k / kQuantBlock;
  const int64_t block_bytes = PackedBlockBytes(*format);
  const int64_t num_tiles = (n + kPackedRows - 1) / kPackedRows;
  const int64_t total = num_tiles * nb * block_bytes;
  const size_t alloc = static_cast<size_t>((total + 63) / 64 * 64);
  std::unique_ptr<uint8_t, Free> data(
      static_cast<uint8_t*>(std::aligned_alloc(64, alloc == 0 ? 64 : alloc)));
  if (data == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("PackedWeights: cannot allocate ", total, " bytes"));
  }
  std::memset(data.get(), 0, alloc == 0 ? 64 : alloc);

  const auto* src = static_cast<const uint8_t*>(w);
  for (int64_t t = 0; t < num_tiles; ++t) {
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* out = data.get() + (t * nb + b) * block_bytes;
      for (int64_t r = 0; r < kPackedRows && t * kPackedRows + r < n; ++r) {
        const int64_t row = t * kPackedRows + r;
        const uint8_t* blk = src + row * w_row_bytes + b * DTypeBlockBytes(type);
        uint16_t d, m = 0;
        const uint8_t* qs;
        int groups;
        std::memcpy(&d, blk, 2);
        if (type == DType::kQ8_0) {
          qs = blk + 2;
          groups = 8;
        } else if (type == DType::kQ4_1) {
          std::memcpy(&m, blk + 2, 2);
          qs = blk + 4;
          groups = 4;
        } else {  // Q4_0: d * (q - 8) = d * q + m with m = -8 d, exact in f16 unless it overflows
          const float offset = -8.0f * HalfToFloat(d);
          if (!std::isfinite(offset) || std::fabs(offset) > 65504.0f) {
            return absl::OutOfRangeError(absl::StrCat("PackedWeights: row ", row, " block ", b,
                                                      ": Q4_0 scale ", HalfToFloat(d),
                                                      " has an offset beyond f16"));
          }
          m = FloatToHalf(offset);
          qs = blk + 2;
          groups = 4;
        }
        for (int g = 0; g < groups; ++g) std::memcpy(out + g * 64 + r * 4, qs + g * 4, 4);
        std::memcpy(out + groups * 64 + r * 2, &d, 2);
        if (*format == PackedFormat::kQ4x16) std::memcpy(out + groups * 64 + 32 + r * 2, &m, 2);
      }
    }
  }
  return PackedWeights(*format, n, k, std::move(data));
}

}  // namespace tandem::cpu
