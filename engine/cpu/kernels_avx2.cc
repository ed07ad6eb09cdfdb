// AVX2 + FMA + F16C inner loops (compiled with -mavx2 -mfma -mf16c). Int8 dot products use
// vpmaddubsw + vpmaddwd, like ggml's AVX2 path. See kernel_table.h for the rules these files keep.
#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "engine/cpu/kernel_table.h"

namespace tandem::cpu {
namespace {

constexpr Isa kTableIsa = Isa::kAvx2;

struct VF {
  using T = __m256;
  static constexpr int kW = 8;
  static T Zero() { return _mm256_setzero_ps(); }
  static T Set1(float a) { return _mm256_set1_ps(a); }
  static T Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, T v) { _mm256_storeu_ps(p, v); }
  static T LoadF16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static T LoadBF16(const uint16_t* p) {
    const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
  }
  static T Fmadd(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T Add(T a, T b) { return _mm256_add_ps(a, b); }
  static T Mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static float Hsum(T v);
};

// u8 x s8 -> pairs summed to s16 (no saturation: |15 * 127 * 2| and |128 * 127 * 2| < 32768),
// then pairs of s16 summed to s32.
inline __m256i DotI8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

#include "engine/cpu/kernels_x86.inc"

// ---- packed tiles (packed_weights.h) ------------------------------------------------------------
// The 16 rows of a tile are two 256-bit halves of 8 rows; each half is walked over all blocks
// with up to 4 activation rows at a time. Q4: the 8 vpmaddubsw pair sums of a block (each at most
// 2 * 15 * 127) add up in 16 bits without overflow, then one vpmaddwd widens them. Q8: codes are
// signed, so the sign moves onto x (as in the row kernel) and each product is widened at once.

inline __m256i Bcast4(const int8_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// Rows 8 * half .. 8 * half + 7 of y (those below `rows`), for each of R activation rows: what
// one half-tile's walk produced.
template <int R>
inline void StoreHalfRows(const __m256 (&acc)[R], int half, float* y, int64_t ys, int64_t rows) {
  const int64_t first = 8 * half;
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    if (rows >= first + 8) {
      _mm256_storeu_ps(y + r * ys + first, acc[r]);
    } else {
      alignas(32) float tmp[8];
      _mm256_store_ps(tmp, acc[r]);
      for (int64_t i = first; i < rows; ++i) y[r * ys + i] = tmp[i - first];
    }
  }
}

// Block index j's scales and offsets of rows 8 half .. 8 half + 7 of a kQ4Kx16 / kQ5Kx16 unit
// (packed_weights.h): d · sc_j and -(dmin · m_j), exact. d_sb, dmin_sb and hi are the unit's
// (this half's), loaded once per unit.
template <bool kFive>
inline void KScales(const uint8_t* unit, int j, int half, __m256 d_sb, __m256 dmin_sb, __m256i hi,
                    __m256* dw, __m256* mw) {
  const __m256i low = _mm256_cvtepu8_epi32(_mm_loadl_epi64(
      reinterpret_cast<const __m128i*>(unit + kPackedKLow<kFive> + 16 * j + 8 * half)));
  const __m256i three = _mm256_set1_epi32(3), fifteen = _mm256_set1_epi32(15);
  const __m256i sc = _mm256_or_si256(
      _mm256_and_si256(low, fifteen),
      _mm256_slli_epi32(_mm256_and_si256(_mm256_srl_epi32(hi, _mm_cvtsi32_si128(2 * j)), three),
                        4));
  const __m256i mn = _mm256_or_si256(
      _mm256_srli_epi32(low, 4),
      _mm256_slli_epi32(
          _mm256_and_si256(_mm256_srl_epi32(hi, _mm_cvtsi32_si128(16 + 2 * j)), three), 4));
  *dw = _mm256_mul_ps(d_sb, _mm256_cvtepi32_ps(sc));
  *mw = _mm256_xor_ps(_mm256_mul_ps(dmin_sb, _mm256_cvtepi32_ps(mn)), _mm256_set1_ps(-0.0f));
}

// F: a PackedFormat as int (0 kQ4x16, 1 kQ8x16, 2 kQ5x16, 4 kQ4Kx16, 5 kQ5Kx16, 6 kQ4Sx16 /
// 7 kQ5Sx16: kQ4x16 / kQ5x16 whose offset is -8 d / -16 d). kQ5x16 is kQ4x16 with each code's
// fifth bit ORed in from its qh group; its pair sums (at most 2 * 31 * 127) add up in 16 bits only 4 at a time, so
// each half of the block is widened on its own. kQ4Kx16 / kQ5Kx16 are kQ4x16 / kQ5x16 with each
// block's scales made from its unit's scale bits (KScales), once for all activation rows.
template <int F, int R>
void PackedHalfRows(const uint8_t* tile, int64_t nb, int half, const BlockQ8Act* x,
                    const int32_t* /*xsum*/, int64_t xs, float* y, int64_t ys, int64_t rows) {
  constexpr bool kQ4 = F != 1;  // nibble codes with an offset
  constexpr bool kFive = F == 2 || F == 5 || F == 7;
  constexpr bool kK = F == 4 || F == 5;  // kQ4Kx16, kQ5Kx16
  constexpr int64_t kBlockBytes = kK        ? kPackedKUnitBytes<kFive> / 8
                                  : F == 7  ? kPackedQ5SBlockBytes
                                  : kFive   ? kPackedQ5BlockBytes
                                  : F == 6  ? kPackedQ4SBlockBytes
                                            : kPackedBlockBytes<kQ4>;
  constexpr int kGroups = kPackedGroups<kQ4>;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  __m256 d_sb = _mm256_setzero_ps(), dmin_sb = _mm256_setzero_ps();
  __m256i hi = _mm256_setzero_si256();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* base = tile + b * kBlockBytes;
    // (The second half reads the lines the first one brought in. K formats: the tiles are still
    // read front to back, a unit's bytes per 8 block indices.)
    if (R > 1 && half == 0) PrefetchPackedBlock<kBlockBytes>(base);
    const uint8_t* unit = nullptr;
    if constexpr (kK) {
      unit = tile + (b / 8) * kPackedKUnitBytes<kFive>;
      base = unit + (b % 8) * kPackedKSubBytes<kFive>;
      if (b % 8 == 0) {
        const uint8_t* d = unit + kPackedKD<kFive> + 16 * half;
        d_sb = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(d)));
        dmin_sb = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(d + 32)));
        hi = _mm256_load_si256(
            reinterpret_cast<const __m256i*>(unit + kPackedKHigh<kFive> + 32 * half));
      }
    }
    const uint8_t* blk = base + 32 * half;  // this half's codes in each 64-byte group
    __m256 dw, mw = _mm256_setzero_ps();
    if constexpr (kK) {
      KScales<kFive>(unit, static_cast<int>(b % 8), half, d_sb, dmin_sb, hi, &dw, &mw);
    } else if constexpr (kFive) {
      const uint8_t* scales = base + kPackedQ5Scales + 16 * half;  // its 8 f16 d (then m)
      dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales)));
      if constexpr (F == 7) {
        mw = _mm256_mul_ps(dw, _mm256_set1_ps(-16.0f));  // exact
      } else {
        mw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + 32)));
      }
    } else {
      const uint8_t* scales = base + kGroups * 64 + 16 * half;  // its 8 f16 d (then, Q4: m)
      dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales)));
      if constexpr (F == 6) {
        mw = _mm256_mul_ps(dw, _mm256_set1_ps(-8.0f));  // exact
      } else if constexpr (kQ4) {
        mw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + 32)));
      }
    }
    if constexpr (kQ4) {
      const __m256i low = _mm256_set1_epi8(0x0F);
      __m256i w[8];
      __m256i h = _mm256_setzero_si256();
      if constexpr (kFive) {
        h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kPackedQ5FifthBits));
      }
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * c));
        w[c] = _mm256_and_si256(v, low);
        w[c + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        if constexpr (kFive) {
          // Bit c (4 + c) of each qh byte to bit 4: 16-bit shifts by at most 4 move no bit of one
          // byte onto bit 4 of the other.
          const __m256i five = _mm256_set1_epi8(0x10);
          w[c] = _mm256_or_si256(w[c], _mm256_and_si256(_mm256_slli_epi16(h, 4 - c), five));
          w[c + 4] =
              _mm256_or_si256(w[c + 4], _mm256_and_si256(_mm256_srli_epi16(h, c), five));
        }
      }
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const BlockQ8Act& xb = x[r * xs + b];
        __m256i s16 = _mm256_maddubs_epi16(w[0], Bcast4(xb.qs));
