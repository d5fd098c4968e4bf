// Current AVX-512 / VNNI row kernels (set_kernel_variant(2), the default).
// Included by kernels.cpp inside namespace opscope::(anonymous); needs h2f, QK, <immintrin.h>.
#pragma once
#if defined(__AVX512F__)
// v2: the fp16 scales of 16 blocks converted at once (F16C) instead of one software conversion per
// block and row; the Q4_1 "+m" term as a vector FMA; VNNI over two blocks per 512-bit instruction.
inline __mmask16 tail_mask(int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1); }
inline __m512 load_h16(const c10::Half* p, int64_t n) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(tail_mask(n), p));
}
inline __m512 load_f32(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(tail_mask(n), p); }
// The Q4_1 mins of up to 16 blocks: loaded, or -8 d (exact) where MD.
template <bool MD>
inline __m512 mins(__m512 dv, const c10::Half* m, int64_t n) {
  if constexpr (MD) return _mm512_mul_ps(dv, _mm512_set1_ps(-8.f));
  else return load_h16(m, n);
}


// MD: m = -8 d (Q4_0 held as Q4_1): the offset from the scales, m never read.
template <int R, bool MD = false>
void q4_1_rows_f32_v2(const float* x, const float* sx, const uint8_t* qs, const c10::Half* d,
                      const c10::Half* m, int64_t K, int64_t row, float* y) {
  const int64_t nb = K / QK;
  __m512 acc[R], macc[R];
  alignas(64) float dbuf[R][16];
  for (int r = 0; r < R; ++r) { acc[r] = _mm512_setzero_ps(); macc[r] = _mm512_setzero_ps(); }
  const __m512i lo_mask = _mm512_set1_epi32(0x0F);
  for (int64_t c = 0; c < nb; c += 16) {
    const int64_t n = std::min<int64_t>(16, nb - c);
    const __m512 sxv = load_f32(sx + c, n);
    for (int r = 0; r < R; ++r) {
      const __m512 dv = load_h16(d + (row + r) * nb + c, n);
      _mm512_store_ps(dbuf[r], dv);
      macc[r] = _mm512_fmadd_ps(mins<MD>(dv, m + (row + r) * nb + c, n), sxv, macc[r]);
    }
    for (int64_t b = 0; b < n; ++b) {
      const __m512 x0 = _mm512_loadu_ps(x + (c + b) * QK);
      const __m512 x1 = _mm512_loadu_ps(x + (c + b) * QK + 16);
      for (int r = 0; r < R; ++r) {
        const uint8_t* q = qs + (row + r) * (K / 2) + (c + b) * 16;
        // software prefetch of the next group's rows (R rows on, contiguous), one line per four
        // blocks, a group ahead of use: more lines in flight than the hardware prefetcher keeps
        // for R short row streams
        if (b % 4 == 0) _mm_prefetch(reinterpret_cast<const char*>(q + R * (K / 2)), _MM_HINT_T0);
        const __m512i w = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
        const __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(w, lo_mask));
        const __m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(w, 4));
        const __m512 t = _mm512_fmadd_ps(hi, x1, _mm512_mul_ps(lo, x0));
        acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(dbuf[r][b]), t, acc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) y[row + r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r], macc[r]));
}

template <int R>
void q8_0_rows_f32_v2(const float* x, const int8_t* qs, const c10::Half* d, int64_t K, int64_t row, float* y) {
  const int64_t nb = K / QK;
  __m512 acc[R];
  alignas(64) float dbuf[R][16];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t c = 0; c < nb; c += 16) {
    const int64_t n = std::min<int64_t>(16, nb - c);
    for (int r = 0; r < R; ++r) _mm512_store_ps(dbuf[r], load_h16(d + (row + r) * nb + c, n));
    for (int64_t b = 0; b < n; ++b) {
      const __m512 x0 = _mm512_loadu_ps(x + (c + b) * QK);
      const __m512 x1 = _mm512_loadu_ps(x + (c + b) * QK + 16);
      for (int r = 0; r < R; ++r) {
        const int8_t* q = qs + (row + r) * K + (c + b) * QK;
        if (b % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(q + R * K), _MM_HINT_T0);  // as Q4_1's
        const __m512 w0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))));
        const __m512 w1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16))));
        acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(dbuf[r][b]), _mm512_fmadd_ps(w1, x1, _mm512_mul_ps(w0, x0)), acc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) y[row + r] = _mm512_reduce_add_ps(acc[r]);
}
#endif

#if defined(OPSCOPE_HAVE_VNNI)
// Two scales (blocks b, b+1 of dbuf) spread over the lanes that hold each block's dot products.
inline __m512 pair_scales(const float* s, const __m512i& idx) {
  return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(s)))));
}

inline __m256 dot_tail_q4(const uint8_t* q16, const int8_t* y32) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q16));
  const __m128i mk = _mm_set1_epi8(0x0F);
  const __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), mk), _mm_and_si128(v, mk));
  return _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), q,
                                                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y32))));
}

