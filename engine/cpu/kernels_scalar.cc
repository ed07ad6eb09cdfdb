// The portable inner loops: the reference every SIMD table is tested against, and the fallback.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "engine/cpu/kernel_table.h"

namespace tandem::cpu {

void QuantizeRowQ8Act(const float* x, BlockQ8Act* out, int64_t k, int32_t* sums) {
  const int64_t nb = k / kQuantBlock;
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + b * kQuantBlock;
    float amax = 0.0f;
    for (int i = 0; i < kQuantBlock; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int32_t sum = 0;
    for (int i = 0; i < kQuantBlock; ++i) {
      // Round to nearest, ties to even, like std::nearbyint in the default rounding mode, but
      // inline and vectorizable: adding 1.5 * 2^23 leaves no fraction bits (|x * id| <= 127.x).
      constexpr float kRound = 12582912.0f;
      const int q = static_cast<int>((xb[i] * id + kRound) - kRound);
      out[b].qs[i] = static_cast<int8_t>(std::clamp(q, -127, 127));
      sum += out[b].qs[i];
    }
    out[b].d = d;
    out[b].s = d * static_cast<float>(sum);
    if (sums != nullptr) sums[b] = sum;
  }
}

namespace {

template <typename Load>
void RowDotFloat(const void* w_row, const void* x, int64_t x_stride, int64_t m, int64_t k, float* y,
                 int64_t y_stride, Load load) {
  const float* xf = static_cast<const float*>(x);
  for (int64_t i = 0; i < m; ++i) {
    const float* xi = xf + i * x_stride;
    float acc = 0.0f;
    for (int64_t j = 0; j < k; ++j) acc += load(w_row, j) * xi[j];
    y[i * y_stride] = acc;
  }
}

void RowDotF32(const void* w, const void* x, int64_t xs, int64_t m, int64_t k, float* y,
               int64_t ys) {
  RowDotFloat(w, x, xs, m, k, y, ys,
              [](const void* p, int64_t j) { return static_cast<const float*>(p)[j]; });
}
void RowDotF16(const void* w, const void* x, int64_t xs, int64_t m, int64_t k, float* y,
               int64_t ys) {
  RowDotFloat(w, x, xs, m, k, y, ys, [](const void* p, int64_t j) {
    return HalfToFloat(static_cast<const uint16_t*>(p)[j]);
  });
}
void RowDotBF16(const void* w, const void* x, int64_t xs, int64_t m, int64_t k, float* y,
                int64_t ys) {
  RowDotFloat(w, x, xs, m, k, y, ys, [](const void* p, int64_t j) {
    return BFloat16ToFloat(static_cast<const uint16_t*>(p)[j]);
  });
}

void RowDotQ8_0(const void* w_row, const void* x, int64_t xs, int64_t m, int64_t k, float* y,
                int64_t ys) {
  const auto* w = static_cast<const BlockQ8_0*>(w_row);
  const int64_t nb = k / kQuantBlock;
  for (int64_t i = 0; i < m; ++i) {
    const BlockQ8Act* xb = static_cast<const BlockQ8Act*>(x) + i * xs;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      int32_t sumi = 0;
      for (int j = 0; j < kQuantBlock; ++j) sumi += w[b].qs[j] * xb[b].qs[j];
      acc += HalfToFloat(w[b].d) * xb[b].d * static_cast<float>(sumi);
    }
    y[i * ys] = acc;
  }
}

// Σ nibble * x over a Q4 block (nibbles unsigned, 0..15).
int32_t NibbleDot(const uint8_t* qs, const int8_t* xq) {
  int32_t sumi = 0;
  for (int j = 0; j < kQuantBlock / 2; ++j) {
    sumi += (qs[j] & 0x0F) * xq[j] + (qs[j] >> 4) * xq[j + kQuantBlock / 2];
  }
  return sumi;
}

void RowDotQ4_0(const void* w_row, const void* x, int64_t xs, int64_t m, int64_t k, float* y,
                int64_t ys) {
  const auto* w = static_cast<const BlockQ4_0*>(w_row);
  const int64_t nb = k / kQuantBlock;
  for (int64_t i = 0; i < m; ++i) {
    const BlockQ8Act* xb = static_cast<const BlockQ8Act*>(x) + i * xs;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      const int32_t sumi = NibbleDot(w[b].qs, xb[b].qs);
      acc += HalfToFloat(w[b].d) * (xb[b].d * static_cast<float>(sumi) - 8.0f * xb[b].s);
    }
    y[i * ys] = acc;
  }
}

