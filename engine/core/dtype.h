// Element types of model tensors and their storage, shared by the model loaders and the kernels.
//
// Quantized types store elements in fixed-size blocks, bit-compatible with GGUF / ggml:
//
//   Q8_0  [32 elements, 34 bytes]  d: f16 scale;          qs: int8[32];      x = d * q
//   Q4_0  [32 elements, 18 bytes]  d: f16 scale;          qs: uint8[16];     x = d * (nibble - 8)
//   Q4_1  [32 elements, 20 bytes]  d: f16 scale, m: f16;  qs: uint8[16];     x = d * nibble + m
//
//   Q5_0  [32 elements, 22 bytes]  d: f16; qh: 32 bits; qs: uint8[16];  x = d * (q - 16)
//   Q5_1  [32 elements, 24 bytes]  d, m: f16; qh; qs;                   x = d * q + m
//   IQ4_NL [32 elements, 18 bytes] d: f16; qs: uint8[16];               x = d * kIq4NlValues[nibble]
//
// In Q4_0/Q4_1/Q5_0/Q5_1/IQ4_NL, byte j of `qs` holds element j in its low nibble and element
// j + 16 in its high nibble; for Q5_*, bit j of the little-endian 32-bit `qh` is element j's 5th
// bit (q = nibble | bit << 4).
//
// The K-quants store 256-element super-blocks (kSuperBlock):
//
//   Q4_K  [256, 144 bytes]  d, dmin: f16; scales: 12 bytes (8 6-bit scales sc_j and mins m_j);
//                           qs: uint8[128];                 x = (d * sc_j) * q - (dmin * m_j)
//   Q5_K  [256, 176 bytes]  as Q4_K plus qh: uint8[32] (the 5th bits)
//   Q6_K  [256, 210 bytes]  ql: uint8[128] (low 4 bits); qh: uint8[64] (high 2 bits);
//                           scales: int8[16]; d: f16;       x = (d * scales[i / 16]) * (q - 32)
//   Q8_K  [256, 292 bytes]  d: f32; qs: int8[256]; bsums: int16[16] (Σ of each 16 codes);
//                           x = d * q
//
// Q4_K/Q5_K sub-block j (elements 32j .. 32j + 31) takes its codes from qs[32 * (j / 2) + l]: the
// low nibble for even j, the high one for odd j; Q5_K's 5th bit of element 32j + l is bit j of
// qh[l]. Scales: for j < 4, sc_j = scales[j] & 63 and m_j = scales[j + 4] & 63; for j >= 4 the low
// four bits come from scales[j + 4] (sc: low nibble, m: high nibble) and the top two from bits 6-7
// of scales[j - 4] (sc) and scales[j] (m) (KQuantScaleMin).
// Q6_K element 128h + 32g + l (h < 2, g < 4, l < 32): low bits from ql[64h + 32(g & 1) + l] (low
// nibble for g < 2, high for g >= 2), high bits (qh[32h + l] >> 2g) & 3, scale scales[8h + 2g +
// l / 16].
// All values are little-endian.
#ifndef TANDEM_ENGINE_CORE_DTYPE_H_
#define TANDEM_ENGINE_CORE_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kQ8_0,
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kIQ4_NL,
  kQ4_K,
  kQ5_K,
  kQ6_K,
  kQ8_K,
};
inline constexpr int kNumDTypes = 13;

inline constexpr DType kAllDTypes[kNumDTypes] = {
    DType::kF32,  DType::kF16,  DType::kBF16,   DType::kQ8_0, DType::kQ4_0,
    DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,   DType::kIQ4_NL, DType::kQ4_K,
    DType::kQ5_K, DType::kQ6_K, DType::kQ8_K};

// "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "Q4_K", "Q5_K", "Q6_K",
// "Q8_K".
absl::string_view DTypeName(DType type);
// Parses the names above (case-insensitive).
absl::StatusOr<DType> ParseDType(absl::string_view name);

