#include "engine/cpu/packed_weights.h"

#include <cmath>
#include <cstring>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "engine/cpu/kernel_table.h"

namespace tandem::cpu {

static_assert(kPackedBlockBytes<true> == 320 && kPackedBlockBytes<false> == 544 &&
                  kPackedQ5BlockBytes == 384 && kPackedQ6UnitBytes == 3328 &&
                  kPackedQ4SBlockBytes == 288 && kPackedQ5SBlockBytes == 352 &&
                  kPackedKUnitBytes<false> == 2304 && kPackedKUnitBytes<true> == 2816,
              "the layouts packed_weights.h documents");
static_assert(kNumPackedFormats == kPackedFormatCount);
// A K-quant unit is its super-block's 8 block indices, the same bytes per row as the file's block
// (kQ6x16: with its d[16], half of its pair's line); every unit is a whole number of cache lines.
static_assert(kPackedKUnitBytes<false> == kPackedRows * sizeof(BlockQ4_K) &&
              kPackedKUnitBytes<true> == kPackedRows * sizeof(BlockQ5_K) &&
              kPackedQ6UnitBytes + kPackedRows * 2 == kPackedRows * sizeof(BlockQ6_K) &&
              kPackedQ6UnitBytes % 64 == 0 && kPackedQ6PairBytes % 64 == 0 &&
              kPackedKUnitBytes<false> % 64 == 0 &&
              kPackedKUnitBytes<true> % 64 == 0);

int64_t PackedBlockBytes(PackedFormat format) {
  switch (format) {
    case PackedFormat::kQ4x16:
      return kPackedBlockBytes<true>;
    case PackedFormat::kQ8x16:
      return kPackedBlockBytes<false>;
    case PackedFormat::kQ5x16:
      return kPackedQ5BlockBytes;
    case PackedFormat::kQ6x16:
      return (kPackedQ6UnitBytes + kPackedRows * 2) / 8;
    case PackedFormat::kQ4Sx16:
      return kPackedQ4SBlockBytes;
    case PackedFormat::kQ5Sx16:
      return kPackedQ5SBlockBytes;
    case PackedFormat::kQ4Kx16:
      return kPackedKUnitBytes<false> / 8;
    case PackedFormat::kQ5Kx16:
      return kPackedKUnitBytes<true> / 8;
  }
  return 0;
}

int64_t PackedTileBytes(PackedFormat format, int64_t k) {
  const int64_t bytes = k / kQuantBlock * PackedBlockBytes(format);
  if (format == PackedFormat::kQ6x16 && (k / kSuperBlock) % 2 != 0) return bytes + 32;
  return bytes;
}

namespace {

// Block b of the Q5_0 / Q5_1 row at `row`: its codes (0..31) and its f16 d and (Q5_1) m as
// stored.
void FiveBitBlock(DType type, const uint8_t* row, int64_t b, uint8_t code[kQuantBlock],
                  uint16_t* d, uint16_t* m) {
  uint32_t qh;
  const uint8_t* qs;
  if (type == DType::kQ5_0) {
    const BlockQ5_0& w = reinterpret_cast<const BlockQ5_0*>(row)[b];
    std::memcpy(&qh, w.qh, 4);
    qs = w.qs;
    *d = w.d;
    *m = 0;
  } else {
    const BlockQ5_1& w = reinterpret_cast<const BlockQ5_1*>(row)[b];
    std::memcpy(&qh, w.qh, 4);
    qs = w.qs;
    *d = w.d;
    *m = w.m;
  }
  for (int j = 0; j < kQuantBlock; ++j) {
    const int low = j < 16 ? (qs[j] & 0x0F) : (qs[j - 16] >> 4);
    code[j] = static_cast<uint8_t>(low | (((qh >> j) & 1) << 4));
  }
}

// Row r's codes of one block in kQ4x16's nibble groups at `out`, and with kFive their fifth bits
// in kQ5x16's group at out + kPackedQ5FifthBits (without, codes are 0..15 and nothing is written
// there: in a kQ4Kx16 unit that is the next sub-block).
template <bool kFive>
void PackCodes(const uint8_t code[kQuantBlock], int64_t r, uint8_t* out) {
  for (int c = 0; c < 4; ++c) {
    for (int j = 0; j < 4; ++j) {
      const int lo = code[4 * c + j], hi = code[16 + 4 * c + j];
      out[c * 64 + r * 4 + j] = static_cast<uint8_t>((lo & 0x0F) | ((hi & 0x0F) << 4));
      if constexpr (kFive) {
        out[kPackedQ5FifthBits + r * 4 + j] |=
            static_cast<uint8_t>(((lo >> 4) << c) | ((hi >> 4) << (4 + c)));
      }
    }
  }
}

// Writes row r's part of one kQ5x16 (with_m) or kQ5Sx16 block index at `out` (packed_weights.h).
void PackFiveBitRow(const uint8_t code[kQuantBlock], uint16_t d, uint16_t m, bool with_m,
                    int64_t r, uint8_t* out) {
  PackCodes<true>(code, r, out);
  std::memcpy(out + kPackedQ5Scales + r * 2, &d, 2);
  if (with_m) std::memcpy(out + kPackedQ5Scales + 32 + r * 2, &m, 2);
}

// Writes row r's part of sub-block b % 8 of the K-quant unit at `unit` (super-block b / 8 of the
// Q4_K / Q5_K row at `row`; packed_weights.h): its codes, its scale bits and, with the first
// sub-block, the super-block's d and dmin.
template <bool kFive>
void PackKRow(const uint8_t* row, int64_t b, int64_t r, uint8_t* unit) {
  using Block = std::conditional_t<kFive, BlockQ5_K, BlockQ4_K>;
  const Block& w = reinterpret_cast<const Block*>(row)[b / 8];
  const int j = static_cast<int>(b % 8);
  uint8_t code[kQuantBlock];
  for (int l = 0; l < kQuantBlock; ++l) {
    int c = (w.qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0F;
    if constexpr (kFive) c |= ((w.qh[l] >> j) & 1) << 4;
    code[l] = static_cast<uint8_t>(c);
  }
  PackCodes<kFive>(code, r, unit + j * kPackedKSubBytes<kFive>);
  int sc, mn;
  KQuantScaleMin(w.scales, j, &sc, &mn);
  unit[kPackedKLow<kFive> + 16 * j + r] = static_cast<uint8_t>((sc & 0x0F) | ((mn & 0x0F) << 4));
  uint32_t hi;
  std::memcpy(&hi, unit + kPackedKHigh<kFive> + 4 * r, 4);
  hi |= static_cast<uint32_t>(sc >> 4) << (2 * j) | static_cast<uint32_t>(mn >> 4) << (16 + 2 * j);
  std::memcpy(unit + kPackedKHigh<kFive> + 4 * r, &hi, 4);
  if (j == 0) {
    std::memcpy(unit + kPackedKD<kFive> + 2 * r, &w.d, 2);
    std::memcpy(unit + kPackedKD<kFive> + 32 + 2 * r, &w.dmin, 2);
  }
}

// Row r of the K-quant unit at `unit` back as the file's super-block at `out`.
template <bool kFive>
void UnpackKRow(const uint8_t* unit, int64_t r, uint8_t* out) {
  using Block = std::conditional_t<kFive, BlockQ5_K, BlockQ4_K>;
  Block w{};
  std::memcpy(&w.d, unit + kPackedKD<kFive> + 2 * r, 2);
  std::memcpy(&w.dmin, unit + kPackedKD<kFive> + 32 + 2 * r, 2);
  uint32_t hi;
  std::memcpy(&hi, unit + kPackedKHigh<kFive> + 4 * r, 4);
  int sc[8], mn[8];
  for (int j = 0; j < 8; ++j) {
    const uint8_t low = unit[kPackedKLow<kFive> + 16 * j + r];
    sc[j] = (low & 0x0F) | static_cast<int>((hi >> (2 * j)) & 3) << 4;
    mn[j] = (low >> 4) | static_cast<int>((hi >> (16 + 2 * j)) & 3) << 4;
    const uint8_t* sub = unit + j * kPackedKSubBytes<kFive>;
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 4; ++l) {
        const uint8_t byte = sub[c * 64 + r * 4 + l];
        const int e0 = 4 * c + l, e1 = 16 + 4 * c + l;  // the byte's two elements
        w.qs[32 * (j / 2) + e0] |= static_cast<uint8_t>((byte & 0x0F) << (4 * (j % 2)));
        w.qs[32 * (j / 2) + e1] |= static_cast<uint8_t>((byte >> 4) << (4 * (j % 2)));
        if constexpr (kFive) {
          const uint8_t h = sub[kPackedQ5FifthBits + r * 4 + l];
          w.qh[e0] |= static_cast<uint8_t>(((h >> c) & 1) << j);
          w.qh[e1] |= static_cast<uint8_t>(((h >> (4 + c)) & 1) << j);
        }
      }
    }
  }
  // dtype.h's 12-byte encoding of the 6-bit scales and mins (KQuantScaleMin's inverse).
  for (int j = 0; j < 4; ++j) {
    w.scales[j] = static_cast<uint8_t>(sc[j] | (sc[j + 4] >> 4) << 6);
    w.scales[j + 4] = static_cast<uint8_t>(mn[j] | (mn[j + 4] >> 4) << 6);
    w.scales[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0x0F) | (mn[j + 4] & 0x0F) << 4);
  }
  std::memcpy(out, &w, sizeof(w));
}