void RowDotQ4_1(const void* w_row, const void* x, int64_t xs, int64_t m, int64_t k, float* y,
                int64_t ys) {
  const auto* w = static_cast<const BlockQ4_1*>(w_row);
  const int64_t nb = k / kQuantBlock;
  for (int64_t i = 0; i < m; ++i) {
    const BlockQ8Act* xb = static_cast<const BlockQ8Act*>(x) + i * xs;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      const int32_t sumi = NibbleDot(w[b].qs, xb[b].qs);
      acc +=
          HalfToFloat(w[b].d) * xb[b].d * static_cast<float>(sumi) + HalfToFloat(w[b].m) * xb[b].s;
    }
    y[i * ys] = acc;
  }
}

// ---- Q5_0, Q5_1, IQ4_NL and the K-quants -------------------------------------------------------
// Each weight block's dot product with the activation blocks it spans (one for 32-element blocks,
// 8 for a 256-element super-block), summed over the row in block order. The SIMD kernels compute
// the same integer sums; only their float roundings may differ.

template <typename Block, int kElements, float (*kBlockDot)(const Block&, const BlockQ8Act*)>
void RowDotBlocks(const void* w_row, const void* x, int64_t xs, int64_t m, int64_t k, float* y,
                  int64_t ys) {
  const auto* w = static_cast<const Block*>(w_row);
  const int64_t nb = k / kElements;
  constexpr int64_t kActBlocks = kElements / kQuantBlock;
  for (int64_t i = 0; i < m; ++i) {
    const BlockQ8Act* xb = static_cast<const BlockQ8Act*>(x) + i * xs;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; ++b) acc += kBlockDot(w[b], xb + b * kActBlocks);
    y[i * ys] = acc;
  }
}

// Σ q * x over a 32-element block of 5-bit codes q (0..31).
int32_t Q5Dot(const uint8_t* qh_bytes, const uint8_t* qs, const int8_t* xq) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  int32_t sumi = 0;
  for (int j = 0; j < kQuantBlock / 2; ++j) {
    const int lo = (qs[j] & 0x0F) | static_cast<int>((qh >> j) & 1) << 4;
    const int hi = (qs[j] >> 4) | static_cast<int>((qh >> (j + 16)) & 1) << 4;
    sumi += lo * xq[j] + hi * xq[j + kQuantBlock / 2];
  }
  return sumi;
}

float DotQ5_0(const BlockQ5_0& w, const BlockQ8Act* x) {
  const int32_t sumi = Q5Dot(w.qh, w.qs, x->qs);
  return HalfToFloat(w.d) * (x->d * static_cast<float>(sumi) - 16.0f * x->s);
}

float DotQ5_1(const BlockQ5_1& w, const BlockQ8Act* x) {
  const int32_t sumi = Q5Dot(w.qh, w.qs, x->qs);
  return HalfToFloat(w.d) * x->d * static_cast<float>(sumi) + HalfToFloat(w.m) * x->s;
}

float DotIQ4_NL(const BlockIQ4_NL& w, const BlockQ8Act* x) {
  int32_t sumi = 0;
  for (int j = 0; j < kQuantBlock / 2; ++j) {
    sumi += kIq4NlValues[w.qs[j] & 0x0F] * x->qs[j] +
            kIq4NlValues[w.qs[j] >> 4] * x->qs[j + kQuantBlock / 2];
  }
  return HalfToFloat(w.d) * x->d * static_cast<float>(sumi);
}

