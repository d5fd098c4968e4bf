// The vector work of the decode step and the prefill (rowwork.h), compiled per variant: the
// vec.h traits' portable bodies, and on AVX-512 the hand-written panel decoders and the decode
// step's RMSNorm.
#include "rowwork.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <vector>
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

void attend(const float* q, int64_t nh, const float* k, const float* v, int64_t stride, int64_t last, int64_t D,
            float scale, float* sc, int64_t sstride, float* out) {
  using V = vec::Vec;
  const int64_t n = last + 1, DV = D / V::W * V::W;  // [DV, D): a head size that is no multiple of W
  // Keys in blocks of ~8 KB that every query of the group reads while they are in L1 (the group's
  // heads share them: GQA), rather than each head streaming all keys from L2 again.
  const int64_t TB = std::max<int64_t>(4, 2048 / D / 4 * 4);
  for (int64_t t0 = 0; t0 < n; t0 += TB) {
    const int64_t t1 = std::min(n, t0 + TB);
    for (int64_t i = 0; i < nh; ++i) {
      const float* qi = q + i * D;
      float* s = sc + i * sstride;
      int64_t t = t0;
      for (; t + 4 <= t1; t += 4) {
        portable::dot4<V>(qi, k + t * stride, stride, DV, s + t);
        for (int j = 0; j < 4; ++j)
          for (int64_t e = DV; e < D; ++e) s[t + j] += qi[e] * k[(t + j) * stride + e];
      }
      for (; t < t1; ++t) s[t] = dot(qi, k + t * stride, D);
    }
  }
  float inv[8];
  for (int64_t i = 0; i < nh; ++i) {
    inv[i] = 1.f / softmax_exp(sc + i * sstride, n, scale);
    std::fill_n(out + i * D, D, 0.f);
  }
  for (int64_t t0 = 0; t0 < n; t0 += TB) {
    const int64_t t1 = std::min(n, t0 + TB);
    for (int64_t i = 0; i < nh; ++i) {
      const float* p = sc + i * sstride;
      float* o = out + i * D;
      int64_t d = 0;
      for (; d + 8 * V::W <= D; d += 8 * V::W) portable::weighted_rows<V, 8>(p, v + d, stride, t0, t1, o + d);
      for (; d + 4 * V::W <= D; d += 4 * V::W) portable::weighted_rows<V, 4>(p, v + d, stride, t0, t1, o + d);
      for (; d + V::W <= D; d += V::W) portable::weighted_rows<V, 1>(p, v + d, stride, t0, t1, o + d);
      for (; d < D; ++d)
        for (int64_t t = t0; t < t1; ++t) o[d] += p[t] * v[t * stride + d];
    }
  }
  for (int64_t i = 0; i < nh; ++i)
    for (int64_t d = 0; d < D; ++d) out[i * D + d] *= inv[i];
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

void quantize_q8(const float* x, int64_t K, int8_t* q, float* d, float* s, float* s16, int32_t* n16) {
  using V = vec::Vec;
  constexpr int W = V::W;
  alignas(64) float t[32];
  for (int64_t b = 0; b < K / 32; ++b) {
    const float* xb = x + 32 * b;
    typename V::F m = V::zero();
    for (int j = 0; j < 32; j += W) {  // |x| as max(x, -x), and the running max second: a NaN is left out
      const typename V::F v = V::load(xb + j);
      m = V::max(V::max(v, V::sub(V::zero(), v)), m);
    }
    V::store(t, m);
    float amax = 0.f;
    for (int j = 0; j < W; ++j) amax = std::max(amax, t[j]);
    const float scale = amax / 127.f, inv = scale > 0.f ? 1.f / scale : 0.f;
    for (int j = 0; j < 32; j += W) V::store(t + j, V::round(V::mul(V::load(xb + j), V::set1(inv))));
    int32_t qsum = 0;
    for (int j = 0; j < 32; ++j) qsum += q[32 * b + j] = int8_t(t[j]);
    d[b] = scale, s[b] = scale * float(qsum);
    if (s16 != nullptr || n16 != nullptr) {  // per 16 (one loop above: it vectorizes as one)
      int32_t lo = 0;
      for (int j = 0; j < 16; ++j) lo += q[32 * b + j];
      if (s16 != nullptr) s16[2 * b] = scale * float(lo), s16[2 * b + 1] = scale * float(qsum - lo);
      if (n16 != nullptr) n16[2 * b] = lo, n16[2 * b + 1] = qsum - lo;
    }
  }
}

void rope_half(const float* __restrict x, const float* __restrict c, const float* __restrict s, int64_t D,
               float* __restrict out) {
  const int64_t h = D / 2;  // plain loops: the variant's flags vectorize them
  for (int64_t j = 0; j < h; ++j) out[j] = x[j] * c[j] - x[j + h] * s[j];
  for (int64_t j = 0; j < h; ++j) out[j + h] = x[j + h] * c[j + h] + x[j] * s[j + h];
}

void scale(const float* __restrict x, float a, int64_t n, float* __restrict y) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * a;
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

// The int8 GEMM's instructions, once per instruction set (the tile below is written against them):
//   L          int32 lanes per register I: the rows one register holds (4 bytes = 4 k's per row)
//   T, R       tokens and registers of rows per tile (the register budget: T * R int32 and float
//              accumulators, R weight registers)
//   kShift     what signed quants are moved up by: 128 where the dot product takes unsigned bytes
//              up to 255 (vpdpbusd), 0 where they stay signed (sdot multiplies signed bytes)
//   kByte      whether 8-bit quants (Q8_0, the IQ4 tables) run here: on maddubs, whose int16 pairs
//              would saturate past 2 * 127 * 127 for unsigned ones, they stay signed (kWide below;
//              mad<true> is the sign trick, vpsignb twice per product: docs/decisions/cpu-variants.md)
//   P, pzero, mad<SGN>(p, w, a), flush(acc, p), chunk(bits)
//              per lane the 4 products of its bytes, summed in p over up to chunk(bits) steps of 4 k
//              (quants of at most bits bits), then added into the int32 acc: maddubs sums in int16
//              (no madd per step) as long as the sum cannot pass 2^15; SGN: w holds signed quants
//   kDirect    mad's sums are int32 (vpdpbusd, sdot): the products go straight into acc
//   kWide      8-bit signed quants run widened to int16 (vpmaddwd, int32 sums) instead of mad<true>:
//              maddubs's sign trick takes two vpsignb per product on the multiply ports (register-only
//              loop, one Zen 4 core held to AVX2: 72 GMAC/s against vpmaddwd's 108; int8_wide)
//   NAME       the multiply, as ctest/gemm.cpp prints it (a test asserts which ran)
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
struct I8 {
  static constexpr const char* NAME = "vpdpbusd zmm";
  static constexpr int L = 16, T = 4, R = 3, kShift = 128;
  static constexpr bool kByte = true;
  using I = __m512i;
  using F = __m512;
  static I izero() { return _mm512_setzero_si512(); }
  static I load(const uint8_t* p) { return _mm512_loadu_si512(p); }
  static I bcast(int32_t a) { return _mm512_set1_epi32(a); }
  using P = I;
  static P pzero() { return _mm512_setzero_si512(); }
  template <bool SGN> static P mad(P p, I w, I a) { return _mm512_dpbusd_epi32(p, w, a); }
  static I flush(I acc, P p) { return _mm512_add_epi32(acc, p); }
  static constexpr int chunk(int) { return 8; }
  static constexpr bool kDirect = true, kWide = false;
  static F fzero() { return _mm512_setzero_ps(); }
  static F fload(const float* p) { return _mm512_loadu_ps(p); }
  static F fset1(float v) { return _mm512_set1_ps(v); }
  static F fmul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F cvt(I a) { return _mm512_cvtepi32_ps(a); }
  static void fstore(float* p, F v) { _mm512_storeu_ps(p, v); }
};
#define OPSCOPE_INT8_GEMM 1
#elif defined(OPSCOPE_VEC_AVX2) && !defined(__AVX512F__)
// OPSCOPE_VNNI_EVEX_TWIN (ctest/gemm.cpp only): the avx2-vnni variant's tile with its one VNNI
// instruction in the AVX512-VNNI encoding, to run on a CPU without AVX-VNNI (as vec_int8.h's)
#if defined(__AVXVNNI__) || defined(OPSCOPE_VNNI_EVEX_TWIN)
#define OPSCOPE_GEMM_VNNI256 1
#endif
struct I8 {
#if defined(OPSCOPE_GEMM_VNNI256)
  static constexpr const char* NAME = "vpdpbusd ymm";
  static constexpr int kShift = 128;
  static constexpr bool kByte = true;
#else
  static constexpr const char* NAME = "vpmaddubsw ymm";
  static constexpr int kShift = 0;
  static constexpr bool kByte = true;
#endif
  static constexpr int L = 8, T = 4, R = 1;
  using I = __m256i;
  using F = __m256;
  static I izero() { return _mm256_setzero_si256(); }
  static I load(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static I bcast(int32_t a) { return _mm256_set1_epi32(a); }
  using P = I;
  static P pzero() { return _mm256_setzero_si256(); }
#if defined(OPSCOPE_GEMM_VNNI256)
#if defined(OPSCOPE_VNNI_EVEX_TWIN)
  template <bool SGN> __attribute__((target("avx512vnni,avx512vl"), noinline)) static P mad(P p, I w, I a) {
    return _mm256_dpbusd_epi32(p, w, a);
  }
#else
  template <bool SGN> static P mad(P p, I w, I a) { return _mm256_dpbusd_avx_epi32(p, w, a); }
#endif
  static I flush(I acc, P p) { return _mm256_add_epi32(acc, p); }
  static constexpr int chunk(int) { return 8; }
  static constexpr bool kDirect = true, kWide = false;
#else
  // pairs of u * a in int16, |a| <= 127: 2 * 31 * 127 * 4 steps and 2 * 63 * 127 * 2 steps stay
  // below 2^15. SGN (8-bit signed quants): |w| * (a with w's sign), one step (2 * 128 * 127 < 2^15)
  template <bool SGN> static P mad(P p, I w, I a) {
    const I u = SGN ? _mm256_sign_epi8(w, w) : w;
    P r = _mm256_add_epi16(p, _mm256_maddubs_epi16(u, SGN ? _mm256_sign_epi8(a, w) : a));
    // keeps each sum one chain in a register: GCC otherwise reassociates a chunk's adds into a tree
    // whose 24-48 products it spills to the stack (perf, the 3 x 16 tile)
    asm("" : "+x"(r));
    return r;
  }
  static I flush(I acc, P p) { return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1))); }
  // 4-bit quants: 2 * 15 * 127 * 8 steps < 2^15, a whole group of 32 in int16, no int32 sums kept
  // across it, and the registers that frees hold a 3-token x 16-row tile (each broadcast feeds 2
  // products, not 1)
  static constexpr int chunk(int bits) { return bits <= 4 ? 8 : bits <= 5 ? 4 : bits <= 6 ? 2 : 1; }
  static constexpr int tokens(int bits) { return bits <= 4 ? 3 : T; }
  static constexpr int regs(int bits) { return bits <= 4 || bits == 8 ? 2 : R; }  // 8: kWide, 2 loads per 8 vpmaddwd
  static constexpr bool kDirect = false, kWide = true;
  // int16 pairs (kWide): 2 k per lane, the products summed in int32 by vpmaddwd
  static P mad16(P p, I w, I a) {
    const I prod = _mm256_madd_epi16(w, a);
    // the add in place: GCC otherwise adds into the product's register and copies it back every step
    asm("vpaddd %1, %0, %0" : "+x"(p) : "x"(prod));
    return p;
  }
  // a weight register loaded once per step (GCC otherwise folds its load into every token's vpmaddwd)
  static I pin(I w) {
    asm("" : "+x"(w));
    return w;
  }
