// AVX-512 inner loops (compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni and
// the AVX2 flags). Float work uses 512-bit vectors; int8 dot products use AVX512-VNNI vpdpbusd on
// 256-bit registers (one 32-element quant block per register, so each block keeps its own scale).
// See kernel_table.h for the rules these files keep.
// GCC 12's AVX-512 headers start some intrinsics from an "undefined" register that -Wuninitialized
// flags once inlined (GCC bug 105593, fixed in GCC 13); the warning is about the header, not us.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "engine/cpu/kernel_table.h"

namespace tandem::cpu {
namespace {

constexpr Isa kTableIsa = Isa::kAvx512;

struct VF {
  using T = __m512;
  static constexpr int kW = 16;
  static T Zero() { return _mm512_setzero_ps(); }
  static T Set1(float a) { return _mm512_set1_ps(a); }
  static T Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, T v) { _mm512_storeu_ps(p, v); }
  static T LoadF16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static T LoadBF16(const uint16_t* p) {
    const __m512i u =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
  }
  static T Fmadd(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static T Add(T a, T b) { return _mm512_add_ps(a, b); }
  static T Mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static float Hsum(T v);
};

// u8 x s8, 4 adjacent products summed into each s32 lane, in one instruction and exact.
inline __m256i DotI8(__m256i u, __m256i s) {
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
}

#include "engine/cpu/kernels_x86.inc"

// Not _mm512_reduce_add_ps: GCC 12 warns (maybe-uninitialized) inside it.
float VF::Hsum(T v) {
  const __m256 lo = _mm512_castps512_ps256(v);
  const __m256 hi = _mm512_maskz_extractf32x8_ps(0xFF, v, 1);
  return Hsum8(_mm256_add_ps(lo, hi));
}

// ---- two weight rows per 512-bit register ----------------------------------------------------
// Block b of weight rows 0 and 1 fill the two 256-bit halves of one register; each activation
// block is broadcast to both halves, so one vpdpbusd / convert / FMA serves both rows.

// [h(p0[0]), h(p0[1]), h(p1[0]), h(p1[1])] from two pairs of f16 values.
inline __m128 LoadHalfPairs(const uint16_t* p0, const uint16_t* p1) {
  uint32_t a, b;
  __builtin_memcpy(&a, p0, 4);
  __builtin_memcpy(&b, p1, 4);
  return _mm_cvtph_ps(_mm_set_epi32(0, 0, static_cast<int>(b), static_cast<int>(a)));
}

// Two Q4 nibble arrays -> 64 bytes: row 0's elements 0..31, then row 1's (as UnpackNibbles).
inline __m512i UnpackNibblePair(const uint8_t* qs0, const uint8_t* qs1) {
  const __m256i both = _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs0))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs1)), 1);
  const __m512i t = _mm512_castsi256_si512(both);
  const __m512i idx = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
  const __m512i v = _mm512_permutex2var_epi64(t, idx, _mm512_srli_epi16(t, 4));
  return _mm512_and_si512(v, _mm512_set1_epi8(0x0F));
}

// Kind: 1 = Q4_0, 2 = Q4_1 (Q8_0 keeps the one-row kernel: paired, it streamed large matrices
// from memory at half the speed). acc[r]: both rows' scaled integer dots (8 lanes each);
// extra[r] lanes 0 / 1: the offset terms of rows 0 / 1.
template <int Kind, int R>
__attribute__((always_inline)) inline void QuantBlock2(const char* w0, const char* w1,
                                                      const BlockQ8Act* x, int64_t xs, int64_t b,
                                                      __m512* acc, __m128* extra) {
  __m512i wq;
  __m512 dvec;
  __m128 mvec;
  static_assert(Kind == 1 || Kind == 2);
  if constexpr (Kind == 1) {
    const BlockQ4_0& a = reinterpret_cast<const BlockQ4_0*>(w0)[b];
    const BlockQ4_0& c = reinterpret_cast<const BlockQ4_0*>(w1)[b];
    wq = UnpackNibblePair(a.qs, c.qs);
    const __m128 d = _mm_cvtph_ps(_mm_cvtsi32_si128(
        static_cast<int>(static_cast<uint32_t>(a.d) | (static_cast<uint32_t>(c.d) << 16))));
    dvec = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                                 _mm512_castps128_ps512(d));
    mvec = _mm_mul_ps(d, _mm_set1_ps(-8.0f));  // [-8·d0, -8·d1, 0, 0]
  } else {
    const BlockQ4_1& a = reinterpret_cast<const BlockQ4_1*>(w0)[b];
    const BlockQ4_1& c = reinterpret_cast<const BlockQ4_1*>(w1)[b];
    wq = UnpackNibblePair(a.qs, c.qs);
    const __m128 dm = LoadHalfPairs(&a.d, &c.d);  // [d0, m0, d1, m1]
    dvec = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2),
                                 _mm512_castps128_ps512(dm));
    mvec = _mm_shuffle_ps(dm, dm, _MM_SHUFFLE(3, 1, 3, 1));  // [m0, m1, m0, m1]
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const BlockQ8Act& xb = x[r * xs + b];
    const __m512i xv = _mm512_broadcast_i64x4(LoadQs(xb.qs));
    const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq, xv);
    const __m512 scale = _mm512_mul_ps(dvec, _mm512_set1_ps(xb.d));
    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), scale, acc[r]);
    // Multiply, then add, as the one-row kernel does: the empty asm keeps GCC from contracting
    // the two into an FMA (one rounding fewer), which would make the results differ from it.
    __m128 offset = _mm_mul_ps(mvec, _mm_set1_ps(xb.s));
    __asm__("" : "+v"(offset));
    extra[r] = _mm_add_ps(extra[r], offset);
  }
}