#pragma GCC unroll 4
        for (int c = 1; c < 4; ++c) {
          s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(w[c], Bcast4(xb.qs + 4 * c)));
        }
        __m256i sum;
        if constexpr (kFive) {
          __m256i t16 = _mm256_maddubs_epi16(w[4], Bcast4(xb.qs + 16));
#pragma GCC unroll 4
          for (int c = 1; c < 4; ++c) {
            t16 = _mm256_add_epi16(t16, _mm256_maddubs_epi16(w[c + 4], Bcast4(xb.qs + 16 + 4 * c)));
          }
          sum = _mm256_add_epi32(_mm256_madd_epi16(s16, ones), _mm256_madd_epi16(t16, ones));
        } else {
#pragma GCC unroll 4
          for (int c = 0; c < 4; ++c) {
            s16 = _mm256_add_epi16(s16,
                                   _mm256_maddubs_epi16(w[c + 4], Bcast4(xb.qs + 16 + 4 * c)));
          }
          sum = _mm256_madd_epi16(s16, ones);
        }
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(dw, _mm256_set1_ps(xb.d)),
                                 acc[r]);
        acc[r] = _mm256_fmadd_ps(mw, _mm256_set1_ps(xb.s), acc[r]);
      }
    } else {
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const BlockQ8Act& xb = x[r * xs + b];
        __m256i sum = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int g = 0; g < 8; ++g) {
          const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * g));
          const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w),
                                                 _mm256_sign_epi8(Bcast4(xb.qs + 4 * g), w));
          sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p, ones));
        }
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(dw, _mm256_set1_ps(xb.d)),
                                 acc[r]);
      }
    }
  }
  StoreHalfRows<R>(acc, half, y, ys, rows);
}