#endif
  static F fzero() { return _mm256_setzero_ps(); }
  static F fload(const float* p) { return _mm256_loadu_ps(p); }
  static F fset1(float v) { return _mm256_set1_ps(v); }
  static F fmul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F cvt(I a) { return _mm256_cvtepi32_ps(a); }
  static void fstore(float* p, F v) { _mm256_storeu_ps(p, v); }
};
#define OPSCOPE_INT8_GEMM 1
#elif defined(OPSCOPE_VEC_NEON)
struct I8 {
#if defined(__ARM_FEATURE_DOTPROD)
  static constexpr const char* NAME = "sdot";
#else
  static constexpr const char* NAME = "smull";
#endif
  static constexpr int L = 4, T = 4, R = 2, kShift = 0;
  static constexpr bool kByte = true;
  using I = int32x4_t;
  using F = float32x4_t;
  static I izero() { return vdupq_n_s32(0); }
  static I load(const uint8_t* p) { return vreinterpretq_s32_u8(vld1q_u8(p)); }
  static I bcast(int32_t a) { return vdupq_n_s32(a); }
  using P = I;
  static P pzero() { return vdupq_n_s32(0); }
  template <bool SGN> static P mad(P p, I w, I a) {  // sdot multiplies signed bytes: SGN is free
    const int8x16_t x = vreinterpretq_s8_s32(w), y = vreinterpretq_s8_s32(a);
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(p, x, y);
#else  // 8 + 8 products to int16 (|w| <= 128, |a| <= 127: no overflow in a pair), pairs, then quads
    const int16x8_t q = vpaddq_s16(vmull_s8(vget_low_s8(x), vget_low_s8(y)), vmull_s8(vget_high_s8(x), vget_high_s8(y)));
    return vpadalq_s16(p, q);
#endif
  }
  static I flush(I acc, P p) { return vaddq_s32(acc, p); }
  static constexpr int chunk(int) { return 8; }
  static constexpr bool kDirect = true, kWide = false;
  static F fzero() { return vdupq_n_f32(0.f); }
  static F fload(const float* p) { return vld1q_f32(p); }
  static F fset1(float v) { return vdupq_n_f32(v); }
  static F fmul(F a, F b) { return vmulq_f32(a, b); }
  static F fma(F a, F b, F c) { return vfmaq_f32(c, a, b); }
  static F cvt(I a) { return vcvtq_f32_s32(a); }
  static void fstore(float* p, F v) { vst1q_f32(p, v); }
};
#define OPSCOPE_INT8_GEMM 1
#else
struct I8 {
  static constexpr int kShift = 128;
  static constexpr bool kByte = false, kWide = false;
};
#endif
constexpr int kShift = I8::kShift;

