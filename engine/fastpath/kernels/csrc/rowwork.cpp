// The vector work of the decode step and the prefill (rowwork.h), compiled per variant: the
// vec.h traits' portable bodies, and on AVX-512 the hand-written panel decoders and the decode
// step's RMSNorm.
#include "rowwork.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdlib>
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

// ---- The int8 prefill GEMM (rowwork.h) ----

namespace {

// Block g (32 weights, one group) of row r as unsigned quants u and w = s * u + c: the 32-weight block
// types in the SoA layouts (Q4_1 holding Q4_0 too, Q8_0) or as raw blocks. Signed quants move up by 128.
bool int8_block32(const Weights& w, int64_t r, int64_t g, uint8_t* u, float& s, float& c) {
  const int64_t K = w.K;
  if (!w.raw()) {
    const int64_t nb = K / 32;
    const float d = float(w.d[r * nb + g]);
    if (w.qtype == 1) {  // Q8_0
      const auto* q = reinterpret_cast<const int8_t*>(w.qs) + r * K + 32 * g;
      for (int j = 0; j < 32; ++j) u[j] = uint8_t(q[j] + 128);
      s = d, c = -128.f * d;
      return true;
    }
    const uint8_t* q = w.qs + r * (K / 2) + 16 * g;  // Q4_1: element j low nibble, j + 16 high
    for (int j = 0; j < 16; ++j) u[j] = q[j] & 15, u[j + 16] = q[j] >> 4;
    s = d, c = float(w.m[r * nb + g]);
    return true;
  }
  const uint8_t* row = w.qs + r * w.row_bytes;
  switch (w.ggml_type) {
    case gguf::Q4_0: case gguf::IQ4_NL: {
      const uint8_t* b = row + 18 * g;
      const float d = gguf::fp16(b);
      const bool nl = w.ggml_type == gguf::IQ4_NL;
      for (int j = 0; j < 16; ++j) {
        const int lo = b[2 + j] & 15, hi = b[2 + j] >> 4;
        u[j] = uint8_t(nl ? gguf::kIQ4NL[lo] + 128 : lo);
        u[j + 16] = uint8_t(nl ? gguf::kIQ4NL[hi] + 128 : hi);
      }
      s = d, c = (nl ? -128.f : -8.f) * d;
      return true;
    }
    case gguf::Q4_1: {
      const uint8_t* b = row + 20 * g;
      for (int j = 0; j < 16; ++j) u[j] = b[4 + j] & 15, u[j + 16] = b[4 + j] >> 4;
      s = gguf::fp16(b), c = gguf::fp16(b + 2);
      return true;
    }
    case gguf::Q5_0: case gguf::Q5_1: {
      const bool one = w.ggml_type == gguf::Q5_1;
      const uint8_t* b = row + (one ? 24 : 22) * g;
      uint32_t qh;
      std::memcpy(&qh, b + (one ? 4 : 2), 4);
      const uint8_t* q = b + (one ? 8 : 6);
      for (int j = 0; j < 16; ++j) {
        u[j] = uint8_t((q[j] & 15) | (((qh >> j) & 1) << 4));
        u[j + 16] = uint8_t((q[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
      }
      s = gguf::fp16(b), c = one ? gguf::fp16(b + 2) : -16.f * gguf::fp16(b);
      return true;
    }
    case gguf::Q8_0: {
      const uint8_t* b = row + 34 * g;
      for (int j = 0; j < 32; ++j) u[j] = uint8_t(int8_t(b[2 + j]) + 128);
      s = gguf::fp16(b), c = -128.f * gguf::fp16(b);
      return true;
    }
    default:
      return false;
  }
}

// The K types with 32-weight sub-blocks: superblock sb of row r (256 weights) as unsigned quants u
// and w = s * u + c per sub-block (ggml's dequantize_row_q4_K / q5_K / iq4_xs).
bool int8_superblock32(const Weights& w, int64_t r, int64_t sb, uint8_t* u, float* s, float* c) {
  const uint8_t* row = w.qs + r * w.row_bytes;
  switch (w.ggml_type) {
    case gguf::Q4_K: case gguf::Q5_K: {  // as dequant_k45
      const bool five = w.ggml_type == gguf::Q5_K;
      const uint8_t* b = row + (five ? 176 : 144) * sb;
      const float d = gguf::fp16(b), dmin = gguf::fp16(b + 2);
      uint8_t sm[16];
      gguf::scale_min_k4(b + 4).to(sm);
      for (int g = 0; g < 8; ++g) {
        const uint8_t* q = b + (five ? 48 : 16) + 32 * (g / 2);
        for (int l = 0; l < 32; ++l)
          u[32 * g + l] = uint8_t((g % 2 ? q[l] >> 4 : q[l] & 15) | (five ? ((b[16 + l] >> g) & 1) << 4 : 0));
        s[g] = d * float(sm[g]), c[g] = -(dmin * float(sm[8 + g]));
      }
      return true;
    }
    case gguf::IQ4_XS: {
      const uint8_t* b = row + 136 * sb;
      const float d = gguf::fp16(b);
      for (int g = 0; g < 8; ++g) {
        const uint8_t* q = b + 8 + 16 * g;
        for (int j = 0; j < 16; ++j) {
          u[32 * g + j] = uint8_t(gguf::kIQ4NL[q[j] & 15] + 128);
          u[32 * g + j + 16] = uint8_t(gguf::kIQ4NL[q[j] >> 4] + 128);
        }
        s[g] = d * float(gguf::TIQ4_XS::scale(b, g)), c[g] = -128.f * s[g];
      }
      return true;
    }
    default:
      return false;
  }
}

// The K types with 16-weight groups: superblock sb of row r (256 weights) as unsigned quants u and
// w = s * u + c per group of 16 (ggml's dequantize_row_q2_K / q3_K / q6_K).
bool int8_superblock16(const Weights& w, int64_t r, int64_t sb, uint8_t* u, float* s, float* c) {
  const uint8_t* row = w.qs + r * w.row_bytes;
  switch (w.ggml_type) {
    case gguf::Q2_K: {  // scales: low nibble scale, high nibble min; 2 bits per weight
      const uint8_t* b = row + 84 * sb;
      const float d = gguf::fp16(b + 80), dmin = gguf::fp16(b + 82);
      for (int h = 0; h < 2; ++h)
        for (int j = 0; j < 4; ++j)
          for (int half = 0; half < 2; ++half) {
            const int grp = 8 * h + 2 * j + half;
            const uint8_t* q = b + 16 + 32 * h + 16 * half;
            for (int l = 0; l < 16; ++l) u[16 * grp + l] = uint8_t((q[l] >> (2 * j)) & 3);
            s[grp] = d * float(b[grp] & 15), c[grp] = -(dmin * float(b[grp] >> 4));
          }
      return true;
    }
    case gguf::Q3_K: {  // w = d * (sc - 32) * (2 bits + 4 * hmask bit - 4)
      const uint8_t* b = row + 110 * sb;
      const float d = gguf::fp16(b + 108);
      uint8_t sc[16];
      gguf::scales_q3k(b + 96).to(sc);
      for (int h = 0; h < 2; ++h)
        for (int j = 0; j < 4; ++j)
          for (int half = 0; half < 2; ++half) {
            const int grp = 8 * h + 2 * j + half;
            const uint8_t* q = b + 32 + 32 * h + 16 * half;
            const uint8_t* hm = b + 16 * half;
            const int bit = 4 * h + j;
            for (int l = 0; l < 16; ++l) u[16 * grp + l] = uint8_t(((q[l] >> (2 * j)) & 3) | (((hm[l] >> bit) & 1) << 2));
            s[grp] = d * float(int(sc[grp]) - 32), c[grp] = -4.f * s[grp];
          }
      return true;
    }
    case gguf::Q6_K: {  // w = d * sc * (4 bits of ql | 2 bits of qh << 4, - 32)
      const uint8_t* b = row + 210 * sb;
      const float d = gguf::fp16(b + 208);
      const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
      for (int h = 0; h < 2; ++h) {
        const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
        uint8_t* o = u + 128 * h;
        for (int l = 0; l < 32; ++l) {
          o[l] = uint8_t((ql[l] & 15) | (((qh[l] >> 0) & 3) << 4));
          o[l + 32] = uint8_t((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4));
          o[l + 64] = uint8_t((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
          o[l + 96] = uint8_t((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
        }
      }
      for (int grp = 0; grp < 16; ++grp) s[grp] = d * float(sc[grp]), c[grp] = -32.f * s[grp];
      return true;
    }
    default:
      return false;
  }
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
// T tokens by NB blocks of 16 rows, groups of GS (32 or 16) weights: per group GS/4 vpdpbusd per
// (token, block) into int32, then the group's scales in float32: acc += i32 * (s * da) + c * ds.
// da is per 32 (the activations' scale), ds per group (da * the group's sum of int8 activations).
template <int T, int NB, int GS>
void int8_tile(const uint8_t* U, const float* S, const float* C, int64_t n, int64_t K, const int8_t* A,
               const float* DA, const float* DS, float* y, int64_t ldy) {
  const int64_t G = K / GS, G32 = K / 32;
  __m512 acc[T][NB];
  for (auto& r : acc)
    for (auto& a : r) a = _mm512_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    __m512i ia[T][NB];
    for (auto& r : ia)
      for (auto& a : r) a = _mm512_setzero_si512();
    const uint8_t* wg = U + g * GS * n;
    for (int k4 = 0; k4 < GS / 4; ++k4) {
      __m512i wv[NB];
      for (int b = 0; b < NB; ++b) wv[b] = _mm512_loadu_si512(wg + 64 * (k4 * NB + b));
      for (int t = 0; t < T; ++t) {
        int32_t a4;
        std::memcpy(&a4, A + t * K + GS * g + 4 * k4, 4);
        const __m512i av = _mm512_set1_epi32(a4);
        for (int b = 0; b < NB; ++b) ia[t][b] = _mm512_dpbusd_epi32(ia[t][b], wv[b], av);
      }
    }
    for (int b = 0; b < NB; ++b) {
      const __m512 s = _mm512_loadu_ps(S + g * n + 16 * b), c = _mm512_loadu_ps(C + g * n + 16 * b);
      for (int t = 0; t < T; ++t) {
        const __m512 sd = _mm512_mul_ps(s, _mm512_set1_ps(DA[t * G32 + g * GS / 32]));
        acc[t][b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[t][b]), sd, acc[t][b]);
        acc[t][b] = _mm512_fmadd_ps(c, _mm512_set1_ps(DS[t * G + g]), acc[t][b]);
      }
    }
  }
  for (int t = 0; t < T; ++t)
    for (int b = 0; b < NB; ++b) _mm512_storeu_ps(y + t * ldy + 16 * b, acc[t][b]);
}

template <int NB, int GS>
void int8_rows(const uint8_t* U, const float* S, const float* C, int64_t K, const int8_t* qa, const float* da,
               const float* ds, int64_t M, float* y, int64_t ldy) {
  const int64_t G32 = K / 32, G = K / GS, n = 16 * NB;
  int64_t m = 0;
  for (; m + 4 <= M; m += 4)
    int8_tile<4, NB, GS>(U, S, C, n, K, qa + m * K, da + m * G32, ds + m * G, y + m * ldy, ldy);
  for (; m < M; ++m) int8_tile<1, NB, GS>(U, S, C, n, K, qa + m * K, da + m * G32, ds + m * G, y + m * ldy, ldy);
}

template <int GS>
void int8_panel(const uint8_t* u, const float* s, const float* c, int64_t n, int64_t K, const int8_t* qa,
                const float* da, const float* ds, int64_t M, float* y, int64_t ldy) {
  switch (n) {
    case 16: return int8_rows<1, GS>(u, s, c, K, qa, da, ds, M, y, ldy);
    case 32: return int8_rows<2, GS>(u, s, c, K, qa, da, ds, M, y, ldy);
    case 48: return int8_rows<3, GS>(u, s, c, K, qa, da, ds, M, y, ldy);
    default: std::abort();  // callers take panels of 16, 32 or 48 rows
  }
}
#define OPSCOPE_INT8_GEMM 1
#endif

// Group j's GS quants of row i (u_row: the row's quants in weight order) into the panel layout
// [groups][GS/4 quads][n/16][16 rows][4 bytes].
void scatter_group(const uint8_t* q, int64_t GS, int64_t j, int64_t i, int64_t n, uint8_t* u) {
  const int64_t NB = n / 16;
  uint8_t* dst = u + j * GS * n + 4 * (i % 16);
  for (int64_t k4 = 0; k4 < GS / 4; ++k4) std::memcpy(dst + 64 * (k4 * NB + i / 16), q + 4 * k4, 4);
}

}  // namespace

int int8_group_size(const Weights& w) {
#if defined(OPSCOPE_INT8_GEMM)
  if (w.K % 32 || w.N % 16) return 0;
  if (!w.raw()) return w.qtype == 0 || w.qtype == 1 ? 32 : 0;
  switch (w.ggml_type) {
    case gguf::Q4_0: case gguf::Q4_1: case gguf::Q5_0: case gguf::Q5_1: case gguf::Q8_0: case gguf::IQ4_NL:
    case gguf::Q4_K: case gguf::Q5_K: case gguf::IQ4_XS:
      return 32;
    case gguf::Q2_K: case gguf::Q3_K: case gguf::Q6_K:
      return 16;
    default:
      return 0;
  }
#else
  (void)w;
  return 0;
#endif
}

void int8_decode_panel(const Weights& w, int64_t r0, int64_t n, uint8_t* u, float* s, float* c) {
  const int64_t gs = int8_group_size(w), bw = w.raw() && raw_block_size(w.ggml_type) == 256 ? 256 : 32;
  uint8_t q[256];
  float bs[16], bc[16];
  for (int64_t i = 0; i < n; ++i)
    for (int64_t b = 0; b < w.K / bw; ++b) {
      if (bw == 32) int8_block32(w, r0 + i, b, q, bs[0], bc[0]);
      else if (gs == 32) int8_superblock32(w, r0 + i, b, q, bs, bc);
      else int8_superblock16(w, r0 + i, b, q, bs, bc);
      for (int64_t k = 0; k < bw / gs; ++k) {  // the block's groups into the panel
        const int64_t j = b * (bw / gs) + k;
        scatter_group(q + gs * k, gs, j, i, n, u);
        s[j * n + i] = bs[k], c[j * n + i] = bc[k];
      }
    }
}

void int8_gemm_panel(int64_t gs, const uint8_t* u, const float* s, const float* c, int64_t n, int64_t K,
                     const int8_t* qa, const float* da, const float* ds, int64_t M, float* y, int64_t ldy) {
#if defined(OPSCOPE_INT8_GEMM)
  if (gs == 32) return int8_panel<32>(u, s, c, n, K, qa, da, ds, M, y, ldy);
  if (gs == 16) return int8_panel<16>(u, s, c, n, K, qa, da, ds, M, y, ldy);
#endif
  (void)gs, (void)u, (void)s, (void)c, (void)n, (void)K, (void)qa, (void)da, (void)ds, (void)M, (void)y, (void)ldy;
  std::abort();  // callers ask int8_group_size first
}

}  // namespace rows
}  // namespace opscope