// Two accumulators per row (even / odd blocks), spelled out so that GCC keeps them in registers.
template <int Kind, int R>
void QuantRows2(const char* w0, const char* w1, const BlockQ8Act* x, int64_t xs, int64_t nb,
                float* y, int64_t ys) {
  __m512 acc0[R], acc1[R];
  __m128 extra[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    acc0[r] = _mm512_setzero_ps();
    acc1[r] = _mm512_setzero_ps();
    extra[r] = _mm_setzero_ps();
  }
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    QuantBlock2<Kind, R>(w0, w1, x, xs, b, acc0, extra);
    QuantBlock2<Kind, R>(w0, w1, x, xs, b + 1, acc1, extra);
  }
  if (b < nb) QuantBlock2<Kind, R>(w0, w1, x, xs, b, acc0, extra);
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const __m512 sum = _mm512_add_ps(acc0[r], acc1[r]);
    const __m256 lo = _mm512_castps512_ps256(sum);
    const __m256 hi = _mm512_maskz_extractf32x8_ps(0xFF, sum, 1);
    y[r * ys] = Hsum8(lo) + _mm_cvtss_f32(extra[r]);
    y[r * ys + 1] = Hsum8(hi) + _mm_cvtss_f32(_mm_shuffle_ps(extra[r], extra[r], 1));
  }
}

template <int Kind>
void RowDot2Quant(const void* w_row, int64_t w_row_bytes, const void* x, int64_t xs, int64_t m,
                  int64_t k, float* y, int64_t ys) {
  const char* w0 = static_cast<const char*>(w_row);
  const char* w1 = w0 + w_row_bytes;
  const auto* xb = static_cast<const BlockQ8Act*>(x);
  const int64_t nb = k / kQuantBlock;
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) QuantRows2<Kind, 4>(w0, w1, xb + i * xs, xs, nb, y + i * ys, ys);
  switch (m - i) {
    case 3:
      QuantRows2<Kind, 3>(w0, w1, xb + i * xs, xs, nb, y + i * ys, ys);
      break;
    case 2:
      QuantRows2<Kind, 2>(w0, w1, xb + i * xs, xs, nb, y + i * ys, ys);
      break;
    case 1:
      QuantRows2<Kind, 1>(w0, w1, xb + i * xs, xs, nb, y + i * ys, ys);
      break;
    default:
      break;
  }
}

const RowDot2Fn kRowDot2[kNumDTypes] = {nullptr, nullptr, nullptr, nullptr, RowDot2Quant<1>,
                               RowDot2Quant<2>};

// ---- packed tiles (packed_weights.h) -----------------------------------------------------------
// One 512-bit register holds 4 codes of each of the 16 rows; vpdpbusd multiplies them by 4
// broadcast activation codes. Per block index: the codes are unpacked once for all activation
// rows, then each activation row costs 8 vpdpbusd, one convert, one multiply and one or two FMAs
// for 16 × 32 multiply-adds. Q8 codes are signed, which vpdpbusd's first operand is not: they are
// biased by 128 (x ^ 0x80) and 128 · Σ x is taken off the integer sum again (exact).