// The panel's unit: the k of one row side by side in it. 4 for the dot products of 4 bytes per lane
// (vpdpbusd, maddubs + madd, sdot); 8 with ARMv8.6's i8mm, whose smmla multiplies a pair of tokens'
// 8 activations by a pair of rows' 8 quants (two rows' units are then one 16-byte load).
#if defined(OPSCOPE_VEC_NEON) && defined(__ARM_FEATURE_MATMUL_INT8)
#define OPSCOPE_INT8_MMLA 1
constexpr int kUnit = 8;
#else
constexpr int kUnit = 4;
#endif
#if defined(OPSCOPE_INT8_MMLA)
[[maybe_unused]] constexpr const char* kInt8Multiply = "smmla";
#elif defined(OPSCOPE_INT8_GEMM)
[[maybe_unused]] constexpr const char* kInt8Multiply = I8::NAME;
#else
[[maybe_unused]] constexpr const char* kInt8Multiply = "none";
#endif

// The tile's tokens and row registers for quants of `bits` bits: I8's T and R, or its own choice.
template <class V, class = void>
struct TileShape {
  static constexpr int tokens(int) { return V::T; }
  static constexpr int regs(int) { return V::R; }
};
template <class V>
struct TileShape<V, std::void_t<decltype(V::tokens(4))>> {
  static constexpr int tokens(int bits) { return V::tokens(bits); }
  static constexpr int regs(int bits) { return V::regs(bits); }
};

// The wide tile's tokens (int8_wide): widen_q8 interleaves the activations by them.
#if defined(OPSCOPE_INT8_GEMM) && !defined(OPSCOPE_INT8_MMLA)
constexpr int kWideTokens = TileShape<I8>::tokens(8);
#else
constexpr int kWideTokens = 1;
#endif

// IQ4_NL's values as the dot product's bytes (moved up by kShift)
struct NlBytes {
  uint8_t v[16];
};
constexpr NlBytes nl_bytes() {
  NlBytes t{};
  for (int i = 0; i < 16; ++i) t.v[i] = uint8_t(gguf::kIQ4NL[i] + kShift);
  return t;
}
alignas(16) constexpr NlBytes kNlBytes = nl_bytes();

// 16 bytes of packed nibbles as 32 quants (element j the low nibble of byte j, j + 16 the high one),
// through the 16-entry table tab where given (the IQ4 types). A byte shuffle does the table: the
// compiler keeps a lookup per byte scalar.
inline void nibbles32(const uint8_t* q, const uint8_t* tab, uint8_t* u) {
#if defined(__SSSE3__)
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q)), m = _mm_set1_epi8(15);
  __m128i lo = _mm_and_si128(x, m), hi = _mm_and_si128(_mm_srli_epi16(x, 4), m);
  if (tab) {
    const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(tab));
    lo = _mm_shuffle_epi8(t, lo), hi = _mm_shuffle_epi8(t, hi);
  }
  _mm_storeu_si128(reinterpret_cast<__m128i*>(u), lo);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(u + 16), hi);
#elif defined(__aarch64__) && defined(__ARM_NEON)
  const uint8x16_t x = vld1q_u8(q);
  uint8x16_t lo = vandq_u8(x, vdupq_n_u8(15)), hi = vshrq_n_u8(x, 4);
  if (tab) {
    const uint8x16_t t = vld1q_u8(tab);
    lo = vqtbl1q_u8(t, lo), hi = vqtbl1q_u8(t, hi);
  }
  vst1q_u8(u, lo);
  vst1q_u8(u + 16, hi);
#else
  for (int j = 0; j < 16; ++j) {
    u[j] = tab ? tab[q[j] & 15] : q[j] & 15;
    u[j + 16] = tab ? tab[q[j] >> 4] : q[j] >> 4;
  }
#endif
}

