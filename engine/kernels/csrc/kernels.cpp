// Fused dequantize-matvec over GGUF Q4_1 / Q8_0 blocks, and a dequantize+GEMM path for prefill.
//
// Weights stay in the GGUF's quantized form, repacked once at load into structure-of-arrays per
// row (quants contiguous, fp16 scales beside them) so one load feeds a SIMD register:
//   Q4_1: qs [N, K/2] uint8 (byte j of a block: element j in the low nibble, j+16 in the high),
//         d [N, K/32] fp16, m [N, K/32] fp16;            value = d * q + m
//   Q8_0: qs [N, K] int8, d [N, K/32] fp16;               value = d * q
// Two activation modes:
//   act_mode 0 ("f32"): weights dequantized exactly to fp32 in registers, fp32 FMA accumulation.
//   act_mode 1 ("q8"):  activations quantized per 32-block to int8 (llama.cpp's Q8 scheme), integer
//                       dot products (AVX512-VNNI), fp32 accumulation of the block sums.
// Rows are split across threads with at::parallel_for (torch's OpenMP pool, torch.set_num_threads).
#include "qkernels.h"

#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace opscope {
namespace {

constexpr int64_t GROUP_GRAIN = 4;  // 4-row groups per thread at least: tiny matrices stay on one thread

inline float h2f(const c10::Half* p, int64_t i) { return static_cast<float>(p[i]); }

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
#define OPSCOPE_HAVE_VNNI 1
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


#if defined(__AVX512F__)
// v2: the fp16 scales of 16 blocks converted at once (F16C) instead of one software conversion per
// block and row; the Q4_1 "+m" term as a vector FMA; VNNI over two blocks per 512-bit instruction.
inline __mmask16 tail_mask(int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1); }
inline __m512 load_h16(const c10::Half* p, int64_t n) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(tail_mask(n), p));
}
inline __m512 load_f16(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(tail_mask(n), p); }

template <int R>
void q4_1_rows_f32_v2(const float* x, const float* sx, const uint8_t* qs, const c10::Half* d,
                      const c10::Half* m, int64_t K, int64_t row, float* y) {
  const int64_t nb = K / QK;
  __m512 acc[R], macc[R];
  alignas(64) float dbuf[R][16];
  for (int r = 0; r < R; ++r) { acc[r] = _mm512_setzero_ps(); macc[r] = _mm512_setzero_ps(); }
  const __m512i lo_mask = _mm512_set1_epi32(0x0F);
  for (int64_t c = 0; c < nb; c += 16) {
    const int64_t n = std::min<int64_t>(16, nb - c);
    const __m512 sxv = load_f16(sx + c, n);
    for (int r = 0; r < R; ++r) {
      _mm512_store_ps(dbuf[r], load_h16(d + (row + r) * nb + c, n));
      macc[r] = _mm512_fmadd_ps(load_h16(m + (row + r) * nb + c, n), sxv, macc[r]);
    }
    for (int64_t b = 0; b < n; ++b) {
      const __m512 x0 = _mm512_loadu_ps(x + (c + b) * QK);
      const __m512 x1 = _mm512_loadu_ps(x + (c + b) * QK + 16);
      for (int r = 0; r < R; ++r) {
        const __m512i w = _mm512_cvtepu8_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + (row + r) * (K / 2) + (c + b) * 16)));
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

// qyp: activations in pair order (see prepare_activation); dy, sx per block.
template <int R>
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
    const __m512 dyv = load_f16(dy + c, n), sxv = load_f16(sx + c, n);
    for (int r = 0; r < R; ++r) {
      _mm512_store_ps(dbuf[r], _mm512_mul_ps(load_h16(d + (row + r) * nb + c, n), dyv));
      macc[r] = _mm512_fmadd_ps(load_h16(m + (row + r) * nb + c, n), sxv, macc[r]);
    }
    int64_t b = 0;
    for (; b + 2 <= n; b += 2) {
      const __m512i yv = _mm512_loadu_si512(qyp + (c + b) * QK);
      for (int r = 0; r < R; ++r) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + (row + r) * (K / 2) + (c + b) * 16));
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
    const __m512 dyv = load_f16(dy + c, n);
    for (int r = 0; r < R; ++r) _mm512_store_ps(dbuf[r], _mm512_mul_ps(load_h16(d + (row + r) * nb + c, n), dyv));
    int64_t b = 0;
    for (; b + 2 <= n; b += 2) {
      const __m512i yv = _mm512_loadu_si512(qy + (c + b) * QK);
      for (int r = 0; r < R; ++r) {
        const __m512i p = dot_s8_512(_mm512_loadu_si512(qs + (row + r) * K + (c + b) * QK), yv);
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

// Portable fallback: plain loops (the compiler vectorizes what it can for the build machine).
void q4_1_row_scalar(const float* x, const float* sx, const uint8_t* qs, const c10::Half* d,
                     const c10::Half* m, int64_t K, int64_t row, float* y) {
  const int64_t nb = K / QK;
  float acc = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* q = qs + row * (K / 2) + b * 16;
    const float* xb = x + b * QK;
    float t = 0.f;
    for (int j = 0; j < 16; ++j) t += float(q[j] & 0x0F) * xb[j] + float(q[j] >> 4) * xb[j + 16];
    acc += h2f(d, row * nb + b) * t + h2f(m, row * nb + b) * sx[b];
  }
  y[row] = acc;
}

void q8_0_row_scalar(const float* x, const int8_t* qs, const c10::Half* d, int64_t K, int64_t row,
                     float* y) {
  const int64_t nb = K / QK;
  float acc = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    const int8_t* q = qs + row * K + b * QK;
    float t = 0.f;
    for (int j = 0; j < QK; ++j) t += float(q[j]) * x[b * QK + j];
    acc += h2f(d, row * nb + b) * t;
  }
  y[row] = acc;
}