inline __m512i Bcast4(const int8_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// Block index b's 16 scales and offsets of a kQ4Kx16 / kQ5Kx16 unit (packed_weights.h):
// d · sc_j and -(dmin · m_j), exact. d_sb, dmin_sb and hi are the unit's, loaded once per unit.
template <bool kFive>
__attribute__((always_inline)) inline void KScales(const uint8_t* unit, int j, __m512 d_sb,
                                                   __m512 dmin_sb, __m512i hi, __m512* dw,
                                                   __m512* mw) {
  const __m512i low = _mm512_cvtepu8_epi32(
      _mm_load_si128(reinterpret_cast<const __m128i*>(unit + kPackedKLow<kFive> + 16 * j)));
  const __m512i three = _mm512_set1_epi32(3), fifteen = _mm512_set1_epi32(15);
  const __m512i sc = _mm512_or_si512(
      _mm512_and_si512(low, fifteen),
      _mm512_slli_epi32(_mm512_and_si512(_mm512_srl_epi32(hi, _mm_cvtsi32_si128(2 * j)), three),
                        4));
  const __m512i mn = _mm512_or_si512(
      _mm512_srli_epi32(low, 4),
      _mm512_slli_epi32(
          _mm512_and_si512(_mm512_srl_epi32(hi, _mm_cvtsi32_si128(16 + 2 * j)), three), 4));
  *dw = _mm512_mul_ps(d_sb, _mm512_cvtepi32_ps(sc));
  *mw = _mm512_castsi512_ps(
      _mm512_xor_si512(_mm512_castps_si512(_mm512_mul_ps(dmin_sb, _mm512_cvtepi32_ps(mn))),
                       _mm512_set1_epi32(static_cast<int>(0x80000000u))));
}

// F: a PackedFormat as int (0 kQ4x16, 1 kQ8x16, 2 kQ5x16, 4 kQ4Kx16, 5 kQ5Kx16, 6 kQ4Sx16 /
// 7 kQ5Sx16: kQ4x16 / kQ5x16 whose offset is -8 d / -16 d). kQ5x16 is kQ4x16 with each code's
// fifth bit ORed in from its qh group; codes stay unsigned (0..31). kQ4Kx16 / kQ5Kx16 are kQ4x16 / kQ5x16 with
// each block's scales made from its unit's scale bits (KScales), once for all activation rows.
template <int F, int R>
__attribute__((always_inline)) inline void PackedRows(const uint8_t* tile, int64_t nb,
                                                      const BlockQ8Act* x, const int32_t* xsum,
                                                      int64_t xs, float* y, int64_t ys,
                                                      int64_t rows) {
  constexpr bool kQ4 = F != 1;  // nibble codes with an offset
  constexpr bool kFive = F == 2 || F == 5 || F == 7;
  constexpr bool kK = F == 4 || F == 5;  // kQ4Kx16, kQ5Kx16
  constexpr int64_t kBlockBytes = kK        ? kPackedKUnitBytes<kFive> / 8
                                  : F == 7  ? kPackedQ5SBlockBytes
                                  : kFive   ? kPackedQ5BlockBytes
                                  : F == 6  ? kPackedQ4SBlockBytes
                                            : kPackedBlockBytes<kQ4>;
  constexpr int kGroups = kPackedGroups<kQ4>;
  __m512 acc[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  __m512 d_sb = _mm512_setzero_ps(), dmin_sb = _mm512_setzero_ps();
  __m512i hi = _mm512_setzero_si512();
  for (int64_t b = 0; b < nb; ++b) {
    // (K formats: the tiles are still read front to back, a unit's bytes per 8 block indices.)
    if constexpr (R > 1) PrefetchPackedBlock<kBlockBytes>(tile + b * kBlockBytes);
    const uint8_t* blk = tile + b * kBlockBytes;
    const uint8_t* unit = nullptr;
    if constexpr (kK) {
      unit = tile + (b / 8) * kPackedKUnitBytes<kFive>;
      blk = unit + (b % 8) * kPackedKSubBytes<kFive>;
      if (b % 8 == 0) {
        d_sb = _mm512_cvtph_ps(
            _mm256_load_si256(reinterpret_cast<const __m256i*>(unit + kPackedKD<kFive>)));
        dmin_sb = _mm512_cvtph_ps(
            _mm256_load_si256(reinterpret_cast<const __m256i*>(unit + kPackedKD<kFive> + 32)));
        hi = _mm512_load_si512(unit + kPackedKHigh<kFive>);
      }
    }
    __m512i w[8];
    if constexpr (kQ4) {
      const __m512i low = _mm512_set1_epi8(0x0F);
      __m512i h = _mm512_setzero_si512();
      if constexpr (kFive) h = _mm512_loadu_si512(blk + kPackedQ5FifthBits);
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        const __m512i v = _mm512_loadu_si512(blk + 64 * c);
        w[c] = _mm512_and_si512(v, low);
        w[c + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        if constexpr (kFive) {
          // Bit c (4 + c) of each qh byte to bit 4: 16-bit shifts by at most 4 move no bit of one
          // byte onto bit 4 of the other.
          const __m512i five = _mm512_set1_epi8(0x10);
          w[c] = _mm512_or_si512(w[c], _mm512_and_si512(_mm512_slli_epi16(h, 4 - c), five));
          w[c + 4] = _mm512_or_si512(w[c + 4], _mm512_and_si512(_mm512_srli_epi16(h, c), five));
        }
      }
    } else {
      const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
#pragma GCC unroll 8
      for (int g = 0; g < 8; ++g) w[g] = _mm512_xor_si512(_mm512_loadu_si512(blk + 64 * g), bias);
    }
    __m512 dw, mw = _mm512_setzero_ps();
    if constexpr (kK) {
      KScales<kFive>(unit, static_cast<int>(b % 8), d_sb, dmin_sb, hi, &dw, &mw);
    } else if constexpr (kFive) {
      dw = _mm512_cvtph_ps(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kPackedQ5Scales)));
      if constexpr (F == 7) {
        mw = _mm512_mul_ps(dw, _mm512_set1_ps(-16.0f));  // exact
      } else {
        mw = _mm512_cvtph_ps(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kPackedQ5Scales + 32)));
      }
    } else {
      dw = _mm512_cvtph_ps(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kGroups * 64)));
      if constexpr (F == 6) {
        mw = _mm512_mul_ps(dw, _mm512_set1_ps(-8.0f));  // exact
      } else if constexpr (kQ4) {
        mw = _mm512_cvtph_ps(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kGroups * 64 + 32)));
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const BlockQ8Act& xb = x[r * xs + b];
      // Two chains of 4 (elements 0..15, 16..31) for the latency; integer sums are exact in any
      // order.
      __m512i s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], Bcast4(xb.qs));
      __m512i s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[4], Bcast4(xb.qs + 16));
#pragma GCC unroll 3
      for (int c = 1; c < 4; ++c) {
        s0 = _mm512_dpbusd_epi32(s0, w[c], Bcast4(xb.qs + 4 * c));
        s1 = _mm512_dpbusd_epi32(s1, w[c + 4], Bcast4(xb.qs + 16 + 4 * c));
      }
      __m512i sum = _mm512_add_epi32(s0, s1);
      if constexpr (!kQ4) sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(128 * xsum[r * xs + b]));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(dw, _mm512_set1_ps(xb.d)),
                               acc[r]);
      if constexpr (kQ4) acc[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(xb.s), acc[r]);
    }
  }
  const __mmask16 keep = static_cast<__mmask16>(rows >= 16 ? 0xFFFF : (1u << rows) - 1);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(y + r * ys, keep, acc[r]);
}

// kQ6x16: the 6-bit codes q (0..63) are vpdpbusd's unsigned operand, assembled from their low
// nibbles and high bit pairs once per block index for all activation rows; Σ (q - 32) x of each
// 16-element half is Σ q x - 32 Σ x (exact), Σ x from MatMul's half sums (xsum). The halves'
// sums are scaled by their int8 scales in integers, as the row kernel does.

// ((hi >> 2c) & 3) << 4 in each byte: 16-bit shifts by at most 4 move no bit of one byte onto
// bits 4 and 5 of the other.
template <int C>
inline __m512i Q6HighBits(__m512i hi) {
  const __m512i mask = _mm512_set1_epi8(0x30);
  if constexpr (C == 0) return _mm512_and_si512(_mm512_slli_epi16(hi, 4), mask);
  if constexpr (C == 1) return _mm512_and_si512(_mm512_slli_epi16(hi, 2), mask);
  if constexpr (C == 2) return _mm512_and_si512(hi, mask);
  return _mm512_and_si512(_mm512_srli_epi16(hi, 2), mask);
}