// Q4_K / Q5_K: sub-block j is activation block j; x = (d·sc_j)·q − dmin·m_j, so
// Σ x·a = (d·a.d)·(sc_j·Σ q·a.qs) − (dmin·a.s)·m_j.
template <bool kFiveBits>
float DotQ45K(const uint16_t* dd, const uint8_t* scales, const uint8_t* qh, const uint8_t* qs,
              const BlockQ8Act* x) {
  const float d = HalfToFloat(dd[0]), dmin = HalfToFloat(dd[1]);
  float acc = 0.0f;
  for (int j = 0; j < kSuperBlock / kQuantBlock; ++j) {
    int sc, m;
    KQuantScaleMin(scales, j, &sc, &m);
    int32_t sumi = 0;
    for (int l = 0; l < kQuantBlock; ++l) {
      const uint8_t byte = qs[32 * (j / 2) + l];
      int q = j % 2 == 0 ? byte & 0x0F : byte >> 4;
      if constexpr (kFiveBits) q |= ((qh[l] >> j) & 1) << 4;
      sumi += q * x[j].qs[l];
    }
    acc += d * x[j].d * static_cast<float>(sc * sumi) - dmin * x[j].s * static_cast<float>(m);
  }
  return acc;
}

float DotQ4_K(const BlockQ4_K& w, const BlockQ8Act* x) {
  return DotQ45K<false>(&w.d, w.scales, nullptr, w.qs, x);
}
float DotQ5_K(const BlockQ5_K& w, const BlockQ8Act* x) {
  return DotQ45K<true>(&w.d, w.scales, w.qh, w.qs, x);
}

// Q6_K: activation block j = 4h + g covers elements 128h + 32g .. + 31, two 16-element scales.
float DotQ6_K(const BlockQ6_K& w, const BlockQ8Act* x) {
  const float d = HalfToFloat(w.d);
  float acc = 0.0f;
  for (int j = 0; j < kSuperBlock / kQuantBlock; ++j) {
    const int h = j / 4, g = j % 4;
    int32_t half_sums[2] = {0, 0};
    for (int l = 0; l < kQuantBlock; ++l) {
      const uint8_t low = w.ql[64 * h + 32 * (g & 1) + l];
      const int q = (g < 2 ? low & 0x0F : low >> 4) | ((w.qh[32 * h + l] >> (2 * g)) & 3) << 4;
      half_sums[l / 16] += (q - 32) * x[j].qs[l];
    }
    const int32_t sumi = w.scales[8 * h + 2 * g] * half_sums[0] +
                         w.scales[8 * h + 2 * g + 1] * half_sums[1];
    acc += d * x[j].d * static_cast<float>(sumi);
  }
  return acc;
}

float DotQ8_K(const BlockQ8_K& w, const BlockQ8Act* x) {
  float acc = 0.0f;
  for (int j = 0; j < kSuperBlock / kQuantBlock; ++j) {
    int32_t sumi = 0;
    for (int l = 0; l < kQuantBlock; ++l) sumi += w.qs[kQuantBlock * j + l] * x[j].qs[l];
    acc += w.d * x[j].d * static_cast<float>(sumi);
  }
  return acc;
}

// The packed kernels' arithmetic, spelled out (packed_weights.h): every SIMD table's packed
// kernels are tested against these bit for bit.
// F: 0 kQ4x16, 1 kQ8x16, 6 kQ4Sx16 (kQ4x16 with m = -8 d, exact in f32).
template <int F>
void PackedDot(const uint8_t* tile, int64_t nb, const BlockQ8Act* x, const int32_t* /*xsum*/,
               int64_t xs, int64_t m, float* y, int64_t ys, int64_t rows) {
  constexpr bool kQ4 = F != 1;
  constexpr int64_t kBlockBytes = F == 6 ? kPackedQ4SBlockBytes : kPackedBlockBytes<kQ4>;
  constexpr int kGroups = kPackedGroups<kQ4>;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t r = 0; r < rows; ++r) {
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = tile + b * kBlockBytes;
        const BlockQ8Act& xb = x[i * xs + b];
        int32_t sumi = 0;
        for (int g = 0; g < kGroups; ++g) {
          for (int j = 0; j < 4; ++j) {
            const uint8_t q = blk[g * 64 + r * 4 + j];
            if constexpr (kQ4) {
              sumi += (q & 0x0F) * xb.qs[4 * g + j] + (q >> 4) * xb.qs[16 + 4 * g + j];
            } else {
              sumi += static_cast<int8_t>(q) * xb.qs[4 * g + j];
            }
          }
        }
        uint16_t d;
        std::memcpy(&d, blk + kGroups * 64 + r * 2, 2);
        acc = std::fma(static_cast<float>(sumi), HalfToFloat(d) * xb.d, acc);
        if constexpr (F == 6) {
          acc = std::fma(-8.0f * HalfToFloat(d), xb.s, acc);
        } else if constexpr (kQ4) {
          uint16_t mw;
          std::memcpy(&mw, blk + kGroups * 64 + 32 + r * 2, 2);
          acc = std::fma(HalfToFloat(mw), xb.s, acc);
        }
      }
      y[i * ys + r] = acc;
    }
  }
}