// kQ6x16: the 6-bit codes q (0..63) are vpmaddubsw's unsigned operand, assembled from their low
// nibbles and high bit pairs once per block index for all activation rows; Σ (q - 32) x of each
// 16-element half is Σ q x - 32 Σ x (exact), Σ x from MatMul's half sums (xsum). A pair sum is
// at most 2 * 63 * 127, so two of them add up in 16 bits before each widening. The halves' sums
// are scaled by their int8 scales in integers, as the row kernel does.

// ((hi >> 2c) & 3) << 4 in each byte: 16-bit shifts by at most 4 move no bit of one byte onto
// bits 4 and 5 of the other.
template <int C>
inline __m256i Q6HighBits(__m256i hi) {
  const __m256i mask = _mm256_set1_epi8(0x30);
  if constexpr (C == 0) return _mm256_and_si256(_mm256_slli_epi16(hi, 4), mask);
  if constexpr (C == 1) return _mm256_and_si256(_mm256_slli_epi16(hi, 2), mask);
  if constexpr (C == 2) return _mm256_and_si256(hi, mask);
  return _mm256_and_si256(_mm256_srli_epi16(hi, 2), mask);
}

template <int C>
inline void Q6Codes(const uint8_t* blk, __m256i hi0, __m256i hi1, __m256i* w) {
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const __m256i lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(blk + 64 * C));
  w[C] = _mm256_or_si256(_mm256_and_si256(lo, nibble), Q6HighBits<C>(hi0));
  w[C + 4] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo, 4), nibble),
                             Q6HighBits<C>(hi1));
}

