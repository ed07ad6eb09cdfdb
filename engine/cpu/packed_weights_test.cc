#include "engine/cpu/packed_weights.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engine/cpu/kernel_table.h"
#include "engine/cpu/kernel_test_util.h"
#include "engine/cpu/matmul.h"
#include "engine/cpu/thread_pool.h"
#include "gtest/gtest.h"

namespace tandem::cpu {
namespace {

using testing::RandomFloats;
using testing::RandomWeights;

constexpr DType kPackable[] = {DType::kQ4_0, DType::kQ4_1, DType::kQ8_0, DType::kQ5_0,
                               DType::kQ5_1, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

// Row widths to test a type on: around the kernels' unrolling, whole super-blocks for K-quants
// (odd and even counts of them: a kQ6x16 tile of an odd count ends in padding).
std::vector<int64_t> Widths(DType type) {
  if (DTypeBlockElements(type) == kSuperBlock) return {256, 512, 768};
  return {32, 96, 576};
}

// Q6_K: elements 32 (b % 8) .. + 31 of super-block b / 8 as x = d * scales[j / 16] * code[j],
// code in -32..31, read from the GGUF block (ql[128], qh[64], int8 scales[16], f16 d).
void Q6KCodes(const uint8_t* row, int64_t b, int code[kQuantBlock], int scales[2], float* d) {
  const uint8_t* blk = row + (b / 8) * DTypeBlockBytes(DType::kQ6_K);
  const uint8_t* ql = blk;
  const uint8_t* qh = blk + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(blk + 192);
  uint16_t d16;
  std::memcpy(&d16, blk + 208, 2);
  *d = HalfToFloat(d16);
  // Element e = 128 h + 32 g + l of the super-block: low bits from ql[64 h + 32 (g & 1) + l]
  // (low nibble for g < 2), high bits 2g..2g+1 of qh[32 h + l]; scale sc[e / 16].
  const int e0 = 32 * static_cast<int>(b % 8), h = e0 / 128, g = (e0 % 128) / 32;
  for (int l = 0; l < kQuantBlock; ++l) {
    const uint8_t low = ql[64 * h + 32 * (g & 1) + l];
    const int q = (g < 2 ? low & 0x0F : low >> 4) | (((qh[32 * h + l] >> (2 * g)) & 3) << 4);
    code[l] = q - 32;
  }
  scales[0] = sc[e0 / 16];
  scales[1] = sc[e0 / 16 + 1];
}

// Element j of 32-element block b (K-quants: sub-block b % 8 of super-block b / 8) of the row at
// `row`, as x = scale * code + offset, read from the GGUF block as dtype.h documents it.
void BlockCodes(DType type, const uint8_t* row, int64_t b, int code[kQuantBlock], float* scale,
                float* offset) {
  const int64_t block_bytes = DTypeBlockBytes(type);
  uint16_t h[2];
  switch (type) {
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1: {
      const uint8_t* blk = row + b * block_bytes;
      std::memcpy(h, blk, 4);
      *scale = HalfToFloat(h[0]);
      *offset = type == DType::kQ4_1 ? HalfToFloat(h[1])
                : type == DType::kQ4_0 ? -8.0f * *scale : 0.0f;
      for (int j = 0; j < kQuantBlock; ++j) {
        if (type == DType::kQ8_0) {
          code[j] = static_cast<int8_t>(blk[2 + j]);
        } else {
          const uint8_t* qs = blk + (type == DType::kQ4_1 ? 4 : 2);
          code[j] = j < 16 ? (qs[j] & 0x0F) : (qs[j - 16] >> 4);
        }
      }
      return;
    }
    case DType::kQ5_0:
    case DType::kQ5_1: {
      const uint8_t* blk = row + b * block_bytes;
      std::memcpy(h, blk, 4);
      const uint8_t* qh = blk + (type == DType::kQ5_1 ? 4 : 2);
      const uint8_t* qs = qh + 4;
      *scale = HalfToFloat(h[0]);
      *offset = type == DType::kQ5_1 ? HalfToFloat(h[1]) : -16.0f * *scale;
      for (int j = 0; j < kQuantBlock; ++j) {
        const int low = j < 16 ? (qs[j] & 0x0F) : (qs[j - 16] >> 4);
        code[j] = low | (((qh[j / 8] >> (j % 8)) & 1) << 4);
      }
      return;
    }
    default: {  // Q4_K, Q5_K: d, dmin, 12 scale bytes, (Q5_K: qh[32]), qs[128]
      const uint8_t* blk = row + (b / 8) * block_bytes;
      const int sub = static_cast<int>(b % 8);
      std::memcpy(h, blk, 4);
      const uint8_t* scales = blk + 4;
      const uint8_t* qh = type == DType::kQ5_K ? blk + 16 : nullptr;
      const uint8_t* qs = blk + (type == DType::kQ5_K ? 48 : 16);
      int sc, mn;
      KQuantScaleMin(scales, sub, &sc, &mn);
      *scale = HalfToFloat(h[0]) * static_cast<float>(sc);
      *offset = -HalfToFloat(h[1]) * static_cast<float>(mn);
      for (int j = 0; j < kQuantBlock; ++j) {
        code[j] = (qs[32 * (sub / 2) + j] >> (4 * (sub % 2))) & 0x0F;
        if (qh != nullptr) code[j] |= ((qh[j] >> sub) & 1) << 4;
      }
      return;
    }
  }
}

// The arithmetic packed_weights.h documents, computed from the GGUF blocks as stored (not from
// the packed tile): weight element j of block b as an integer code q and a scale and offset.
std::vector<float> Reference(DType type, const std::vector<uint8_t>& w, int64_t n, int64_t k,
                             const std::vector<BlockQ8Act>& xq, int64_t m) {
  const int64_t nb = k / kQuantBlock;
  const int64_t row_bytes = *DTypeStorageBytes(type, k);
  std::vector<float> y(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t r = 0; r < n; ++r) {
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        const BlockQ8Act& xb = xq[static_cast<size_t>(i * nb + b)];
        if (type == DType::kQ6_K) {  // two 16-element halves with int8 scales, summed in integers
          int code[kQuantBlock];
          int scales[2];
          float d;
          Q6KCodes(w.data() + r * row_bytes, b, code, scales, &d);
          int32_t half_sums[2] = {0, 0};
          for (int j = 0; j < kQuantBlock; ++j) half_sums[j / 16] += code[j] * xb.qs[j];
          const int32_t sumi = scales[0] * half_sums[0] + scales[1] * half_sums[1];
          acc = std::fma(static_cast<float>(sumi), d * xb.d, acc);
          continue;
        }
        int code[kQuantBlock];
        float scale, offset;
        BlockCodes(type, w.data() + r * row_bytes, b, code, &scale, &offset);
        int32_t sumi = 0;
        for (int j = 0; j < kQuantBlock; ++j) sumi += code[j] * xb.qs[j];
        acc = std::fma(static_cast<float>(sumi), scale * xb.d, acc);
        if (type != DType::kQ8_0) acc = std::fma(offset, xb.s, acc);
      }
      y[static_cast<size_t>(i * n + r)] = acc;
    }
  }
  return y;
}

std::vector<BlockQ8Act> Quantize(const std::vector<float>& x, int64_t m, int64_t k) {
  const int64_t nb = k / kQuantBlock;
  std::vector<BlockQ8Act> xq(static_cast<size_t>(m * nb));
  for (int64_t i = 0; i < m; ++i) QuantizeRowQ8Act(x.data() + i * k, xq.data() + i * nb, k);
  return xq;
}

// MatMul over packed weights, on every ISA the host has, equals the documented arithmetic bit
// for bit: for M in and around the kernels' register blocks (8), N that leaves partial tiles, and
// padded strides. The reference reads the GGUF blocks, so a wrong transposition fails here.
TEST(PackedWeightsTest, EveryIsaComputesTheDocumentedArithmeticExactly) {
  std::mt19937 rng(77);
  for (DType type : kPackable) {
    for (int64_t k : Widths(type)) {
      for (int64_t n : {1, 15, 16, 17, 40}) {
        const std::vector<uint8_t> w = RandomWeights(rng, type, n, k);
        absl::StatusOr<PackedWeights> packed = PackedWeights::Pack(w.data(), type, n, k);
        ASSERT_TRUE(packed.ok()) << packed.status();
        for (int64_t m : {1, 3, 8, 9, 17}) {
          const std::vector<float> x = RandomFloats(rng, m * k, -2.0f, 2.0f);
          const std::vector<float> want = Reference(type, w, n, k, Quantize(x, m, k), m);
          for (Isa isa : kAllIsas) {
            if (!IsaSupported(isa, HostCpuFeatures())) continue;
            SCOPED_TRACE(::testing::Message() << IsaName(isa) << " " << DTypeName(type)
                                              << " M=" << m << " N=" << n << " K=" << k);
            const int64_t y_stride = n + 2;
            std::vector<float> y(static_cast<size_t>(m * y_stride), -1.0f);
            MatMulParams p{.x = x.data(), .x_stride = k, .y = y.data(), .y_stride = y_stride,
                           .m = m, .n = n, .k = k, .packed = &*packed};
            ASSERT_TRUE(MatMul(p, {.isa = isa}).ok());
            for (int64_t i = 0; i < m; ++i) {
              for (int64_t r = 0; r < n; ++r) {
                ASSERT_EQ(y[i * y_stride + r], want[i * n + r]) << "m=" << i << " n=" << r;
              }
              // Outputs past N (the packed tile's zero rows) are not written.
              ASSERT_EQ(y[i * y_stride + n], -1.0f);
              ASSERT_EQ(y[i * y_stride + n + 1], -1.0f);
            }
          }
        }
      }
    }
  }
}

// The packed product approximates the unpacked one: both take the same integer dot products of
// the same quantized activations and differ only in float rounding order.
TEST(PackedWeightsTest, AgreesWithTheRowKernelsWithinRounding) {
  std::mt19937 rng(3);
  const int64_t m = 5, n = 33;
  for (DType type : kPackable) {
    const int64_t k = DTypeBlockElements(type) == kSuperBlock ? 512 : 32 * 9;
    const std::vector<uint8_t> w = RandomWeights(rng, type, n, k);
    std::vector<float> deq(static_cast<size_t>(n * k));
    DequantizeReference(type, w.data(), deq.data(), n * k);
    absl::StatusOr<PackedWeights> packed = PackedWeights::Pack(w.data(), type, n, k);
    ASSERT_TRUE(packed.ok()) << packed.status();
    const std::vector<float> x = RandomFloats(rng, m * k, -2.0f, 2.0f);
    std::vector<float> y_rows(static_cast<size_t>(m * n)), y_packed(static_cast<size_t>(m * n));
    MatMulParams p{.x = x.data(), .x_stride = k, .w = w.data(), .w_type = type,
                   .y = y_rows.data(), .y_stride = n, .m = m, .n = n, .k = k};
    ASSERT_TRUE(MatMul(p).ok());
    p.y = y_packed.data();
    p.packed = &*packed;
    ASSERT_TRUE(MatMul(p).ok());
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t r = 0; r < n; ++r) {
        // Σ |w · x| bounds every partial sum; Q4 offsets add up to 16·|d| per element.
        double terms = 0.0;
        for (int64_t j = 0; j < k; ++j) {
          terms += (std::fabs(deq[r * k + j]) + 0.3) * std::fabs(x[i * k + j]);
        }
        EXPECT_NEAR(y_packed[i * n + r], y_rows[i * n + r], 4.0 * k * FLT_EPSILON * terms)
            << DTypeName(type) << " m=" << i << " n=" << r;
      }
    }
  }
}