// Element l of a Q6_K sub-block (32 j + l of its super-block): its 6-bit code q's place in a
// kQ6x16 sub-block (packed_weights.h): low nibble in byte `low` (bits 4 * shift_low ..), high
// bits in byte `high` (bits 2 * shift_high ..), both for row r.
struct Q6Place {
  int64_t low, high;
  int shift_low, shift_high;
};
Q6Place PlaceQ6(int l, int64_t r) {
  const int h = l / 16, c = (l % 16) / 4, e = l % 4;
  return {c * 64 + r * 4 + e, kPackedQ6High + h * 64 + r * 4 + e, 4 * h, 2 * c};
}

// Writes row r's part of sub-block b % 8 of the kQ6x16 unit at `unit` (super-block b / 8 of the
// Q6_K row at `row`; packed_weights.h): its codes, its two scales and, with the first sub-block,
// the super-block's d to `d` (the unit's 16 entries of the tile's d array).
void PackQ6Row(const uint8_t* row, int64_t b, int64_t r, uint8_t* unit, uint8_t* d) {
  const BlockQ6_K& w = reinterpret_cast<const BlockQ6_K*>(row)[b / 8];
  const int j = static_cast<int>(b % 8), h = j / 4, g = j % 4;
  uint8_t* sub = unit + j * kPackedQ6SubBytes;
  for (int l = 0; l < kQuantBlock; ++l) {
    const uint8_t low = w.ql[64 * h + 32 * (g & 1) + l];
    const int q = (g < 2 ? low & 0x0F : low >> 4) | ((w.qh[32 * h + l] >> (2 * g)) & 3) << 4;
    const Q6Place at = PlaceQ6(l, r);
    sub[at.low] |= static_cast<uint8_t>((q & 0x0F) << at.shift_low);
    sub[at.high] |= static_cast<uint8_t>((q >> 4) << at.shift_high);
  }
  unit[kPackedQ6Scales + 32 * j + r] = static_cast<uint8_t>(w.scales[8 * h + 2 * g]);
  unit[kPackedQ6Scales + 32 * j + 16 + r] = static_cast<uint8_t>(w.scales[8 * h + 2 * g + 1]);
  if (j == 0) std::memcpy(d + 2 * r, &w.d, 2);
}

