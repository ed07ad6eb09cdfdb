// Internal to engine/cpu: the per-ISA inner loops behind the public ops, and the one table that
// dispatches to them. Not part of the backend's contract; use matmul.h, paged_attention.h, ...
//
// Each ISA's loops live in their own translation unit (kernels_scalar.cc, kernels_avx2.cc,
// kernels_avx512.cc), the SIMD ones compiled with that ISA's -m flags, so the library runs on any
// x86-64 and picks a table at start-up. Those SIMD files keep every function in an anonymous
// namespace and use no inline library templates, so that no COMDAT function compiled with
// AVX-512 can be picked by the linker for code that runs on an older CPU.
#ifndef TANDEM_ENGINE_CPU_KERNEL_TABLE_H_
#define TANDEM_ENGINE_CPU_KERNEL_TABLE_H_

#include <cstdint>

#include "engine/core/dtype.h"
#include "engine/cpu/cpu_features.h"

namespace tandem::cpu {

// A 32-element activation block quantized to int8 (the role of ggml's q8_1 activation blocks):
// x ≈ d * qs, qs in [-127, 127]; s = d * Σ qs, so that the weight offsets (Q4_0's -8, Q4_1's m)
// cost one multiply per block. d and s are floats (not f16) to keep the error at int8's, and
// adjacent so that SIMD code loads them as one pair.
struct BlockQ8Act {
  float d;
  float s;
  int8_t qs[kQuantBlock];
};
static_assert(sizeof(BlockQ8Act) == 40);

// Quantizes `k` floats (k a multiple of 32) into k / 32 blocks: d = max|x| / 127,
// qs = round-to-nearest-even(x / d). The same for every ISA, so integer dot products agree exactly.
// `sums`, when given, receives each block's integer Σ qs (k / 32 values; the kQ8x16 kernels' xsum).
void QuantizeRowQ8Act(const float* x, BlockQ8Act* out, int64_t k, int32_t* sums = nullptr);

// Dot products of one weight row with `m` activation rows:
//   y[i * y_stride] = Σ_k w_row[k] * x_i[k]            for i in [0, m)
// w_row: one row of K weight elements in its DType's storage (K / 32 blocks when quantized).
// x:     float rows (F32/F16/BF16 weights) or BlockQ8Act rows (quantized weights);
//        row i starts `x_stride` elements (floats or blocks) after row i-1.
// k:     elements per row (a whole number of the weight type's blocks: 32 elements, or 256 for
//        the K-quants, whose super-blocks span 8 activation blocks).
using RowDotFn = void (*)(const void* w_row, const void* x, int64_t x_stride, int64_t m, int64_t k,
                          float* y, int64_t y_stride);

// Dot products of two adjacent weight rows, w_row and (const char*)w_row + w_row_bytes, with `m`
// activation rows: y[i * y_stride] from the first and y[i * y_stride + 1] from the second.
// Bit-identical to two RowDotFn calls (same roundings in the same order), so pairing rows changes
// no result; matmul.cc pairs rows 2j, 2j + 1 of each tile.
using RowDot2Fn = void (*)(const void* w_row, int64_t w_row_bytes, const void* x, int64_t x_stride,
                           int64_t m, int64_t k, float* y, int64_t y_stride);

// A packed tile of 16 weight rows (packed_weights.h, whose comment gives the exact arithmetic)
// against `m` activation rows: y[i * y_stride + r] for i < m, r < rows (rows <= 16). Activation
// row i's block b is x[i * x_stride + b], and xsum[i * x_stride + b] is the integer sum of its 32
// codes (the kQ8x16 kernels use it); for kQ6x16, xsum[2 (i * x_stride + b) + h] is the sum of
// the block's codes 16 h .. 16 h + 15 instead; for the other formats it may be null. nb: blocks
// per row (K / 32).
// The packed layouts' sizes per block index of a tile (packed_weights.h): 64-byte groups of 4
// codes of each of the 16 rows (4 for Q4, whose bytes hold two codes; 8 for Q8), then the rows'
// f16 scales (and, Q4, offsets).
template <bool kQ4>
inline constexpr int kPackedGroups = kQ4 ? 4 : 8;
template <bool kQ4>
inline constexpr int64_t kPackedBlockBytes = kPackedGroups<kQ4> * 64 + (kQ4 ? 64 : 32);
// kQ4Sx16 (packed_weights.h): kQ4x16's 4 groups of nibbles, then the rows' f16 scales only.
inline constexpr int64_t kPackedQ4SBlockBytes = 4 * 64 + 32;
// kQ5x16 (packed_weights.h): 4 groups of nibbles as kQ4x16's, one 64-byte group of fifth bits,
// then the rows' f16 scales and offsets.
inline constexpr int64_t kPackedQ5FifthBits = 4 * 64;  // offset of the fifth bits in a block
inline constexpr int64_t kPackedQ5Scales = 5 * 64;     // offset of d[16] (f16), then m[16]
inline constexpr int64_t kPackedQ5BlockBytes = 5 * 64 + 64;
// kQ5Sx16: kQ5x16 without m[16] (Q5_0: m = -16 d).
inline constexpr int64_t kPackedQ5SBlockBytes = 5 * 64 + 32;
// kQ6x16 (packed_weights.h): a tile holds its super-blocks in pairs: one 64-byte line with the
// two units' f16 d[16], then the two units. A unit: 8 sub-blocks of codes (kQ4x16's 4 groups of
// low nibbles, then two 64-byte groups of high bit pairs), then the rows' int8 16-element scales:
// 3328 = 52 * 64 bytes. A last, odd super-block is a pair without its second unit.
inline constexpr int64_t kPackedQ6SubBytes = 6 * 64;             // one sub-block's codes
inline constexpr int64_t kPackedQ6High = 4 * 64;                 // its high bits, in the sub-block
inline constexpr int64_t kPackedQ6Scales = 8 * kPackedQ6SubBytes;  // int8 sc[8][2][16]
inline constexpr int64_t kPackedQ6UnitBytes = kPackedQ6Scales + 256;
inline constexpr int64_t kPackedQ6PairBytes = 64 + 2 * kPackedQ6UnitBytes;  // 105 cache lines
// Offsets in a kQ6x16 tile of super-block s's unit and of its d[16].
inline constexpr int64_t PackedQ6Unit(int64_t s) {
  return s / 2 * kPackedQ6PairBytes + 64 + s % 2 * kPackedQ6UnitBytes;
}
inline constexpr int64_t PackedQ6D(int64_t s) { return s / 2 * kPackedQ6PairBytes + s % 2 * 32; }
// kQ4Kx16 / kQ5Kx16 (packed_weights.h): one super-block unit of a tile: 8 sub-blocks of codes
// (kQ4x16's 4 groups, then for kQ5Kx16 kQ5x16's fifth-bit group), then the rows' low scale
// bits, high scale bits and f16 d / dmin.
template <bool kFive>
inline constexpr int64_t kPackedKSubBytes = kFive ? 5 * 64 : 4 * 64;  // one sub-block's codes
template <bool kFive>
inline constexpr int64_t kPackedKLow = 8 * kPackedKSubBytes<kFive>;  // uint8 lo[8][16]
template <bool kFive>
inline constexpr int64_t kPackedKHigh = kPackedKLow<kFive> + 128;  // uint32 hi[16]
template <bool kFive>
inline constexpr int64_t kPackedKD = kPackedKHigh<kFive> + 64;  // f16 d[16], then dmin[16]
template <bool kFive>
inline constexpr int64_t kPackedKUnitBytes = kPackedKD<kFive> + 64;

inline constexpr int kPackedFormatCount = 8;  // packed_weights.h's kNumPackedFormats

using PackedDotFn = void (*)(const uint8_t* tile, int64_t nb, const BlockQ8Act* x,
                             const int32_t* xsum, int64_t x_stride, int64_t m, float* y,
                             int64_t y_stride, int64_t rows);

// Causal attention of `heads` query heads that share one KV head, head_dim 64, over `ctx` cached
// positions: k[j] / v[j] point at position j's key / value (64 floats each). The arrays hold
// ctx rounded up to a multiple of 32 entries; those past ctx point at 64 readable floats (zeros)
// and are masked out. Query head h is q + h * q_stride, its output out + h * out_stride.
// Online softmax over fixed chunks of 32 positions, as PagedAttention documents.
using Attend64Fn = void (*)(const float* q, int64_t q_stride, int64_t heads, const float* const* k,
                            const float* const* v, int64_t ctx, float scale, float* out,
                            int64_t out_stride);
// The same over an F16 cache: k[j] / v[j] point at 64 IEEE halves, widened as they are loaded.
using Attend64F16Fn = void (*)(const float* q, int64_t q_stride, int64_t heads,
                               const uint16_t* const* k, const uint16_t* const* v, int64_t ctx,
                               float scale, float* out, int64_t out_stride);
inline constexpr int64_t kAttendChunk = 32;
inline constexpr int64_t kAttendMaxHeads = 6;  // Attend64Fn takes 1..6 heads

// Attend64Fn for `rows` query tokens of one sequence at consecutive positions (a prompt chunk):
// token r's heads sit at q + r * q_token_stride + h * 64 and its output at
// out + r * out_token_stride + h * 64; token r attends to positions 0 .. first_ctx + r - 1. The
// arrays hold first_ctx + rows - 1 entries rounded up to a multiple of 32, padded as Attend64Fn's.
// Each key chunk is widened and transposed once for every token and head of the call, so the
// scores come from broadcast query elements without horizontal sums. Every output is bit for bit
// Attend64Fn's for that token alone (the same operations in the same order), so how a prompt is
// cut into calls never changes a result.
using Attend64RowsFn = void (*)(const float* q, int64_t q_token_stride, int64_t rows,
                                int64_t heads, const float* const* k, const float* const* v,
                                int64_t first_ctx, float scale, float* out,
                                int64_t out_token_stride);
using Attend64RowsF16Fn = void (*)(const float* q, int64_t q_token_stride, int64_t rows,
                                   int64_t heads, const uint16_t* const* k,
                                   const uint16_t* const* v, int64_t first_ctx, float scale,
                                   float* out, int64_t out_token_stride);
inline constexpr int64_t kAttendMaxRows = 8;  // Attend64RowsFn takes 1..8 tokens

// QuantizeRowQ8Act's contract; every table's entry gives bit-identical blocks and sums.
using QuantizeQ8ActFn = void (*)(const float* x, BlockQ8Act* out, int64_t k, int32_t* sums);

// out[i] = gate[i] * sigmoid(gate[i]) * up[i] for i < n (SwiGLU); out may alias gate or up.
// Within a few ulp of the scalar entry (the SIMD ones use a vector exp).
using SiluMulFn = void (*)(const float* gate, const float* up, float* out, int64_t n);

// n IEEE halves to floats and back (the KV cache's F16 rows). Every table's entries equal
// HalfToFloat / FloatToHalf (round to nearest even, overflow to Inf) bit for bit; a NaN stays a
// NaN but its payload bits may differ.
using F16ToF32Fn = void (*)(const uint16_t* src, float* dst, int64_t n);
using F32ToF16Fn = void (*)(const float* src, uint16_t* dst, int64_t n);

struct KernelTable {
  Isa isa;
  // Indexed by static_cast<int>(DType); an entry may be nullptr where the table has no kernel of
  // its own for that type (MatMul then runs the scalar table's, which has every entry).
  RowDotFn row_dot[kNumDTypes];
  // Σ a[i] * b[i] for i < n.
  float (*dot_f32)(const float* a, const float* b, int64_t n);
  // y[i] += a * x[i] for i < n.
  void (*axpy_f32)(float a, const float* x, float* y, int64_t n);
  // y[i] *= a for i < n.
  void (*scale_f32)(float a, float* y, int64_t n);
  // Two-row kernels indexed by DType (kNumDTypes entries), or nullptr where the table has none;
  // an entry may be nullptr (then row_dot is used for every row).
  const RowDot2Fn* row_dot2;
  // Kernels over packed tiles, indexed by PackedFormat (kPackedFormatCount entries), or nullptr
  // where the table has none of its own: MatMul then runs the scalar table's, and a caller that
  // packs weights for speed should not pack for this table (PackedKernelsAreNative).
  const PackedDotFn* packed_dot;
  // Attention for head_dim 64, or nullptr (PagedAttention then runs its generic loop on
  // dot_f32 / axpy_f32 / scale_f32).
  Attend64Fn attend64;
  // Never nullptr.
  QuantizeQ8ActFn quantize_q8_act;
  SiluMulFn silu_mul;
  F16ToF32Fn f16_to_f32;
  F32ToF16Fn f32_to_f16;
  // Attend64Fn over an F16 cache, or nullptr (the generic loop then widens each row first).
  Attend64F16Fn attend64_f16;
  // Prompt-chunk tiles (Attend64RowsFn), or nullptr: PagedAttention then calls attend64 /
  // attend64_f16 once per token, with the same result.
  Attend64RowsFn attend64_rows = nullptr;
  Attend64RowsF16Fn attend64_rows_f16 = nullptr;
};

// Whether `table` has its own kernel for packed format `format` (an int PackedFormat).
inline bool PackedKernelsAreNative(const KernelTable& table, int format) {
  return table.packed_dot != nullptr && table.packed_dot[format] != nullptr;
}

const KernelTable& ScalarKernelTable();
// nullptr when the library was built without that ISA's file (non-x86 builds).
const KernelTable* Avx2KernelTable();
const KernelTable* Avx512KernelTable();

// The table for `isa`, or for the best ISA below it that the host supports.
const KernelTable& KernelTableFor(Isa isa);

}  // namespace tandem::cpu

#endif  // TANDEM_ENGINE_CPU_KERNEL_TABLE_H_