// A row's result does not depend on how many activation rows share the call, nor on threads.
TEST(PackedWeightsTest, BatchAndThreadInvariant) {
  std::mt19937 rng(11);
  const int64_t n = 48, m = 19;
  ThreadPool pool({.num_threads = 3});
  for (DType type : kPackable) {
    const int64_t k = DTypeBlockElements(type) == kSuperBlock ? 512 : 32 * 5;
    const std::vector<uint8_t> w = RandomWeights(rng, type, n, k);
    absl::StatusOr<PackedWeights> packed = PackedWeights::Pack(w.data(), type, n, k);
    ASSERT_TRUE(packed.ok());
    const std::vector<float> x = RandomFloats(rng, m * k);
    std::vector<float> batched(static_cast<size_t>(m * n));
    MatMulParams p{.x = x.data(), .x_stride = k, .y = batched.data(), .y_stride = n, .m = m,
                   .n = n, .k = k, .packed = &*packed};
    ASSERT_TRUE(MatMul(p, {.pool = &pool, .isa = std::nullopt}).ok());
    testing::ExpectRowsEqualAlone(p, {}, batched);
  }
}

// MatMulShared mixes packed and row-layout products over one quantization of x.
TEST(PackedWeightsTest, SharedCallMixesPackedAndRowLayouts) {
  std::mt19937 rng(21);
  const int64_t m = 6, k = 64;
  const std::vector<uint8_t> wa = RandomWeights(rng, DType::kQ4_1, 20, k);
  const std::vector<uint8_t> wb = RandomWeights(rng, DType::kQ8_0, 7, k);
  absl::StatusOr<PackedWeights> pa = PackedWeights::Pack(wa.data(), DType::kQ4_1, 20, k);
  ASSERT_TRUE(pa.ok());
  const std::vector<float> x = RandomFloats(rng, m * k);
  std::vector<float> ya(m * 20), yb(m * 7), ya1(m * 20), yb1(m * 7);
  MatMulParams a{.x = x.data(), .x_stride = k, .y = ya.data(), .y_stride = 20, .m = m, .n = 20,
                 .k = k, .packed = &*pa};
  MatMulParams b{.x = x.data(), .x_stride = k, .w = wb.data(), .w_type = DType::kQ8_0,
                 .y = yb.data(), .y_stride = 7, .m = m, .n = 7, .k = k};
  const MatMulParams both[] = {a, b};
  ASSERT_TRUE(MatMulShared(both).ok());
  a.y = ya1.data();
  b.y = yb1.data();
  ASSERT_TRUE(MatMul(a).ok());
  ASSERT_TRUE(MatMul(b).ok());
  EXPECT_EQ(ya, ya1);
  EXPECT_EQ(yb, yb1);
}

