// The int8 half of the vector-traits layer (vec.h): the integer dot products the int8-activation
// kernels (int8.h) are written against, once per instruction set. Y is 32 bytes (vec::Bytes32's
// register: quants or activations), S int32 lanes, as many as V::F has float32 lanes.
//   NAME               the instruction that multiplies the bytes
//   zero, sub, shl<k>, cvt (S to V::F)
//   dot_u(acc, u, y)   acc + the products u * y, u unsigned and at most 127, y signed (the lanes
//                      that take which products differ by instruction set; the total does not)
//   dot_s(acc, w, y)   the same for signed w
//   dot_sc<SIGNED, ONE, j>(acc, u, y, sc)
//                      acc + sc[2j] * (products of bytes 0-15) + sc[2j + 1] * (bytes 16-31), sc 16
//                      int16 scales (32-byte aligned); ONE: the two scales are known to be equal
//   madd16(a, b)       the 16 int16 products a * b, summed into the lanes
//   widen<SIGNED>(v, out)  the 16 bytes of v (signed or not) to int16 out[0..16)
//   twice(v)           the 8 bytes of v, each twice (b0 b0 b1 b1 ...), as V::B
// Every sum is exact: |u|, |w|, |y| <= 127, int16 scales, and at most 256 products per int32 lane.
#pragma once
#include <cstdint>
#include <cstring>

#include "vec.h"

namespace opscope {
namespace vec {

template <class V>
struct Int8;

#if defined(OPSCOPE_VEC_AVX2)
// OPSCOPE_VNNI_EVEX_TWIN (the test driver only): the avx2-vnni variant's bodies, with its one VNNI
// instruction in the AVX512-VNNI encoding (the same vpdpbusd on 256 bits, EVEX instead of VEX), so
// that they run on a CPU that has AVX512-VNNI but not AVX-VNNI (tests/engine/fastpath/test_kernels_portable.py).
#if defined(__AVXVNNI__) || defined(OPSCOPE_VNNI_EVEX_TWIN)
#define OPSCOPE_INT8_VNNI 1
#endif
// maddubs (u8 x s8 to int16 pairs: 2 * 127 * 127 < 2^15, no saturation) + madd; one vpdpbusd on
// AVX-VNNI (the avx2-vnni variant). Signed weights: |w| times y with w's sign, the same products.
template <>
struct Int8<VecAVX2> {
#if defined(OPSCOPE_INT8_VNNI)
  static constexpr const char* NAME = "vpdpbusd";
#else
  static constexpr const char* NAME = "vpmaddubsw";
#endif
  using F = __m256;
  using Y = __m256i;
  using S = __m256i;
  static S zero() { return _mm256_setzero_si256(); }
  static S sub(S a, S b) { return _mm256_sub_epi32(a, b); }
  template <int k> static S shl(S a) { return _mm256_slli_epi32(a, k); }
  static F cvt(S a) { return _mm256_cvtepi32_ps(a); }
#if defined(OPSCOPE_VNNI_EVEX_TWIN)
  __attribute__((target("avx512vnni,avx512vl"), noinline)) static S dot_u(S acc, Y u, Y y) {
    return _mm256_dpbusd_epi32(acc, u, y);
  }
#else
  static S dot_u(S acc, Y u, Y y) {
#if defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(acc, u, y);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, y), _mm256_set1_epi16(1)));
#endif
  }
#endif
  static S dot_s(S acc, Y w, Y y) { return dot_u(acc, _mm256_sign_epi8(w, w), _mm256_sign_epi8(y, w)); }
  // ONE: the pair (sc[2j], sc[2j + 1]) is the scale twice, dword j of the 16 scales, spread by one
  // vpermd (read back as an int32, GCC takes it from the register with two shuffles instead, on the
  // port the table lookups need; docs/decisions/cpu-variants.md)
  template <bool SIGNED, bool ONE, int j>
  static S dot_sc(S acc, Y u, Y y, const int16_t* sc) {
    const __m256i p = SIGNED ? _mm256_maddubs_epi16(_mm256_sign_epi8(u, u), _mm256_sign_epi8(y, u))
                             : _mm256_maddubs_epi16(u, y);
    __m256i s;
    if constexpr (ONE) {
      s = _mm256_permutevar8x32_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(sc)), _mm256_set1_epi32(j));
    } else {
      int32_t pair;
      std::memcpy(&pair, sc + 2 * j, 4);
      const __m256i idx = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                           2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
      s = _mm256_shuffle_epi8(_mm256_set1_epi32(pair), idx);
    }
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, s));
  }
  static S madd16(const int16_t* a, const int16_t* b) {
    return _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)),
                             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)));
  }
  template <bool SIGNED> static void widen(__m128i v, int16_t* out) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), SIGNED ? _mm256_cvtepi8_epi16(v) : _mm256_cvtepu8_epi16(v));
  }
  static __m128i twice(uint64_t v) {
    const __m128i x = _mm_cvtsi64_si128(int64_t(v));
    return _mm_unpacklo_epi8(x, x);
  }
};
#elif defined(OPSCOPE_VEC_NEON)
// Signed bytes times signed bytes, 16 at a time: one sdot with ARMv8.2 dotprod (the neon-dotprod
// variant), vmull + vpadal on ARMv8.0 (neon).
template <>
struct Int8<VecNEON> {
#if defined(__ARM_FEATURE_DOTPROD)
  static constexpr const char* NAME = "sdot";
#else
  static constexpr const char* NAME = "smull";
#endif
  using F = float32x4_t;
  using Y = Bytes32<VecNEON>::T;
  using S = int32x4_t;
  static S zero() { return vdupq_n_s32(0); }
  static S sub(S a, S b) { return vsubq_s32(a, b); }
  template <int k> static S shl(S a) { return vshlq_n_s32(a, k); }
  static F cvt(S a) { return vcvtq_f32_s32(a); }
  static S dot16(S acc, uint8x16_t u, uint8x16_t y) {
    const int8x16_t a = vreinterpretq_s8_u8(u), b = vreinterpretq_s8_u8(y);
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, a, b);
#else
    return vpadalq_s16(vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b))), vmull_high_s8(a, b));