// Q5_0/Q5_1's fifth bits: bit j of qh into u[j] as 16 (a byte shuffle spreads qh's bytes over the
// lanes, a test per lane picks each one's bit).
inline void fifth_bits32(uint32_t qh, uint8_t* u) {
#if defined(__SSSE3__)
  const __m128i h = _mm_cvtsi32_si128(int(qh)), bit = _mm_set1_epi64x(int64_t(0x8040201008040201ull));
  for (int z = 0; z < 2; ++z) {
    const __m128i spread = _mm_shuffle_epi8(h, _mm_set_epi64x(0x0101010101010101ll * (2 * z + 1), 0x0101010101010101ll * (2 * z)));
    const __m128i on = _mm_cmpeq_epi8(_mm_and_si128(spread, bit), bit);
    __m128i* o = reinterpret_cast<__m128i*>(u + 16 * z);
    _mm_storeu_si128(o, _mm_or_si128(_mm_loadu_si128(o), _mm_and_si128(on, _mm_set1_epi8(16))));
  }
#else
  for (int j = 0; j < 32; ++j) u[j] |= uint8_t(((qh >> j) & 1) << 4);
#endif
}

// Block g (32 weights, one group) of row r as quants u and w = s * u + c: the 32-weight block types in
// the SoA layouts (Q4_1 holding Q4_0 too, Q8_0) or as raw blocks. Signed quants move up by kShift
// (unsigned bytes for vpdpbusd), or stay signed (kShift 0).
bool int8_block32(const Weights& w, int64_t r, int64_t g, uint8_t* u, float& s, float& c) {
  const int64_t K = w.K;
  if (!w.raw()) {
    const int64_t nb = K / 32;
    const float d = float(w.d[r * nb + g]);
    if (w.qtype == 1) {  // Q8_0
      const auto* q = reinterpret_cast<const int8_t*>(w.qs) + r * K + 32 * g;
      for (int j = 0; j < 32; ++j) u[j] = uint8_t(q[j] + kShift);
      s = d, c = -float(kShift) * d;
      return true;
    }
    nibbles32(w.qs + r * (K / 2) + 16 * g, nullptr, u);  // Q4_1: element j low nibble, j + 16 high
    s = d, c = float(w.m[r * nb + g]);
    return true;
  }
  const uint8_t* row = w.qs + r * w.row_bytes;
  switch (w.ggml_type) {
    case gguf::Q4_0: case gguf::IQ4_NL: {
      const uint8_t* b = row + 18 * g;
      const float d = gguf::fp16(b);
      const bool nl = w.ggml_type == gguf::IQ4_NL;
      nibbles32(b + 2, nl ? kNlBytes.v : nullptr, u);
      s = d, c = (nl ? -float(kShift) : -8.f) * d;
      return true;
    }
    case gguf::Q4_1: {
      const uint8_t* b = row + 20 * g;
      nibbles32(b + 4, nullptr, u);
      s = gguf::fp16(b), c = gguf::fp16(b + 2);
      return true;
    }
    case gguf::Q5_0: case gguf::Q5_1: {
      const bool one = w.ggml_type == gguf::Q5_1;
      const uint8_t* b = row + (one ? 24 : 22) * g;
      uint32_t qh;
      std::memcpy(&qh, b + (one ? 4 : 2), 4);
      nibbles32(b + (one ? 8 : 6), nullptr, u);
      fifth_bits32(qh, u);
      s = gguf::fp16(b), c = one ? gguf::fp16(b + 2) : -16.f * gguf::fp16(b);
      return true;
    }
    case gguf::Q8_0: {
      const uint8_t* b = row + 34 * g;
      for (int j = 0; j < 32; ++j) u[j] = uint8_t(int8_t(b[2 + j]) + kShift);
      s = gguf::fp16(b), c = -float(kShift) * gguf::fp16(b);
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
      for (int g = 0; g < 8; g += 2) {  // one loop per case: the compiler vectorizes each
        const uint8_t* q = b + (five ? 48 : 16) + 16 * g;
        for (int l = 0; l < 32; ++l) u[32 * g + l] = q[l] & 15, u[32 * g + 32 + l] = q[l] >> 4;
      }
      if (five)
        for (int g = 0; g < 8; ++g)
          for (int l = 0; l < 32; ++l) u[32 * g + l] |= uint8_t(((b[16 + l] >> g) & 1) << 4);
      for (int g = 0; g < 8; ++g) s[g] = d * float(sm[g]), c[g] = -(dmin * float(sm[8 + g]));
      return true;
    }
    case gguf::IQ4_XS: {
      const uint8_t* b = row + 136 * sb;
      const float d = gguf::fp16(b);
      for (int g = 0; g < 8; ++g) {
        nibbles32(b + 8 + 16 * g, kNlBytes.v, u + 32 * g);
        s[g] = d * float(gguf::TIQ4_XS::scale(b, g)), c[g] = -float(kShift) * s[g];
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

#if defined(OPSCOPE_INT8_GEMM)
// T tokens by R registers of L rows (rows r0 of the panel on), groups of GS (32 or 16) weights: per
// group GS/4 dot products per (token, register) into int32, then the group's scales in float32:
// acc += i32 * (s * da) + c * ds. da is per 32 (the activations' scale), ds per group (da * the
// group's sum of int8 activations); SGN (signed quants, kShift 0) has no offset c; BITS: at most the quants'
// width (how many steps the int16 sums of maddubs may take). Signed quants in a kWide build: the
// panel and the activations (A16, the T tokens' pairs of k side by side: widen_q8) are int16, GS/2
// steps of 2 k per group (int8_wide).
template <int T, int R, int GS, bool SGN, int BITS, bool KAP, int64_t n>
__attribute__((noinline))  // inlined into int8_rows's loops, its int32 sums spilled (the wide tile)
void int8_tile(const uint8_t* U, const float* S, const float* C, int64_t r0, int64_t K, const int8_t* A,
               const int16_t* A16, const float* DA, const float* DS, const int32_t* N16, int kappa, float* y,
               int64_t ldy) {
  using X = std::conditional_t<T >= 0, I8, void>;  // dependent: mad16 exists in kWide builds only
  constexpr bool WIDE = SGN && I8::kWide;
  constexpr int L = I8::L, CH = std::min(GS / 4, I8::chunk(BITS));
  const int64_t G = K / GS, G32 = K / 32, G16 = K / 16;
  typename I8::F acc[T][R];
  for (auto& r : acc)
    for (auto& a : r) a = I8::fzero();
  for (int64_t g = 0; g < G; ++g) {
    typename I8::I ia[T][R];
    for (int t = 0; t < T; ++t) {  // KAP: the offset's term kappa * (the group's int8 sum) as the start
      const int32_t* n16 = N16 + t * G16 + g * GS / 16;
      const auto start = KAP ? I8::bcast(kappa * (GS == 32 ? n16[0] + n16[1] : n16[0])) : I8::izero();
      for (int v = 0; v < R; ++v) ia[t][v] = start;
    }
    const uint8_t* wg = U + g * GS * n * (WIDE ? 2 : 1) + 4 * r0;
    // steps [k0, k1) of 4 k: the products into p (T by R registers)
    auto steps = [&](int k0, int k1, typename I8::P (&p)[T][R]) {
      for (int k4 = k0; k4 < k1; ++k4) {
        typename I8::I wv[R];
        for (int v = 0; v < R; ++v) wv[v] = I8::load(wg + 4 * (k4 * n + L * v));
        for (int t = 0; t < T; ++t) {
          int32_t a4;
          std::memcpy(&a4, A + t * K + GS * g + 4 * k4, 4);
          const auto av = I8::bcast(a4);
          for (int v = 0; v < R; ++v) p[t][v] = I8::template mad<SGN>(p[t][v], wv[v], av);
        }
      }
    };
    if constexpr (WIDE) {  // 2 k per step, int32 sums straight into ia
      for (int k2 = 0; k2 < GS / 2; ++k2) {
        typename I8::I wv[R];
        for (int v = 0; v < R; ++v) wv[v] = X::pin(I8::load(wg + 4 * (k2 * n + L * v)));
        const int16_t* a = A16 + (GS * g / 2 + k2) * 2 * T;  // widen_q8's layout: the T tokens' pairs
        for (int t = 0; t < T; ++t) {
          int32_t a2;
          std::memcpy(&a2, a + 2 * t, 4);
          const auto av = I8::bcast(a2);
          for (int v = 0; v < R; ++v) ia[t][v] = X::mad16(ia[t][v], wv[v], av);
        }
      }
    } else if constexpr (I8::kDirect) {  // int32 sums: the products straight into ia
      steps(0, GS / 4, ia);
    } else {  // int16 sums, flushed into ia every CH steps
      for (int k0 = 0; k0 < GS / 4; k0 += CH) {
        typename I8::P p[T][R];
        for (auto& r : p)
          for (auto& a : r) a = I8::pzero();
        steps(k0, k0 + CH, p);
        for (int t = 0; t < T; ++t)
          for (int v = 0; v < R; ++v) ia[t][v] = I8::flush(ia[t][v], p[t][v]);
      }
    }
    for (int v = 0; v < R; ++v) {
      const auto s = I8::fload(S + g * n + r0 + L * v);
      const auto c = SGN || KAP ? I8::fzero() : I8::fload(C + g * n + r0 + L * v);
      for (int t = 0; t < T; ++t) {
        const auto sd = I8::fmul(s, I8::fset1(DA[t * G32 + g * GS / 32]));
        acc[t][v] = I8::fma(I8::cvt(ia[t][v]), sd, acc[t][v]);
        if (!SGN && !KAP) acc[t][v] = I8::fma(c, I8::fset1(DS[t * G + g]), acc[t][v]);
      }
    }
  }
  for (int t = 0; t < T; ++t)
    for (int v = 0; v < R; ++v) I8::fstore(y + t * ldy + r0 + L * v, acc[t][v]);
}

#if defined(OPSCOPE_INT8_MMLA)
// int8_tile with smmla: T tokens in pairs (an odd last one paired with itself, its copy's sums not
// stored) by RP pairs of rows. smmla adds a token pair's 8 int8 activations times a row pair's 8
// quants into [t r, t r+1, t' r, t' r+1] (int32, exact: quants and activations are signed bytes),
// the panel's unit being 8 k ([K/8][n rows][8 bytes]); then the same float32 steps as int8_tile, so
// every sum, and every result, equals the sdot tile's bit for bit.
template <int T, int RP, int GS, bool SGN, bool KAP, int64_t n>
void mmla_tile(const uint8_t* U, const float* S, const float* C, int64_t r0, int64_t K, const int8_t* A,
               const float* DA, const float* DS, const int32_t* N16, int kappa, float* y, int64_t ldy) {
  constexpr int P = (T + 1) / 2;
  const int64_t G = K / GS, G32 = K / 32, G16 = K / 16;
  const auto tok = [](int j) { return j < T ? j : T - 1; };
  const auto pair = [](float a, float b) { return vcombine_f32(vdup_n_f32(a), vdup_n_f32(b)); };
  float32x4_t acc[P][RP];
  for (auto& r : acc)
    for (auto& a : r) a = vdupq_n_f32(0.f);
  for (int64_t g = 0; g < G; ++g) {
    int32x4_t ia[P][RP];
    for (int p = 0; p < P; ++p) {  // KAP: the offset's term kappa * (the group's int8 sum) as the start
      const auto sum = [&](int t) {
        const int32_t* n16 = N16 + t * G16 + g * GS / 16;
        return KAP ? kappa * (GS == 32 ? n16[0] + n16[1] : n16[0]) : 0;
      };
      const int32x4_t start = vcombine_s32(vdup_n_s32(sum(tok(2 * p))), vdup_n_s32(sum(tok(2 * p + 1))));
      for (int v = 0; v < RP; ++v) ia[p][v] = start;
    }
    const int8_t* wg = reinterpret_cast<const int8_t*>(U) + g * GS * n + 8 * r0;
    for (int k8 = 0; k8 < GS / 8; ++k8) {
      int8x16_t wv[RP];
      for (int v = 0; v < RP; ++v) wv[v] = vld1q_s8(wg + 8 * (k8 * n + 2 * v));
      for (int p = 0; p < P; ++p) {
        const int64_t at = GS * g + 8 * k8;
        const int8x16_t av = vcombine_s8(vld1_s8(A + tok(2 * p) * K + at), vld1_s8(A + tok(2 * p + 1) * K + at));
        for (int v = 0; v < RP; ++v) ia[p][v] = vmmlaq_s32(ia[p][v], av, wv[v]);
      }
    }
    for (int v = 0; v < RP; ++v) {
      const float32x2_t s2 = vld1_f32(S + g * n + r0 + 2 * v);
      const float32x4_t s = vcombine_f32(s2, s2);
      const float32x2_t c2 = !SGN && !KAP ? vld1_f32(C + g * n + r0 + 2 * v) : vdup_n_f32(0.f);
      const float32x4_t c = vcombine_f32(c2, c2);
      for (int p = 0; p < P; ++p) {
        const int64_t gi = g * GS / 32;
        const float32x4_t sd = vmulq_f32(s, pair(DA[tok(2 * p) * G32 + gi], DA[tok(2 * p + 1) * G32 + gi]));
        acc[p][v] = vfmaq_f32(acc[p][v], vcvtq_f32_s32(ia[p][v]), sd);
        if constexpr (!SGN && !KAP)
          acc[p][v] = vfmaq_f32(acc[p][v], c, pair(DS[tok(2 * p) * G + g], DS[tok(2 * p + 1) * G + g]));
      }
    }
  }
  for (int p = 0; p < P; ++p)
    for (int v = 0; v < RP; ++v) {
      vst1_f32(y + 2 * p * ldy + r0 + 2 * v, vget_low_f32(acc[p][v]));
      if (2 * p + 1 < T) vst1_f32(y + (2 * p + 1) * ldy + r0 + 2 * v, vget_high_f32(acc[p][v]));
    }
}

// Every token through the panel's n rows with mmla_tile: 4 tokens by 8 rows (8 int32 and 8 float32
// accumulators, 4 quant and 1 activation registers of the 32), then the last 1-3 tokens.
template <int GS, bool SGN, bool KAP, int64_t n>
void mmla_rows(const uint8_t* U, const float* S, const float* C, int64_t K, const Int8Rows& a, int kappa, float* y,
               int64_t ldy) {
  constexpr int RP = 4;
  static_assert(n % (2 * RP) == 0, "panels are whole tiles of rows");
  const int64_t G32 = K / 32, G = K / GS, G16 = K / 16;
  const auto tiles = [&](auto tc, int64_t m) {
    constexpr int T = decltype(tc)::value;
    for (int64_t r0 = 0; r0 < n; r0 += 2 * RP)
      mmla_tile<T, RP, GS, SGN, KAP, n>(U, S, C, r0, K, a.qa + m * K, a.da + m * G32, a.ds + m * G, a.n16 + m * G16,
                                        kappa, y + m * ldy, ldy);
  };
  int64_t m = 0;
  for (; m + 4 <= a.M; m += 4) tiles(std::integral_constant<int, 4>{}, m);
  if (a.M - m == 3) tiles(std::integral_constant<int, 3>{}, m);
  if (a.M - m == 2) tiles(std::integral_constant<int, 2>{}, m);
  if (a.M - m == 1) tiles(std::integral_constant<int, 1>{}, m);
}
#endif

// Every token through the panel's n rows, R registers of rows at a time (T tokens, then the rest).
template <int R, int GS, bool SGN, int BITS, bool KAP, int64_t n>
void int8_rows(const uint8_t* U, const float* S, const float* C, int64_t K, const Int8Rows& a, int kappa, float* y,
               int64_t ldy) {
#if defined(OPSCOPE_INT8_MMLA)
  mmla_rows<GS, SGN, KAP, n>(U, S, C, K, a, kappa, y, ldy);
#else
  constexpr int T = TileShape<I8>::tokens(BITS), W = R * I8::L;
  const int64_t G32 = K / 32, G = K / GS, G16 = K / 16;
  if (SGN && I8::kWide && a.qa16 == nullptr) std::abort();  // int8_wide panels read the widened activations
  static_assert(!(SGN && I8::kWide) || T == kWideTokens, "widen_q8 lays out the tile's tokens");
  const auto a16 = [&](int64_t m) { return a.qa16 == nullptr ? nullptr : a.qa16 + m * K; };
  // tokens [m0, m1) over rows [r0, r1) of the panel, T tokens at a time
  const auto tiles = [&](int64_t m0, int64_t m1, int64_t r0, int64_t r1) {
    int64_t m = m0;
    for (; m + T <= m1; m += T)
      for (int64_t r = r0; r < r1; r += W)
        int8_tile<T, R, GS, SGN, BITS, KAP, n>(U, S, C, r, K, a.qa + m * K, a16(m), a.da + m * G32, a.ds + m * G,
                                               a.n16 + m * G16, kappa, y + m * ldy, ldy);
    for (; m < m1; ++m)
      for (int64_t r = r0; r < r1; r += W)
        int8_tile<1, R, GS, SGN, BITS, KAP, n>(U, S, C, r, K, a.qa + m * K, a16(m), a.da + m * G32, a.ds + m * G,
                                               a.n16 + m * G16, kappa, y + m * ldy, ldy);
  };
  if constexpr (SGN && I8::kWide) {
    // int16 panels (twice the bytes): blocks of 32 tokens (their activations in L2), each over the
    // panel a register of rows at a time (those rows in L1 while the block's tokens pass)
    constexpr int64_t MB = 8 * T;
    for (int64_t m0 = 0; m0 < a.M; m0 += MB)
      for (int64_t r0 = 0; r0 < n; r0 += W) tiles(m0, std::min(a.M, m0 + MB), r0, r0 + W);
  } else {
    tiles(0, a.M, 0, n);
  }
#endif
}

// A panel of NP rows: whole registers of the tile's R where they divide NP, else of fewer.
template <int GS, bool SGN, int BITS, bool KAP, int64_t NP>
void int8_panel_n(const uint8_t* u, const float* s, const float* c, int64_t K, const Int8Rows& a, int kappa,
                  float* y, int64_t ldy) {
  constexpr int R = TileShape<I8>::regs(BITS), L = I8::L;
  constexpr int RN = NP % (R * L) == 0 ? R : NP % (2 * L) == 0 && R >= 2 ? 2 : 1;  // AVX-512: NP / 16
  static_assert(NP % (RN * L) == 0, "panels are whole registers of rows");
  int8_rows<RN, GS, SGN, BITS, KAP, NP>(u, s, c, K, a, kappa, y, ldy);
}

template <int GS, bool SGN, int BITS, bool KAP>
void int8_panel_k(const uint8_t* u, const float* s, const float* c, int64_t n, int64_t K, const Int8Rows& a,
                  int kappa, float* y, int64_t ldy) {
  switch (n) {
    case 16: return int8_panel_n<GS, SGN, BITS, KAP, 16>(u, s, c, K, a, kappa, y, ldy);
    case 32: return int8_panel_n<GS, SGN, BITS, KAP, 32>(u, s, c, K, a, kappa, y, ldy);
    case 48: return int8_panel_n<GS, SGN, BITS, KAP, 48>(u, s, c, K, a, kappa, y, ldy);
    default: std::abort();  // callers take panels of 16, 32 or 48 rows
  }
}

// kappa != 0 (c = kappa * s in every group): the offset's term in the integer sums
template <int GS, bool SGN, int BITS>
void int8_panel(const uint8_t* u, const float* s, const float* c, int64_t n, int64_t K, const Int8Rows& a,
                int kappa, float* y, int64_t ldy) {
  if (!SGN && kappa != 0) return int8_panel_k<GS, SGN, BITS, true>(u, s, c, n, K, a, kappa, y, ldy);
  return int8_panel_k<GS, SGN, BITS, false>(u, s, c, n, K, a, 0, y, ldy);
}
#endif

// 16 rows' quants (q: row i at q + i * K, in weight order) into the panel layout [K / kUnit]
// [n / 16][16 rows][kUnit bytes], as the 16-row block `chunk`: a transpose of kUnit-byte units. On
// x86 with vectors 16 (or 8) quads of 16 rows at a time; one 4-byte copy per row and quad cost about
// as much as decoding the quants.
void transpose_rows16(const uint8_t* q, int64_t K, int64_t n, int64_t chunk, uint8_t* u) {
  const int64_t NB = n / 16, K4 = K / 4;
  int64_t k4 = 0;
#if defined(__AVX512F__)
  for (; k4 + 16 <= K4; k4 += 16) {
    __m512i r[16], t[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(q + i * K + 4 * k4);
    for (int i = 0; i < 8; ++i)  // per 128-bit lane, 4 x 4 transposes
      t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]), t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    for (int i = 0; i < 4; ++i) {  // r[4i + m], lane L: quad 4L + m of rows 4i .. 4i + 3
      r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
      r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
      r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
      r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int m = 0; m < 4; ++m) {  // the lanes of the four row blocks together
      const __m512i a = _mm512_shuffle_i32x4(r[m], r[4 + m], 0x44), b = _mm512_shuffle_i32x4(r[m], r[4 + m], 0xEE);
      const __m512i c = _mm512_shuffle_i32x4(r[8 + m], r[12 + m], 0x44), d = _mm512_shuffle_i32x4(r[8 + m], r[12 + m], 0xEE);
      const __m512i out[4] = {_mm512_shuffle_i32x4(a, c, 0x88), _mm512_shuffle_i32x4(a, c, 0xDD),
                              _mm512_shuffle_i32x4(b, d, 0x88), _mm512_shuffle_i32x4(b, d, 0xDD)};
      for (int L = 0; L < 4; ++L) _mm512_storeu_si512(u + 64 * ((k4 + 4 * L + m) * NB + chunk), out[L]);
    }
  }
#elif defined(__AVX2__)
  for (; k4 + 8 <= K4; k4 += 8)
    for (int h = 0; h < 2; ++h) {  // rows 8h .. 8h + 7: an 8 x 8 transpose into half of each 64 bytes
      __m256i r[8], t[8];
      for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + (8 * h + i) * K + 4 * k4));
      for (int i = 0; i < 4; ++i)
        t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]), t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
      for (int i = 0; i < 2; ++i) {  // r[4i + m], lane L: quad 4L + m of rows 4i .. 4i + 3
        r[4 * i] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
      }
      for (int m = 0; m < 4; ++m)
        for (int L = 0; L < 2; ++L) {
          const __m256i o = _mm256_permute2x128_si256(r[m], r[4 + m], L ? 0x31 : 0x20);
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(u + 64 * ((k4 + 4 * L + m) * NB + chunk) + 32 * h), o);
        }
    }