TEST(PackedWeightsTest, RejectsWhatItCannotPack) {
  std::mt19937 rng(1);
  const std::vector<uint8_t> f32 = RandomWeights(rng, DType::kF32, 4, 32);
  EXPECT_EQ(PackedWeights::Pack(f32.data(), DType::kF32, 4, 32).status().code(),
            absl::StatusCode::kUnimplemented);
  const std::vector<uint8_t> q = RandomWeights(rng, DType::kQ4_1, 4, 64);
  EXPECT_EQ(PackedWeights::Pack(q.data(), DType::kQ4_1, 4, 48).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PackedWeights::Pack(q.data(), DType::kQ4_1, 4, 64, /*w_row_bytes=*/20).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PackedWeights::Pack(nullptr, DType::kQ4_1, 4, 64).status().code(),
            absl::StatusCode::kInvalidArgument);

  // MatMul checks the packed shape against the product's.
  absl::StatusOr<PackedWeights> packed = PackedWeights::Pack(q.data(), DType::kQ4_1, 4, 64);
  ASSERT_TRUE(packed.ok());
  std::vector<float> x(64), y(4);
  MatMulParams p{.x = x.data(), .x_stride = 64, .y = y.data(), .y_stride = 3, .m = 1, .n = 3,
                 .k = 64, .packed = &*packed};
  EXPECT_EQ(MatMul(p).code(), absl::StatusCode::kInvalidArgument);

  // K-quant rows are whole 256-element super-blocks; 32-aligned is not enough.
  const std::vector<uint8_t> k4 = RandomWeights(rng, DType::kQ4_K, 2, 256);
  EXPECT_EQ(PackedWeights::Pack(k4.data(), DType::kQ4_K, 2, 96).status().code(),
            absl::StatusCode::kInvalidArgument);
  // IQ4_NL has no packed format.
  EXPECT_FALSE(PackedWeights::FormatFor(DType::kIQ4_NL).has_value());
}

