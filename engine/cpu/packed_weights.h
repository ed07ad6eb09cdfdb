// Quantized weight matrices repacked once, at load time, for the batched matrix products.
//
// In GGUF's layout each 32-weight block of a row carries its own scales, so a SIMD kernel over one
// row pays a convert, a scale multiply and an FMA for every 32 multiply-adds. Packed, 16 rows are
// interleaved: for each block index b, the 16 rows' int codes lie in 64-byte groups of 4 codes
// per row, followed by the 16 rows' scales. One vpdpbusd then multiplies 4 codes of all 16 rows by
// 4 broadcast activations, and one convert / multiply / FMA serves 16 rows and 32 inputs. Decode
// at batch 8 is compute-bound, and this is where its time goes (docs/performance.md).
//
// Formats (per tile of 16 rows, per block index b; a tile holds K / 32 of these, b ascending):
//
//   kQ4x16  320 bytes  qs[4][16][4]: group c, row r, byte j = byte 4c + j of row r's Q4 block
//                                    (low nibble: element 4c + j; high: element 16 + 4c + j)
//                      d[16], m[16]: f16 scale and offset of each row (x = d * nibble + m)
//           from Q4_1 (d, m as stored)
//   kQ4Sx16 288 bytes  qs[4][16][4] as kQ4x16's, then d[16]: f16 scale of each row
//           from Q4_0 (symmetric: the kernels take m = -8 d, exact in f32): 18 bytes per row and
//           block, the file's
//   kQ8x16  544 bytes  qs[8][16][4]: group g, row r, byte j = int8 code 4g + j of row r
//                      d[16]:        f16 scale of each row
//           from Q8_0
//   kQ5x16  384 bytes  qs[4][16][4]: as kQ4x16, the low 4 bits of each 5-bit code
//                      qh[16][4]:    row r, byte j: bit c = fifth bit of element 4c + j, bit 4 + c
//                                    = fifth bit of element 16 + 4c + j (c = 0..3)
//                      d[16], m[16]: f16 scale and offset of each row (x = d * code + m)
//           from Q5_1 (d, m as stored): 24 bytes per row and block, the file's
//   kQ5Sx16 352 bytes  kQ5x16 without m[16], from Q5_0 (the kernels take m = -16 d, exact in
//                      f32): 22 bytes, the file's
//   kQ6x16  from Q6_K, in units of one super-block per tile as the K-quants below (block
//           index 8s + j: elements 32 j .. 32 j + 31 of super-block s):
//                      sub[8]:       sub-block j at 384 j: lo[4][16][4] as kQ4x16's qs, the low 4
//                                    bits of each 6-bit code q (0..63); then hi[2][16][4]: half h,
//                                    row r, byte l: bits 2c, 2c + 1 = q >> 4 of element
//                                    16 h + 4 c + l (c = 0..3)
//                      sc[8][2][16]: int8 scale of sub-block j's half h (elements 16 h ..) of row r
//           3328 = 52 x 64 bytes a unit. The units' f16 d[16] (each row's, as the file's super-
//           block holds it) go out of line, two units' in one 64-byte line: a tile is pairs of
//           super-blocks 2p, 2p + 1 at 6720 p, each the line d[2][16] then the two units, so
//           units stay 64-byte aligned and the tile reads front to back. 3360 bytes per
//           super-block and tile, the file's 210 per row; when K / 256 is odd, the last pair has
//           one unit and its line 32 bytes of padding. The codes are c = q - 32 (-32..31).
//   kQ4Kx16, kQ5Kx16: the K-quants, in units of one super-block (256 weights, block indices
//           8s .. 8s + 7) per tile, so that the scales stay as compact as the file's:
//                      sub[8]:       sub-block j (block index 8s + j) at 256 j (kQ4Kx16) or 320 j
//                                    (kQ5Kx16): qs[4][16][4] as kQ4x16's, then (kQ5Kx16) qh[16][4]
//                                    as kQ5x16's
//                      lo[8][16]:    sub-block j, row r: (sc_j & 15) | (m_j & 15) << 4
//                      hi[16]:       uint32 of row r: bits 2j, 2j + 1 = sc_j >> 4, bits 16 + 2j,
//                                    17 + 2j = m_j >> 4 (sc_j, m_j: the file's 6-bit scale and min)
//                      d[16], dmin[16]: f16 of each row, as the file's super-block holds them
//           2304 (kQ4Kx16) or 2816 (kQ5Kx16) bytes a unit: 18 and 22 bytes per row and 32 weights,
//           the file's own. Block b's scale and offset are d[n,b] = d · sc_j and
//           m[n,b] = -(dmin · m_j), both exact in f32 (11 x 6 significant bits), computed by the
//           kernel once per block index for all activation rows; the arithmetic below is
//           kQ4x16's / kQ5x16's with them.
//
// Rows past N in the last tile are zero (scales included), and their outputs are not written.
//
// What the packed kernels compute, for weight row n and activation row i (BlockQ8Act blocks x_b),
// in this order and rounding, on every ISA:
//
//   acc = 0
//   for b in 0 .. K/32 - 1:
//     acc = fma(float(Σ_j q[n,b,j] · x_b.qs[j]), d[n,b] · x_b.d, acc)   // the integer sum is exact
//     acc = fma(m[n,b], x_b.s, acc)                 // all but kQ8x16 and kQ6x16
//
// except kQ6x16, whose integer sum is sc0 · Σ_{j<16} c_j x_j + sc1 · Σ_{j>=16} c_j x_j (exact;
// sc0, sc1: the block's two half scales), then acc = fma(float(sum), d[n,b] · x_b.d, acc) as
// above.
//   y[i, n] = acc
//
// so a result depends neither on the ISA nor on how many activation rows share the call.
#ifndef TANDEM_ENGINE_CPU_PACKED_WEIGHTS_H_
#define TANDEM_ENGINE_CPU_PACKED_WEIGHTS_H_

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "engine/core/dtype.h"
#include "engine/cpu/cpu_features.h"

