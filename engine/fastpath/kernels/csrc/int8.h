// The int8-activation matvecs (act_mode 1, llama.cpp's q8 scheme) of the vec.h variants, written once
// over the int8 traits (vec_int8.h) and instantiated for the instruction set the translation unit
// is compiled for: AVX2 / AVX-VNNI at 256 bits, ARM64 NEON (+dotprod) 16 bytes at a time. Per block
// or group an exact int32 dot product meets the float scales once; only the float32 summation
// order differs from kernels.cpp's scalar q8 rows.
//   soa_q4_1_rows_q8 / soa_q8_0_rows_q8   the repacked Q4_1 (Q4_0) and Q8_0 layouts
//   b32_rows_q8                           raw 32-weight blocks (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL)
//   kq::rows                              the K types (Q2_K ... Q6_K, IQ4_XS), activations per 256
// The AVX-512 variants have their own (simd_v2.h, raw_q8.cpp); the baseline has none (activations
// stay float32).
#pragma once
#include "vec.h"

#if !defined(__AVX512F__) && (defined(OPSCOPE_VEC_AVX2) || defined(OPSCOPE_VEC_NEON))
#define OPSCOPE_HAVE_INT8_VEC 1
#include <cstdint>
#include <utility>

#include "portable.h"
#include "vec_int8.h"