// A Q4_0 scale of 2^14, whose offset -8 · 2^14 is beyond f16 (the old kQ4x16 form stored it as
// f16 and could not pack such a block): the kernels make it in f32, so it packs and every ISA
// still computes the documented arithmetic.
TEST(PackedWeightsTest, Q4_0OffsetsBeyondF16) {
  std::mt19937 rng(5);
  const int64_t n = 3, k = 64;
  std::vector<uint8_t> w = RandomWeights(rng, DType::kQ4_0, n, k);
  const uint16_t huge = FloatToHalf(16384.0f);
  std::memcpy(w.data() + 18 * 2, &huge, 2);  // row 1, block 0
  absl::StatusOr<PackedWeights> packed = PackedWeights::Pack(w.data(), DType::kQ4_0, n, k);
  ASSERT_TRUE(packed.ok()) << packed.status();
  const std::vector<float> x = RandomFloats(rng, k, -2.0f, 2.0f);
  const std::vector<float> want = Reference(DType::kQ4_0, w, n, k, Quantize(x, 1, k), 1);
  for (Isa isa : kAllIsas) {
    if (!IsaSupported(isa, HostCpuFeatures())) continue;
    std::vector<float> y(n);
    MatMulParams p{.x = x.data(), .x_stride = k, .y = y.data(), .y_stride = n, .m = 1, .n = n,
                   .k = k, .packed = &*packed};
    ASSERT_TRUE(MatMul(p, {.isa = isa}).ok());
    for (int64_t r = 0; r < n; ++r) EXPECT_EQ(y[r], want[r]) << IsaName(isa) << " row " << r;
  }
  EXPECT_GT(std::fabs(want[1]), 1000.0f);  // the big block counts
}