template <int C>
inline void Q6Codes(const __m512i* lo, __m512i hi0, __m512i hi1, __m512i* w) {
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  w[C] = _mm512_or_si512(_mm512_and_si512(lo[C], nibble), Q6HighBits<C>(hi0));
  w[C + 4] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(lo[C], 4), nibble),
                             Q6HighBits<C>(hi1));
}

template <int R>
__attribute__((always_inline)) inline void PackedRowsQ6(const uint8_t* tile, int64_t nb,
                                                        const BlockQ8Act* x, const int32_t* halves,
                                                        int64_t xs, float* y, int64_t ys,
                                                        int64_t rows) {
  constexpr int64_t kBlockBytes = kPackedQ6PairBytes / 16;  // on average
  __m512 acc[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  __m512 dw = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    // (The tiles are read front to back, a unit's bytes per 8 block indices.)
    if constexpr (R > 1) PrefetchPackedBlock<kBlockBytes>(tile + b * kBlockBytes);
    const uint8_t* unit = tile + PackedQ6Unit(b / 8);
    const int j = static_cast<int>(b % 8);
    const uint8_t* sub = unit + j * kPackedQ6SubBytes;
    if (j == 0) {
      dw = _mm512_cvtph_ps(
          _mm256_load_si256(reinterpret_cast<const __m256i*>(tile + PackedQ6D(b / 8))));
    }
    __m512i lo[4], w[8];
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) lo[c] = _mm512_load_si512(sub + 64 * c);
    const __m512i hi0 = _mm512_load_si512(sub + kPackedQ6High);
    const __m512i hi1 = _mm512_load_si512(sub + kPackedQ6High + 64);
    Q6Codes<0>(lo, hi0, hi1, w);
    Q6Codes<1>(lo, hi0, hi1, w);
    Q6Codes<2>(lo, hi0, hi1, w);
    Q6Codes<3>(lo, hi0, hi1, w);
    const __m512i sc0 = _mm512_cvtepi8_epi32(
        _mm_load_si128(reinterpret_cast<const __m128i*>(unit + kPackedQ6Scales + 32 * j)));
    const __m512i sc1 = _mm512_cvtepi8_epi32(
        _mm_load_si128(reinterpret_cast<const __m128i*>(unit + kPackedQ6Scales + 32 * j + 16)));
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const BlockQ8Act& xb = x[r * xs + b];
      const int32_t* hs = halves + 2 * (r * xs + b);
      __m512i s0 = _mm512_dpbusd_epi32(_mm512_set1_epi32(-32 * hs[0]), w[0], Bcast4(xb.qs));
      __m512i s1 = _mm512_dpbusd_epi32(_mm512_set1_epi32(-32 * hs[1]), w[4], Bcast4(xb.qs + 16));
#pragma GCC unroll 3
      for (int c = 1; c < 4; ++c) {
        s0 = _mm512_dpbusd_epi32(s0, w[c], Bcast4(xb.qs + 4 * c));
        s1 = _mm512_dpbusd_epi32(s1, w[c + 4], Bcast4(xb.qs + 16 + 4 * c));
      }
      const __m512i sum =
          _mm512_add_epi32(_mm512_mullo_epi32(s0, sc0), _mm512_mullo_epi32(s1, sc1));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(dw, _mm512_set1_ps(xb.d)),
                               acc[r]);
    }
  }
  const __mmask16 keep = static_cast<__mmask16>(rows >= 16 ? 0xFFFF : (1u << rows) - 1);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(y + r * ys, keep, acc[r]);
}

template <int F, int R>
__attribute__((always_inline)) inline void Rows(const uint8_t* tile, int64_t nb,
                                                const BlockQ8Act* x, const int32_t* xsum,
                                                int64_t xs, float* y, int64_t ys, int64_t rows) {
  if constexpr (F == 3) {
    PackedRowsQ6<R>(tile, nb, x, xsum, xs, y, ys, rows);
  } else {
    PackedRows<F, R>(tile, nb, x, xsum, xs, y, ys, rows);
  }
}

template <int F>
void PackedDot(const uint8_t* tile, int64_t nb, const BlockQ8Act* x, const int32_t* xsum,
               int64_t xs, int64_t m, float* y, int64_t ys, int64_t rows) {
  // xsum is only read (and only guaranteed to point anywhere) for Q8 tiles (block sums) and Q6
  // tiles (half sums).
  auto sums = [&](int64_t i) {
    return F == 1 ? xsum + i * xs : F == 3 ? xsum + 2 * i * xs : nullptr;
  };
  int64_t i = 0;
  for (; i + 8 <= m; i += 8) {
    Rows<F, 8>(tile, nb, x + i * xs, sums(i), xs, y + i * ys, ys, rows);
  }
  const BlockQ8Act* xi = x + i * xs;
  const int32_t* si = sums(i);
  float* yi = y + i * ys;
  switch (m - i) {
    case 7: Rows<F, 7>(tile, nb, xi, si, xs, yi, ys, rows); break;
    case 6: Rows<F, 6>(tile, nb, xi, si, xs, yi, ys, rows); break;
    case 5: Rows<F, 5>(tile, nb, xi, si, xs, yi, ys, rows); break;
    case 4: Rows<F, 4>(tile, nb, xi, si, xs, yi, ys, rows); break;
    case 3: Rows<F, 3>(tile, nb, xi, si, xs, yi, ys, rows); break;
    case 2: Rows<F, 2>(tile, nb, xi, si, xs, yi, ys, rows); break;
    case 1: Rows<F, 1>(tile, nb, xi, si, xs, yi, ys, rows); break;
    default: break;
  }
}