namespace tandem::cpu {

enum class PackedFormat : uint8_t {
  kQ4x16, kQ8x16, kQ5x16, kQ6x16, kQ4Kx16, kQ5Kx16, kQ4Sx16, kQ5Sx16
};
inline constexpr int kNumPackedFormats = 8;
inline constexpr int64_t kPackedRows = 16;  // weight rows per tile

// Bytes of one block index of one tile (320, 544, 384, 288 for kQ4Sx16, 352 for kQ5Sx16; for
// kQ6x16, kQ4Kx16 and kQ5Kx16, whose unit is a super-block of 8 block indices, an eighth of it:
// 420 (with its share of the d array), 288, 352).
int64_t PackedBlockBytes(PackedFormat format);

// Bytes of one tile of rows of k elements: k / 32 * PackedBlockBytes(format), and for kQ6x16 with
// an odd number of super-blocks 32 more (its padding). A multiple of 64 for every format but
// kQ8x16. REQUIRES: k a multiple of the format's block (32; 256 for the K-quants).
int64_t PackedTileBytes(PackedFormat format, int64_t k);

// Whether the kernel table for `isa` has its own kernel for `format`. Where it has not, MatMul
// runs packed weights on the scalar reference kernel, so packing for speed is pointless there.
bool PackedKernelIsNative(PackedFormat format, Isa isa);

class PackedWeights {
 public:
  // The packed format for `type`, or std::nullopt for a type without one (F32, F16, BF16,
  // IQ4_NL, Q8_K).
  static std::optional<PackedFormat> FormatFor(DType type);

  // Packs the [n, k] matrix at `w` (row r at w + r * w_row_bytes; 0: packed rows). INVALID_ARGUMENT
  // for a negative size, K not a multiple of the type's block (32; 256 for the K-quants), a short
  // w_row_bytes or a null `w`; UNIMPLEMENTED for a type without a packed format;
  // RESOURCE_EXHAUSTED when the memory cannot be allocated.
  //
  // `rows_packed`, when set, is called as packing goes, with the number of leading source rows
  // that will not be read again (ascending; the last call has n), so that a caller can release
  // their memory before the rest is packed: the source and the copy never both stay whole.
  static absl::StatusOr<PackedWeights> Pack(
      const void* w, DType type, int64_t n, int64_t k, int64_t w_row_bytes = 0,
      const std::function<void(int64_t rows)>& rows_packed = nullptr);

  // Bytes Pack allocates for an [n, k] matrix of `type` (0 for a type without a packed format).
  static int64_t PackedBytes(DType type, int64_t n, int64_t k);

  PackedFormat format() const { return format_; }
  int64_t n() const { return n_; }
  int64_t k() const { return k_; }
  int64_t num_tiles() const { return (n_ + kPackedRows - 1) / kPackedRows; }
  int64_t tile_bytes() const { return PackedTileBytes(format_, k_); }
  int64_t bytes() const { return num_tiles() * tile_bytes(); }
  // Writes row `row` back in the GGUF layout of `type`, byte for byte what was packed, to
  // `out` (DTypeStorageBytes(type, k) bytes): a tied embedding reads its token rows from the
  // output matrix's packed copy, not from file pages that would come back into memory.
  // UNIMPLEMENTED unless the format is kQ8x16 from Q8_0, kQ4x16 from Q4_1, kQ4Sx16 from Q4_0,
  // kQ6x16 from Q6_K or kQ4Kx16 / kQ5Kx16 from Q4_K / Q5_K (the formats that hold the file's codes
  // and scales as they are); OUT_OF_RANGE for a row past n.
  absl::Status UnpackRow(int64_t row, DType type, void* out) const;
  // Tile t: rows 16t .. 16t + 15. The data starts 64-byte aligned (so do the tiles of every format
  // but kQ8x16).
  const uint8_t* tile(int64_t t) const { return data_.get() + t * tile_bytes(); }

 private:
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  PackedWeights(PackedFormat format, int64_t n, int64_t k, std::unique_ptr<uint8_t, Free> data)
      : format_(format), n_(n), k_(k), data_(std::move(data)) {}

  PackedFormat format_;
  int64_t n_ = 0, k_ = 0;
  std::unique_ptr<uint8_t, Free> data_;
};

}  // namespace tandem::cpu

#endif  // TANDEM_ENGINE_CPU_PACKED_WEIGHTS_H_
