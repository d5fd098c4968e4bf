// The vector-traits layer: the portable kernel bodies (portable.h) are written once against one of
// these structs and instantiated for the instruction set the translation unit is compiled for
// (build.py compiles the whole library once per variant with that variant's -m flags, as
// llama.cpp's GGML_CPU_ALL_VARIANTS does; the loader picks the variant from the CPU's features).
//
// Each struct has
//   W                 float32 lanes per register F
//   F ops             zero, set1, load, store, add, sub, mul, fma (a*b + c), max, reduce, round
//   load_f16/bf16     W half-precision values to float32 (own conversion: no torch inside)
//   fp16(p)           one fp16 to float (fp16x2 below: two consecutive ones, each broadcast)
//   B                 16 bytes in a register; load16, from64 (two 64-bit halves), nib_lo, nib_hi, add8, sub8, or8, lut16
//                     (16-entry byte table), bits16 (byte j = 0xFF where bit j of a 16-bit mask
//                     is set), and8
//   u8<c>(B), s8<c>(B) bytes [cW, cW + W) widened to float32 lanes (C = 16 / W chunks per B)
//   u8p/s8p/nibp<c>(p) the same straight from memory (AVX2: a load-and-extend, off the shuffle port)
//   nib5p<c>(p, qh)   AVX2 and AVX-512 only (has_nib5p): Q5 nibbles with their 5th bits
//   pow2i(F k)        2^k for integral k in float32 range (for exp)
// VecAVX512 (16 lanes, the byte work at 128 bits as VecAVX2's) instantiates the same bodies in the
// AVX-512 variants: their decode-step and prefill row work; their matvecs are still the
// hand-scheduled kernels (simd_v2.h, gguf_types.h, raw_q8.cpp), see docs/decisions/cpu-variants.md.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define OPSCOPE_VEC_AVX2 1
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define OPSCOPE_VEC_AVX512 1
#endif
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#define OPSCOPE_VEC_NEON 1
#endif