TEST(PackedWeightsTest, SizesAndAlignment) {
  std::mt19937 rng(2);
  const std::vector<uint8_t> w = RandomWeights(rng, DType::kQ4_1, 33, 96);
  absl::StatusOr<PackedWeights> packed = PackedWeights::Pack(w.data(), DType::kQ4_1, 33, 96);
  ASSERT_TRUE(packed.ok());
  EXPECT_EQ(packed->num_tiles(), 3);
  EXPECT_EQ(packed->tile_bytes(), 3 * 320);
  EXPECT_EQ(packed->bytes(), 3 * 3 * 320);  // the same bytes per row as Q4_1: 320 / 16 = 20
  EXPECT_EQ(reinterpret_cast<uintptr_t>(packed->tile(1)) % 64, 0u);
  EXPECT_EQ(PackedBlockBytes(PackedFormat::kQ8x16), 16 * 34);
  EXPECT_EQ(PackedBlockBytes(PackedFormat::kQ5x16), 16 * 24);   // Q5_1's 24
  EXPECT_EQ(PackedBlockBytes(PackedFormat::kQ5Sx16), 16 * 22);  // Q5_0's 22
  EXPECT_EQ(8 * PackedBlockBytes(PackedFormat::kQ6x16), 16 * 210);  // Q6_K's 210
  const std::vector<uint8_t> w5 = RandomWeights(rng, DType::kQ5_0, 17, 64);
  absl::StatusOr<PackedWeights> packed5 = PackedWeights::Pack(w5.data(), DType::kQ5_0, 17, 64);
  ASSERT_TRUE(packed5.ok());
  EXPECT_EQ(packed5->format(), PackedFormat::kQ5Sx16);
  EXPECT_EQ(packed5->bytes(), 2 * 2 * 352);
  EXPECT_EQ(PackedWeights::PackedBytes(DType::kQ4_1, 33, 96), packed->bytes());
  EXPECT_EQ(PackedWeights::PackedBytes(DType::kQ5_0, 17, 64), packed5->bytes());
  EXPECT_EQ(PackedWeights::PackedBytes(DType::kIQ4_NL, 16, 64), 0);

  // Q4_0 keeps its 18 bytes per 32 weights (kQ4Sx16: no stored offset).
  const std::vector<uint8_t> w0 = RandomWeights(rng, DType::kQ4_0, 32, 96);
  absl::StatusOr<PackedWeights> packed0 = PackedWeights::Pack(w0.data(), DType::kQ4_0, 32, 96);
  ASSERT_TRUE(packed0.ok());
  EXPECT_EQ(packed0->format(), PackedFormat::kQ4Sx16);
  EXPECT_EQ(packed0->bytes(), *DTypeStorageBytes(DType::kQ4_0, 32 * 96));

  // The K-quant forms take the file's bytes: a whole number of 16-row tiles packs into exactly
  // DTypeStorageBytes (kQ6x16 with an odd number of super-blocks per row: 32 bytes more per
  // tile, its padding), and every tile and super-block unit stays 64-byte aligned.
  for (DType type : {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    for (int64_t k : {512, 768, 14336}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(type) << " K=" << k);
      const int64_t n = 32;
      const std::vector<uint8_t> wk = RandomWeights(rng, type, n, k);
      absl::StatusOr<PackedWeights> packedk = PackedWeights::Pack(wk.data(), type, n, k);
      ASSERT_TRUE(packedk.ok()) << packedk.status();
      EXPECT_EQ(packedk->format(), type == DType::kQ4_K   ? PackedFormat::kQ4Kx16
                                   : type == DType::kQ5_K ? PackedFormat::kQ5Kx16
                                                          : PackedFormat::kQ6x16);
      const bool padded = type == DType::kQ6_K && (k / 256) % 2 != 0;
      EXPECT_EQ(packedk->bytes(), *DTypeStorageBytes(type, n * k) + (padded ? 2 * 32 : 0));
      EXPECT_EQ(PackedWeights::PackedBytes(type, n, k), packedk->bytes());
      EXPECT_EQ(packedk->tile_bytes() % 64, 0);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(packedk->tile(1)) % 64, 0u);
    }
    EXPECT_EQ(8 * PackedBlockBytes(*PackedWeights::FormatFor(type)), 16 * DTypeBlockBytes(type));
  }
  // An 8B Q6_K output matrix (128256 x 4096, 16 super-blocks a row) packs into its file bytes.
  EXPECT_EQ(PackedWeights::PackedBytes(DType::kQ6_K, 128256, 4096),
            *DTypeStorageBytes(DType::kQ6_K, int64_t{128256} * 4096));
  EXPECT_EQ(kPackedQ6UnitBytes % 64, 0);
}