#endif
#if defined(__AVX2__) || defined(__AVX512F__)
  static_assert(kUnit == 4, "the vector transposes move 4-byte units");
#endif
  // the rest (all of it off x86) a unit at a time: [K / kUnit][n rows][kUnit bytes]
  for (int64_t k = k4 * 4 / kUnit; k < K / kUnit; ++k)
    for (int64_t i = 0; i < 16; ++i)
      std::memcpy(u + 16 * kUnit * (k * NB + chunk) + kUnit * i, q + i * K + kUnit * k, kUnit);
}

// Row r's quants (K bytes in weight order) and its groups' s and c (at stride n) from its blocks.
void int8_decode_row(const Weights& w, int64_t r, int64_t gs, uint8_t* q, float* s, float* c, int64_t n) {
  const int64_t bw = w.raw() && raw_block_size(w.ggml_type) == 256 ? 256 : 32, per = bw / gs, nb = w.K / bw;
  float bs[16], bc[16];
  for (int64_t b = 0; b < nb; ++b) {
    if (bw == 32) int8_block32(w, r, b, q + 32 * b, bs[0], bc[0]);
    else if (gs == 32) int8_superblock32(w, r, b, q + 256 * b, bs, bc);
    else int8_superblock16(w, r, b, q + 256 * b, bs, bc);
    for (int64_t k = 0; k < per; ++k) s[(b * per + k) * n] = bs[k], c[(b * per + k) * n] = bc[k];
  }
}

}  // namespace

