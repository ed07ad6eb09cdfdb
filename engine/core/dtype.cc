#include "engine/core/dtype.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace tandem {

absl::string_view DTypeName(DType type) {
  switch (type) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kQ8_0:
      return "Q8_0";
    case DType::kQ4_0:
      return "Q4_0";
    case DType::kQ4_1:
      return "Q4_1";
    case DType::kQ5_0:
      return "Q5_0";
    case DType::kQ5_1:
      return "Q5_1";
    case DType::kIQ4_NL:
      return "IQ4_NL";
    case DType::kQ4_K:
      return "Q4_K";
    case DType::kQ5_K:
      return "Q5_K";
    case DType::kQ6_K:
      return "Q6_K";
    case DType::kQ8_K:
      return "Q8_K";
  }
  return "?";
}

namespace {

// "F32, F16, ..., Q8_K": every supported type, for error messages.
std::string SupportedNames() {
  std::string names;
  for (DType t : kAllDTypes) absl::StrAppend(&names, names.empty() ? "" : ", ", DTypeName(t));
  return names;
}

}  // namespace

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  const std::string upper = absl::AsciiStrToUpper(name);
  for (DType t : kAllDTypes) {
    if (DTypeName(t) == upper) return t;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown tensor type '", name, "' (expected one of ", SupportedNames(), ")"));
}

int64_t DTypeBlockElements(DType type) {
  switch (type) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
      return 1;
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
    case DType::kQ8_K:
      return kSuperBlock;
    default:
      return kQuantBlock;
  }
}

int64_t DTypeBlockBytes(DType type) {
  switch (type) {
    case DType::kF32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kQ8_0:
      return sizeof(BlockQ8_0);
    case DType::kQ4_0:
      return sizeof(BlockQ4_0);
    case DType::kQ4_1:
      return sizeof(BlockQ4_1);
    case DType::kQ5_0:
      return sizeof(BlockQ5_0);
    case DType::kQ5_1:
      return sizeof(BlockQ5_1);
    case DType::kIQ4_NL:
      return sizeof(BlockIQ4_NL);
    case DType::kQ4_K:
      return sizeof(BlockQ4_K);
    case DType::kQ5_K:
      return sizeof(BlockQ5_K);
    case DType::kQ6_K:
      return sizeof(BlockQ6_K);
    case DType::kQ8_K:
      return sizeof(BlockQ8_K);
  }
  return 0;
}

bool IsQuantized(DType type) {
  return type != DType::kF32 && type != DType::kF16 && type != DType::kBF16;
}

std::optional<int64_t> DTypeStorageBytes(DType type, int64_t elements) {
  const int64_t per_block = DTypeBlockElements(type);
  if (elements < 0 || elements % per_block != 0) return std::nullopt;
  const int64_t blocks = elements / per_block;
  const int64_t bytes_per_block = DTypeBlockBytes(type);
  if (blocks > std::numeric_limits<int64_t>::max() / bytes_per_block) return std::nullopt;
  return blocks * bytes_per_block;
}

uint32_t GgmlTypeId(DType type) {
  switch (type) {
    case DType::kF32:
      return 0;
    case DType::kF16:
      return 1;
    case DType::kQ4_0:
      return 2;
    case DType::kQ4_1:
      return 3;
    case DType::kQ5_0:
      return 6;
    case DType::kQ5_1:
      return 7;
    case DType::kQ8_0:
      return 8;
    case DType::kQ4_K:
      return 12;
    case DType::kQ5_K:
      return 13;
    case DType::kQ6_K:
      return 14;
    case DType::kQ8_K:
      return 15;
    case DType::kIQ4_NL:
      return 20;
    case DType::kBF16:
      return 30;
  }
  return ~0u;
}