// The formats that keep the file's codes and scales give each row back byte for byte (a tied
// embedding reads its rows this way; for the K-quants this also checks that their unit holds every
// bit of the file's 6-bit scales and mins); the others, and rows past N, are refused.
TEST(PackedWeightsTest, UnpackRowGivesBackTheFileRow) {
  std::mt19937 rng(41);
  for (DType type : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ4_K, DType::kQ5_K,
                     DType::kQ6_K}) {
    const int64_t n = 16 * 3 + 5, k = DTypeBlockElements(type) == kSuperBlock ? 768 : 96;
    const std::vector<uint8_t> w = RandomWeights(rng, type, n, k);
    absl::StatusOr<PackedWeights> packed = PackedWeights::Pack(w.data(), type, n, k);
    ASSERT_TRUE(packed.ok()) << packed.status();
    const size_t row_bytes = static_cast<size_t>(*DTypeStorageBytes(type, k));
    std::vector<uint8_t> row(row_bytes);
    for (int64_t r = 0; r < n; ++r) {
      ASSERT_TRUE(packed->UnpackRow(r, type, row.data()).ok());
      ASSERT_EQ(std::memcmp(row.data(), w.data() + r * row_bytes, row_bytes), 0)
          << DTypeName(type) << " row " << r;
    }
    EXPECT_EQ(packed->UnpackRow(n, type, row.data()).code(), absl::StatusCode::kOutOfRange);
    EXPECT_EQ(packed->UnpackRow(-1, type, row.data()).code(), absl::StatusCode::kOutOfRange);
  }
  const std::vector<uint8_t> w = RandomWeights(rng, DType::kQ5_0, 16, 64);
  absl::StatusOr<PackedWeights> packed5 = PackedWeights::Pack(w.data(), DType::kQ5_0, 16, 64);
  ASSERT_TRUE(packed5.ok());
  std::vector<uint8_t> row(64);
  EXPECT_EQ(packed5->UnpackRow(0, DType::kQ5_0, row.data()).code(),
            absl::StatusCode::kUnimplemented);
  const std::vector<uint8_t> w8 = RandomWeights(rng, DType::kQ8_0, 16, 64);
  absl::StatusOr<PackedWeights> packed8 = PackedWeights::Pack(w8.data(), DType::kQ8_0, 16, 64);
  ASSERT_TRUE(packed8.ok());
  EXPECT_EQ(packed8->UnpackRow(0, DType::kQ4_1, row.data()).code(),
            absl::StatusCode::kUnimplemented);
}