const PackedDotFn kPackedDot[kPackedFormatCount] = {PackedDot<0>, PackedDot<1>, PackedDot<2>,
                                                     PackedDot<3>, PackedDot<4>, PackedDot<5>,
                                                     PackedDot<6>, PackedDot<7>};

// ---- attention, head_dim 64 ---------------------------------------------------------------------
// Scores for 16 positions at a time: 16 partial-product vectors (4 FMAs each) are summed
// horizontally all at once by a transposing tree (45 shuffles and adds instead of 16 reductions of
// 8 operations each); softmax weights with a vector exp; values accumulated for every query head
// of the KV head from one load of each value row.

// e^x for x <= 0 (softmax arguments), within ~2 ulp (Cephes' expf polynomial); x below -87.3
// gives ~1e-38, not 0: callers mask what must be 0.
inline __m512 ExpNonPositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

inline float HmaxF32(__m512 v) {
  return Hmax8(_mm256_max_ps(_mm512_castps512_ps256(v), _mm512_maskz_extractf32x8_ps(0xFF, v, 1)));
}

// q · k for head_dim 64 as 16 partial sums (lane i: dimensions i, i + 16, i + 32, i + 48).
template <typename E>
inline __m512 Dot64(const __m512* q, const E* k) {
  __m512 p = _mm512_mul_ps(q[0], LoadKv(k));
  p = _mm512_fmadd_ps(q[1], LoadKv(k + 16), p);
  p = _mm512_fmadd_ps(q[2], LoadKv(k + 32), p);
  return _mm512_fmadd_ps(q[3], LoadKv(k + 48), p);
}

// q · k[j] for j < 16, lane j.
template <typename E>
inline __m512 Scores16(const __m512* q, const E* const* k) {
  // Per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3] for keys a = 2i, b = 2i + 1 (each pair folded
  // as soon as it is computed, so that 16 partial products are never live at once).
  __m512 r1[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    const __m512 a = Dot64(q, k[2 * i]), b = Dot64(q, k[2 * i + 1]);
    r1[i] = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  }
  // Per 128-bit lane: keys 4i .. 4i+3, each summed over that lane's quarter of the dimensions.
  __m512 r2[4];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    r2[i] = _mm512_add_ps(_mm512_shuffle_ps(r1[2 * i], r1[2 * i + 1], 0x44),
                          _mm512_shuffle_ps(r1[2 * i], r1[2 * i + 1], 0xEE));
  }
  // Lanes: [keys 8i..8i+3 (quarters 0+1), (2+3), keys 8i+4..8i+7 (0+1), (2+3)].
  __m512 r3[2];
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i) {
    r3[i] = _mm512_add_ps(_mm512_shuffle_f32x4(r2[2 * i], r2[2 * i + 1], 0x88),
                          _mm512_shuffle_f32x4(r2[2 * i], r2[2 * i + 1], 0xDD));
  }
  return _mm512_add_ps(_mm512_shuffle_f32x4(r3[0], r3[1], 0x88),
                       _mm512_shuffle_f32x4(r3[0], r3[1], 0xDD));
}

// Live lanes' masks of a chunk of `count` (1..32) positions: its first and second 16.
struct ChunkMasks {
  __mmask16 live0, live1;
};
inline ChunkMasks MasksOf(int64_t count) {
  return {static_cast<__mmask16>(count >= 16 ? 0xFFFF : (1u << count) - 1),
          static_cast<__mmask16>(count >= 32 ? 0xFFFF
                                 : count > 16 ? (1u << (count - 16)) - 1
                                              : 0)};
}

// A query line's online-softmax step over one chunk: scaled scores s0 / s1 (dead lanes -inf) to
// weights (dead lanes 0) stored at `weights`, the running maximum and sum updated. Returns the
// factor the line's accumulator must be multiplied by (0 on the first chunk, 1 when the maximum
// stays). Both attention kernels call this, so their arithmetic is the same.
__attribute__((always_inline)) inline float SoftmaxChunk(__m512 s0, __m512 s1, __mmask16 live0,
                                                         __mmask16 live1, float& running_max,
                                                         float& running_sum, float* weights) {
  const float chunk_max = HmaxF32(_mm512_max_ps(s0, s1));
  const float new_max = running_max > chunk_max ? running_max : chunk_max;
  const float correction = __builtin_expf(running_max - new_max);
  const __m512 m = _mm512_set1_ps(new_max);
  const __m512 e0 = _mm512_maskz_mov_ps(live0, ExpNonPositive(_mm512_sub_ps(s0, m)));
  const __m512 e1 = _mm512_maskz_mov_ps(live1, ExpNonPositive(_mm512_sub_ps(s1, m)));
  _mm512_store_ps(weights, e0);
  _mm512_store_ps(weights + 16, e1);
  running_sum = running_sum * correction + VF::Hsum(_mm512_add_ps(e0, e1));
  running_max = new_max;
  return correction;
}

// acc[h] += weights[h][j] · value row (v0 v1 v2 v3) for the G query heads of a KV head.
template <int G>
__attribute__((always_inline)) inline void AccumulateValue(const float (*weights)[kAttendChunk],
                                                            int64_t j, __m512 v0, __m512 v1,
                                                            __m512 v2, __m512 v3,
                                                            __m512 (*acc)[4]) {
#pragma GCC unroll 8
  for (int h = 0; h < G; ++h) {
    const __m512 w = _mm512_set1_ps(weights[h][j]);
    acc[h][0] = _mm512_fmadd_ps(w, v0, acc[h][0]);
    acc[h][1] = _mm512_fmadd_ps(w, v1, acc[h][1]);
    acc[h][2] = _mm512_fmadd_ps(w, v2, acc[h][2]);
    acc[h][3] = _mm512_fmadd_ps(w, v3, acc[h][3]);
  }
}

