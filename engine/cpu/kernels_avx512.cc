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

}  // namespace

const KernelTable* Avx512KernelTable() { return &kTable; }

}  // namespace tandem::cpu