namespace opscope {
namespace vec {

// IEEE half to float without F16C (subnormals, inf and NaN included).
inline float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do { man <<= 1; ++e; } while (!(man & 0x400));
    bits = sign | (uint32_t(112 - e) << 23) | ((man & 0x3FF) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float bf16_to_float(uint16_t h) {
  const uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Portable: four float lanes as an array; the compiler vectorizes the loops where it can (SSE2 on
// the x86-64 baseline).
struct VecScalar {
  static constexpr int W = 4;
  static constexpr const char* NAME = "scalar";
  struct F { float v[4]; };
  struct B { uint8_t v[16]; };
  static F zero() { return set1(0.f); }
  static F set1(float a) { F r; for (int i = 0; i < 4; ++i) r.v[i] = a; return r; }
  static F load(const float* p) { F r; std::memcpy(r.v, p, 16); return r; }
  static void store(float* p, F a) { std::memcpy(p, a.v, 16); }
  static F add(F a, F b) { for (int i = 0; i < 4; ++i) a.v[i] += b.v[i]; return a; }
  static F sub(F a, F b) { for (int i = 0; i < 4; ++i) a.v[i] -= b.v[i]; return a; }
  static F mul(F a, F b) { for (int i = 0; i < 4; ++i) a.v[i] *= b.v[i]; return a; }
  static F div(F a, F b) { for (int i = 0; i < 4; ++i) a.v[i] /= b.v[i]; return a; }
  static F fma(F a, F b, F c) { for (int i = 0; i < 4; ++i) c.v[i] += a.v[i] * b.v[i]; return c; }
  static F max(F a, F b) { for (int i = 0; i < 4; ++i) a.v[i] = a.v[i] > b.v[i] ? a.v[i] : b.v[i]; return a; }
  static F min(F a, F b) { for (int i = 0; i < 4; ++i) a.v[i] = a.v[i] < b.v[i] ? a.v[i] : b.v[i]; return a; }
  static F round(F a) { for (int i = 0; i < 4; ++i) a.v[i] = std::nearbyint(a.v[i]); return a; }
  static float reduce(F a) { return (a.v[0] + a.v[2]) + (a.v[1] + a.v[3]); }
  static F pow2i(F k) {
    F r;
    for (int i = 0; i < 4; ++i) {
      const uint32_t bits = uint32_t(int32_t(k.v[i]) + 127) << 23;
      std::memcpy(&r.v[i], &bits, 4);
    }
    return r;
  }
  static F load_f16(const uint16_t* p) { F r; for (int i = 0; i < 4; ++i) r.v[i] = half_to_float(p[i]); return r; }
  static F load_bf16(const uint16_t* p) { F r; for (int i = 0; i < 4; ++i) r.v[i] = bf16_to_float(p[i]); return r; }
  static B load16(const uint8_t* p) { B r; std::memcpy(r.v, p, 16); return r; }
  static B from64(uint64_t lo, uint64_t hi) { B r; std::memcpy(r.v, &lo, 8); std::memcpy(r.v + 8, &hi, 8); return r; }
  static B nib_lo(B a) { for (auto& x : a.v) x &= 0x0F; return a; }
  static B nib_hi(B a) { for (auto& x : a.v) x >>= 4; return a; }
  static B add8(B a, int k) { for (auto& x : a.v) x = uint8_t(x + k); return a; }
  static B sub8(B a, int k) { for (auto& x : a.v) x = uint8_t(x - k); return a; }
  static B or8(B a, B b) { for (int i = 0; i < 16; ++i) a.v[i] |= b.v[i]; return a; }
  static B and8(B a, B b) { for (int i = 0; i < 16; ++i) a.v[i] &= b.v[i]; return a; }
  static B splat8(int k) { B r; std::memset(r.v, k, 16); return r; }
  template <int k> static B shr8(B a) { for (auto& x : a.v) x = uint8_t(x >> k); return a; }
  template <int k> static B shl8(B a) { for (auto& x : a.v) x = uint8_t(x << k); return a; }
  static B lut16(const int8_t* table, B idx) { for (auto& x : idx.v) x = uint8_t(table[x & 0x0F]); return idx; }
  static B bits16(uint32_t m) { B r; for (int i = 0; i < 16; ++i) r.v[i] = (m >> i) & 1 ? 0xFF : 0; return r; }
  template <int c> static F u8(B a) { F r; for (int i = 0; i < 4; ++i) r.v[i] = float(a.v[4 * c + i]); return r; }
  template <int c> static F s8(B a) { F r; for (int i = 0; i < 4; ++i) r.v[i] = float(int8_t(a.v[4 * c + i])); return r; }
  static float fp16(const uint8_t* p) { uint16_t h; std::memcpy(&h, p, 2); return half_to_float(h); }
  // Straight from memory (bytes [cW, cW + W) of p): signed or unsigned bytes, or the low and high
  // nibbles of those bytes, as float lanes.
  template <int c> static F s8p(const uint8_t* p) { return s8<c>(load16(p)); }
  template <int c> static F u8p(const uint8_t* p) { return u8<c>(load16(p)); }
  template <int c> static void nibp(const uint8_t* p, F& lo, F& hi) {
    const B v = load16(p);
    lo = u8<c>(nib_lo(v));
    hi = u8<c>(nib_hi(v));
  }
};

#if defined(OPSCOPE_VEC_AVX2)
// AVX2 + FMA + F16C (Haswell and later, AMD Zen): 8 lanes; the byte work at 128 bits (SSSE3's
// pshufb for the tables), widened 8 bytes at a time.
struct VecAVX2 {
  static constexpr int W = 8;
  static constexpr const char* NAME = "avx2";
  using F = __m256;
  using B = __m128i;
  static F zero() { return _mm256_setzero_ps(); }
  static F set1(float a) { return _mm256_set1_ps(a); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, F a) { _mm256_storeu_ps(p, a); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F max(F a, F b) { return _mm256_max_ps(a, b); }
  static F min(F a, F b) { return _mm256_min_ps(a, b); }
  static F round(F a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static float reduce(F a) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 s2 = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
  }
  static F pow2i(F k) {
    const __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127));
    return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
  }
  static F load_f16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static F load_bf16(const uint16_t* p) {
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  }
  static B load16(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
  static B from64(uint64_t lo, uint64_t hi) { return _mm_set_epi64x(int64_t(hi), int64_t(lo)); }
  static B nib_lo(B a) { return _mm_and_si128(a, _mm_set1_epi8(0x0F)); }
  static B nib_hi(B a) { return _mm_and_si128(_mm_srli_epi16(a, 4), _mm_set1_epi8(0x0F)); }
  static B add8(B a, int k) { return _mm_add_epi8(a, _mm_set1_epi8(char(k))); }
  static B sub8(B a, int k) { return _mm_sub_epi8(a, _mm_set1_epi8(char(k))); }
  static B or8(B a, B b) { return _mm_or_si128(a, b); }
  static B and8(B a, B b) { return _mm_and_si128(a, b); }
  static B splat8(int k) { return _mm_set1_epi8(char(k)); }
  template <int k> static B shr8(B a) { return k == 0 ? a : _mm_and_si128(_mm_srli_epi16(a, k), _mm_set1_epi8(char(0xFF >> k))); }
  template <int k> static B shl8(B a) { return k == 0 ? a : _mm_and_si128(_mm_slli_epi16(a, k), _mm_set1_epi8(char((0xFF << k) & 0xFF))); }
  static B lut16(const int8_t* table, B idx) {
    return _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(table)), idx);
  }
  static B bits16(uint32_t m) {  // bytes 0-7 test bits 0-7 of the low byte, 8-15 of the high one
    const __m128i v = _mm_shuffle_epi8(_mm_cvtsi32_si128(int(m)), _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
    const __m128i bit = _mm_set1_epi64x(int64_t(0x8040201008040201ull));
    return _mm_cmpeq_epi8(_mm_and_si128(v, bit), bit);
  }
  template <int c> static F u8(B a) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(c ? _mm_srli_si128(a, 8) : a)); }
  template <int c> static F s8(B a) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c ? _mm_srli_si128(a, 8) : a)); }
  static float fp16(const uint8_t* p) { uint16_t h; std::memcpy(&h, p, 2); return _cvtsh_ss(h); }
  // From memory, 8 bytes widened by a load-and-extend (vpmovsxbd/vpmovzxbd ymm, m64): no 128-bit
  // shift on the shuffle port; the nibbles split in the 32-bit lanes (and / shift, any ALU port).
  template <int c> static F s8p(const uint8_t* p) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(load8(p + 8 * c))); }
  template <int c> static F u8p(const uint8_t* p) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(load8(p + 8 * c))); }
  template <int c> static void nibp(const uint8_t* p, F& lo, F& hi) {
    const __m256i w = _mm256_cvtepu8_epi32(load8(p + 8 * c));
    lo = _mm256_cvtepi32_ps(_mm256_and_si256(w, _mm256_set1_epi32(0x0F)));
    hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(w, 4));
  }
  // Q5's nibbles with their 5th bits (bit j of qh for weight j: low nibbles 0-15, high 16-31) put
  // together in the 32-bit lanes by variable shifts, not byte shuffles (~10 % off the Q5 matvecs).
  template <int c> static void nib5p(const uint8_t* p, uint32_t qh, F& lo, F& hi) {
    const __m256i w = _mm256_cvtepu8_epi32(load8(p + 8 * c));
    const __m256i h = _mm256_set1_epi32(int(qh));
    const __m256i j = _mm256_setr_epi32(8 * c, 8 * c + 1, 8 * c + 2, 8 * c + 3, 8 * c + 4, 8 * c + 5, 8 * c + 6, 8 * c + 7);
    const __m256i m = _mm256_set1_epi32(0x10);
    const __m256i b_lo = _mm256_and_si256(_mm256_srlv_epi32(_mm256_slli_epi32(h, 4), j), m);  // bit j -> 4
    const __m256i b_hi = _mm256_and_si256(_mm256_srlv_epi32(h, _mm256_add_epi32(j, _mm256_set1_epi32(12))), m);
    lo = _mm256_cvtepi32_ps(_mm256_or_si256(_mm256_and_si256(w, _mm256_set1_epi32(0x0F)), b_lo));
    hi = _mm256_cvtepi32_ps(_mm256_or_si256(_mm256_srli_epi32(w, 4), b_hi));
  }
  static __m128i load8(const uint8_t* p) { return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)); }
};
#if defined(OPSCOPE_VEC_AVX512)
// AVX-512 (F, BW, VL): 16 lanes, so one B of 16 bytes widens to one register (C = 1); the byte
// operations are VecAVX2's, at 128 bits.
struct VecAVX512 : VecAVX2 {
  static constexpr int W = 16;
  static constexpr const char* NAME = "avx512";
  using F = __m512;
  static F zero() { return _mm512_setzero_ps(); }
  static F set1(float a) { return _mm512_set1_ps(a); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, F a) { _mm512_storeu_ps(p, a); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F max(F a, F b) { return _mm512_max_ps(a, b); }
  static F min(F a, F b) { return _mm512_min_ps(a, b); }
  static F round(F a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static float reduce(F a) { return _mm512_reduce_add_ps(a); }
  static F pow2i(F k) {
    const __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127));
    return _mm512_castsi512_ps(_mm512_slli_epi32(e, 23));
  }
  static F load_f16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static F load_bf16(const uint16_t* p) {
    const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  }
  template <int c> static F u8(B a) { static_assert(c == 0); return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(a)); }
  template <int c> static F s8(B a) { static_assert(c == 0); return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(a)); }
  template <int c> static F s8p(const uint8_t* p) { return s8<c>(load16(p)); }  // vpmovsxbd zmm, m128
  template <int c> static F u8p(const uint8_t* p) { return u8<c>(load16(p)); }
  template <int c> static void nibp(const uint8_t* p, F& lo, F& hi) {
    static_assert(c == 0);
    const __m512i w = _mm512_cvtepu8_epi32(load16(p));
    lo = _mm512_cvtepi32_ps(_mm512_and_si512(w, _mm512_set1_epi32(0x0F)));
    hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(w, 4));
  }
  template <int c> static void nib5p(const uint8_t* p, uint32_t qh, F& lo, F& hi) {  // VecAVX2's, 16 lanes
    static_assert(c == 0);
    const __m512i w = _mm512_cvtepu8_epi32(load16(p));
    const __m512i h = _mm512_set1_epi32(int(qh));
    const __m512i j = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i m = _mm512_set1_epi32(0x10);
    const __m512i b_lo = _mm512_and_si512(_mm512_srlv_epi32(_mm512_slli_epi32(h, 4), j), m);
    const __m512i b_hi = _mm512_and_si512(_mm512_srlv_epi32(h, _mm512_add_epi32(j, _mm512_set1_epi32(12))), m);
    lo = _mm512_cvtepi32_ps(_mm512_or_si512(_mm512_and_si512(w, _mm512_set1_epi32(0x0F)), b_lo));
    hi = _mm512_cvtepi32_ps(_mm512_or_si512(_mm512_srli_epi32(w, 4), b_hi));
  }
};
using Vec = VecAVX512;
#else
using Vec = VecAVX2;
#endif
#elif defined(OPSCOPE_VEC_NEON)
// ARM64 NEON (every ARMv8-A core, Apple Silicon): 4 lanes, tbl for the tables.
struct VecNEON {
  static constexpr int W = 4;
  static constexpr const char* NAME = "neon";
  using F = float32x4_t;
  using B = uint8x16_t;
  static F zero() { return vdupq_n_f32(0.f); }
  static F set1(float a) { return vdupq_n_f32(a); }
  static F load(const float* p) { return vld1q_f32(p); }
  static void store(float* p, F a) { vst1q_f32(p, a); }
  static F add(F a, F b) { return vaddq_f32(a, b); }
  static F sub(F a, F b) { return vsubq_f32(a, b); }
  static F mul(F a, F b) { return vmulq_f32(a, b); }
  static F div(F a, F b) { return vdivq_f32(a, b); }
  static F fma(F a, F b, F c) { return vfmaq_f32(c, a, b); }
  static F max(F a, F b) { return vmaxq_f32(a, b); }
  static F min(F a, F b) { return vminq_f32(a, b); }
  static F round(F a) { return vrndnq_f32(a); }
  static float reduce(F a) { return vaddvq_f32(a); }
  static F pow2i(F k) {
    const int32x4_t e = vaddq_s32(vcvtnq_s32_f32(k), vdupq_n_s32(127));
    return vreinterpretq_f32_s32(vshlq_n_s32(e, 23));
  }
  static F load_f16(const uint16_t* p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }
  static F load_bf16(const uint16_t* p) { return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16)); }
  static B load16(const uint8_t* p) { return vld1q_u8(p); }
  static B from64(uint64_t lo, uint64_t hi) { return vcombine_u8(vcreate_u8(lo), vcreate_u8(hi)); }
  static B nib_lo(B a) { return vandq_u8(a, vdupq_n_u8(0x0F)); }
  static B nib_hi(B a) { return vshrq_n_u8(a, 4); }
  static B add8(B a, int k) { return vaddq_u8(a, vdupq_n_u8(uint8_t(k))); }
  static B sub8(B a, int k) { return vsubq_u8(a, vdupq_n_u8(uint8_t(k))); }
  static B or8(B a, B b) { return vorrq_u8(a, b); }
  static B and8(B a, B b) { return vandq_u8(a, b); }
  static B splat8(int k) { return vdupq_n_u8(uint8_t(k)); }
  template <int k> static B shr8(B a) {
    if constexpr (k == 0) return a;
    else return vshrq_n_u8(a, k);
  }
  template <int k> static B shl8(B a) { return vshlq_n_u8(a, k); }
  static B lut16(const int8_t* table, B idx) { return vqtbl1q_u8(vld1q_u8(reinterpret_cast<const uint8_t*>(table)), idx); }
  static B bits16(uint32_t m) {
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t v = vcombine_u8(vdup_n_u8(uint8_t(m)), vdup_n_u8(uint8_t(m >> 8)));
    return vtstq_u8(v, vld1q_u8(bit));
  }
  template <int c> static F u8(B a) {
    const uint16x8_t h = c < 2 ? vmovl_u8(vget_low_u8(a)) : vmovl_u8(vget_high_u8(a));
    return vcvtq_f32_u32(c % 2 ? vmovl_u16(vget_high_u16(h)) : vmovl_u16(vget_low_u16(h)));
  }
  template <int c> static F s8(B a) {
    const int8x16_t s = vreinterpretq_s8_u8(a);
    const int16x8_t h = c < 2 ? vmovl_s8(vget_low_s8(s)) : vmovl_s8(vget_high_s8(s));
    return vcvtq_f32_s32(c % 2 ? vmovl_s16(vget_high_s16(h)) : vmovl_s16(vget_low_s16(h)));
  }
  static float fp16(const uint8_t* p) { uint16_t h; std::memcpy(&h, p, 2); return half_to_float(h); }
  template <int c> static F s8p(const uint8_t* p) { return s8<c>(load16(p)); }
  template <int c> static F u8p(const uint8_t* p) { return u8<c>(load16(p)); }
  template <int c> static void nibp(const uint8_t* p, F& lo, F& hi) {
    const B v = load16(p);
    lo = u8<c>(nib_lo(v));
    hi = u8<c>(nib_hi(v));
  }
};
using Vec = VecNEON;
#else
using Vec = VecScalar;
#endif

