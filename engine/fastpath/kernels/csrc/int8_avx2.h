// The int8-activation matvecs (act_mode 1, llama.cpp's q8 scheme) of the repacked Q4_1 / Q8_0
// layouts and of the raw 32-weight blocks (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL) at 256 bits: the avx2 variant multiplies bytes with maddubs + madd (32 weights per
// pair of instructions), the avx2-vnni variant (AVX-VNNI: Alder Lake, Zen 5) with one vpdpbusd.
// Same arithmetic as kernels.cpp's scalar q8 rows: per block d * dy * (integer dot) (+ m * sx for
// Q4_1, sx the quantized block's sum times its scale); only the float32 summation order differs.
// The AVX-512 variants have their own (simd_v2.h).
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "portable.h"
#include "vec.h"

namespace opscope {
namespace int8x {

// acc + the 8 int32 sums of 4 adjacent u8 x s8 products (no saturation for |u8| <= 128, |s8| <= 127:
// 2 * 128 * 127 < 2^15, so maddubs's int16 pairs are exact)
inline __m256i dot_u8s8(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

// The 32 nibbles of a Q4_1 SoA block (byte j: element j low, j + 16 high) in element order.
inline __m256i q4_block(const uint8_t* q) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
  const __m128i m = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}

inline float h16(const void* p, int64_t i) { return vec::VecAVX2::fp16(static_cast<const uint8_t*>(p) + 2 * i); }

// MD: Q4_0 held as Q4_1 with m = -8 d (m never read)
template <int R, bool MD>
void soa_q4_1_rows_q8(const int8_t* qy, const float* dy, const float* sx, const uint8_t* qs, const void* d,
                      const void* m, int64_t K, int64_t row, float* y) {
  const int64_t nb = K / 32;
  __m256 acc[R];
  float macc[R];
  for (int r = 0; r < R; ++r) { acc[r] = _mm256_setzero_ps(); macc[r] = 0.f; }
  for (int64_t b = 0; b < nb; ++b) {
    const __m256i yv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qy + 32 * b));
    for (int r = 0; r < R; ++r) {
      const int64_t i = (row + r) * nb + b;
      const float dd = h16(d, i);
      const __m256i p = dot_u8s8(_mm256_setzero_si256(), q4_block(qs + (row + r) * (K / 2) + 16 * b), yv);
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dd * dy[b]), _mm256_cvtepi32_ps(p), acc[r]);
      macc[r] += (MD ? -8.f * dd : h16(m, i)) * sx[b];
    }
  }
  for (int r = 0; r < R; ++r) y[row + r] = vec::VecAVX2::reduce(acc[r]) + macc[r];
}

template <int R>
void soa_q8_0_rows_q8(const int8_t* qy, const float* dy, const int8_t* qs, const void* d, int64_t K, int64_t row,
                      float* y) {
  const int64_t nb = K / 32;
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const __m256i yv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qy + 32 * b));
    for (int r = 0; r < R; ++r) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + (row + r) * K + 32 * b));
      // |w| as unsigned bytes, y with w's sign: the same products, u8 x s8 as maddubs wants
      const __m256i p = dot_u8s8(_mm256_setzero_si256(), _mm256_sign_epi8(w, w), _mm256_sign_epi8(yv, w));
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(h16(d, (row + r) * nb + b) * dy[b]), _mm256_cvtepi32_ps(p), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) y[row + r] = vec::VecAVX2::reduce(acc[r]);
}

// Raw 32-weight blocks of type T (portable.h's B32 gives the 32 quants as bytes), R rows.
template <class T, int R>
void b32_rows_q8(const int8_t* qy, const float* dy, const float* sx, const uint8_t* qs, int64_t row_bytes,
                 int64_t K, int64_t row, float* y) {
  using P = portable::B32<T>;
  using V = vec::VecAVX2;
  const int64_t nb = K / 32;
  __m256 acc[R];
  float macc[R];
  for (int r = 0; r < R; ++r) { acc[r] = _mm256_setzero_ps(); macc[r] = 0.f; }
  for (int64_t b = 0; b < nb; ++b) {
    const __m256i yv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qy + 32 * b));
    for (int r = 0; r < R; ++r) {
      const uint8_t* blk = qs + (row + r) * row_bytes + b * T::BYTES;
      __m128i lo, hi;
      P::template bytes<V>(blk, lo, hi);
      const __m256i q = _mm256_set_m128i(hi, lo);
      const __m256i p = P::SIGNED ? dot_u8s8(_mm256_setzero_si256(), _mm256_sign_epi8(q, q), _mm256_sign_epi8(yv, q))
                                  : dot_u8s8(_mm256_setzero_si256(), q, yv);
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(V::fp16(blk) * dy[b]), _mm256_cvtepi32_ps(p), acc[r]);
      if constexpr (P::M_OFF >= 0) macc[r] += V::fp16(blk + P::M_OFF) * sx[b];
    }
  }
  for (int r = 0; r < R; ++r) y[row + r] = V::reduce(acc[r]) + macc[r];
}

}  // namespace int8x
}  // namespace opscope