namespace opscope {
namespace int8x {

using V = vec::Vec;
using I = vec::Int8<V>;
using X = vec::Bytes32<V>;  // I::Y's byte operations
using Y = I::Y;
using portable::h16;
using portable::prefetch_next;

inline Y ld(const int8_t* p) { return X::load(reinterpret_cast<const uint8_t*>(p)); }
inline Y ld(const uint8_t* p) { return X::load(p); }

// The row loop of the 32-weight layouts with activations per 32 (qy): block(n, b, yv, macc) returns
// {d * dy, int32 dot product} of row n's block b and adds any min term to macc.
template <int R, class Block>
void rows32_q8(const int8_t* qy, int64_t K, int64_t row, float* y, Block&& block) {
  V::F acc[R];
  float macc[R];
  for (int r = 0; r < R; ++r) { acc[r] = V::zero(); macc[r] = 0.f; }
  for (int64_t b = 0; b < K / 32; ++b) {
    const Y yv = ld(qy + 32 * b);
    for (int r = 0; r < R; ++r) {
      const auto [s, p] = block(row + r, b, yv, macc[r]);
      acc[r] = V::fma(V::set1(s), I::cvt(p), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) y[row + r] = V::reduce(acc[r]) + macc[r];
}

// MD: Q4_0 held as Q4_1 with m = -8 d (m never read). A block's 16 bytes hold element j in the low
// nibble of byte j and element j + 16 in the high one.
template <int R, bool MD>
void soa_q4_1_rows_q8(const int8_t* qy, const float* dy, const float* sx, const uint8_t* qs, const void* d,
                      const void* m, int64_t K, int64_t row, float* y) {
  const int64_t nb = K / 32;
  rows32_q8<R>(qy, K, row, y, [&](int64_t n, int64_t b, Y yv, float& macc) {
    const float dd = h16<V>(d, n * nb + b);
    macc += (MD ? -8.f * dd : h16<V>(m, n * nb + b)) * sx[b];
    if (b % 4 == 0) prefetch_next<R>(qs + n * (K / 2) + 16 * b, K / 2);  // once per 64-byte line
    const V::B v = V::load16(qs + n * (K / 2) + 16 * b);
    return std::pair{dd * dy[b], I::dot_u(I::zero(), X::join(V::nib_lo(v), V::nib_hi(v)), yv)};
  });
}

template <int R>
void soa_q8_0_rows_q8(const int8_t* qy, const float* dy, const int8_t* qs, const void* d, int64_t K, int64_t row,
                      float* y) {
  const int64_t nb = K / 32;
  rows32_q8<R>(qy, K, row, y, [&](int64_t n, int64_t b, Y yv, float&) {
    const int8_t* w = qs + n * K + 32 * b;
    if (b % 2 == 0) prefetch_next<R>(reinterpret_cast<const uint8_t*>(w), K);
    return std::pair{h16<V>(d, n * nb + b) * dy[b], I::dot_s(I::zero(), ld(w), yv)};
  });
}

// Raw 32-weight blocks of type T (portable.h's B32 gives the 32 quants as bytes), R rows.
template <class T, int R>
void b32_rows_q8(const int8_t* qy, const float* dy, const float* sx, const uint8_t* qs, int64_t row_bytes,
                 int64_t K, int64_t row, float* y) {
  using P = portable::B32<T>;
  rows32_q8<R>(qy, K, row, y, [&](int64_t n, int64_t b, Y yv, float& macc) {
    const uint8_t* blk = qs + n * row_bytes + b * T::BYTES;
    if ((b * T::BYTES) % 64 < T::BYTES) prefetch_next<R>(blk, row_bytes);  // once per line
    V::B lo, hi;
    P::template bytes<V>(blk, lo, hi);
    const Y q = X::join(lo, hi);
    if constexpr (P::M_OFF >= 0) macc += V::fp16(blk + P::M_OFF) * sx[b];
    return std::pair{V::fp16(blk) * dy[b], P::SIGNED ? I::dot_s(I::zero(), q, yv) : I::dot_u(I::zero(), q, yv)};
  });
}

// ---- The K types (256-weight superblocks) with activations per 256 (prepare_q8k: llama.cpp's
// q8_K): qy the int8 values in plain order, dy their scale per 256, bs16 the sums of qy per 16.
// Per superblock and row, quants<k> gives the quants u of weights [64k, 64k + 32) and
// [64k + 32, 64k + 64) (unsigned, or signed where SIGNED); their products with the activations meet
// the groups' integer scales (one per 16 weights: G32 types hold each sub-block's scale twice), so
// the superblock's dot product is exact in int32 and meets the float scales d * dy once. Offsets
// (w = d*sc*(u - o), o = 2^OFF_SHIFT) come off as o * sum_g sc_g * bs_g, mins (w = d*sc*u - dmin*mn)
// as dmin * sum_g mn_g * bs_g.
namespace kq {

struct Sc {
  alignas(32) int16_t sc[16];
  alignas(32) int16_t mn[16];
  float d, dmin;
};

// bits [from, from + width) of every byte moved to bit `to` (the shift may carry bits across a
// byte; the mask drops them)
template <int from, int width, int to>
inline Y field(Y v) {
  const Y mask = X::splat8(((1 << width) - 1) << to);
  if constexpr (from >= to) return X::and8(X::template shr_raw<from - to>(v), mask);
  else return X::and8(X::template shl_raw<to - from>(v), mask);
}

struct Q2 {  // w = d*sc*u - dmin*mn, groups of 16, u = 2 bits
  static constexpr int BYTES = 84, OFF_SHIFT = -1;
  static constexpr bool G32 = false, MINS = true, SIGNED = false;
  static void scales(const uint8_t* b, Sc& s) {
    const V::B v = V::load16(b);
    I::widen<false>(V::nib_lo(v), s.sc);
    I::widen<false>(V::nib_hi(v), s.mn);
    s.d = gguf::fp16(b + 80);
    s.dmin = gguf::fp16(b + 82);
  }
  template <int k> static void quants(const uint8_t* b, Y& u0, Y& u1) {
    const Y v = ld(b + 16 + 32 * (k / 2));
    u0 = field<4 * (k % 2), 2, 0>(v);
    u1 = field<4 * (k % 2) + 2, 2, 0>(v);
  }
};

struct Q3 {  // w = d*sc*(u - 4), u = 2 low bits + 4 * hmask bit
  static constexpr int BYTES = 110, OFF_SHIFT = 2;
  static constexpr bool G32 = false, MINS = false, SIGNED = false;
  static void scales(const uint8_t* b, Sc& s) {
    const gguf::Bytes16 q = gguf::scales_q3k(b + 96);
    I::widen<true>(V::sub8(V::from64(q.lo, q.hi), 32), s.sc);
    s.d = gguf::fp16(b + 108);
  }
  template <int k> static void quants(const uint8_t* b, Y& u0, Y& u1) {
    const Y v = ld(b + 32 + 32 * (k / 2)), hm = ld(b);
    u0 = X::or8(field<4 * (k % 2), 2, 0>(v), field<2 * k, 1, 2>(hm));
    u1 = X::or8(field<4 * (k % 2) + 2, 2, 0>(v), field<2 * k + 1, 1, 2>(hm));
  }
};

template <bool FIVE>
struct Q45 {  // w = d*sc*u - dmin*mn per sub-block of 32; Q5_K's 5th bit from qh
  static constexpr int BYTES = FIVE ? 176 : 144, OFF_SHIFT = -1;
  static constexpr bool G32 = true, MINS = true, SIGNED = false;
  static void scales(const uint8_t* b, Sc& s) {
    const gguf::Bytes16 q = gguf::scale_min_k4(b + 4);
    I::widen<false>(I::twice(q.lo), s.sc);
    I::widen<false>(I::twice(q.hi), s.mn);
    s.d = gguf::fp16(b);
    s.dmin = gguf::fp16(b + 2);
  }
  template <int k> static void quants(const uint8_t* b, Y& u0, Y& u1) {
    const Y v = ld(b + (FIVE ? 48 : 16) + 32 * k);
    u0 = X::nib_lo(v);
    u1 = X::nib_hi(v);
    if constexpr (FIVE) {
      const Y qh = ld(b + 16);
      u0 = X::or8(u0, field<2 * k, 1, 4>(qh));
      u1 = X::or8(u1, field<2 * k + 1, 1, 4>(qh));
    }
  }
};

struct Q6 {  // w = d*sc*(u - 32), u = 4 bits of ql | 2 bits of qh << 4, groups of 16
  static constexpr int BYTES = 210, OFF_SHIFT = 5;
  static constexpr bool G32 = false, MINS = false, SIGNED = false;
  static void scales(const uint8_t* b, Sc& s) {
    I::widen<true>(V::load16(b + 192), s.sc);
    s.d = gguf::fp16(b + 208);
  }
  // weights [64k, 64k + 64): ql[64h + 32(j%2) + l]'s low (j < 2) or high nibble, bits 2j, 2j+1 of
  // qh[32h + l], h = k / 2, j = 2 (k % 2)
  template <int k> static void quants(const uint8_t* b, Y& u0, Y& u1) {
    constexpr int h = k / 2, j = 2 * (k % 2), sh = j ? 4 : 0;
    const Y qh = ld(b + 128 + 32 * h);
    u0 = X::or8(field<sh, 4, 0>(ld(b + 64 * h)), field<2 * j, 2, 4>(qh));
    u1 = X::or8(field<sh, 4, 0>(ld(b + 64 * h + 32)), field<2 * j + 2, 2, 4>(qh));
  }
};

struct QX {  // IQ4_XS: w = d*sc*table[n], signed (the table's values)
  static constexpr int BYTES = 136, OFF_SHIFT = -1;
  static constexpr bool G32 = true, MINS = false, SIGNED = true;
  static void scales(const uint8_t* b, Sc& s) {
    uint64_t s6 = 0;
    for (int i = 0; i < 8; ++i) s6 |= uint64_t(uint8_t(gguf::TIQ4_XS::scale(b, i))) << (8 * i);
    I::widen<true>(I::twice(s6), s.sc);
    s.d = gguf::fp16(b);
  }
  // sub-blocks 2k, 2k+1: 16 bytes each, low nibbles = weights 0-15, high = 16-31
  template <int k> static void quants(const uint8_t* b, Y& u0, Y& u1) {
    const Y v = ld(b + 8 + 32 * k);
    const Y lo = X::nib_lo(v), hi = X::nib_hi(v);
    u0 = X::lut16(gguf::kIQ4NL, X::cat_lo(lo, hi));
    u1 = X::lut16(gguf::kIQ4NL, X::cat_hi(lo, hi));
  }
};

template <class T, int R>
void rows(const int8_t* qy, const float* dy, const int16_t* bs16, const uint8_t* qs, int64_t row_bytes, int64_t K,
          int64_t row, float* y) {
  const int64_t nb = K / 256;
  V::F acc[R], macc[R];
  for (int r = 0; r < R; ++r) { acc[r] = V::zero(); macc[r] = V::zero(); }
  for (int64_t b = 0; b < nb; ++b) {
    const int8_t* yb = qy + 256 * b;
    const int16_t* bs = bs16 + 16 * b;
    gguf::static_for<R>([&](auto rc) {
      constexpr int r = decltype(rc)::value;
      const uint8_t* blk = qs + (row + r) * row_bytes + b * T::BYTES;
      for (int o = 0; o < T::BYTES; o += 64) prefetch_next<R>(blk + o, row_bytes);
      Sc s;
      T::scales(blk, s);
      I::S si = I::zero();
      gguf::static_for<4>([&](auto kc) {
        constexpr int k = decltype(kc)::value;
        Y u0, u1;
        T::template quants<k>(blk, u0, u1);
        si = I::dot_sc<T::SIGNED, T::G32, 2 * k>(si, u0, ld(yb + 64 * k), s.sc);
        si = I::dot_sc<T::SIGNED, T::G32, 2 * k + 1>(si, u1, ld(yb + 64 * k + 32), s.sc);
      });
      if constexpr (T::OFF_SHIFT >= 0) si = I::sub(si, I::shl<T::OFF_SHIFT>(I::madd16(s.sc, bs)));
      acc[r] = V::fma(I::cvt(si), V::set1(s.d * dy[b]), acc[r]);
      if constexpr (T::MINS) macc[r] = V::fma(I::cvt(I::madd16(s.mn, bs)), V::set1(s.dmin * dy[b]), macc[r]);
    });
  }
  for (int r = 0; r < R; ++r) y[row + r] = V::reduce(V::sub(acc[r], macc[r]));
}

// Calls fn(T{}) with the K type's decoder; false for the other types.
template <class Fn>
bool with_type(int64_t t, Fn&& fn) {
  switch (t) {
    case gguf::Q2_K: fn(Q2{}); return true;
    case gguf::Q3_K: fn(Q3{}); return true;
    case gguf::Q4_K: fn(Q45<false>{}); return true;
    case gguf::Q5_K: fn(Q45<true>{}); return true;
    case gguf::Q6_K: fn(Q6{}); return true;
    case gguf::IQ4_XS: fn(QX{}); return true;
    default: return false;
  }
}

}  // namespace kq

// Calls fn(T{}) with the raw 32-weight block type that has an int8 kernel here (b32_rows_q8); false
// for the others (Q8_0 is repacked at load and has its own, soa_q8_0_rows_q8).
template <class F>
bool with_b32_type(int64_t ggml_type, F&& fn) {
  switch (ggml_type) {
    case gguf::Q4_0: fn(gguf::TQ4_0{}); return true;
    case gguf::Q4_1: fn(gguf::TQ4_1{}); return true;
    case gguf::Q5_0: fn(gguf::TQ5_0{}); return true;
    case gguf::Q5_1: fn(gguf::TQ5_1{}); return true;
    case gguf::IQ4_NL: fn(gguf::TIQ4_NL{}); return true;
    default: return false;
  }
}

}  // namespace int8x
}  // namespace opscope
#endif