// Scalar rows with int8 activations (tails of the q8 path: same arithmetic as the SIMD kernels).
void q4_1_row_scalar_q8(const int8_t* qy, const float* dy, const float* sx, const uint8_t* qs,
                        const c10::Half* d, const c10::Half* m, int64_t K, int64_t row, float* y) {
  const int64_t nb = K / QK;
  float acc = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* q = qs + row * (K / 2) + b * 16;
    const int8_t* yb = qy + b * QK;
    int32_t t = 0;
    for (int j = 0; j < 16; ++j) t += int32_t(q[j] & 0x0F) * yb[j] + int32_t(q[j] >> 4) * yb[j + 16];
    acc += h2f(d, row * nb + b) * dy[b] * float(t) + h2f(m, row * nb + b) * sx[b];
  }
  y[row] = acc;
}

void q8_0_row_scalar_q8(const int8_t* qy, const float* dy, const int8_t* qs, const c10::Half* d, int64_t K,
                        int64_t row, float* y) {
  const int64_t nb = K / QK;
  float acc = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    int32_t t = 0;
    for (int j = 0; j < QK; ++j) t += int32_t(qs[row * K + b * QK + j]) * qy[b * QK + j];
    acc += h2f(d, row * nb + b) * dy[b] * float(t);
  }
  y[row] = acc;
}

// Per-block sums of x (the Q4_1 "+m" term) and, for q8, x quantized to int8 per block with its
// scale: qy in plain order and qyp in the pair order the 512-bit Q4_1 kernel reads (for blocks A, B:
// A[0:16] B[0:16] A[16:32] B[16:32], matching low nibbles of both, then high nibbles of both).
void prepare_activation(const float* x, int64_t K, bool quantize, float* sx, int8_t* qy, int8_t* qyp, float* dy) {
  const int64_t nb = K / QK;
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + b * QK;
    float s = 0.f, amax = 0.f;
    for (int j = 0; j < QK; ++j) { s += xb[j]; amax = std::max(amax, std::fabs(xb[j])); }
    sx[b] = s;
    if (!quantize) continue;
    const float scale = amax / 127.f;
    const float inv = scale > 0.f ? 1.f / scale : 0.f;
    dy[b] = scale;
    for (int j = 0; j < QK; ++j) qy[b * QK + j] = static_cast<int8_t>(std::nearbyint(xb[j] * inv));
  }
  if (!quantize) return;
  for (int64_t b = 0; b + 1 < nb; b += 2) {
    const int8_t* a = qy + b * QK;
    int8_t* o = qyp + b * QK;
    std::copy_n(a, 16, o);
    std::copy_n(a + QK, 16, o + 16);
    std::copy_n(a + 16, 16, o + 32);
    std::copy_n(a + QK + 16, 16, o + 48);
  }
  if (nb % 2) std::copy_n(qy + (nb - 1) * QK, QK, qyp + (nb - 1) * QK);
}

struct Act {
  const float* x;
  const float* sx;
  const int8_t* qy;
  const int8_t* qyp;
  const float* dy;
};

int g_variant = 2;  // 1: first kernels (per-block scalar scale conversion), 2: current