absl::StatusOr<DType> DTypeFromGgmlTypeId(uint32_t id) {
  for (DType t : kAllDTypes) {
    if (GgmlTypeId(t) == id) return t;
  }
  // Names of ggml types Tandem does not read (yet), for a clearer message.
  static constexpr struct {
    uint32_t id;
    const char* name;
  } kKnown[] = {{9, "Q8_1"},     {10, "Q2_K"},   {11, "Q3_K"},  {16, "IQ2_XXS"}, {17, "IQ2_XS"},
                {18, "IQ3_XXS"}, {19, "IQ1_S"},  {21, "IQ3_S"}, {22, "IQ2_S"},   {23, "IQ4_XS"},
                {24, "I8"},      {25, "I16"},    {26, "I32"},   {27, "I64"},     {28, "F64"},
                {29, "IQ1_M"},   {34, "TQ1_0"},  {35, "TQ2_0"}};
  for (const auto& k : kKnown) {
    if (k.id == id) {
      return absl::UnimplementedError(absl::StrCat(
          "tensor type ", k.name, " (ggml type ", id,
          ") is not supported; supported: ", SupportedNames()));
    }
  }
  return absl::NotFoundError(absl::StrCat("unknown ggml tensor type id ", id));
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  const uint32_t mant = h & 0x3FF;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      int e = -1;
      uint32_t m = mant;
      do {
        ++e;
        m <<= 1;
      } while ((m & 0x400) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (m & 0x3FF) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint16_t FloatToHalf(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) {  // Inf or NaN
    return sign | 0x7C00 | (abs > 0x7F800000u ? 0x200 : 0);
  }
  if (abs >= 0x477FF000u) return sign | 0x7C00;  // rounds to >= 65520: overflow to Inf
  if (abs < 0x38800000u) {                        // below the smallest normal half: subnormal
    if (abs < 0x33000000u) return sign;           // rounds to zero
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7FFFFF) | 0x800000;
    const int shift = static_cast<int>(126 - exp);  // 14 - (exp - 127) + 10 - 23 ... = 126 - exp
    uint32_t half_mant = mant >> shift;
    const uint32_t rest = mant & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half_mant & 1))) ++half_mant;
    return sign | static_cast<uint16_t>(half_mant);
  }
  uint32_t h = ((abs >> 13) - ((127 - 15) << 10));
  const uint32_t rest = abs & 0x1FFF;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;  // may carry into the exponent: fine
  return sign | static_cast<uint16_t>(h);
}

uint16_t FloatToBFloat16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  const uint32_t rounding = 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

namespace {

// Q5_0 (x = d * (q - 16)) or Q5_1 (x = d * q + m).
void DequantizeQ5(bool with_min, const void* src, float* dst, int64_t n) {
  const size_t block_bytes = with_min ? sizeof(BlockQ5_1) : sizeof(BlockQ5_0);
  for (int64_t b = 0; b < n / kQuantBlock; ++b) {
    const auto* blk = static_cast<const uint8_t*>(src) + b * block_bytes;
    uint16_t dh, mh = 0;
    uint32_t qh;
    std::memcpy(&dh, blk, 2);
    if (with_min) std::memcpy(&mh, blk + 2, 2);
    const uint8_t* rest = blk + (with_min ? 4 : 2);
    std::memcpy(&qh, rest, 4);
    const uint8_t* qs = rest + 4;
    const float d = HalfToFloat(dh), m = HalfToFloat(mh);
    for (int j = 0; j < kQuantBlock; ++j) {
      const int nibble = j < 16 ? qs[j] & 0x0F : qs[j - 16] >> 4;
      const int q = nibble | static_cast<int>((qh >> j) & 1) << 4;
      float* out = dst + b * kQuantBlock + j;
      *out = with_min ? d * static_cast<float>(q) + m : d * static_cast<float>(q - 16);
    }
  }
}

// Q4_K or Q5_K (with the 5th bits).
void DequantizeQ45K(bool five_bits, const void* src, float* dst, int64_t n) {
  const size_t block_bytes = five_bits ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    const auto* blk = static_cast<const uint8_t*>(src) + b * block_bytes;
    uint16_t dh, mh;
    std::memcpy(&dh, blk, 2);
    std::memcpy(&mh, blk + 2, 2);
    const uint8_t* scales = blk + 4;
    const uint8_t* qh = blk + 16;  // Q5_K only
    const uint8_t* qs = five_bits ? qh + kSuperBlock / 8 : blk + 16;
    const float d = HalfToFloat(dh), dmin = HalfToFloat(mh);
    for (int j = 0; j < kSuperBlock / kQuantBlock; ++j) {
      int sc, m;
      KQuantScaleMin(scales, j, &sc, &m);
      const float dl = d * static_cast<float>(sc);
      const float ml = dmin * static_cast<float>(m);
      for (int l = 0; l < kQuantBlock; ++l) {
        const uint8_t byte = qs[32 * (j / 2) + l];
        int q = j % 2 == 0 ? byte & 0x0F : byte >> 4;
        if (five_bits) q |= ((qh[l] >> j) & 1) << 4;
        dst[b * kSuperBlock + kQuantBlock * j + l] = dl * static_cast<float>(q) - ml;
      }
    }
  }
}

}  // namespace