template <int G, typename E>
void Attend64Heads(const float* q, int64_t q_stride, const E* const* k, const E* const* v,
                   int64_t ctx, float scale, float* out, int64_t out_stride) {
  __m512 acc[G][4];
  float running_max[G], running_sum[G];
  alignas(64) float weights[G][kAttendChunk];
#pragma GCC unroll 8
  for (int h = 0; h < G; ++h) {
    for (int i = 0; i < 4; ++i) acc[h][i] = _mm512_setzero_ps();
    running_max[h] = -__builtin_inff();
    running_sum[h] = 0.0f;
  }
  const __m512 scale_v = _mm512_set1_ps(scale);
  const __m512 neg_inf = _mm512_set1_ps(-__builtin_inff());
  for (int64_t start = 0; start < ctx; start += kAttendChunk) {
    const int64_t count = ctx - start < kAttendChunk ? ctx - start : kAttendChunk;
    const auto [live0, live1] = MasksOf(count);
#pragma GCC unroll 8
    for (int h = 0; h < G; ++h) {
      const float* qh = q + h * q_stride;
      const __m512 qv[4] = {_mm512_loadu_ps(qh), _mm512_loadu_ps(qh + 16),
                            _mm512_loadu_ps(qh + 32), _mm512_loadu_ps(qh + 48)};
      __m512 s0 = _mm512_mask_blend_ps(live0, neg_inf,
                                       _mm512_mul_ps(Scores16(qv, k + start), scale_v));
      __m512 s1 = neg_inf;
      if (live1 != 0) {
        s1 = _mm512_mask_blend_ps(live1, neg_inf,
                                  _mm512_mul_ps(Scores16(qv, k + start + 16), scale_v));
      }
      const float correction =
          SoftmaxChunk(s0, s1, live0, live1, running_max[h], running_sum[h], weights[h]);
      if (correction != 1.0f) {
        const __m512 c = _mm512_set1_ps(correction);
        for (int i = 0; i < 4; ++i) acc[h][i] = _mm512_mul_ps(acc[h][i], c);
      }
    }
    for (int64_t j = 0; j < count; ++j) {
      const E* vj = v[start + j];
      const __m512 v0 = LoadKv(vj), v1 = LoadKv(vj + 16);
      const __m512 v2 = LoadKv(vj + 32), v3 = LoadKv(vj + 48);
      AccumulateValue<G>(weights, j, v0, v1, v2, v3, acc);
    }
  }
#pragma GCC unroll 8
  for (int h = 0; h < G; ++h) {
    const __m512 inv = _mm512_set1_ps(running_sum[h] > 0.0f ? 1.0f / running_sum[h] : 0.0f);
    for (int i = 0; i < 4; ++i) {
      _mm512_storeu_ps(out + h * out_stride + 16 * i, _mm512_mul_ps(acc[h][i], inv));
    }
  }
}

template <typename E>
void Attend64Impl(const float* q, int64_t q_stride, int64_t heads, const E* const* k,
                  const E* const* v, int64_t ctx, float scale, float* out, int64_t out_stride) {
  switch (heads) {
    case 1: Attend64Heads<1>(q, q_stride, k, v, ctx, scale, out, out_stride); break;
    case 2: Attend64Heads<2>(q, q_stride, k, v, ctx, scale, out, out_stride); break;
    case 3: Attend64Heads<3>(q, q_stride, k, v, ctx, scale, out, out_stride); break;
    case 4: Attend64Heads<4>(q, q_stride, k, v, ctx, scale, out, out_stride); break;
    case 5: Attend64Heads<5>(q, q_stride, k, v, ctx, scale, out, out_stride); break;
    case 6: Attend64Heads<6>(q, q_stride, k, v, ctx, scale, out, out_stride); break;
    default: break;
  }
}

// ---- attention over a prompt chunk's tokens, head_dim 64 (Attend64RowsFn) -----------------------
// Per 16 keys, the rows are widened once and transposed (kt[d] = dimension d of the 16 keys), and
// each query line's 16 scores are 64 multiply-adds of a broadcast query element into those
// columns. Attend64Heads' lane i sums dimensions i, i+16, i+32, i+48 in that order and its tree
// adds lanes (i, i+2) and (i+1, i+3) of each quarter, then the quarters as (0+1) + (2+3): the
// columns are combined in exactly that order, so the scores (and all that follows) are the same
// bits. Value rows are widened once per chunk and shared by every line of the call.

// kt[d * 16 + j] = element d of row j, for 16 rows of 64 elements.
template <typename E>
inline void TransposeKeys16(const E* const* k, float* kt) {
#pragma GCC unroll 4
  for (int quarter = 0; quarter < 4; ++quarter) {
    __m512 r[16], t[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) r[j] = LoadKv(k[j] + 16 * quarter);
    // Per 128-bit lane: t[2i] = [a0 b0 a1 b1], t[2i+1] = [a2 b2 a3 b3] of rows a = 2i, b = 2i+1.
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    // Per 128-bit lane L: r[4i + e] = element 4L + e of rows 4i .. 4i+3.
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
      const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
      r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
      r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
      r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
      r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    // Column 4L + e gathers lane L of r[e], r[4 + e], r[8 + e], r[12 + e].
#pragma GCC unroll 4
    for (int e = 0; e < 4; ++e) {
      const __m512 v = _mm512_shuffle_f32x4(r[e], r[4 + e], 0x88);   // lanes 0, 2 | 0, 2
      const __m512 w = _mm512_shuffle_f32x4(r[e], r[4 + e], 0xDD);   // lanes 1, 3 | 1, 3
      const __m512 v2 = _mm512_shuffle_f32x4(r[8 + e], r[12 + e], 0x88);
      const __m512 w2 = _mm512_shuffle_f32x4(r[8 + e], r[12 + e], 0xDD);
      float* col = kt + (16 * quarter + e) * 16;
      _mm512_store_ps(col + 0 * 64, _mm512_shuffle_f32x4(v, v2, 0x88));   // L = 0
      _mm512_store_ps(col + 1 * 64, _mm512_shuffle_f32x4(w, w2, 0x88));   // L = 1
      _mm512_store_ps(col + 2 * 64, _mm512_shuffle_f32x4(v, v2, 0xDD));   // L = 2
      _mm512_store_ps(col + 3 * 64, _mm512_shuffle_f32x4(w, w2, 0xDD));   // L = 3
    }
  }
}