template <int R>
void PackedHalfRowsQ6(const uint8_t* tile, int64_t nb, int half, const BlockQ8Act* x,
                      const int32_t* halves, int64_t xs, float* y, int64_t ys, int64_t rows) {
  constexpr int64_t kBlockBytes = kPackedQ6PairBytes / 16;  // on average
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  __m256 dw = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    // (The second half reads the lines the first one brought in; the tiles are read front to
    // back, a unit's bytes per 8 block indices.)
    if (R > 1 && half == 0) PrefetchPackedBlock<kBlockBytes>(tile + b * kBlockBytes);
    const uint8_t* unit = tile + PackedQ6Unit(b / 8);
    const int j = static_cast<int>(b % 8);
    const uint8_t* blk = unit + j * kPackedQ6SubBytes + 32 * half;
    if (j == 0) {
      dw = _mm256_cvtph_ps(_mm_load_si128(
          reinterpret_cast<const __m128i*>(tile + PackedQ6D(b / 8) + 16 * half)));
    }
    const uint8_t* scales = unit + kPackedQ6Scales + 32 * j + 8 * half;
    const __m256i sc0 =
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(scales)));
    const __m256i sc1 =
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(scales + 16)));
    const __m256i hi0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(blk + kPackedQ6High));
    const __m256i hi1 =
        _mm256_load_si256(reinterpret_cast<const __m256i*>(blk + kPackedQ6High + 64));
    __m256i w[8];
    Q6Codes<0>(blk, hi0, hi1, w);
    Q6Codes<1>(blk, hi0, hi1, w);
    Q6Codes<2>(blk, hi0, hi1, w);
    Q6Codes<3>(blk, hi0, hi1, w);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const BlockQ8Act& xb = x[r * xs + b];
      const int32_t* hs = halves + 2 * (r * xs + b);
      __m256i s[2];
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const int g = 4 * h;
        const __m256i p01 =
            _mm256_add_epi16(_mm256_maddubs_epi16(w[g], Bcast4(xb.qs + 4 * g)),
                             _mm256_maddubs_epi16(w[g + 1], Bcast4(xb.qs + 4 * g + 4)));
        const __m256i p23 =
            _mm256_add_epi16(_mm256_maddubs_epi16(w[g + 2], Bcast4(xb.qs + 4 * g + 8)),
                             _mm256_maddubs_epi16(w[g + 3], Bcast4(xb.qs + 4 * g + 12)));
        s[h] = _mm256_add_epi32(
            _mm256_add_epi32(_mm256_madd_epi16(p01, ones), _mm256_madd_epi16(p23, ones)),
            _mm256_set1_epi32(-32 * hs[h]));
      }
      const __m256i sum =
          _mm256_add_epi32(_mm256_mullo_epi32(s[0], sc0), _mm256_mullo_epi32(s[1], sc1));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(dw, _mm256_set1_ps(xb.d)),
                               acc[r]);
    }
  }
  StoreHalfRows<R>(acc, half, y, ys, rows);
}

template <int F, int R>
inline void HalfRows(const uint8_t* tile, int64_t nb, int half, const BlockQ8Act* x,
                     const int32_t* xsum, int64_t xs, float* y, int64_t ys, int64_t rows) {
  if constexpr (F == 3) {
    PackedHalfRowsQ6<R>(tile, nb, half, x, xsum, xs, y, ys, rows);
  } else {
    PackedHalfRows<F, R>(tile, nb, half, x, xsum, xs, y, ys, rows);
  }
}

template <int F>
void PackedDot(const uint8_t* tile, int64_t nb, const BlockQ8Act* x, const int32_t* xsum,
               int64_t xs, int64_t m, float* y, int64_t ys, int64_t rows) {
  // xsum is only read (and only guaranteed to point anywhere) for Q6 tiles (half sums).
  auto sums = [&](int64_t i) { return F == 3 ? xsum + 2 * i * xs : nullptr; };
  for (int half = 0; half < 2 && 8 * half < rows; ++half) {
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) {
      HalfRows<F, 4>(tile, nb, half, x + i * xs, sums(i), xs, y + i * ys, ys, rows);
    }
    const BlockQ8Act* xi = x + i * xs;
    float* yi = y + i * ys;
    switch (m - i) {
      case 3: HalfRows<F, 3>(tile, nb, half, xi, sums(i), xs, yi, ys, rows); break;
      case 2: HalfRows<F, 2>(tile, nb, half, xi, sums(i), xs, yi, ys, rows); break;
      case 1: HalfRows<F, 1>(tile, nb, half, xi, sums(i), xs, yi, ys, rows); break;
      default: break;
    }
  }
}

