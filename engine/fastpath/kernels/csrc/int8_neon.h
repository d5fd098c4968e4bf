// The int8-activation matvecs (act_mode 1) on ARM64 NEON: the same kernels and the same arithmetic
// as int8_avx2.h (llama.cpp's q8 scheme; per block or group an exact int32 dot product, met by the
// float scales once), 16 bytes at a time. The products are signed bytes times signed bytes: every
// quant fits int8 (unsigned ones are at most 63), and the activations are within +-127. The neon
// variant sums them with vmull + vpadal (ARMv8.0), the neon-dotprod variant with one sdot (ARMv8.2
// dotprod: Apple M1 and later, Neoverse N1 and later, Cortex-A55/A76 and later).
#pragma once
#include <arm_neon.h>

#include <cstdint>
#include <cstring>
#include <utility>

#include "portable.h"
#include "vec.h"

namespace opscope {
namespace int8x {

// acc + sums of the products of a and b (4 products per int32 lane with sdot; which lane takes
// which product differs without it, the total does not)
inline int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
  return vdotq_s32(acc, a, b);
#else
  return vpadalq_s16(vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b))), vmull_high_s8(a, b));
#endif
}

inline int8x16_t s8(uint8x16_t v) { return vreinterpretq_s8_u8(v); }
inline int32x4_t dot32(int8x16_t w0, int8x16_t w1, int8x16_t y0, int8x16_t y1) {
  return dot16(dot16(vdupq_n_s32(0), w0, y0), w1, y1);
}

using portable::h16;
using portable::prefetch_next;
using V = vec::VecNEON;


// The row loop of the 32-weight layouts with activations per 32 (qy): block(n, b, y0, y1, macc)
// returns {d * dy, int32 dot product} of row n's block b and adds any min term to macc.
template <int R, class Block>
void rows32_q8(const int8_t* qy, int64_t K, int64_t row, float* y, Block&& block) {
  float32x4_t acc[R];
  float macc[R];
  for (int r = 0; r < R; ++r) { acc[r] = vdupq_n_f32(0.f); macc[r] = 0.f; }
  for (int64_t b = 0; b < K / 32; ++b) {
    const int8x16_t y0 = vld1q_s8(qy + 32 * b), y1 = vld1q_s8(qy + 32 * b + 16);
    for (int r = 0; r < R; ++r) {
      const auto [s, p] = block(row + r, b, y0, y1, macc[r]);
      acc[r] = vfmaq_n_f32(acc[r], vcvtq_f32_s32(p), s);
    }
  }
  for (int r = 0; r < R; ++r) y[row + r] = vaddvq_f32(acc[r]) + macc[r];
}

// MD: Q4_0 held as Q4_1 with m = -8 d (m never read)
template <int R, bool MD>
void soa_q4_1_rows_q8(const int8_t* qy, const float* dy, const float* sx, const uint8_t* qs, const void* d,
                      const void* m, int64_t K, int64_t row, float* y) {
  const int64_t nb = K / 32;
  rows32_q8<R>(qy, K, row, y, [&](int64_t n, int64_t b, int8x16_t y0, int8x16_t y1, float& macc) {
    const float dd = h16<V>(d, n * nb + b);
    macc += (MD ? -8.f * dd : h16<V>(m, n * nb + b)) * sx[b];
    if (b % 4 == 0) prefetch_next<R>(qs + n * (K / 2) + 16 * b, K / 2);  // once per 64-byte line
    const uint8x16_t v = vld1q_u8(qs + n * (K / 2) + 16 * b);  // element j low, j + 16 high
    return std::pair{dd * dy[b], dot32(s8(V::nib_lo(v)), s8(V::nib_hi(v)), y0, y1)};
  });
}