// The rows Pack reports as done are never read again: overwriting them with other weights as
// soon as they are reported leaves the packed copy byte for byte what packing the untouched
// matrix gives. The reports ascend and the last is n. (Enough tiles that reports come mid-way.)
TEST(PackedWeightsTest, ReportedRowsAreNotReadAgain) {
  std::mt19937 rng(31);
  for (DType type : kPackable) {
    const int64_t k = Widths(type)[0], n = 16 * 200 + 5;
    const std::vector<uint8_t> w = RandomWeights(rng, type, n, k);
    const std::vector<uint8_t> other = RandomWeights(rng, type, n, k);
    absl::StatusOr<PackedWeights> want = PackedWeights::Pack(w.data(), type, n, k);
    ASSERT_TRUE(want.ok()) << want.status();
    std::vector<uint8_t> clobbered = w;
    const int64_t row_bytes = static_cast<int64_t>(w.size()) / n;
    std::vector<int64_t> reports;
    absl::StatusOr<PackedWeights> got = PackedWeights::Pack(
        clobbered.data(), type, n, k, 0, [&](int64_t rows) {
          reports.push_back(rows);
          std::memcpy(clobbered.data(), other.data(), static_cast<size_t>(rows * row_bytes));
        });
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_GT(reports.size(), 2u) << DTypeName(type);
    EXPECT_TRUE(std::is_sorted(reports.begin(), reports.end()));
    EXPECT_EQ(reports.back(), n);
    ASSERT_EQ(got->bytes(), want->bytes());
    EXPECT_EQ(std::memcmp(got->tile(0), want->tile(0), static_cast<size_t>(want->bytes())), 0)
        << DTypeName(type);
  }
}

}  // namespace
}  // namespace tandem::cpu