// Row r of the kQ6x16 unit at `unit` (its d array entries at `d`) back as the file's super-block
// at `out`.
void UnpackQ6Row(const uint8_t* unit, const uint8_t* d, int64_t r, uint8_t* out) {
  BlockQ6_K w{};
  for (int j = 0; j < 8; ++j) {
    const int h = j / 4, g = j % 4;
    const uint8_t* sub = unit + j * kPackedQ6SubBytes;
    for (int l = 0; l < kQuantBlock; ++l) {
      const Q6Place at = PlaceQ6(l, r);
      const int low = (sub[at.low] >> at.shift_low) & 0x0F;
      const int high = (sub[at.high] >> at.shift_high) & 3;
      w.ql[64 * h + 32 * (g & 1) + l] |= static_cast<uint8_t>(low << (g < 2 ? 0 : 4));
      w.qh[32 * h + l] |= static_cast<uint8_t>(high << (2 * g));
    }
    w.scales[8 * h + 2 * g] = static_cast<int8_t>(unit[kPackedQ6Scales + 32 * j + r]);
    w.scales[8 * h + 2 * g + 1] = static_cast<int8_t>(unit[kPackedQ6Scales + 32 * j + 16 + r]);
  }
  std::memcpy(&w.d, d + 2 * r, 2);
  std::memcpy(out, &w, sizeof(w));
}

}  // namespace