// Elements per storage block: 1 for F32/F16/BF16, 32 for Q8_0 ... IQ4_NL, 256 for the K-quants.
int64_t DTypeBlockElements(DType type);
// Bytes per storage block.
int64_t DTypeBlockBytes(DType type);
bool IsQuantized(DType type);

// Bytes needed for `elements` elements, or std::nullopt when `elements` is negative, not a whole
// number of blocks, or the size overflows int64.
std::optional<int64_t> DTypeStorageBytes(DType type, int64_t elements);

// The ggml type id used in GGUF files (F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7,
// Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15, IQ4_NL = 20, BF16 = 30), and back; NOT_FOUND / UNIMPLEMENTED name the id for types Tandem does not support.
uint32_t GgmlTypeId(DType type);
absl::StatusOr<DType> DTypeFromGgmlTypeId(uint32_t id);

inline constexpr int kQuantBlock = 32;

struct BlockQ8_0 {
  uint16_t d;  // f16
  int8_t qs[kQuantBlock];
};
struct BlockQ4_0 {
  uint16_t d;  // f16
  uint8_t qs[kQuantBlock / 2];
};
struct BlockQ4_1 {
  uint16_t d;  // f16
  uint16_t m;  // f16
  uint8_t qs[kQuantBlock / 2];
};
struct BlockQ5_0 {
  uint16_t d;     // f16
  uint8_t qh[4];  // little-endian uint32: bit j is element j's 5th bit
  uint8_t qs[kQuantBlock / 2];
};
struct BlockQ5_1 {
  uint16_t d;  // f16
  uint16_t m;  // f16
  uint8_t qh[4];
  uint8_t qs[kQuantBlock / 2];
};
struct BlockIQ4_NL {
  uint16_t d;  // f16
  uint8_t qs[kQuantBlock / 2];
};
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockIQ4_NL) == 18);

// IQ4_NL's 16 code points (the format's fixed non-linear grid).
inline constexpr int8_t kIq4NlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

inline constexpr int kSuperBlock = 256;

struct BlockQ4_K {
  uint16_t d;     // f16
  uint16_t dmin;  // f16
  uint8_t scales[12];
  uint8_t qs[kSuperBlock / 2];
};
struct BlockQ5_K {
  uint16_t d;     // f16
  uint16_t dmin;  // f16
  uint8_t scales[12];
  uint8_t qh[kSuperBlock / 8];
  uint8_t qs[kSuperBlock / 2];
};
struct BlockQ6_K {
  uint8_t ql[kSuperBlock / 2];
  uint8_t qh[kSuperBlock / 4];
  int8_t scales[kSuperBlock / 16];
  uint16_t d;  // f16
};
struct BlockQ8_K {
  float d;
  int8_t qs[kSuperBlock];
  int16_t bsums[kSuperBlock / 16];
};
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ8_K) == 292);

// Q4_K / Q5_K sub-block j's (j < 8) 6-bit scale and min, unpacked from `scales` (12 bytes).
inline void KQuantScaleMin(const uint8_t* scales, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = scales[j] & 63;
    *m = scales[j + 4] & 63;
  } else {
    *sc = (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4);
    *m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
  }
}

// IEEE half <-> float, exact (round-to-nearest-even on the way down; NaN and Inf kept).
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
// bfloat16 <-> float (round-to-nearest-even on the way down; NaN kept as a quiet NaN).
inline float BFloat16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  __builtin_memcpy(&f, &bits, sizeof(f));
  return f;
}
uint16_t FloatToBFloat16(float f);

// Reference conversion of `n` elements of `type` at `src` to float (n must be a whole number of
// blocks). The scalar ground truth that SIMD kernels are tested against.
void DequantizeReference(DType type, const void* src, float* dst, int64_t n);

}  // namespace tandem

#endif  // TANDEM_ENGINE_CORE_DTYPE_H_
