// Element types of model tensors and their storage, shared by the model loaders and the kernels.
//
// Quantized types store elements in fixed-size blocks, bit-compatible with GGUF / ggml:
//
//   Q8_0  [32 elements, 34 bytes]  d: f16 scale;          qs: int8[32];      x = d * q
//   Q4_0  [32 elements, 18 bytes]  d: f16 scale;          qs: uint8[16];     x = d * (nibble - 8)
//   Q4_1  [32 elements, 20 bytes]  d: f16 scale, m: f16;  qs: uint8[16];     x = d * nibble + m
//
// In Q4_0/Q4_1, byte j of `qs` holds element j in its low nibble and element j + 16 in its high
// nibble. All values are little-endian.
#ifndef TANDEM_ENGINE_CORE_DTYPE_H_
#define TANDEM_ENGINE_CORE_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

enum class DType : uint8_t { kF32, kF16, kBF16, kQ8_0, kQ4_0, kQ4_1 };

inline constexpr DType kAllDTypes[] = {DType::kF32,  DType::kF16,  DType::kBF16,
                                       DType::kQ8_0, DType::kQ4_0, DType::kQ4_1};

// "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1".
absl::string_view DTypeName(DType type);
// Parses the names above (case-insensitive).
absl::StatusOr<DType> ParseDType(absl::string_view name);

// Elements per storage block: 1 for F32/F16/BF16, 32 for the quantized types.
int64_t DTypeBlockElements(DType type);
// Bytes per storage block.
int64_t DTypeBlockBytes(DType type);
bool IsQuantized(DType type);

// Bytes needed for `elements` elements, or std::nullopt when `elements` is negative, not a whole
// number of blocks, or the size overflows int64.
std::optional<int64_t> DTypeStorageBytes(DType type, int64_t elements);

// The ggml type id used in GGUF files (F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q8_0 = 8,
// BF16 = 30), and back; NOT_FOUND / UNIMPLEMENTED name the id for types Tandem does not support.
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
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);

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
