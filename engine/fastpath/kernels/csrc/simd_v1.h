// First-generation AVX-512 / VNNI row kernels (kept for the A/B benchmarks: set_kernel_variant(1)).
// Included by kernels.cpp inside namespace opscope::(anonymous); needs h2f, QK, <immintrin.h>.
#pragma once
#if defined(__AVX512F__)
inline float hsum512(__m512 v) { return _mm512_reduce_add_ps(v); }

// 4 rows at a time share every activation load and give 4 independent FMA chains.
template <int R>
void q4_1_rows_f32_avx512(const float* x, const float* sx, const uint8_t* qs, const c10::Half* d,
                          const c10::Half* m, int64_t K, int64_t row, float* y) {
  const int64_t nb = K / QK;
  __m512 acc[R];
  float macc[R];
  for (int r = 0; r < R; ++r) { acc[r] = _mm512_setzero_ps(); macc[r] = 0.f; }
  const __m512i lo_mask = _mm512_set1_epi32(0x0F);
  for (int64_t b = 0; b < nb; ++b) {
    const __m512 x0 = _mm512_loadu_ps(x + b * QK);
    const __m512 x1 = _mm512_loadu_ps(x + b * QK + 16);
    for (int r = 0; r < R; ++r) {
      const int64_t rr = row + r;
      const __m512i w = _mm512_cvtepu8_epi32(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + rr * (K / 2) + b * 16)));
      const __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(w, lo_mask));
      const __m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(w, 4));
      const __m512 t = _mm512_fmadd_ps(hi, x1, _mm512_mul_ps(lo, x0));
      acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(h2f(d, rr * nb + b)), t, acc[r]);
      macc[r] += h2f(m, rr * nb + b) * sx[b];
    }
  }
  for (int r = 0; r < R; ++r) y[row + r] = hsum512(acc[r]) + macc[r];
}

template <int R>
void q8_0_rows_f32_avx512(const float* x, const int8_t* qs, const c10::Half* d, int64_t K,
                          int64_t row, float* y) {
  const int64_t nb = K / QK;
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const __m512 x0 = _mm512_loadu_ps(x + b * QK);
    const __m512 x1 = _mm512_loadu_ps(x + b * QK + 16);
    for (int r = 0; r < R; ++r) {
      const int8_t* q = qs + (row + r) * K + b * QK;
      const __m512 w0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
          reinterpret_cast<const __m128i*>(q))));
      const __m512 w1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
          reinterpret_cast<const __m128i*>(q + 16))));
      const __m512 t = _mm512_fmadd_ps(w1, x1, _mm512_mul_ps(w0, x0));
      acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(h2f(d, (row + r) * nb + b)), t, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) y[row + r] = hsum512(acc[r]);
}
#endif

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
// Activations as int8 (qy) with a scale per block (dy); u8 nibbles x s8 activations → int32.
template <int R>
void q4_1_rows_q8_vnni(const int8_t* qy, const float* dy, const float* sx, const uint8_t* qs,
                       const c10::Half* d, const c10::Half* m, int64_t K, int64_t row, float* y) {
  const int64_t nb = K / QK;
  __m256 acc[R];
  float macc[R];
  for (int r = 0; r < R; ++r) { acc[r] = _mm256_setzero_ps(); macc[r] = 0.f; }
  const __m128i lo_mask = _mm_set1_epi8(0x0F);
  for (int64_t b = 0; b < nb; ++b) {
    const __m256i yv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qy + b * QK));
    for (int r = 0; r < R; ++r) {
      const int64_t rr = row + r;
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + rr * (K / 2) + b * 16));
      const __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), lo_mask),
                                         _mm_and_si128(v, lo_mask));
      const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q, yv);
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(h2f(d, rr * nb + b) * dy[b]), _mm256_cvtepi32_ps(p), acc[r]);
      macc[r] += h2f(m, rr * nb + b) * sx[b];
    }
  }
  for (int r = 0; r < R; ++r) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc[r]), _mm256_extractf128_ps(acc[r], 1));
    const __m128 s2 = _mm_add_ps(s, _mm_movehl_ps(s, s));
    y[row + r] = _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1))) + macc[r];
  }
}

// Signed x signed through the u8 x s8 instruction: |w| x (sign(w) * y).
template <int R>
void q8_0_rows_q8_vnni(const int8_t* qy, const float* dy, const int8_t* qs, const c10::Half* d,
                       int64_t K, int64_t row, float* y) {
  const int64_t nb = K / QK;
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const __m256i yv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qy + b * QK));
    for (int r = 0; r < R; ++r) {
      const int64_t rr = row + r;
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + rr * K + b * QK));
      const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(w, w),
                                            _mm256_sign_epi8(yv, w));
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(h2f(d, rr * nb + b) * dy[b]), _mm256_cvtepi32_ps(p), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc[r]), _mm256_extractf128_ps(acc[r], 1));
    const __m128 s2 = _mm_add_ps(s, _mm_movehl_ps(s, s));
    y[row + r] = _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
  }
}
#endif