const PackedDotFn kPackedDot[kPackedFormatCount] = {PackedDot<0>, PackedDot<1>, PackedDot<2>,
                                                     PackedDot<3>, PackedDot<4>, PackedDot<5>,
                                                     PackedDot<6>, PackedDot<7>};

// ---- attention, head_dim 64 ---------------------------------------------------------------------
// The AVX-512 kernel's plan on 256-bit registers: scores for 8 positions at a time (8 partial
// product vectors summed horizontally by one hadd tree), a vector exp for the softmax weights, and
// value rows accumulated per query head. With 16 registers, each query head keeps its 8
// accumulators in memory between chunks and re-reads the chunk's value rows from L1.

// q · k for head_dim 64 as 8 partial sums (lane i: dimensions i, i + 8, ..., i + 56).
template <typename E>
inline __m256 Dot64x8(const __m256* q, const E* k) {
  __m256 p0 = _mm256_mul_ps(q[0], LoadKv(k));
  __m256 p1 = _mm256_mul_ps(q[1], LoadKv(k + 8));
  p0 = _mm256_fmadd_ps(q[2], LoadKv(k + 16), p0);
  p1 = _mm256_fmadd_ps(q[3], LoadKv(k + 24), p1);
  p0 = _mm256_fmadd_ps(q[4], LoadKv(k + 32), p0);
  p1 = _mm256_fmadd_ps(q[5], LoadKv(k + 40), p1);
  p0 = _mm256_fmadd_ps(q[6], LoadKv(k + 48), p0);
  p1 = _mm256_fmadd_ps(q[7], LoadKv(k + 56), p1);
  return _mm256_add_ps(p0, p1);
}

// q · k[j] for j < 8, lane j.
template <typename E>
inline __m256 Scores8(const __m256* q, const E* const* k) {
  // hadd(a, b) per 128-bit half: [a0+a1, a2+a3, b0+b1, b2+b3]; two levels leave, per half, one
  // partial sum of each of 4 keys; the halves are then added across.
  const __m256 t0 = _mm256_hadd_ps(Dot64x8(q, k[0]), Dot64x8(q, k[1]));
  const __m256 t1 = _mm256_hadd_ps(Dot64x8(q, k[2]), Dot64x8(q, k[3]));
  const __m256 t2 = _mm256_hadd_ps(Dot64x8(q, k[4]), Dot64x8(q, k[5]));
  const __m256 t3 = _mm256_hadd_ps(Dot64x8(q, k[6]), Dot64x8(q, k[7]));
  const __m256 u0 = _mm256_hadd_ps(t0, t1);  // [k0 k1 k2 k3 | k0 k1 k2 k3] (low | high halves)
  const __m256 u1 = _mm256_hadd_ps(t2, t3);  // [k4 .. k7 | k4 .. k7]
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// One query head's scores over a chunk of `count` (1..32) positions, scaled, 8 at a time from
// score(g) (positions 8g .. 8g+7); dead lanes and groups -inf. Returns their lane-wise maximum.
template <typename ScoreFn>
__attribute__((always_inline)) inline __m256 ChunkScores8(int64_t count, __m256 scale_v,
                                                          ScoreFn score, __m256* s) {
  const __m256 neg_inf = _mm256_set1_ps(-__builtin_inff());
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256 m = neg_inf;
  for (int g = 0; g < kAttendChunk / 8; ++g) {
    const int64_t live = count - 8 * g;  // positions of this group inside the context
    if (live <= 0) {
      s[g] = neg_inf;
      continue;
    }
    const __m256 mask = _mm256_castsi256_ps(
        _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(live)), lane));
    s[g] = _mm256_blendv_ps(neg_inf, _mm256_mul_ps(score(g), scale_v), mask);
    m = _mm256_max_ps(m, s[g]);
  }
  return m;
}