int int8_group_size(const Weights& w) {
#if defined(OPSCOPE_INT8_GEMM)
  if (w.K % 32 || w.N % 16) return 0;
  if (!I8::kByte && int8_quant_bits(w) == 8) return 0;
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

int int8_offset_ratio(const Weights& w) {
  if (!w.raw()) return w.qtype == 1 ? -kShift : 0;  // SoA Q8_0; Q4_1's c is its own
  switch (w.ggml_type) {  // as the decoders above write c
    case gguf::Q4_0: return -8;
    case gguf::Q5_0: return -16;
    case gguf::Q3_K: return -4;
    case gguf::Q6_K: return -32;
    case gguf::Q8_0: case gguf::IQ4_NL: case gguf::IQ4_XS: return -kShift;
    default: return 0;
  }
}

int int8_decode_panel(const Weights& w, int64_t r0, int64_t n, uint8_t* u, float* s, float* c) {
  const int64_t gs = int8_group_size(w), K = w.K;
  const bool wide = int8_wide(w);
  thread_local std::vector<uint8_t> rows;  // 16 rows of quants in weight order
  thread_local std::vector<int16_t> rows16;  // the same widened (int8_wide)
  rows.resize(size_t(16 * K));
  if (wide) rows16.resize(size_t(16 * K));
  for (int64_t i0 = 0; i0 < n; i0 += 16) {  // n: a multiple of 16 (int8_group_size asks N % 16 == 0)
    for (int64_t i = 0; i < 16; ++i) int8_decode_row(w, r0 + i0 + i, gs, rows.data() + i * K, s + i0 + i, c + i0 + i, n);
    if (wide) {  // units of 2 int16: a row of 2K bytes
      const auto* q8 = reinterpret_cast<const int8_t*>(rows.data());
      for (int64_t j = 0; j < 16 * K; ++j) rows16[size_t(j)] = q8[j];  // a plain loop: the flags vectorize it
      transpose_rows16(reinterpret_cast<const uint8_t*>(rows16.data()), 2 * K, n, i0 / 16, u);
    } else {
      transpose_rows16(rows.data(), K, n, i0 / 16, u);
    }
  }
  if (w.raw() || w.qtype != 0) return int8_offset_ratio(w);
  // Q4_1's layout also holds Q4_0 (packing.py: m = -8 d exactly): those panels have c = -8 s
  for (int64_t j = 0; j < n * (K / gs); ++j)
    if (c[j] != -8.f * s[j]) return 0;
  return -8;
}

bool int8_wide(const Weights& w) { return I8::kWide && int8_group_size(w) == 32 && int8_quant_bits(w) == 8; }

void widen_q8(const int8_t* q, int64_t M, int64_t K, int16_t* out) {
  constexpr int T = kWideTokens;
  int64_t m = 0;
  for (; m + T <= M; m += T) {  // the tile's broadcasts from one line, not T rows
    const int8_t* src = q + m * K;
    int16_t* dst = out + m * K;
    int64_t k = 0;
#if defined(__AVX2__)
    if constexpr (T == 4)
      for (; k + 16 <= K; k += 16) {  // 4 rows x 8 pairs of k, a 4 x 8 transpose of int32 pairs
        __m256i x[4];
        for (int t = 0; t < 4; ++t)
          x[t] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + t * K + k)));
        const __m256i a = _mm256_unpacklo_epi32(x[0], x[1]), b = _mm256_unpacklo_epi32(x[2], x[3]);
        const __m256i c = _mm256_unpackhi_epi32(x[0], x[1]), d = _mm256_unpackhi_epi32(x[2], x[3]);
        const __m256i p04 = _mm256_unpacklo_epi64(a, b), p15 = _mm256_unpackhi_epi64(a, b);
        const __m256i p26 = _mm256_unpacklo_epi64(c, d), p37 = _mm256_unpackhi_epi64(c, d);
        __m256i* o = reinterpret_cast<__m256i*>(dst + k * T);
        _mm256_storeu_si256(o, _mm256_permute2x128_si256(p04, p15, 0x20));
        _mm256_storeu_si256(o + 1, _mm256_permute2x128_si256(p26, p37, 0x20));
        _mm256_storeu_si256(o + 2, _mm256_permute2x128_si256(p04, p15, 0x31));
        _mm256_storeu_si256(o + 3, _mm256_permute2x128_si256(p26, p37, 0x31));
      }
