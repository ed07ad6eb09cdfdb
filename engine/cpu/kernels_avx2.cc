// AVX2 + FMA + F16C inner loops (compiled with -mavx2 -mfma -mf16c). Int8 dot products use
// vpmaddubsw + vpmaddwd, like ggml's AVX2 path. See kernel_table.h for the rules these files keep.
#include <immintrin.h>

#include <cstdint>

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

const KernelTable kTable = {
    kTableIsa,
    {RowDotFloat<0>, RowDotFloat<1>, RowDotFloat<2>, RowDotQuant<0>, RowDotQuant<1>,
     RowDotQuant<2>},
    DotF32,
    AxpyF32,
    ScaleF32,
    nullptr,
    nullptr,  // no packed kernels: MatMul falls back to the scalar ones; CpuForward does not pack
    nullptr,
};

float VF::Hsum(T v) { return Hsum8(v); }

}  // namespace

const KernelTable* Avx2KernelTable() { return &kTable; }

}  // namespace tandem::cpu