template <int R>
void soa_q8_0_rows_q8(const int8_t* qy, const float* dy, const int8_t* qs, const void* d, int64_t K, int64_t row,
                      float* y) {
  const int64_t nb = K / 32;
  rows32_q8<R>(qy, K, row, y, [&](int64_t n, int64_t b, int8x16_t y0, int8x16_t y1, float&) {
    const int8_t* w = qs + n * K + 32 * b;
    if (b % 2 == 0) prefetch_next<R>(reinterpret_cast<const uint8_t*>(w), K);
    return std::pair{h16<V>(d, n * nb + b) * dy[b], dot32(vld1q_s8(w), vld1q_s8(w + 16), y0, y1)};
  });
}

// Raw 32-weight blocks of type T (portable.h's B32 gives the 32 quants as bytes), R rows.
template <class T, int R>
void b32_rows_q8(const int8_t* qy, const float* dy, const float* sx, const uint8_t* qs, int64_t row_bytes,
                 int64_t K, int64_t row, float* y) {
  using P = portable::B32<T>;
  rows32_q8<R>(qy, K, row, y, [&](int64_t n, int64_t b, int8x16_t y0, int8x16_t y1, float& macc) {
    const uint8_t* blk = qs + n * row_bytes + b * T::BYTES;
    if ((b * T::BYTES) % 64 < T::BYTES) prefetch_next<R>(blk, row_bytes);  // once per line
    uint8x16_t lo, hi;
    P::template bytes<V>(blk, lo, hi);
    if constexpr (P::M_OFF >= 0) macc += V::fp16(blk + P::M_OFF) * sx[b];
    return std::pair{V::fp16(blk) * dy[b], dot32(s8(lo), s8(hi), y0, y1)};
  });
}