// 32 bytes at a time, for the byte passes that prepare a K-type superblock (portable.h's KT<>::prep)
// and the int8 kernels' quants (int8.h): one register on AVX2, two B elsewhere. B's operations, and
// the raw shifts, tables and half moves those need.
template <class V>
struct Bytes32 {
  struct T { typename V::B a, b; };
  static T load(const uint8_t* p) { return {V::load16(p), V::load16(p + 16)}; }
  static void store(uint8_t* p, T v) { std::memcpy(p, &v.a, 16); std::memcpy(p + 16, &v.b, 16); }
  static T splat8(int k) { return {V::splat8(k), V::splat8(k)}; }
  static T nib_lo(T v) { return {V::nib_lo(v.a), V::nib_lo(v.b)}; }
  static T nib_hi(T v) { return {V::nib_hi(v.a), V::nib_hi(v.b)}; }
  static T or8(T x, T y) { return {V::or8(x.a, y.a), V::or8(x.b, y.b)}; }
  static T and8(T x, T y) { return {V::and8(x.a, y.a), V::and8(x.b, y.b)}; }
  static T sub8(T v, int k) { return {V::sub8(v.a, k), V::sub8(v.b, k)}; }
  template <int k> static T shl8(T v) { return {V::template shl8<k>(v.a), V::template shl8<k>(v.b)}; }
  template <int k> static T shr8(T v) { return {V::template shr8<k>(v.a), V::template shr8<k>(v.b)}; }
  // shifts whose bits may cross into the neighbouring byte (the caller masks them off): no mask here
  template <int k> static T shl_raw(T v) { return shl8<k>(v); }
  template <int k> static T shr_raw(T v) { return shr8<k>(v); }
  static T lut16(const int8_t* table, T v) { return {V::lut16(table, v.a), V::lut16(table, v.b)}; }
  static T join(typename V::B lo, typename V::B hi) { return {lo, hi}; }
  // the first (cat_lo) or second (cat_hi) 16 bytes of x and of y, one after the other
  static T cat_lo(T x, T y) { return {x.a, y.a}; }
  static T cat_hi(T x, T y) { return {x.b, y.b}; }
};
#if defined(OPSCOPE_VEC_AVX2)
template <>
struct Bytes32<VecAVX2> {
  using T = __m256i;
  static T load(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static void store(uint8_t* p, T v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
  static T splat8(int k) { return _mm256_set1_epi8(char(k)); }
  static T nib_lo(T v) { return _mm256_and_si256(v, splat8(0x0F)); }
  static T nib_hi(T v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), splat8(0x0F)); }
  static T or8(T x, T y) { return _mm256_or_si256(x, y); }
  static T and8(T x, T y) { return _mm256_and_si256(x, y); }
  static T sub8(T v, int k) { return _mm256_sub_epi8(v, splat8(k)); }
  template <int k> static T shl8(T v) { return k == 0 ? v : _mm256_and_si256(_mm256_slli_epi16(v, k), splat8((0xFF << k) & 0xFF)); }
  template <int k> static T shr8(T v) { return k == 0 ? v : _mm256_and_si256(_mm256_srli_epi16(v, k), splat8(0xFF >> k)); }
  template <int k> static T shl_raw(T v) { return k == 0 ? v : _mm256_slli_epi16(v, k); }
  template <int k> static T shr_raw(T v) { return k == 0 ? v : _mm256_srli_epi16(v, k); }
  static T lut16(const int8_t* table, T v) {
    return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(table))), v);
  }
  static T join(__m128i lo, __m128i hi) { return _mm256_set_m128i(hi, lo); }
  static T cat_lo(T x, T y) { return _mm256_permute2x128_si256(x, y, 0x20); }
  static T cat_hi(T x, T y) { return _mm256_permute2x128_si256(x, y, 0x31); }
};
#endif