// The online-softmax step of that head: weights (dead lanes 0) to `weights`, the running maximum
// and sum updated; returns the factor its accumulator is multiplied by (0 on the first chunk).
__attribute__((always_inline)) inline float SoftmaxChunk8(const __m256* s, __m256 m,
                                                          float& running_max, float& running_sum,
                                                          float* weights) {
  const __m256 neg_inf = _mm256_set1_ps(-__builtin_inff());
  const float chunk_max = Hmax8(m);
  const float new_max = running_max > chunk_max ? running_max : chunk_max;
  const float correction = __builtin_expf(running_max - new_max);
  const __m256 mv = _mm256_set1_ps(new_max);
  __m256 sum = _mm256_setzero_ps();
  for (int g = 0; g < kAttendChunk / 8; ++g) {
    // exp(-inf - max) must be 0, not ExpNonPositive8's floor.
    const __m256 live = _mm256_cmp_ps(s[g], neg_inf, _CMP_NEQ_OQ);
    const __m256 e = _mm256_and_ps(live, ExpNonPositive8(_mm256_sub_ps(s[g], mv)));
    _mm256_store_ps(weights + 8 * g, e);
    sum = _mm256_add_ps(sum, e);
  }
  running_sum = running_sum * correction + Hsum8(sum);
  running_max = new_max;
  return correction;
}

// acc = acc · c + Σ weights[j] · row(j) over j < count: one query head's 64 accumulators, kept in
// memory between chunks (16 registers hold one head's).
template <typename RowFn>
__attribute__((always_inline)) inline void AccumulateValues8(float* acc, float c,
                                                             const float* weights, int64_t count,
                                                             RowFn row) {
  __m256 a[8];
  const __m256 cv = _mm256_set1_ps(c);
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) a[i] = _mm256_mul_ps(_mm256_load_ps(acc + 8 * i), cv);
  for (int64_t j = 0; j < count; ++j) {
    const auto* vj = row(j);
    const __m256 w = _mm256_set1_ps(weights[j]);
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) a[i] = _mm256_fmadd_ps(w, LoadKv(vj + 8 * i), a[i]);
  }
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) _mm256_store_ps(acc + 8 * i, a[i]);
}

// out = acc / sum (0 when nothing was summed), 64 floats.
inline void StoreNormalized8(const float* acc, float sum, float* out) {
  const __m256 inv = _mm256_set1_ps(sum > 0.0f ? 1.0f / sum : 0.0f);
  for (int i = 0; i < 8; ++i) {
    _mm256_storeu_ps(out + 8 * i, _mm256_mul_ps(_mm256_load_ps(acc + 8 * i), inv));
  }
}

template <typename E>
void Attend64Impl(const float* q, int64_t q_stride, int64_t heads, const E* const* k,
                  const E* const* v, int64_t ctx, float scale, float* out, int64_t out_stride) {
  alignas(32) float acc[kAttendMaxHeads][64] = {};
  alignas(32) float weights[kAttendChunk];
  float running_max[kAttendMaxHeads], running_sum[kAttendMaxHeads];
  for (int64_t h = 0; h < heads; ++h) {
    running_max[h] = -__builtin_inff();
    running_sum[h] = 0.0f;
  }
  const __m256 scale_v = _mm256_set1_ps(scale);
  for (int64_t start = 0; start < ctx; start += kAttendChunk) {
    const int64_t count = ctx - start < kAttendChunk ? ctx - start : kAttendChunk;
    for (int64_t h = 0; h < heads; ++h) {
      const float* qh = q + h * q_stride;
      __m256 qv[8];
      for (int i = 0; i < 8; ++i) qv[i] = _mm256_loadu_ps(qh + 8 * i);
      __m256 s[kAttendChunk / 8];
      const __m256 m = ChunkScores8(
          count, scale_v, [&](int g) { return Scores8(qv, k + start + 8 * g); }, s);
      const float c = SoftmaxChunk8(s, m, running_max[h], running_sum[h], weights);
      AccumulateValues8(acc[h], c, weights, count, [&](int64_t j) { return v[start + j]; });
    }
  }
  for (int64_t h = 0; h < heads; ++h) StoreNormalized8(acc[h], running_sum[h], out + h * out_stride);
}