#endif
  }
  static S dot_u(S acc, Y u, Y y) { return dot16(dot16(acc, u.a, y.a), u.b, y.b); }
  static S dot_s(S acc, Y w, Y y) { return dot_u(acc, w, y); }
  template <bool SIGNED, bool ONE, int j>
  static S dot_sc(S acc, Y u, Y y, const int16_t* sc) {
    if constexpr (ONE) return vmlaq_n_s32(acc, dot_u(zero(), u, y), sc[2 * j]);
    acc = vmlaq_n_s32(acc, dot16(zero(), u.a, y.a), sc[2 * j]);
    return vmlaq_n_s32(acc, dot16(zero(), u.b, y.b), sc[2 * j + 1]);
  }
  static S madd16(const int16_t* a, const int16_t* b) {
    const int16x8_t a0 = vld1q_s16(a), a1 = vld1q_s16(a + 8), b0 = vld1q_s16(b), b1 = vld1q_s16(b + 8);
    const int32x4_t s = vmlal_high_s16(vmull_s16(vget_low_s16(a0), vget_low_s16(b0)), a0, b0);
    return vmlal_high_s16(vmlal_s16(s, vget_low_s16(a1), vget_low_s16(b1)), a1, b1);
  }
  template <bool SIGNED> static void widen(uint8x16_t v, int16_t* out) {
    if constexpr (SIGNED) {
      const int8x16_t s = vreinterpretq_s8_u8(v);
      vst1q_s16(out, vmovl_s8(vget_low_s8(s)));
      vst1q_s16(out + 8, vmovl_high_s8(s));
    } else {
      vst1q_s16(out, vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(v))));
      vst1q_s16(out + 8, vreinterpretq_s16_u16(vmovl_high_u8(v)));
    }
  }
  static uint8x16_t twice(uint64_t v) {
    const uint8x16_t x = vcombine_u8(vcreate_u8(v), vcreate_u8(0));
    return vzip1q_u8(x, x);
  }
};
#endif

}  // namespace vec
}  // namespace opscope
