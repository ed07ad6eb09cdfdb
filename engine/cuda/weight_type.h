// Element types of weight matrices on the GPU, and their storage blocks, bit-compatible with GGUF /
// ggml (and with tandem::DType in engine/core/dtype.h, which the backend maps from one layer up;
// this header includes nothing of the project so the kernels build standalone):
//
//   F32   [1 element,   4 bytes]   float
//   F16   [1 element,   2 bytes]   IEEE half
//   BF16  [1 element,   2 bytes]   bfloat16
//   Q8_0  [32 elements, 34 bytes]  d: f16 scale;          qs: int8[32];    x = d * q
//   Q4_0  [32 elements, 18 bytes]  d: f16 scale;          qs: uint8[16];   x = d * (nibble - 8)
//   Q4_1  [32 elements, 20 bytes]  d: f16 scale, m: f16;  qs: uint8[16];   x = d * nibble + m
//
// In Q4_0 / Q4_1, byte j of `qs` holds element j in its low nibble and element j + 16 in its high
// nibble. All values are little-endian. Every block size is even, so any block, and any row of
// whole blocks, starts on a 2-byte boundary when the tensor does.
//
// The helpers are constexpr and callable from host and device code.
#ifndef TANDEM_ENGINE_CUDA_WEIGHT_TYPE_H_
#define TANDEM_ENGINE_CUDA_WEIGHT_TYPE_H_

#include <cstdint>

#if defined(__CUDACC__)
#define TANDEM_WEIGHT_TYPE_HD __host__ __device__
#else
#define TANDEM_WEIGHT_TYPE_HD
#endif

namespace tandem::cuda {

// Same order as tandem::DType.
enum class WeightType { kF32, kF16, kBF16, kQ8_0, kQ4_0, kQ4_1 };

// Element type of a KV cache (same order as tandem::DType's first two): what both the cache
// writes (elementwise.h) and paged attention read.
enum class KvCacheType { kF32, kF16 };

inline constexpr WeightType kAllWeightTypes[] = {WeightType::kF32,  WeightType::kF16,
                                                 WeightType::kBF16, WeightType::kQ8_0,
                                                 WeightType::kQ4_0, WeightType::kQ4_1};

// Elements per quantization block.
inline constexpr int kWeightQuantBlock = 32;

TANDEM_WEIGHT_TYPE_HD constexpr bool IsQuantized(WeightType type) {
  return type == WeightType::kQ8_0 || type == WeightType::kQ4_0 || type == WeightType::kQ4_1;
}

// Elements per storage block: 1 for F32 / F16 / BF16, 32 for the quantized types.
TANDEM_WEIGHT_TYPE_HD constexpr int64_t WeightBlockElements(WeightType type) {
  return IsQuantized(type) ? kWeightQuantBlock : 1;
}

// Bytes per storage block.
TANDEM_WEIGHT_TYPE_HD constexpr int64_t WeightBlockBytes(WeightType type) {
  switch (type) {
    case WeightType::kF32:
      return 4;
    case WeightType::kF16:
    case WeightType::kBF16:
      return 2;
    case WeightType::kQ8_0:
      return 34;
    case WeightType::kQ4_0:
      return 18;
    case WeightType::kQ4_1:
      return 20;
  }
  return 0;
}

// Bytes of a packed row of `k` elements. REQUIRES: k >= 0 and a multiple of
// WeightBlockElements(type).
TANDEM_WEIGHT_TYPE_HD constexpr int64_t WeightRowBytes(WeightType type, int64_t k) {
  return k / WeightBlockElements(type) * WeightBlockBytes(type);
}

// "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1".
TANDEM_WEIGHT_TYPE_HD constexpr const char* WeightTypeName(WeightType type) {
  switch (type) {
    case WeightType::kF32:
      return "F32";
    case WeightType::kF16:
      return "F16";
    case WeightType::kBF16:
      return "BF16";
    case WeightType::kQ8_0:
      return "Q8_0";
    case WeightType::kQ4_0:
      return "Q4_0";
    case WeightType::kQ4_1:
      return "Q4_1";
  }
  return "?";
}

static_assert(WeightRowBytes(WeightType::kQ8_0, 64) == 68);
static_assert(WeightRowBytes(WeightType::kQ4_1, 4096) == 2560);

}  // namespace tandem::cuda

#undef TANDEM_WEIGHT_TYPE_HD

#endif  // TANDEM_ENGINE_CUDA_WEIGHT_TYPE_H_