// qyp: activations in pair order (see prepare_activation); dy, sx per block. MD as q4_1_rows_f32_v2.
template <int R, bool MD = false>
void q4_1_rows_q8_v2(const int8_t* qyp, const float* dy, const float* sx, const uint8_t* qs, const c10::Half* d,
                     const c10::Half* m, int64_t K, int64_t row, float* y) {
  const int64_t nb = K / QK;
  __m512 acc[R], macc[R];
  alignas(64) float dbuf[R][16];
  for (int r = 0; r < R; ++r) { acc[r] = _mm512_setzero_ps(); macc[r] = _mm512_setzero_ps(); }
  const __m256i lo_mask = _mm256_set1_epi8(0x0F);
  const __m512i idx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1);
  for (int64_t c = 0; c < nb; c += 16) {
    const int64_t n = std::min<int64_t>(16, nb - c);
    const __m512 dyv = load_f32(dy + c, n), sxv = load_f32(sx + c, n);
    for (int r = 0; r < R; ++r) {
      const __m512 dv = load_h16(d + (row + r) * nb + c, n);
      _mm512_store_ps(dbuf[r], _mm512_mul_ps(dv, dyv));
      macc[r] = _mm512_fmadd_ps(mins<MD>(dv, m + (row + r) * nb + c, n), sxv, macc[r]);
    }
    int64_t b = 0;
    for (; b + 2 <= n; b += 2) {
      const __m512i yv = _mm512_loadu_si512(qyp + (c + b) * QK);
      for (int r = 0; r < R; ++r) {
        const uint8_t* qp = qs + (row + r) * (K / 2) + (c + b) * 16;
        if (b % 4 == 0) _mm_prefetch(reinterpret_cast<const char*>(qp + R * (K / 2)), _MM_HINT_T0);  // as f32's
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qp));
        const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, lo_mask)),
                                             _mm256_and_si256(_mm256_srli_epi16(v, 4), lo_mask), 1);
        const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, yv);
        acc[r] = _mm512_fmadd_ps(pair_scales(dbuf[r] + b, idx), _mm512_cvtepi32_ps(p), acc[r]);
      }
    }
    if (b < n)  // an odd last block: 256-bit
      for (int r = 0; r < R; ++r)
        acc[r] = _mm512_add_ps(acc[r], _mm512_zextps256_ps512(_mm256_mul_ps(_mm256_set1_ps(dbuf[r][b]),
                 dot_tail_q4(qs + (row + r) * (K / 2) + (c + b) * 16, qyp + (c + b) * QK))));
  }
  for (int r = 0; r < R; ++r) y[row + r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r], macc[r]));
}

// Signed x signed through the u8 x s8 instruction: |w| x (y negated where w < 0). qy in plain order.
inline __m512i dot_s8_512(const __m512i w, const __m512i y) {
  const __mmask64 neg = _mm512_movepi8_mask(w);
  return _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(w),
                             _mm512_mask_sub_epi8(y, neg, _mm512_setzero_si512(), y));
}

template <int R>
void q8_0_rows_q8_v2(const int8_t* qy, const float* dy, const int8_t* qs, const c10::Half* d, int64_t K,
                     int64_t row, float* y) {
  const int64_t nb = K / QK;
  __m512 acc[R];
  alignas(64) float dbuf[R][16];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  for (int64_t c = 0; c < nb; c += 16) {
    const int64_t n = std::min<int64_t>(16, nb - c);
    const __m512 dyv = load_f32(dy + c, n);
    for (int r = 0; r < R; ++r) _mm512_store_ps(dbuf[r], _mm512_mul_ps(load_h16(d + (row + r) * nb + c, n), dyv));
    int64_t b = 0;
    for (; b + 2 <= n; b += 2) {
      const __m512i yv = _mm512_loadu_si512(qy + (c + b) * QK);
      for (int r = 0; r < R; ++r) {
        const int8_t* q = qs + (row + r) * K + (c + b) * QK;
        _mm_prefetch(reinterpret_cast<const char*>(q + R * K), _MM_HINT_T0);  // as f32's: one line per 2 blocks
        const __m512i p = dot_s8_512(_mm512_loadu_si512(q), yv);
        acc[r] = _mm512_fmadd_ps(pair_scales(dbuf[r] + b, idx), _mm512_cvtepi32_ps(p), acc[r]);
      }
    }
    if (b < n) {  // an odd last block: the upper half of the 64-byte load masked off
      const __m512i yv = _mm512_maskz_loadu_epi8(0xFFFFFFFFull, qy + (c + b) * QK);
      for (int r = 0; r < R; ++r) {
        const __m512i p = dot_s8_512(_mm512_maskz_loadu_epi8(0xFFFFFFFFull, qs + (row + r) * K + (c + b) * QK), yv);
        acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(dbuf[r][b]), _mm512_cvtepi32_ps(p), acc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) y[row + r] = _mm512_reduce_add_ps(acc[r]);
}
#endif