bool PackedKernelIsNative(PackedFormat format, Isa isa) {
  return PackedKernelsAreNative(KernelTableFor(isa), static_cast<int>(format));
}

std::optional<PackedFormat> PackedWeights::FormatFor(DType type) {
  switch (type) {
    case DType::kQ4_0:
      return PackedFormat::kQ4Sx16;
    case DType::kQ4_1:
      return PackedFormat::kQ4x16;
    case DType::kQ8_0:
      return PackedFormat::kQ8x16;
    case DType::kQ5_0:
      return PackedFormat::kQ5Sx16;
    case DType::kQ5_1:
      return PackedFormat::kQ5x16;
    case DType::kQ4_K:
      return PackedFormat::kQ4Kx16;
    case DType::kQ5_K:
      return PackedFormat::kQ5Kx16;
    case DType::kQ6_K:
      return PackedFormat::kQ6x16;
    default:
      return std::nullopt;
  }
}

int64_t PackedWeights::PackedBytes(DType type, int64_t n, int64_t k) {
  const std::optional<PackedFormat> format = FormatFor(type);
  if (!format.has_value() || n <= 0 || k <= 0) return 0;
  return (n + kPackedRows - 1) / kPackedRows * PackedTileBytes(*format, k);
}

absl::StatusOr<PackedWeights> PackedWeights::Pack(
    const void* w, DType type, int64_t n, int64_t k, int64_t w_row_bytes,
    const std::function<void(int64_t rows)>& rows_packed) {
  const std::optional<PackedFormat> format = FormatFor(type);
  if (!format.has_value()) {
    return absl::UnimplementedError(
        absl::StrCat("PackedWeights: no packed format for ", DTypeName(type)));
  }
  if (n < 0 || k < 0 || k % DTypeBlockElements(type) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("PackedWeights: N=", n, " K=", k,
                                                   " (K must be a non-negative multiple of ",
                                                   DTypeBlockElements(type), " for ",
                                                   DTypeName(type), ")"));
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
  const int64_t tile_bytes = PackedTileBytes(*format, k);
  const int64_t num_tiles = (n + kPackedRows - 1) / kPackedRows;
  const int64_t total = num_tiles * tile_bytes;
  const size_t alloc = static_cast<size_t>((total + 63) / 64 * 64);
  std::unique_ptr<uint8_t, Free> data(
      static_cast<uint8_t*>(std::aligned_alloc(64, alloc == 0 ? 64 : alloc)));
  if (data == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("PackedWeights: cannot allocate ", total, " bytes"));
  }
  std::memset(data.get(), 0, alloc == 0 ? 64 : alloc);

  // Tile t reads source rows 16t .. 16t + 15 only: every this many tiles, the rows before are done.
  constexpr int64_t kTilesPerReport = 64;
  const auto* src = static_cast<const uint8_t*>(w);
  for (int64_t t = 0; t < num_tiles; ++t) {
    if (rows_packed && t > 0 && t % kTilesPerReport == 0) rows_packed(t * kPackedRows);
    uint8_t* tile = data.get() + t * tile_bytes;
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* out = tile + b * block_bytes;
      for (int64_t r = 0; r < kPackedRows && t * kPackedRows + r < n; ++r) {
        const int64_t row = t * kPackedRows + r;
        if (*format == PackedFormat::kQ4Kx16 || *format == PackedFormat::kQ5Kx16) {
          // This block's unit: its super-block's 8 block indices.
          uint8_t* unit = tile + b / 8 * 8 * block_bytes;
          if (*format == PackedFormat::kQ4Kx16) {
            PackKRow<false>(src + row * w_row_bytes, b, r, unit);
          } else {
            PackKRow<true>(src + row * w_row_bytes, b, r, unit);
          }
          continue;
        }
        if (*format == PackedFormat::kQ6x16) {
          PackQ6Row(src + row * w_row_bytes, b, r, tile + PackedQ6Unit(b / 8),
                    tile + PackedQ6D(b / 8));
          continue;
        }
        if (*format == PackedFormat::kQ5x16 || *format == PackedFormat::kQ5Sx16) {
          uint8_t code[kQuantBlock];
          uint16_t d, m;
          FiveBitBlock(type, src + row * w_row_bytes, b, code, &d, &m);
          PackFiveBitRow(code, d, m, *format == PackedFormat::kQ5x16, r, out);
          continue;
        }
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
        } else {  // Q4_0: d * (q - 8) = d * q + m, the kernels taking m = -8 d (kQ4Sx16)
          qs = blk + 2;
          groups = 4;
        }
        for (int g = 0; g < groups; ++g) std::memcpy(out + g * 64 + r * 4, qs + g * 4, 4);
        std::memcpy(out + groups * 64 + r * 2, &d, 2);
        if (*format == PackedFormat::kQ4x16) std::memcpy(out + groups * 64 + 32 + r * 2, &m, 2);
      }
    }
  }
  if (rows_packed) rows_packed(n);
  return PackedWeights(*format, n, k, std::move(data));
}

