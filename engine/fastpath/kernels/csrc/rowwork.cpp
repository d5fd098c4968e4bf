// The vector work of the decode step and the prefill (rowwork.h), compiled per variant: the
// vec.h traits' portable bodies, and on AVX-512 the hand-written panel decoders and the decode
// step's RMSNorm.
#include "rowwork.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "gguf_types.h"
#include "portable.h"

namespace opscope {
namespace rows {

float dot(const float* a, const float* b, int64_t n) { return portable::dot<vec::Vec>(a, b, n); }

void rmsnorm(const float* x, const float* w, int64_t n, double eps, float* out) {
  double ss = 0.0;  // double: the sum of 576+ squares without order-dependent rounding
  int64_t i = 0;
#if defined(__AVX512F__)
  __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();  // 16 lanes: off the serial add chain
  for (; i + 16 <= n; i += 16) {
    const __m512d lo = _mm512_cvtps_pd(_mm256_loadu_ps(x + i)), hi = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8));
    a0 = _mm512_fmadd_pd(lo, lo, a0);
    a1 = _mm512_fmadd_pd(hi, hi, a1);
  }
  ss = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
#endif
  for (; i < n; ++i) ss += double(x[i]) * x[i];
  const float r = float(1.0 / std::sqrt(ss / n + eps));
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * r * w[i];
}

void scale_mul(const float* a, float inv, const float* w, int64_t n, float* y) {
  portable::scale_mul<vec::Vec>(a, inv, w, n, y);
}

// (vec::exp: the scalar libm call per value cost about as much as a small layer's matvec on the
// decode step's serial path)
void glu(const float* g, const float* u, int64_t n, int64_t act, float* out) {
  if (act == 0) return portable::silu_mul<vec::Vec>(g, u, n, out);
  return portable::gelu_mul<vec::Vec>(g, u, n, out);
}

float softmax_exp(float* s, int64_t n, float scale) {
  return portable::exp_scaled<vec::Vec>(s, n, portable::max_of<vec::Vec>(s, n), scale);
}

void attend(const float* q, const float* k, const float* v, int64_t stride, int64_t last, int64_t D, float scale,
            float* sc, float* out) {
  float mx = -INFINITY;
  for (int64_t t = 0; t <= last; ++t) {
    sc[t] = dot(q, k + t * stride, D) * scale;
    mx = std::max(mx, sc[t]);
  }
  float sum = 0.f;
  for (int64_t t = 0; t <= last; ++t) {
    sc[t] = std::exp(sc[t] - mx);
    sum += sc[t];
  }
  std::fill_n(out, D, 0.f);
  for (int64_t t = 0; t <= last; ++t) portable::axpy<vec::Vec>(sc[t] / sum, v + t * stride, D, out);
}

namespace {
#if !defined(OPSCOPE_AVX512_RAW)
// decode_panel off AVX-512: the raw 32-weight blocks and the SoA layouts through the vec.h traits;
// false for the types left to dequantize_row (the K types, F16/BF16: their scalar decoders).
bool portable_decode_panel(const Weights& w, int64_t r0, int64_t n, float* buf) {
  using V = vec::Vec;
  const int64_t K = w.K;
  if (w.raw()) {
    bool done = false;
    gguf::with_type(w.ggml_type, [&](auto t) {
      using T = decltype(t);
      if constexpr (portable::B32<T>::OK) {
        for (int64_t i = 0; i < n; ++i) portable::b32_decode_row<V, T>(w.qs + (r0 + i) * w.row_bytes, K, buf + i * K);
        done = true;
      }
    });
    return done;
  }
  for (int64_t i = 0; i < n; ++i) portable::soa_decode_row<V>(w.qs, w.d, w.m, w.qtype, K, r0 + i, buf + i * K);
  return true;
}
#endif

}  // namespace

void decode_panel(const Weights& w, int64_t r0, int64_t n, float* buf) {
  const int64_t K = w.K;
#if defined(OPSCOPE_AVX512_RAW)
  if (w.raw()) {
    gguf::with_type(w.ggml_type, [&](auto t) {
      using T = decltype(t);
      for (int64_t i = 0; i < n; ++i) {
        const uint8_t* row = w.qs + (r0 + i) * w.row_bytes;
        float* o = buf + i * K;
        for (int64_t b = 0; b < K / T::QK; ++b)
          T::decode(row + b * T::BYTES, [&](int c, __m512 v) { _mm512_storeu_ps(o + b * T::QK + 16 * c, v); });
      }
    });
    return;
  }
  const int64_t nb = K / QK;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = r0 + i;
    float* o = buf + i * K;
    const c10::Half* d = w.d + r * nb;
    if (w.qtype == 0) {  // Q4_1 SoA: byte j of a block holds element j (low nibble) and j + 16
      const uint8_t* q = w.qs + r * (K / 2);
      const c10::Half* m = w.m + r * nb;
      for (int64_t b = 0; b < nb; ++b) {
        const __m512 dd = _mm512_set1_ps(float(d[b])), mm = _mm512_set1_ps(float(m[b]));
        __m512 q0, q1;
        gguf::nibbles32(q + b * 16, q0, q1);
        _mm512_storeu_ps(o + b * QK, _mm512_fmadd_ps(dd, q0, mm));
        _mm512_storeu_ps(o + b * QK + 16, _mm512_fmadd_ps(dd, q1, mm));
      }
    } else {  // Q8_0 SoA
      const int8_t* q = reinterpret_cast<const int8_t*>(w.qs) + r * K;
      for (int64_t b = 0; b < nb; ++b) {
        const __m512 dd = _mm512_set1_ps(float(d[b]));
        _mm512_storeu_ps(o + b * QK, _mm512_mul_ps(dd, gguf::s8_ps(gguf::load16(reinterpret_cast<const uint8_t*>(q + b * QK)))));
        _mm512_storeu_ps(o + b * QK + 16,
                         _mm512_mul_ps(dd, gguf::s8_ps(gguf::load16(reinterpret_cast<const uint8_t*>(q + b * QK + 16)))));
      }
    }
  }
#else
  if (portable_decode_panel(w, r0, n, buf)) return;
  for (int64_t i = 0; i < n; ++i) dequantize_row(w, r0 + i, buf + i * K);
#endif
}

void to_bf16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {  // a plain loop: the variant's flags vectorize it
    uint32_t u;
    std::memcpy(&u, src + i, 4);
    const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
    dst[i] = nan ? uint16_t(0x7fc0) : uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
}

}  // namespace rows
}  // namespace opscope