void DequantizeReference(DType type, const void* src, float* dst, int64_t n) {
  switch (type) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kF16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = HalfToFloat(h[i]);
      return;
    }
    case DType::kBF16: {
      const auto* b = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = BFloat16ToFloat(b[i]);
      return;
    }
    case DType::kQ8_0: {
      const auto* blocks = static_cast<const BlockQ8_0*>(src);
      for (int64_t b = 0; b < n / kQuantBlock; ++b) {
        const float d = HalfToFloat(blocks[b].d);
        for (int j = 0; j < kQuantBlock; ++j) dst[b * kQuantBlock + j] = d * blocks[b].qs[j];
      }
      return;
    }
    case DType::kQ4_0: {
      const auto* blocks = static_cast<const BlockQ4_0*>(src);
      for (int64_t b = 0; b < n / kQuantBlock; ++b) {
        const float d = HalfToFloat(blocks[b].d);
        for (int j = 0; j < kQuantBlock / 2; ++j) {
          dst[b * kQuantBlock + j] = d * static_cast<float>((blocks[b].qs[j] & 0x0F) - 8);
          dst[b * kQuantBlock + j + 16] = d * static_cast<float>((blocks[b].qs[j] >> 4) - 8);
        }
      }
      return;
    }
    case DType::kQ4_1: {
      const auto* blocks = static_cast<const BlockQ4_1*>(src);
      for (int64_t b = 0; b < n / kQuantBlock; ++b) {
        const float d = HalfToFloat(blocks[b].d);
        const float m = HalfToFloat(blocks[b].m);
        for (int j = 0; j < kQuantBlock / 2; ++j) {
          dst[b * kQuantBlock + j] = d * static_cast<float>(blocks[b].qs[j] & 0x0F) + m;
          dst[b * kQuantBlock + j + 16] = d * static_cast<float>(blocks[b].qs[j] >> 4) + m;
        }
      }
      return;
    }
    case DType::kQ5_0:
    case DType::kQ5_1:
      DequantizeQ5(type == DType::kQ5_1, src, dst, n);
      return;
    case DType::kIQ4_NL: {
      const auto* blocks = static_cast<const BlockIQ4_NL*>(src);
      for (int64_t b = 0; b < n / kQuantBlock; ++b) {
        const float d = HalfToFloat(blocks[b].d);
        for (int j = 0; j < kQuantBlock / 2; ++j) {
          dst[b * kQuantBlock + j] = d * static_cast<float>(kIq4NlValues[blocks[b].qs[j] & 0x0F]);
          dst[b * kQuantBlock + j + 16] = d * static_cast<float>(kIq4NlValues[blocks[b].qs[j] >> 4]);
        }
      }
      return;
    }
    case DType::kQ4_K:
    case DType::kQ5_K:
      DequantizeQ45K(type == DType::kQ5_K, src, dst, n);
      return;
    case DType::kQ6_K: {
      const auto* blocks = static_cast<const BlockQ6_K*>(src);
      for (int64_t b = 0; b < n / kSuperBlock; ++b) {
        const BlockQ6_K& blk = blocks[b];
        const float d = HalfToFloat(blk.d);
        float* out = dst + b * kSuperBlock;
        for (int e = 0; e < kSuperBlock; ++e) {
          const int h = e / 128, g = (e % 128) / 32, l = e % 32;
          const uint8_t low = blk.ql[64 * h + 32 * (g & 1) + l];
          const int q = ((g < 2 ? low & 0x0F : low >> 4) | ((blk.qh[32 * h + l] >> (2 * g)) & 3) << 4);
          const float dl = d * static_cast<float>(blk.scales[e / 16]);
          out[e] = dl * static_cast<float>(q - 32);
        }
      }
      return;
    }
    case DType::kQ8_K: {
      const auto* blocks = static_cast<const BlockQ8_K*>(src);
      for (int64_t b = 0; b < n / kSuperBlock; ++b) {
        for (int j = 0; j < kSuperBlock; ++j) {
          dst[b * kSuperBlock + j] = blocks[b].d * static_cast<float>(blocks[b].qs[j]);
        }
      }
      return;
    }
  }
}

}  // namespace tandem