// Whether V has nib5p (the Q5 types' lanes built in 32-bit lanes); the others take the byte path.
template <class V> inline constexpr bool has_nib5p = false;
#if defined(OPSCOPE_VEC_AVX2)
template <> inline constexpr bool has_nib5p<VecAVX2> = true;
#endif
#if defined(OPSCOPE_VEC_AVX512)
template <> inline constexpr bool has_nib5p<VecAVX512> = true;
template <> struct Bytes32<VecAVX512> : Bytes32<VecAVX2> {};
#endif

// Two consecutive fp16 at p (a K block's d and dmin), each broadcast to all lanes.
template <class V>
inline void fp16x2(const uint8_t* p, typename V::F& a, typename V::F& b) {
  a = V::set1(V::fp16(p));
  b = V::set1(V::fp16(p + 2));
}
#if defined(OPSCOPE_VEC_AVX2)
template <>
inline void fp16x2<VecAVX2>(const uint8_t* p, __m256& a, __m256& b) {  // one conversion for both
  uint32_t h;
  std::memcpy(&h, p, 4);
  const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128(int(h)));
  a = _mm256_broadcastss_ps(f);
  b = _mm256_broadcastss_ps(_mm_movehdup_ps(f));
}
#endif

// exp of N registers of W float32 lanes, written once over the traits: Cephes' expf polynomial
// (within a few ulp of libm's expf), x clamped to +-87 so 2^k stays a normal float32 (exp(-87) ~
// 1.6e-38: the softmax and SiLU uses lose nothing). Each step is applied to all N registers before
// the next: one exp is a chain of ~20 dependent operations, and one register at a time the
// scheduler holds too few chains to overlap them (N = 4: the softmax's exp pass ~20 % faster on
// an AVX2 core).
template <class V, int N>
inline void exp_n(typename V::F (&x)[N]) {
  using F = typename V::F;
  F k[N], r[N], p[N];
  for (int i = 0; i < N; ++i) {
    x[i] = V::max(V::min(x[i], V::set1(87.f)), V::set1(-87.f));
    k[i] = V::round(V::mul(x[i], V::set1(1.44269504088896341f)));
  }
  for (int i = 0; i < N; ++i) r[i] = V::sub(x[i], V::mul(k[i], V::set1(0.693359375f)));  // x - k ln2 in two parts
  for (int i = 0; i < N; ++i) r[i] = V::sub(r[i], V::mul(k[i], V::set1(-2.12194440e-4f)));
  for (int i = 0; i < N; ++i) p[i] = V::fma(V::set1(1.9875691500e-4f), r[i], V::set1(1.3981999507e-3f));
  for (int i = 0; i < N; ++i) p[i] = V::fma(p[i], r[i], V::set1(8.3334519073e-3f));
  for (int i = 0; i < N; ++i) p[i] = V::fma(p[i], r[i], V::set1(4.1665795894e-2f));
  for (int i = 0; i < N; ++i) p[i] = V::fma(p[i], r[i], V::set1(1.6666665459e-1f));
  for (int i = 0; i < N; ++i) p[i] = V::fma(p[i], r[i], V::set1(5.0000001201e-1f));
  for (int i = 0; i < N; ++i) x[i] = V::mul(V::fma(p[i], V::mul(r[i], r[i]), V::add(r[i], V::set1(1.f))), V::pow2i(k[i]));
}

template <class V>
inline typename V::F exp(typename V::F x) {
  typename V::F a[1] = {x};
  exp_n<V, 1>(a);
  return a[0];
}

}  // namespace vec
}  // namespace opscope