// Scores16 of the G query lines at q + h * 64 against the 16 keys transposed in kt, bit for
// bit, into scores[h]; each column of kt is loaded once for the G lines. Kept out of line: its
// caller's registers are taken by the value loop.
template <int G>
__attribute__((noinline)) void ScoresTransposed16(const float* q, const float* kt,
                                                  __m512* scores) {
  // lanes[h] = Dot64's lane i of line h: dimensions i, i+16, i+32, i+48 in that order.
  auto lane = [&](int i, __m512* lanes) __attribute__((always_inline)) {
    __m512 k0 = _mm512_load_ps(kt + 16 * i), k1 = _mm512_load_ps(kt + 16 * (i + 16));
    __m512 k2 = _mm512_load_ps(kt + 16 * (i + 32)), k3 = _mm512_load_ps(kt + 16 * (i + 48));
    // In registers, loaded once for the G lines (left to itself the compiler folds the loads
    // into every multiply-add and broadcasts the query elements separately: two loads each).
    asm("" : "+v"(k0), "+v"(k1), "+v"(k2), "+v"(k3));
#pragma GCC unroll 8
    for (int h = 0; h < G; ++h) {
      const float* qh = q + h * 64;
      __m512 p = _mm512_mul_ps(_mm512_set1_ps(qh[i]), k0);
      p = _mm512_fmadd_ps(_mm512_set1_ps(qh[i + 16]), k1, p);
      p = _mm512_fmadd_ps(_mm512_set1_ps(qh[i + 32]), k2, p);
      lanes[h] = _mm512_fmadd_ps(_mm512_set1_ps(qh[i + 48]), k3, p);
    }
  };
  __m512 pair[2][G];  // quarters 0 + 1 and 2 + 3
#pragma GCC unroll 4
  for (int l = 0; l < 4; ++l) {
    __m512 a[G], b[G], quarter[G];
    lane(4 * l, a);
    lane(4 * l + 2, b);
#pragma GCC unroll 8
    for (int h = 0; h < G; ++h) quarter[h] = _mm512_add_ps(a[h], b[h]);
    lane(4 * l + 1, a);
    lane(4 * l + 3, b);
#pragma GCC unroll 8
    for (int h = 0; h < G; ++h) {
      quarter[h] = _mm512_add_ps(quarter[h], _mm512_add_ps(a[h], b[h]));
      pair[l / 2][h] = l % 2 == 0 ? quarter[h] : _mm512_add_ps(pair[l / 2][h], quarter[h]);
    }
  }
#pragma GCC unroll 8
  for (int h = 0; h < G; ++h) scores[h] = _mm512_add_ps(pair[0][h], pair[1][h]);
}