// kSym: kQ5Sx16 (m = -16 d, exact in f32); else kQ5x16.
template <bool kSym>
void PackedDotQ5(const uint8_t* tile, int64_t nb, const BlockQ8Act* x, const int32_t* /*xsum*/,
                 int64_t xs, int64_t m, float* y, int64_t ys, int64_t rows) {
  constexpr int64_t kBlockBytes = kSym ? kPackedQ5SBlockBytes : kPackedQ5BlockBytes;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t r = 0; r < rows; ++r) {
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = tile + b * kBlockBytes;
        const BlockQ8Act& xb = x[i * xs + b];
        int32_t sumi = 0;
        for (int c = 0; c < 4; ++c) {
          for (int j = 0; j < 4; ++j) {
            const uint8_t q = blk[c * 64 + r * 4 + j];
            const uint8_t h = blk[kPackedQ5FifthBits + r * 4 + j];
            const int lo = (q & 0x0F) | (((h >> c) & 1) << 4);
            const int hi = (q >> 4) | (((h >> (4 + c)) & 1) << 4);
            sumi += lo * xb.qs[4 * c + j] + hi * xb.qs[16 + 4 * c + j];
          }
        }
        uint16_t d16, m16 = 0;
        std::memcpy(&d16, blk + kPackedQ5Scales + r * 2, 2);
        if constexpr (!kSym) std::memcpy(&m16, blk + kPackedQ5Scales + 32 + r * 2, 2);
        const float d = HalfToFloat(d16);
        const float mw = kSym ? -16.0f * d : HalfToFloat(m16);
        acc = std::fma(static_cast<float>(sumi), d * xb.d, acc);
        acc = std::fma(mw, xb.s, acc);
      }
      y[i * ys + r] = acc;
    }
  }
}

void PackedDotQ6(const uint8_t* tile, int64_t nb, const BlockQ8Act* x, const int32_t* /*xsum*/,
                 int64_t xs, int64_t m, float* y, int64_t ys, int64_t rows) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t r = 0; r < rows; ++r) {
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* unit = tile + PackedQ6Unit(b / 8);
        const int j = static_cast<int>(b % 8);
        const uint8_t* sub = unit + j * kPackedQ6SubBytes;
        const BlockQ8Act& xb = x[i * xs + b];
        int32_t half_sums[2] = {0, 0};
        for (int l = 0; l < kQuantBlock; ++l) {
          const int h = l / 16, c = (l % 16) / 4, e = l % 4;
          const int q = ((sub[c * 64 + r * 4 + e] >> (4 * h)) & 0x0F) |
                        ((sub[kPackedQ6High + h * 64 + r * 4 + e] >> (2 * c)) & 3) << 4;
          half_sums[h] += (q - 32) * xb.qs[l];
        }
        const auto sc0 = static_cast<int8_t>(unit[kPackedQ6Scales + 32 * j + r]);
        const auto sc1 = static_cast<int8_t>(unit[kPackedQ6Scales + 32 * j + 16 + r]);
        uint16_t d;
        std::memcpy(&d, tile + PackedQ6D(b / 8) + r * 2, 2);
        const int32_t sumi = sc0 * half_sums[0] + sc1 * half_sums[1];
        acc = std::fma(static_cast<float>(sumi), HalfToFloat(d) * xb.d, acc);
      }
      y[i * ys + r] = acc;
    }
  }
}

