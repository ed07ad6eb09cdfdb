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

// The packed kernels' arithmetic, spelled out (packed_weights.h): every SIMD table's packed
// kernels are tested against these bit for bit.
template <bool kQ4>
void PackedDot(const uint8_t* tile, int64_t nb, const BlockQ8Act* x, const int32_t* /*xsum*/,
               int64_t xs, int64_t m, float* y, int64_t ys, int64_t rows) {
  constexpr int64_t kBlockBytes = kPackedBlockBytes<kQ4>;
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
        if constexpr (kQ4) {
          uint16_t mw;
          std::memcpy(&mw, blk + kGroups * 64 + 32 + r * 2, 2);
          acc = std::fma(HalfToFloat(mw), xb.s, acc);
        }
      }
      y[i * ys + r] = acc;
    }
  }
}

const PackedDotFn kPackedDot[2] = {PackedDot<true>, PackedDot<false>};

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
    {RowDotF32, RowDotF16, RowDotBF16, RowDotQ8_0, RowDotQ4_0, RowDotQ4_1},
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
