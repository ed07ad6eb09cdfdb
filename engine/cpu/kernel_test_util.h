// Test-only helpers shared by the engine/cpu kernel tests: random tensors in every DType.
#ifndef TANDEM_ENGINE_CPU_KERNEL_TEST_UTIL_H_
#define TANDEM_ENGINE_CPU_KERNEL_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/cpu/cpu_features.h"
#include "engine/cpu/matmul.h"
#include "gtest/gtest.h"

namespace tandem::cpu::testing {

inline std::vector<float> RandomFloats(std::mt19937& rng, int64_t n, float lo = -1.0f,
                                       float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// `rows` rows of `k` elements of `type` with random contents (quantized blocks get random int
// codes and scales of the size real checkpoints have).
inline std::vector<uint8_t> RandomWeights(std::mt19937& rng, DType type, int64_t rows, int64_t k) {
  const int64_t elements = rows * k;
  std::vector<uint8_t> bytes(static_cast<size_t>(*DTypeStorageBytes(type, elements)));
  std::uniform_real_distribution<float> val(-1.0f, 1.0f);
  std::uniform_real_distribution<float> scale(0.002f, 0.03f);
  std::uniform_int_distribution<int> byte(0, 255);
  auto put16 = [&](int64_t offset, uint16_t v) { std::memcpy(bytes.data() + offset, &v, 2); };
  switch (type) {
    case DType::kF32:
      for (int64_t i = 0; i < elements; ++i) {
        const float f = val(rng);
        std::memcpy(bytes.data() + 4 * i, &f, 4);
      }
      break;
    case DType::kF16:
      for (int64_t i = 0; i < elements; ++i) put16(2 * i, FloatToHalf(val(rng)));
      break;
    case DType::kBF16:
      for (int64_t i = 0; i < elements; ++i) put16(2 * i, FloatToBFloat16(val(rng)));
      break;
    default: {  // quantized: random codes, then scales of realistic size where the format has them
      const int64_t block_bytes = DTypeBlockBytes(type);
      for (int64_t b = 0; b < elements / DTypeBlockElements(type); ++b) {
        const int64_t off = b * block_bytes;
        for (int64_t i = 0; i < block_bytes; ++i) bytes[off + i] = static_cast<uint8_t>(byte(rng));
        switch (type) {
          case DType::kQ8_0:  // int8 codes in [-127, 127], as ggml writes them
            put16(off, FloatToHalf(scale(rng)));
            for (int i = 0; i < kQuantBlock; ++i) {
              if (bytes[off + 2 + i] == 0x80) bytes[off + 2 + i] = 0x81;
            }
            break;
          case DType::kQ4_1:
          case DType::kQ5_1:
            put16(off, FloatToHalf(scale(rng)));
            put16(off + 2, FloatToHalf(0.1f * val(rng)));
            break;
          case DType::kIQ4_NL:  // codes up to 127
            put16(off, FloatToHalf(scale(rng) / 16.0f));
            break;
          case DType::kQ4_K:  // 6-bit sub-block scales and mins
          case DType::kQ5_K:
            put16(off, FloatToHalf(scale(rng) / 32.0f));
            put16(off + 2, FloatToHalf(scale(rng) / 8.0f));
            break;
          case DType::kQ6_K:  // int8 sub-block scales; d last
            put16(off + 208, FloatToHalf(scale(rng) / 64.0f));
            break;
          case DType::kQ8_K: {  // f32 d
            const float d = scale(rng);
            std::memcpy(bytes.data() + off, &d, 4);
            break;
          }
          default:
            put16(off, FloatToHalf(scale(rng)));
            break;
        }
      }
      break;
    }
  }
  return bytes;
}

inline std::string IsaDTypeName(Isa isa, DType type) {
  return std::string(IsaName(isa)) + "_" + std::string(DTypeName(type));
}

// Batch invariance: `batched` (the result of MatMul(p) with p.m rows) equals, bit for bit, each
// row computed alone (M = 1) with `context`.
inline void ExpectRowsEqualAlone(const MatMulParams& p, const KernelContext& context,
                                 const std::vector<float>& batched) {
  for (int64_t i = 0; i < p.m; ++i) {
    std::vector<float> alone(static_cast<size_t>(p.n));
    MatMulParams one = p;
    one.x = p.x + i * p.x_stride;
    one.y = alone.data();
    one.m = 1;
    ASSERT_TRUE(MatMul(one, context).ok());
    EXPECT_EQ(alone, std::vector<float>(batched.begin() + i * p.y_stride,
                                        batched.begin() + i * p.y_stride + p.n))
        << "row " << i;
  }
}

}  // namespace tandem::cpu::testing

#endif  // TANDEM_ENGINE_CPU_KERNEL_TEST_UTIL_H_