// kQ4Kx16 / kQ5Kx16: kQ4x16's / kQ5x16's arithmetic, with block b's scale d · sc_j and offset
// -(dmin · m_j) (exact in f32) from the scale bits of its super-block unit.
template <bool kFive>
void PackedDotK(const uint8_t* tile, int64_t nb, const BlockQ8Act* x, const int32_t* /*xsum*/,
                int64_t xs, int64_t m, float* y, int64_t ys, int64_t rows) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t r = 0; r < rows; ++r) {
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* unit = tile + (b / 8) * kPackedKUnitBytes<kFive>;
        const int j = static_cast<int>(b % 8);
        const uint8_t* sub = unit + j * kPackedKSubBytes<kFive>;
        const BlockQ8Act& xb = x[i * xs + b];
        int32_t sumi = 0;
        for (int c = 0; c < 4; ++c) {
          for (int l = 0; l < 4; ++l) {
            const uint8_t q = sub[c * 64 + r * 4 + l];
            int lo = q & 0x0F, hi = q >> 4;
            if constexpr (kFive) {
              const uint8_t h = sub[kPackedQ5FifthBits + r * 4 + l];
              lo |= ((h >> c) & 1) << 4;
              hi |= ((h >> (4 + c)) & 1) << 4;
            }
            sumi += lo * xb.qs[4 * c + l] + hi * xb.qs[16 + 4 * c + l];
          }
        }
        const uint8_t low = unit[kPackedKLow<kFive> + 16 * j + r];
        uint32_t high;
        std::memcpy(&high, unit + kPackedKHigh<kFive> + 4 * r, 4);
        const int sc = (low & 0x0F) | static_cast<int>((high >> (2 * j)) & 3) << 4;
        const int mn = (low >> 4) | static_cast<int>((high >> (16 + 2 * j)) & 3) << 4;
        uint16_t d, dmin;
        std::memcpy(&d, unit + kPackedKD<kFive> + 2 * r, 2);
        std::memcpy(&dmin, unit + kPackedKD<kFive> + 32 + 2 * r, 2);
        const float dw = HalfToFloat(d) * static_cast<float>(sc);
        const float mw = -(HalfToFloat(dmin) * static_cast<float>(mn));
        acc = std::fma(static_cast<float>(sumi), dw * xb.d, acc);
        acc = std::fma(mw, xb.s, acc);
      }
      y[i * ys + r] = acc;
    }
  }
}

const PackedDotFn kPackedDot[kPackedFormatCount] = {
    PackedDot<0>,      PackedDot<1>,      PackedDotQ5<false>, PackedDotQ6,
    PackedDotK<false>, PackedDotK<true>,  PackedDot<6>,       PackedDotQ5<true>};

float DotF32(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}
void AxpyF32(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}
void ScaleF32(float a, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] *= a;
}

void SiluMulRow(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void F16ToF32(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = HalfToFloat(src[i]);
}
void F32ToF16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = FloatToHalf(src[i]);
}

const KernelTable kScalarTable = {
    Isa::kScalar,
    {RowDotF32, RowDotF16, RowDotBF16, RowDotQ8_0, RowDotQ4_0, RowDotQ4_1,
     RowDotBlocks<BlockQ5_0, kQuantBlock, DotQ5_0>, RowDotBlocks<BlockQ5_1, kQuantBlock, DotQ5_1>,
     RowDotBlocks<BlockIQ4_NL, kQuantBlock, DotIQ4_NL>,
     RowDotBlocks<BlockQ4_K, kSuperBlock, DotQ4_K>, RowDotBlocks<BlockQ5_K, kSuperBlock, DotQ5_K>,
     RowDotBlocks<BlockQ6_K, kSuperBlock, DotQ6_K>, RowDotBlocks<BlockQ8_K, kSuperBlock, DotQ8_K>},
    DotF32,
    AxpyF32,
    ScaleF32,
    nullptr,
    kPackedDot,
    nullptr,
    QuantizeRowQ8Act,
    SiluMulRow,
    F16ToF32,
    F32ToF16,
    nullptr,
};

}  // namespace

const KernelTable& ScalarKernelTable() { return kScalarTable; }

const KernelTable& KernelTableFor(Isa isa) {
  const CpuFeatures& host = HostCpuFeatures();
  if (isa == Isa::kAvx512 && IsaSupported(Isa::kAvx512, host) && Avx512KernelTable() != nullptr) {
    return *Avx512KernelTable();
  }
  if (isa != Isa::kScalar && IsaSupported(Isa::kAvx2, host) && Avx2KernelTable() != nullptr) {
    return *Avx2KernelTable();
  }
  return kScalarTable;
}

}  // namespace tandem::cpu