#if defined(__AVX512F__)
void group4(const Weights& w, const Act& a, bool q8, int64_t r, float* y) {
  const int8_t* q8w = reinterpret_cast<const int8_t*>(w.qs);
#if defined(OPSCOPE_HAVE_VNNI)
  if (q8 && g_variant == 1) {
    if (w.qtype == 0) q4_1_rows_q8_vnni<4>(a.qy, a.dy, a.sx, w.qs, w.d, w.m, w.K, r, y);
    else q8_0_rows_q8_vnni<4>(a.qy, a.dy, q8w, w.d, w.K, r, y);
    return;
  }
  if (q8) {
    if (w.qtype == 0) q4_1_rows_q8_v2<4>(a.qyp, a.dy, a.sx, w.qs, w.d, w.m, w.K, r, y);
    else q8_0_rows_q8_v2<4>(a.qy, a.dy, q8w, w.d, w.K, r, y);
    return;
  }
#endif
  if (g_variant == 1) {
    if (w.qtype == 0) q4_1_rows_f32_avx512<4>(a.x, a.sx, w.qs, w.d, w.m, w.K, r, y);
    else q8_0_rows_f32_avx512<4>(a.x, q8w, w.d, w.K, r, y);
    return;
  }
  if (w.qtype == 0) q4_1_rows_f32_v2<4>(a.x, a.sx, w.qs, w.d, w.m, w.K, r, y);
  else q8_0_rows_f32_v2<4>(a.x, q8w, w.d, w.K, r, y);
}
#endif

// Rows [r0, r1) of one output vector; whole 4-row groups take the SIMD path.
void rows_range(const Weights& w, const Act& a, bool q8, int64_t r0, int64_t r1, float* y) {
  int64_t r = r0;
#if defined(__AVX512F__)
  for (; r + 4 <= r1; r += 4) group4(w, a, q8, r, y);
#endif
  for (; r < r1 && q8; ++r) {
    if (w.qtype == 0) q4_1_row_scalar_q8(a.qy, a.dy, a.sx, w.qs, w.d, w.m, w.K, r, y);
    else q8_0_row_scalar_q8(a.qy, a.dy, reinterpret_cast<const int8_t*>(w.qs), w.d, w.K, r, y);
  }
  for (; r < r1; ++r) {
    if (w.qtype == 0) q4_1_row_scalar(a.x, a.sx, w.qs, w.d, w.m, w.K, r, y);
    else q8_0_row_scalar(a.x, reinterpret_cast<const int8_t*>(w.qs), w.d, w.K, r, y);
  }
}

}  // namespace

void matvec_multi(const float* x, int64_t K, const Weights* ws, float* const* ys, int n, bool q8, Scratch& s) {
#if !defined(OPSCOPE_HAVE_VNNI)
  q8 = false;  // no integer dot product here: the exact fp32 path instead
#endif
  s.ensure(K);
  prepare_activation(x, K, q8, s.sx.data(), s.qy.data(), s.qyp.data(), s.dy.data());
  const Act a{x, s.sx.data(), s.qy.data(), s.qyp.data(), s.dy.data()};
  std::vector<int64_t> start(n + 1, 0);  // prefix sums of 4-row groups over the matrices
  for (int i = 0; i < n; ++i) start[i + 1] = start[i] + (ws[i].N + 3) / 4;
  at::parallel_for(0, start[n], GROUP_GRAIN, [&](int64_t g0, int64_t g1) {
    for (int i = 0; i < n; ++i) {
      const int64_t lo = std::max(g0, start[i]), hi = std::min(g1, start[i + 1]);
      if (lo < hi) rows_range(ws[i], a, q8, (lo - start[i]) * 4, std::min((hi - start[i]) * 4, ws[i].N), ys[i]);
    }
  });
}

void dequantize_row(const Weights& w, int64_t r, float* out) {
  const int64_t nb = w.K / QK;
  for (int64_t b = 0; b < nb; ++b) {
    const float dd = h2f(w.d, r * nb + b);
    float* ob = out + b * QK;
    if (w.qtype == 0) {
      const uint8_t* q = w.qs + r * (w.K / 2) + b * 16;
      const float mm = h2f(w.m, r * nb + b);
      for (int j = 0; j < 16; ++j) { ob[j] = dd * (q[j] & 0x0F) + mm; ob[j + 16] = dd * (q[j] >> 4) + mm; }
    } else {
      const int8_t* q = reinterpret_cast<const int8_t*>(w.qs) + r * w.K + b * QK;
      for (int j = 0; j < QK; ++j) ob[j] = dd * q[j];
    }
  }
}

void set_kernel_variant(int v) { g_variant = v; }

bool built_with_avx512() {
#if defined(__AVX512F__)
  return true;
#else
  return false;
#endif
}

bool built_with_vnni() {
#if defined(OPSCOPE_HAVE_VNNI)
  return true;
#else
  return false;
#endif
}

}  // namespace opscope