// ---- The K types with activations per 256 (prepare_q8k): per superblock and row, u[h] holds the
// quants of weights [64k + 16h, 64k + 16h + 16) for k = 0..3 (quants<k>). Their dot products with
// the activations are scaled by the group's integer scale (a group of 16 weights: one u[h]; of 32:
// two) and summed in int32; offsets and mins come off through the activations' group sums, as in
// int8_avx2.h.
namespace kq {

struct Sc {
  int32_t sc[16], mn[16];  // G32 types: the first 8 of each
  float d, dmin;
};

inline uint8x16_t ld(const uint8_t* p) { return vld1q_u8(p); }
inline uint8x16_t b8(int v) { return vdupq_n_u8(uint8_t(v)); }
// bits [from, from + width) of every byte, moved to bit `to`
inline uint8x16_t field(uint8x16_t v, int from, int width, int to) {
  return vshlq_u8(vandq_u8(vshlq_u8(v, vdupq_n_s8(int8_t(-from))), b8((1 << width) - 1)), vdupq_n_s8(int8_t(to)));
}
inline void bytes8(uint64_t v, int32_t* out, bool sign) {
  for (int i = 0; i < 8; ++i) out[i] = sign ? int32_t(int8_t(v >> (8 * i))) : int32_t(uint8_t(v >> (8 * i)));
}

struct Q2 {  // w = d*sc*u - dmin*mn, groups of 16, u = 2 bits
  static constexpr int BYTES = 84, OFF_SHIFT = -1;
  static constexpr bool G32 = false, MINS = true;
  static void scales(const uint8_t* b, Sc& s) {
    for (int g = 0; g < 16; ++g) { s.sc[g] = b[g] & 0x0F; s.mn[g] = b[g] >> 4; }
    s.d = gguf::fp16(b + 80);
    s.dmin = gguf::fp16(b + 82);
  }
  template <int k> static void quants(const uint8_t* b, uint8x16_t* u) {
    const uint8x16_t va = ld(b + 16 + 32 * (k / 2)), vb = ld(b + 32 + 32 * (k / 2));
    constexpr int sh = 4 * (k % 2);
    u[0] = field(va, sh, 2, 0), u[1] = field(vb, sh, 2, 0);
    u[2] = field(va, sh + 2, 2, 0), u[3] = field(vb, sh + 2, 2, 0);
  }
};

struct Q3 {  // w = d*sc*(u - 4), u = 2 low bits + 4 * hmask bit
  static constexpr int BYTES = 110, OFF_SHIFT = 2;
  static constexpr bool G32 = false, MINS = false;
  static void scales(const uint8_t* b, Sc& s) {
    const gguf::Bytes16 q = gguf::scales_q3k(b + 96);
    bytes8(q.lo, s.sc, false);
    bytes8(q.hi, s.sc + 8, false);
    for (int g = 0; g < 16; ++g) s.sc[g] -= 32;
    s.d = gguf::fp16(b + 108);
  }
  template <int k> static void quants(const uint8_t* b, uint8x16_t* u) {
    const uint8x16_t va = ld(b + 32 + 32 * (k / 2)), vb = ld(b + 48 + 32 * (k / 2)), ha = ld(b), hb = ld(b + 16);
    constexpr int sh = 4 * (k % 2);
    u[0] = vorrq_u8(field(va, sh, 2, 0), field(ha, 2 * k, 1, 2));
    u[1] = vorrq_u8(field(vb, sh, 2, 0), field(hb, 2 * k, 1, 2));
    u[2] = vorrq_u8(field(va, sh + 2, 2, 0), field(ha, 2 * k + 1, 1, 2));
    u[3] = vorrq_u8(field(vb, sh + 2, 2, 0), field(hb, 2 * k + 1, 1, 2));
  }
};

template <bool FIVE>
struct Q45 {  // w = d*sc*u - dmin*mn per sub-block of 32; Q5_K's 5th bit from qh
  static constexpr int BYTES = FIVE ? 176 : 144, OFF_SHIFT = -1;
  static constexpr bool G32 = true, MINS = true;
  static void scales(const uint8_t* b, Sc& s) {
    const gguf::Bytes16 q = gguf::scale_min_k4(b + 4);
    bytes8(q.lo, s.sc, false);
    bytes8(q.hi, s.mn, false);
    s.d = gguf::fp16(b);
    s.dmin = gguf::fp16(b + 2);
  }
  template <int k> static void quants(const uint8_t* b, uint8x16_t* u) {
    const uint8_t* q = b + (FIVE ? 48 : 16) + 32 * k;
    const uint8x16_t va = ld(q), vb = ld(q + 16);
    u[0] = V::nib_lo(va), u[1] = V::nib_lo(vb), u[2] = V::nib_hi(va), u[3] = V::nib_hi(vb);
    if constexpr (FIVE) {
      const uint8x16_t ha = ld(b + 16), hb = ld(b + 32);
      u[0] = vorrq_u8(u[0], field(ha, 2 * k, 1, 4)), u[1] = vorrq_u8(u[1], field(hb, 2 * k, 1, 4));
      u[2] = vorrq_u8(u[2], field(ha, 2 * k + 1, 1, 4)), u[3] = vorrq_u8(u[3], field(hb, 2 * k + 1, 1, 4));
    }
  }
};

struct Q6 {  // w = d*sc*(u - 32), u = 4 bits of ql | 2 bits of qh << 4, groups of 16
  static constexpr int BYTES = 210, OFF_SHIFT = 5;
  static constexpr bool G32 = false, MINS = false;
  static void scales(const uint8_t* b, Sc& s) {
    for (int g = 0; g < 16; ++g) s.sc[g] = int8_t(b[192 + g]);
    s.d = gguf::fp16(b + 208);
  }
  // weights [64k, 64k + 64): ql[64h + 32(j%2) + l]'s low (j < 2) or high nibble, bits 2j, 2j+1 of
  // qh[32h + l], h = k / 2, j = 2 (k % 2) (int8_avx2.h's Q6 in 16-byte halves)
  template <int k> static void quants(const uint8_t* b, uint8x16_t* u) {
    constexpr int h = k / 2, j = 2 * (k % 2), sh = j ? 4 : 0;
    const uint8_t* l = b + 64 * h;
    const uint8x16_t qa = ld(b + 128 + 32 * h), qb = ld(b + 144 + 32 * h);
    u[0] = vorrq_u8(field(ld(l), sh, 4, 0), field(qa, 2 * j, 2, 4));
    u[1] = vorrq_u8(field(ld(l + 16), sh, 4, 0), field(qb, 2 * j, 2, 4));
    u[2] = vorrq_u8(field(ld(l + 32), sh, 4, 0), field(qa, 2 * j + 2, 2, 4));
    u[3] = vorrq_u8(field(ld(l + 48), sh, 4, 0), field(qb, 2 * j + 2, 2, 4));
  }
};

struct QX {  // IQ4_XS: w = d*sc*table[n], table values signed bytes
  static constexpr int BYTES = 136, OFF_SHIFT = -1;
  static constexpr bool G32 = true, MINS = false;
  static void scales(const uint8_t* b, Sc& s) {
    for (int i = 0; i < 8; ++i) s.sc[i] = gguf::TIQ4_XS::scale(b, i);
    s.d = gguf::fp16(b);
  }
  // sub-blocks 2k, 2k+1: 16 bytes each, low nibbles = weights 0-15, high = 16-31
  template <int k> static void quants(const uint8_t* b, uint8x16_t* u) {
    const uint8x16_t va = ld(b + 8 + 32 * k), vb = ld(b + 24 + 32 * k);
    u[0] = V::lut16(gguf::kIQ4NL, V::nib_lo(va)), u[1] = V::lut16(gguf::kIQ4NL, V::nib_hi(va));
    u[2] = V::lut16(gguf::kIQ4NL, V::nib_lo(vb)), u[3] = V::lut16(gguf::kIQ4NL, V::nib_hi(vb));
  }
};

template <class T, int R>
void rows(const int8_t* qy, const float* dy, const int16_t* bs16, const int16_t* bs32, const uint8_t* qs,
          int64_t row_bytes, int64_t K, int64_t row, float* y) {
  const int64_t nb = K / 256;
  float acc[R], macc[R];
  for (int r = 0; r < R; ++r) acc[r] = macc[r] = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    const int8_t* yb = qy + 256 * b;
    const int16_t* bs = T::G32 ? bs32 + 8 * b : bs16 + 16 * b;
    constexpr int NG = T::G32 ? 8 : 16;
    gguf::static_for<R>([&](auto rc) {
      constexpr int r = decltype(rc)::value;
      const uint8_t* blk = qs + (row + r) * row_bytes + b * T::BYTES;
      for (int o = 0; o < T::BYTES; o += 64) prefetch_next<R>(blk + o, row_bytes);
      Sc s;
      T::scales(blk, s);
      int32x4_t si = vdupq_n_s32(0);
      gguf::static_for<4>([&](auto kc) {
        constexpr int k = decltype(kc)::value;
        uint8x16_t u[4];
        T::template quants<k>(blk, u);
        for (int h = 0; h < 4; ++h) {
          const int32x4_t p = dot16(vdupq_n_s32(0), s8(u[h]), vld1q_s8(yb + 64 * k + 16 * h));
          si = vmlaq_n_s32(si, p, T::G32 ? s.sc[2 * k + h / 2] : s.sc[4 * k + h]);
        }
      });
      int32_t total = vaddvq_s32(si), mins = 0;
      if constexpr (T::OFF_SHIFT >= 0 || T::MINS) {
        int32_t off = 0;
        for (int g = 0; g < NG; ++g) {
          off += s.sc[g] * bs[g];
          if constexpr (T::MINS) mins += s.mn[g] * bs[g];
        }
        if constexpr (T::OFF_SHIFT >= 0) total -= off * (1 << T::OFF_SHIFT);
      }
      acc[r] += float(total) * (s.d * dy[b]);
      if constexpr (T::MINS) macc[r] += float(mins) * (s.dmin * dy[b]);
    });
  }
  for (int r = 0; r < R; ++r) y[row + r] = acc[r] - macc[r];
}

}  // namespace kq

}  // namespace int8x
}  // namespace opscope