// ---- attention over a prompt chunk's tokens, head_dim 64 (Attend64RowsFn) ----------------------
// kernels_avx512.cc's plan on 256-bit registers: per 8 keys, the rows widened once and transposed
// (kt[d] = dimension d of the 8 keys), each query head's 8 scores 64 multiply-adds of broadcast
// query elements into those columns, combined as Scores8 adds its lanes (Dot64x8's two chains per
// lane, then lanes (0+1) + (2+3) and (4+5) + (6+7), then the two halves), so every output is bit
// for bit Attend64's for that token alone. Values are widened once per chunk for all the tokens.

// kt[d * 8 + j] = element d of row j, for 8 rows of 64 elements.
template <typename E>
inline void TransposeKeys8(const E* const* k, float* kt) {
  for (int block = 0; block < 8; ++block) {  // dimensions 8 · block .. 8 · block + 7
    __m256 r[8], t[8];
    for (int j = 0; j < 8; ++j) r[j] = LoadKv(k[j] + 8 * block);
    for (int i = 0; i < 4; ++i) {  // [a0 b0 a1 b1 | a4 b4 a5 b5], [a2 b2 a3 b3 | a6 b6 a7 b7]
      t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; ++i) {  // r[4i + e] = elements e and 4 + e of rows 4i .. 4i+3
      r[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
      r[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
      r[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
      r[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    float* col = kt + 8 * 8 * block;
    for (int e = 0; e < 4; ++e) {
      _mm256_store_ps(col + 8 * e, _mm256_permute2f128_ps(r[e], r[4 + e], 0x20));
      _mm256_store_ps(col + 8 * (4 + e), _mm256_permute2f128_ps(r[e], r[4 + e], 0x31));
    }
  }
}

// Scores8 of query head q against the 8 keys transposed in kt, bit for bit.
inline __m256 ScoresTransposed8(const float* q, const float* kt) {
  auto lane = [&](int i) {  // Dot64x8's lane i: its two chains, then their sum
    __m256 p0 = _mm256_mul_ps(_mm256_set1_ps(q[i]), _mm256_load_ps(kt + 8 * i));
    __m256 p1 = _mm256_mul_ps(_mm256_set1_ps(q[i + 8]), _mm256_load_ps(kt + 8 * (i + 8)));
    for (int d = 16; d < 64; d += 16) {
      p0 = _mm256_fmadd_ps(_mm256_set1_ps(q[i + d]), _mm256_load_ps(kt + 8 * (i + d)), p0);
      p1 = _mm256_fmadd_ps(_mm256_set1_ps(q[i + d + 8]), _mm256_load_ps(kt + 8 * (i + d + 8)),
                           p1);
    }
    return _mm256_add_ps(p0, p1);
  };
  const __m256 low = _mm256_add_ps(_mm256_add_ps(lane(0), lane(1)), _mm256_add_ps(lane(2), lane(3)));
  const __m256 high =
      _mm256_add_ps(_mm256_add_ps(lane(4), lane(5)), _mm256_add_ps(lane(6), lane(7)));
  return _mm256_add_ps(low, high);
}

template <typename E>
void Attend64RowsImpl(const float* q, int64_t q_token_stride, int64_t rows, int64_t heads,
                      const E* const* k, const E* const* v, int64_t first_ctx, float scale,
                      float* out, int64_t out_token_stride) {
  if (heads < 1 || heads > kAttendMaxHeads || rows < 1 || rows > kAttendMaxRows) return;
  constexpr int64_t kMaxLines = kAttendMaxRows * kAttendMaxHeads;
  alignas(32) float acc[kMaxLines][64];
  alignas(32) float weights[kAttendChunk];
  alignas(32) float kt[kAttendChunk / 8][64 * 8];
  alignas(32) float vf[kAttendChunk][64];
  float running_max[kMaxLines], running_sum[kMaxLines];
  const int64_t lines = rows * heads;
  for (int64_t line = 0; line < lines; ++line) {
    for (int i = 0; i < 64; i += 8) _mm256_store_ps(acc[line] + i, _mm256_setzero_ps());
    running_max[line] = -__builtin_inff();
    running_sum[line] = 0.0f;
  }
  const __m256 scale_v = _mm256_set1_ps(scale);
  const int64_t last_ctx = first_ctx + rows - 1;
  for (int64_t start = 0; start < last_ctx; start += kAttendChunk) {
    const int64_t chunk = last_ctx - start < kAttendChunk ? last_ctx - start : kAttendChunk;
    for (int64_t g = 0; 8 * g < chunk; ++g) TransposeKeys8(k + start + 8 * g, kt[g]);
    for (int64_t j = 0; j < chunk; ++j) {
      for (int i = 0; i < 8; ++i) _mm256_store_ps(vf[j] + 8 * i, LoadKv(v[start + j] + 8 * i));
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t ctx = first_ctx + r;
      if (start >= ctx) continue;  // the earlier tokens of the call end before this chunk
      const int64_t count = ctx - start < kAttendChunk ? ctx - start : kAttendChunk;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t line = r * heads + h;
        const float* qh = q + r * q_token_stride + h * 64;
        __m256 s[kAttendChunk / 8];
        const __m256 m = ChunkScores8(
            count, scale_v, [&](int g) { return ScoresTransposed8(qh, kt[g]); }, s);
        const float c = SoftmaxChunk8(s, m, running_max[line], running_sum[line], weights);
        AccumulateValues8(acc[line], c, weights, count, [&](int64_t j) { return vf[j]; });
      }
    }
  }
  for (int64_t line = 0; line < lines; ++line) {
    StoreNormalized8(acc[line], running_sum[line],
                     out + (line / heads) * out_token_stride + (line % heads) * 64);
  }
}

// ---- activation quantization ------------------------------------------------------------------

// QuantizeRowQ8Act, bit for bit: max|x| is exact in any order; the scale is the same scalar
// division; x·(1/d) is one rounding either way, and cvtps2dq rounds to nearest even as the scalar
// code's 1.5·2^23 trick does. NaN leaves the maximum alone (vmaxps returns its second operand, as
// std::max(amax, NaN) keeps amax) and becomes -127 on both paths.
void QuantizeQ8Act(const float* x, BlockQ8Act* out, int64_t k, int32_t* sums) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
  QuantizeBlocks(x, out, k, sums, [&](const float* xb, int8_t* qs) {
    __m256 v[4];
    __m256 m = _mm256_setzero_ps();
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(xb + 8 * i);
      m = _mm256_max_ps(_mm256_andnot_ps(sign, v[i]), m);
    }
    const float d = Hmax8(m) / 127.0f;
    const __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
    __m256i q[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      q[i] = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v[i], id)), lo),
                              hi);
    }
    const __m256i total =
        _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i t4 = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
    t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0x4E));
    t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0xB1));
    // packs work per 128-bit lane: the bytes come out as dwords 0 4 1 5 2 6 3 7 of the order
    // wanted.
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]),
                                             _mm256_packs_epi32(q[2], q[3]));
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs), _mm256_permutevar8x32_epi32(bytes, order));
    return QuantizedBlock{d, _mm_cvtsi128_si32(t4)};
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
    nullptr,
    kPackedDot,
    Attend64,
    QuantizeQ8Act,
    SiluMulRow,
    F16ToF32,
    F32ToF16,
    Attend64F16,
    Attend64Rows,
    Attend64RowsF16,
};

float VF::Hsum(T v) { return Hsum8(v); }

}  // namespace

const KernelTable* Avx2KernelTable() { return &kTable; }

}  // namespace tandem::cpu