absl::Status PackedWeights::UnpackRow(int64_t row, DType type, void* out) const {
  const bool q8 = format_ == PackedFormat::kQ8x16 && type == DType::kQ8_0;
  const bool q4 = (format_ == PackedFormat::kQ4x16 && type == DType::kQ4_1) ||
                  (format_ == PackedFormat::kQ4Sx16 && type == DType::kQ4_0);
  const bool q4k = format_ == PackedFormat::kQ4Kx16 && type == DType::kQ4_K;
  const bool q5k = format_ == PackedFormat::kQ5Kx16 && type == DType::kQ5_K;
  const bool q6k = format_ == PackedFormat::kQ6x16 && type == DType::kQ6_K;
  if (!q8 && !q4 && !q4k && !q5k && !q6k) {
    return absl::UnimplementedError(absl::StrCat("PackedWeights: no ", DTypeName(type),
                                                 " rows from this packed format"));
  }
  if (row < 0 || row >= n_) {
    return absl::OutOfRangeError(absl::StrCat("PackedWeights: row ", row, " of ", n_));
  }
  const int64_t nb = k_ / kQuantBlock;
  const int64_t r = row % kPackedRows;
  if (q4k || q5k || q6k) {
    const int64_t unit_bytes = 8 * PackedBlockBytes(format_);
    const uint8_t* tile_data = tile(row / kPackedRows);
    for (int64_t s = 0; s < k_ / kSuperBlock; ++s) {
      uint8_t* blk = static_cast<uint8_t*>(out) + s * DTypeBlockBytes(type);
      if (q6k) {
        UnpackQ6Row(tile_data + PackedQ6Unit(s), tile_data + PackedQ6D(s), r, blk);
        continue;
      }
      const uint8_t* unit = tile_data + s * unit_bytes;
      if (q4k) {
        UnpackKRow<false>(unit, r, blk);
      } else {
        UnpackKRow<true>(unit, r, blk);
      }
    }
    return absl::OkStatus();
  }
  const int groups = q8 ? 8 : 4;
  const int64_t block_bytes = DTypeBlockBytes(type);
  const uint8_t* tile_data = tile(row / kPackedRows);
  auto* dst = static_cast<uint8_t*>(out);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* in = tile_data + b * PackedBlockBytes(format_);
    uint8_t* blk = dst + b * block_bytes;
    // The block as Pack read it: d, then m (Q4_1 only), then the codes.
    std::memcpy(blk, in + groups * 64 + r * 2, 2);
    uint8_t* qs = blk + 2;
    if (type == DType::kQ4_1) {
      std::memcpy(blk + 2, in + groups * 64 + 32 + r * 2, 2);
      qs = blk + 4;
    }
    for (int g = 0; g < groups; ++g) std::memcpy(qs + g * 4, in + g * 64 + r * 4, 4);
  }
  return absl::OkStatus();
}

}  // namespace tandem::cpu