template <int G, typename E>
void Attend64RowsHeads(const float* q, int64_t q_token_stride, int64_t rows, const E* const* k,
                       const E* const* v, int64_t first_ctx, float scale, float* out,
                       int64_t out_token_stride) {
  constexpr int64_t kMaxLines = kAttendMaxRows * G;
  alignas(64) float acc[kMaxLines][64];
  alignas(64) float weights[kMaxLines][kAttendChunk];
  alignas(64) float kt[2][64 * 16];
  alignas(64) float vf[kAttendChunk][64];
  float running_max[kMaxLines], running_sum[kMaxLines];
  for (int64_t line = 0; line < rows * G; ++line) {
    for (int i = 0; i < 64; i += 16) _mm512_store_ps(acc[line] + i, _mm512_setzero_ps());
    running_max[line] = -__builtin_inff();
    running_sum[line] = 0.0f;
  }
  const __m512 scale_v = _mm512_set1_ps(scale);
  const __m512 neg_inf = _mm512_set1_ps(-__builtin_inff());
  const int64_t last_ctx = first_ctx + rows - 1;
  for (int64_t start = 0; start < last_ctx; start += kAttendChunk) {
    const int64_t chunk = last_ctx - start < kAttendChunk ? last_ctx - start : kAttendChunk;
    TransposeKeys16(k + start, kt[0]);
    if (chunk > 16) TransposeKeys16(k + start + 16, kt[1]);
    for (int64_t j = 0; j < chunk; ++j) {
      const E* vj = v[start + j];
      for (int i = 0; i < 4; ++i) _mm512_store_ps(vf[j] + 16 * i, LoadKv(vj + 16 * i));
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t ctx = first_ctx + r;
      if (start >= ctx) continue;  // the earlier tokens of the call end before this chunk
      const int64_t count = ctx - start < kAttendChunk ? ctx - start : kAttendChunk;
      const auto [live0, live1] = MasksOf(count);
      float* const acc_r = acc[r * G];
      __m512 scores0[G], scores1[G];
      ScoresTransposed16<G>(q + r * q_token_stride, kt[0], scores0);
      if (live1 != 0) ScoresTransposed16<G>(q + r * q_token_stride, kt[1], scores1);
#pragma GCC unroll 8
      for (int h = 0; h < G; ++h) {
        const int64_t line = r * G + h;
        const __m512 s0 =
            _mm512_mask_blend_ps(live0, neg_inf, _mm512_mul_ps(scores0[h], scale_v));
        __m512 s1 = neg_inf;
        if (live1 != 0) {
          s1 = _mm512_mask_blend_ps(live1, neg_inf, _mm512_mul_ps(scores1[h], scale_v));
        }
        const float correction = SoftmaxChunk(s0, s1, live0, live1, running_max[line],
                                              running_sum[line], weights[line]);
        if (correction != 1.0f) {
          const __m512 c = _mm512_set1_ps(correction);
          for (int i = 0; i < 4; ++i) {
            float* a = acc_r + h * 64 + 16 * i;
            _mm512_store_ps(a, _mm512_mul_ps(_mm512_load_ps(a), c));
          }
        }
      }
      // The token's heads share each value row, as in Attend64Heads.
      __m512 a[G][4];
#pragma GCC unroll 8
      for (int h = 0; h < G; ++h) {
        for (int i = 0; i < 4; ++i) a[h][i] = _mm512_load_ps(acc_r + h * 64 + 16 * i);
      }
      for (int64_t j = 0; j < count; ++j) {
        __m512 v0 = _mm512_load_ps(vf[j]), v1 = _mm512_load_ps(vf[j] + 16);
        __m512 v2 = _mm512_load_ps(vf[j] + 32), v3 = _mm512_load_ps(vf[j] + 48);
        asm("" : "+v"(v0), "+v"(v1), "+v"(v2), "+v"(v3));  // once for the G lines
        AccumulateValue<G>(weights + r * G, j, v0, v1, v2, v3, a);
      }
#pragma GCC unroll 8
      for (int h = 0; h < G; ++h) {
        for (int i = 0; i < 4; ++i) _mm512_store_ps(acc_r + h * 64 + 16 * i, a[h][i]);
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
#pragma GCC unroll 8
    for (int h = 0; h < G; ++h) {
      const int64_t line = r * G + h;
      const __m512 inv =
          _mm512_set1_ps(running_sum[line] > 0.0f ? 1.0f / running_sum[line] : 0.0f);
      for (int i = 0; i < 4; ++i) {
        _mm512_storeu_ps(out + r * out_token_stride + h * 64 + 16 * i,
                         _mm512_mul_ps(_mm512_load_ps(acc[line] + 16 * i), inv));
      }
    }
  }
}

template <typename E>
void Attend64RowsImpl(const float* q, int64_t q_token_stride, int64_t rows, int64_t heads,
                      const E* const* k, const E* const* v, int64_t first_ctx, float scale,
                      float* out, int64_t out_token_stride) {
  using Fn = void (*)(const float*, int64_t, int64_t, const E* const*, const E* const*, int64_t,
                      float, float*, int64_t);
  static constexpr Fn kByHeads[kAttendMaxHeads + 1] = {
      nullptr,
      Attend64RowsHeads<1, E>,
      Attend64RowsHeads<2, E>,
      Attend64RowsHeads<3, E>,
      Attend64RowsHeads<4, E>,
      Attend64RowsHeads<5, E>,
      Attend64RowsHeads<6, E>};
  if (heads < 1 || heads > kAttendMaxHeads || rows < 1 || rows > kAttendMaxRows) return;
  kByHeads[heads](q, q_token_stride, rows, k, v, first_ctx, scale, out, out_token_stride);
}

// QuantizeRowQ8Act on two 512-bit registers a block, bit for bit as kernels_avx2.cc's
// QuantizeQ8Act (whose comment gives the reasons): the maximum ignores NaN in any order, the scale
// is the same scalar division, cvtps2dq rounds to nearest even, and vpmovsdb only narrows codes
// already clamped to [-127, 127].
void QuantizeQ8Act512(const float* x, BlockQ8Act* out, int64_t k, int32_t* sums) {
  const __m512 sign = _mm512_set1_ps(-0.0f);
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  QuantizeBlocks(x, out, k, sums, [&](const float* xb, int8_t* qs) {
    const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
    __m512 m = _mm512_max_ps(_mm512_andnot_ps(sign, v0), _mm512_setzero_ps());
    m = _mm512_max_ps(_mm512_andnot_ps(sign, v1), m);
    const float d =
        Hmax8(_mm256_max_ps(_mm512_castps512_ps256(m), _mm512_extractf32x8_ps(m, 1))) / 127.0f;
    const __m512 id = _mm512_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
    const __m512i q0 =
        _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v0, id)), lo), hi);
    const __m512i q1 =
        _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v1, id)), lo), hi);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qs), _mm512_cvtsepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + 16), _mm512_cvtsepi32_epi8(q1));
    return QuantizedBlock{d, _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1))};
  });
}

const KernelTable kTable = {
    kTableIsa,
    {RowDotFloat<0>, RowDotFloat<1>, RowDotFloat<2>, RowDotQuant<kKindQ8_0>,
     RowDotQuant<kKindQ4_0>, RowDotQuant<kKindQ4_1>, RowDotQuant<kKindQ5_0>,
     RowDotQuant<kKindQ5_1>, RowDotQuant<kKindIQ4_NL>, RowDotQuant<kKindQ4_K>,
     RowDotQuant<kKindQ5_K>, RowDotQuant<kKindQ6_K>, nullptr},
    DotF32,
    AxpyF32,
    ScaleF32,
    kRowDot2,
    kPackedDot,
    Attend64,
    QuantizeQ8Act512,
    SiluMulRow,
    F16ToF32,
    F32ToF16,
    Attend64F16,
    Attend64Rows,
    Attend64RowsF16,
};

}  // namespace

const KernelTable* Avx512KernelTable() { return &kTable; }

}  // namespace tandem::cpu