#endif
    for (; k < K; k += 2)
      for (int t = 0; t < T; ++t) {
        dst[k * T + 2 * t] = src[t * K + k];
        dst[k * T + 2 * t + 1] = src[t * K + k + 1];
      }
  }
  for (int64_t i = m * K; i < M * K; ++i) out[i] = q[i];  // the last tokens, one tile each
}

int int8_quant_bits(const Weights& w) {
  const int t = w.raw() ? w.ggml_type : w.qtype == 1 ? int(gguf::Q8_0) : int(gguf::Q4_1);
  switch (t) {
    case gguf::Q8_0: case gguf::IQ4_NL: case gguf::IQ4_XS: return 8;
    case gguf::Q6_K: return 6;
    case gguf::Q4_0: case gguf::Q4_1: case gguf::Q4_K: case gguf::Q2_K: case gguf::Q3_K: return 4;  // at most
    default: return 5;
  }
}

void int8_gemm_panel(int64_t gs, int bits, int kappa, const uint8_t* u, const float* s, const float* c, int64_t n,
                     int64_t K, const Int8Rows& a, float* y, int64_t ldy) {
#if defined(OPSCOPE_INT8_GEMM)
  if constexpr (I8::kByte) {
    if (gs == 32 && bits == 8) return int8_panel<32, kShift == 0, 8>(u, s, c, n, K, a, kappa, y, ldy);
  }
  if constexpr (!I8::kDirect) {  // int16 sums: quants of up to 4 bits run whole groups in them (I8::chunk)
    if (gs == 32 && bits == 4) return int8_panel<32, false, 4>(u, s, c, n, K, a, kappa, y, ldy);
    if (gs == 16 && bits == 4) return int8_panel<16, false, 4>(u, s, c, n, K, a, kappa, y, ldy);
  }
  if (gs == 32) return int8_panel<32, false, 5>(u, s, c, n, K, a, kappa, y, ldy);
  if (gs == 16 && bits == 6) return int8_panel<16, false, 6>(u, s, c, n, K, a, kappa, y, ldy);
  if (gs == 16) return int8_panel<16, false, 5>(u, s, c, n, K, a, kappa, y, ldy);
#endif
  (void)gs, (void)bits, (void)kappa, (void)u, (void)s, (void)c, (void)n, (void)K, (void)a, (void)y, (void)ldy;
  std::abort();  // callers ask int8_group_size first
}

}  // namespace rows
}  // namespace opscope
