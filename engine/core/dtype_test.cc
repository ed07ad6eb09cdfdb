#include "engine/core/dtype.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

uint16_t Bits(_Float16 h) {
  uint16_t b;
  std::memcpy(&b, &h, sizeof(b));
  return b;
}

// The compiler's own _Float16 conversion is the independent reference for ours.
TEST(HalfTest, EveryHalfMatchesTheCompilerAndRoundTrips) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    _Float16 ref;
    const auto bits = static_cast<uint16_t>(h);
    std::memcpy(&ref, &bits, sizeof(ref));
    const float want = static_cast<float>(ref);
    const float got = HalfToFloat(bits);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << h;
      ASSERT_TRUE(std::isnan(HalfToFloat(FloatToHalf(got))));
      continue;
    }
    ASSERT_EQ(std::memcmp(&got, &want, sizeof(float)), 0) << std::hex << h;
    ASSERT_EQ(FloatToHalf(got), bits) << std::hex << h;
  }
}

TEST(HalfTest, RoundingMatchesTheCompilerOnRandomFloats) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> any;
  for (int i = 0; i < 2000000; ++i) {
    uint32_t u = any(rng);
    // Bias towards the half range, including subnormals and overflow.
    if (i % 2 == 0) u = (u & 0x807FFFFFu) | ((100u + (u >> 24) % 50u) << 23);
    float f;
    std::memcpy(&f, &u, sizeof(f));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToHalf(f), Bits(static_cast<_Float16>(f))) << f << " bits " << std::hex << u;
  }
}

TEST(BFloat16Test, RoundTripAndRounding) {
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(1.0f)), 1.0f);
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(-3.5f)), -3.5f);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to even (1.0).
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(std::nanf("")))));
  EXPECT_TRUE(std::isinf(BFloat16ToFloat(FloatToBFloat16(INFINITY))));
}

TEST(DTypeTest, NamesSizesAndGgmlIds) {
  for (DType t : kAllDTypes) {
    EXPECT_EQ(*ParseDType(DTypeName(t)), t);
    EXPECT_EQ(*DTypeFromGgmlTypeId(GgmlTypeId(t)), t);
  }
  EXPECT_EQ(*ParseDType("q4_k"), DType::kQ4_K);
  EXPECT_EQ(*ParseDType("iq4_nl"), DType::kIQ4_NL);
  EXPECT_EQ(ParseDType("q3_k").status().code(), absl::StatusCode::kInvalidArgument);
  // Known ggml types Tandem does not read are named in the message.
  const absl::Status q3k = DTypeFromGgmlTypeId(11).status();
  EXPECT_EQ(q3k.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(q3k.message().find("Q3_K"), absl::string_view::npos) << q3k;
  EXPECT_EQ(*DTypeFromGgmlTypeId(12), DType::kQ4_K);
  EXPECT_EQ(*DTypeFromGgmlTypeId(20), DType::kIQ4_NL);
  EXPECT_EQ(DTypeFromGgmlTypeId(999).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(DTypeStorageBytes(DType::kQ4_1, 64), 40);
  EXPECT_EQ(DTypeStorageBytes(DType::kQ8_0, 32), 34);
  EXPECT_EQ(DTypeStorageBytes(DType::kBF16, 3), 6);
  EXPECT_EQ(DTypeStorageBytes(DType::kQ4_0, 33), std::nullopt);  // not whole blocks
  EXPECT_EQ(DTypeStorageBytes(DType::kQ4_K, 512), 288);
  EXPECT_EQ(DTypeStorageBytes(DType::kQ6_K, 256), 210);
  EXPECT_EQ(DTypeStorageBytes(DType::kQ5_0, 64), 44);
  EXPECT_EQ(DTypeStorageBytes(DType::kQ4_K, 576), std::nullopt);  // 2.25 super-blocks
  EXPECT_EQ(DTypeStorageBytes(DType::kF32, -1), std::nullopt);
  EXPECT_EQ(DTypeStorageBytes(DType::kF32, int64_t{1} << 62), std::nullopt);  // overflow
}

TEST(DequantizeTest, QuantizedBlocksFollowTheGgmlLayout) {
  BlockQ4_1 q41{};
  q41.d = FloatToHalf(0.5f);
  q41.m = FloatToHalf(-1.0f);
  for (int j = 0; j < 16; ++j) q41.qs[j] = static_cast<uint8_t>(j | (15 - j) << 4);
  float out[32];
  DequantizeReference(DType::kQ4_1, &q41, out, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], 0.5f * j - 1.0f);
    EXPECT_EQ(out[j + 16], 0.5f * (15 - j) - 1.0f);
  }
  BlockQ4_0 q40{};
  q40.d = FloatToHalf(2.0f);
  for (int j = 0; j < 16; ++j) q40.qs[j] = static_cast<uint8_t>(j | j << 4);
  DequantizeReference(DType::kQ4_0, &q40, out, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], 2.0f * (j - 8));
    EXPECT_EQ(out[j + 16], 2.0f * (j - 8));
  }
  BlockQ8_0 q8{};
  q8.d = FloatToHalf(0.25f);
  for (int j = 0; j < 32; ++j) q8.qs[j] = static_cast<int8_t>(j * 8 - 128);
  DequantizeReference(DType::kQ8_0, &q8, out, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(out[j], 0.25f * (j * 8 - 128));
}

}  // namespace
}  // namespace tandem
