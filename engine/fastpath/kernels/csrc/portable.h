// The matvec kernel bodies of the portable variants (x86-64 baseline, AVX2+FMA+F16C, ARM64 NEON),
// written once over the vector traits of vec.h (V) and instantiated for the instruction set the
// translation unit is compiled for. Exact float32: weights decoded to float32 in registers, float32
// FMA accumulation, each block's scale factored out of its dot product.
//   soa_q4_1_rows / soa_q8_0_rows  the repacked structure-of-arrays layouts (kernels.cpp)
//   b32_rows                        raw 32-weight blocks with one fp16 scale (Q4_0 ... IQ4_NL)
//   k_rows                          raw 256-weight superblocks (Q2_K ... Q6_K, IQ4_XS)
//   half_rows                       raw F32 / F16 / BF16
// Each computes R rows (4 share every activation load: four independent FMA chains).
#pragma once
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "gguf_types.h"
#include "vec.h"

namespace opscope {
namespace portable {

using gguf::static_for;
constexpr int C16 = 16;  // bytes per V::B

// Convert chunk c of a byte register to float lanes, signed or not.
template <class V, bool SIGNED, int c>
inline typename V::F conv(typename V::B b) {
  if constexpr (SIGNED) return V::template s8<c>(b);
  else return V::template u8<c>(b);
}

// Chunk c of a 32-weight block (weights [cW, cW + W) against x0, [16 + cW, 16 + cW + W) against
// x1) added to the block's two FMA chains t0, t1: from bytes in registers (lo: weights 0-15, hi:
// 16-31), from bytes in memory, or from 16 bytes of nibbles in memory (low: 0-15, high: 16-31).
template <class V, bool SIGNED, int c>
inline void chunk32(typename V::B lo, typename V::B hi, typename V::F x0, typename V::F x1, typename V::F& t0,
                    typename V::F& t1) {
  t0 = V::fma(conv<V, SIGNED, c>(lo), x0, t0);
  t1 = V::fma(conv<V, SIGNED, c>(hi), x1, t1);
}
template <class V, bool SIGNED, int c>
inline void chunk32p(const uint8_t* q, typename V::F x0, typename V::F x1, typename V::F& t0, typename V::F& t1) {
  if constexpr (SIGNED) {
    t0 = V::fma(V::template s8p<c>(q), x0, t0);
    t1 = V::fma(V::template s8p<c>(q + 16), x1, t1);
  } else {
    t0 = V::fma(V::template u8p<c>(q), x0, t0);
    t1 = V::fma(V::template u8p<c>(q + 16), x1, t1);
  }
}
template <class V, int c>
inline void chunk_nib32p(const uint8_t* q, typename V::F x0, typename V::F x1, typename V::F& t0, typename V::F& t1) {
  typename V::F lo, hi;
  V::template nibp<c>(q, lo, hi);
  t0 = V::fma(lo, x0, t0);
  t1 = V::fma(hi, x1, t1);
}

// Q5_0 / Q5_1: where the 5th bits (QH) and the nibbles (QS) are in a block.
template <class T> struct Q5 { static constexpr bool OK = false; };
template <> struct Q5<gguf::TQ5_0> { static constexpr bool OK = true; static constexpr int QH = 2, QS = 6; };
template <> struct Q5<gguf::TQ5_1> { static constexpr bool OK = true; static constexpr int QH = 4, QS = 8; };

template <class V, int c>
inline void chunk_nib5p(const uint8_t* q, uint32_t qh, typename V::F x0, typename V::F x1, typename V::F& t0,
                        typename V::F& t1) {
  typename V::F lo, hi;
  V::template nib5p<c>(q, qh, lo, hi);
  t0 = V::fma(lo, x0, t0);
  t1 = V::fma(hi, x1, t1);
}

// The same place R rows on (the next group of rows), a group ahead of use: more lines in flight
// than the hardware prefetcher keeps for R short row streams. The matvecs of a model larger than
// the caches wait on memory latency, not arithmetic (a 1.1B Q4_K_M file on the avx2 variant,
// int8 activations: 16 -> 25 tok/s), as gguf_types.h's prefetch_next does for the 512-bit kernels.
template <int R>
inline void prefetch_next(const uint8_t* p, int64_t row_bytes) {
  __builtin_prefetch(p + R * row_bytes, 0, 3);
}

// sc[0..16) = d * (16 bytes, signed or not): the K types' group scales, W at a time.
template <class V, bool SIGNED>
inline void scales16(typename V::B v, float d, float* sc) {
  const typename V::F dv = V::set1(d);
  static_for<C16 / V::W>([&](auto cc) {
    constexpr int c = decltype(cc)::value;
    V::store(sc + c * V::W, V::mul(dv, conv<V, SIGNED, c>(v)));
  });
}

// fp16 scale i of an array of fp16 (the SoA layouts' d and m).
template <class V>
inline float h16(const void* p, int64_t i) { return V::fp16(static_cast<const uint8_t*>(p) + 2 * i); }

// ---- The row loop of every 32-weight-block layout: x[32b, 32b+32) loaded a chunk at a time for R
// rows, the rows innermost (as q4k_rows: their FMA chains side by side, ~10 % faster than row by
// row). chunk(n, b, c, x0, x1, t0, t1) adds chunk c (a std::integral_constant) of row n's block b
// (chunk32*); scale(n, b, macc) returns the block's scale and adds any min/offset term (through the
// block sums of x) to macc. The callers' lambdas capture by value: by reference, GCC reloads the
// captured pointers through the closure in the loop once registers run short (Q8_0: 15 % slower).
template <class V, int R, class Chunk, class Scale>
void rows32(const float* x, int64_t K, int64_t row, float* y, Chunk&& chunk, Scale&& scale) {
  constexpr int C = C16 / V::W;
  typename V::F acc[R];
  float macc[R];
  for (int r = 0; r < R; ++r) { acc[r] = V::zero(); macc[r] = 0.f; }
  for (int64_t b = 0; b < K / 32; ++b) {
    typename V::F t0[R], t1[R];
    for (int r = 0; r < R; ++r) { t0[r] = V::zero(); t1[r] = V::zero(); }
    static_for<C>([&](auto cc) {
      constexpr int c = decltype(cc)::value;
      const typename V::F x0 = V::load(x + 32 * b + c * V::W), x1 = V::load(x + 32 * b + 16 + c * V::W);
      static_for<R>([&](auto rc) {
        constexpr int r = decltype(rc)::value;
        chunk(row + r, b, cc, x0, x1, t0[r], t1[r]);
      });
    });
    static_for<R>([&](auto rc) {
      constexpr int r = decltype(rc)::value;
      acc[r] = V::fma(V::set1(scale(row + r, b, macc[r])), V::add(t0[r], t1[r]), acc[r]);
    });
  }
  for (int r = 0; r < R; ++r) y[row + r] = V::reduce(acc[r]) + macc[r];
}

// ---- SoA layouts (engine.kernels.packing): Q4_1 qs [N, K/2], d, m [N, K/32]; Q8_0 qs [N, K]
// MD: Q4_0 held as Q4_1 with m = -8 d (m never read).
template <class V, int R, bool MD>
void soa_q4_1_rows(const float* x, const float* sx, const uint8_t* qs, const void* d, const void* m, int64_t K,
                   int64_t row, float* y) {
  const int64_t nb = K / 32;
  using F = typename V::F;
  rows32<V, R>(
      x, K, row, y,
      [=](int64_t n, int64_t b, auto cc, F x0, F x1, F& t0, F& t1) {
        chunk_nib32p<V, decltype(cc)::value>(qs + n * (K / 2) + b * 16, x0, x1, t0, t1);
      },
      [=](int64_t n, int64_t b, float& macc) {
        const float dd = h16<V>(d, n * nb + b);
        macc += (MD ? -8.f * dd : h16<V>(m, n * nb + b)) * sx[b];
        if (b % 4 == 0) prefetch_next<R>(qs + n * (K / 2) + b * 16, K / 2);  // once per 64-byte line
        return dd;
      });
}

template <class V, int R>
void soa_q8_0_rows(const float* x, const int8_t* qs, const void* d, int64_t K, int64_t row, float* y) {
  const int64_t nb = K / 32;
  using F = typename V::F;
  const uint8_t* q8 = reinterpret_cast<const uint8_t*>(qs);
  rows32<V, R>(
      x, K, row, y,
      [=](int64_t n, int64_t b, auto cc, F x0, F x1, F& t0, F& t1) {
        chunk32p<V, true, decltype(cc)::value>(q8 + n * K + b * 32, x0, x1, t0, t1);
      },
      [=](int64_t n, int64_t b, float&) {
        if (b % 2 == 0) prefetch_next<R>(q8 + n * K + b * 32, K);
        return h16<V>(d, n * nb + b);
      });
}

// ---- raw 32-weight blocks: bytes(blk, lo, hi) gives the 32 quants as bytes (weights 0-15, 16-31),
// SIGNED or not; w = d * q (+ m where M_OFF >= 0, through the block sums of x).
template <class T> struct B32 { static constexpr bool OK = false; };

template <> struct B32<gguf::TQ4_0> {
  static constexpr bool OK = true, SIGNED = true;
  static constexpr int M_OFF = -1;
  template <class V> static void bytes(const uint8_t* b, typename V::B& lo, typename V::B& hi) {
    const typename V::B v = V::load16(b + 2);
    lo = V::sub8(V::nib_lo(v), 8);
    hi = V::sub8(V::nib_hi(v), 8);
  }
};
template <> struct B32<gguf::TQ4_1> {
  static constexpr bool OK = true, SIGNED = false;
  static constexpr int M_OFF = 2;
  template <class V> static void bytes(const uint8_t* b, typename V::B& lo, typename V::B& hi) {
    const typename V::B v = V::load16(b + 4);
    lo = V::nib_lo(v);
    hi = V::nib_hi(v);
  }
};
// The 5th bits: 16 where bit j of qh is set (bytes of lo: bits 0-15, hi: 16-31).
template <class V>
inline void fives(typename V::B v, uint32_t qh, typename V::B& lo, typename V::B& hi) {
  const typename V::B sixteen = V::splat8(16);
  lo = V::or8(V::nib_lo(v), V::and8(V::bits16(qh & 0xFFFF), sixteen));
  hi = V::or8(V::nib_hi(v), V::and8(V::bits16(qh >> 16), sixteen));
}
template <> struct B32<gguf::TQ5_0> {
  static constexpr bool OK = true, SIGNED = true;
  static constexpr int M_OFF = -1;
  template <class V> static void bytes(const uint8_t* b, typename V::B& lo, typename V::B& hi) {
    fives<V>(V::load16(b + 6), gguf::u32(b + 2), lo, hi);
    lo = V::sub8(lo, 16);
    hi = V::sub8(hi, 16);
  }
};
template <> struct B32<gguf::TQ5_1> {
  static constexpr bool OK = true, SIGNED = false;
  static constexpr int M_OFF = 2;
  template <class V> static void bytes(const uint8_t* b, typename V::B& lo, typename V::B& hi) {
    fives<V>(V::load16(b + 8), gguf::u32(b + 4), lo, hi);
  }
};
template <> struct B32<gguf::TQ8_0> {
  static constexpr bool OK = true, SIGNED = true;
  static constexpr int M_OFF = -1;
  template <class V> static void bytes(const uint8_t* b, typename V::B& lo, typename V::B& hi) {
    lo = V::load16(b + 2);
    hi = V::load16(b + 18);
  }
};
template <> struct B32<gguf::TIQ4_NL> {
  static constexpr bool OK = true, SIGNED = true;
  static constexpr int M_OFF = -1;
  template <class V> static void bytes(const uint8_t* b, typename V::B& lo, typename V::B& hi) {
    const typename V::B v = V::load16(b + 2);
    lo = V::lut16(gguf::kIQ4NL, V::nib_lo(v));
    hi = V::lut16(gguf::kIQ4NL, V::nib_hi(v));
  }
};

// sx: the exact float32 sums of x per 32-block (the min term).
template <class V, class T, int R>
void b32_rows(const float* x, const float* sx, const uint8_t* qs, int64_t row_bytes, int64_t K, int64_t row, float* y) {
  using P = B32<T>;
  using F = typename V::F;
  rows32<V, R>(
      x, K, row, y,
      [=](int64_t n, int64_t b, auto cc, F x0, F x1, F& t0, F& t1) {
        constexpr int c = decltype(cc)::value;
        const uint8_t* blk = qs + n * row_bytes + b * T::BYTES;
        if constexpr (std::is_same_v<T, gguf::TQ8_0>) {
          chunk32p<V, true, c>(blk + 2, x0, x1, t0, t1);
        } else if constexpr (std::is_same_v<T, gguf::TQ4_1>) {
          chunk_nib32p<V, c>(blk + 4, x0, x1, t0, t1);
        } else if constexpr (std::is_same_v<T, gguf::TQ4_0>) {  // d (q - 8): the -8 d through the block sum
          chunk_nib32p<V, c>(blk + 2, x0, x1, t0, t1);
        } else if constexpr (Q5<T>::OK && vec::has_nib5p<V>) {  // d (q - 16) (+ m): the -16 d through the sum
          chunk_nib5p<V, c>(blk + Q5<T>::QS, gguf::u32(blk + Q5<T>::QH), x0, x1, t0, t1);
        } else {  // asked for in every chunk (IQ4_NL on AVX2 runs as fast as with one decode per block)
          typename V::B lo, hi;
          P::template bytes<V>(blk, lo, hi);
          chunk32<V, P::SIGNED, c>(lo, hi, x0, x1, t0, t1);
        }
      },
      [=](int64_t n, int64_t b, float& macc) {
        const uint8_t* blk = qs + n * row_bytes + b * T::BYTES;
        if ((b * T::BYTES) % 64 < T::BYTES) prefetch_next<R>(blk, row_bytes);  // once per line
        const float d = V::fp16(blk);
        if constexpr (std::is_same_v<T, gguf::TQ4_0>) macc -= 8.f * d * sx[b];
        if constexpr (Q5<T>::OK && vec::has_nib5p<V> && P::M_OFF < 0) macc -= 16.f * d * sx[b];
        if constexpr (P::M_OFF >= 0) macc += V::fp16(blk + P::M_OFF) * sx[b];
        return d;
      });
}

// ---- raw 256-weight superblocks: prep decodes a superblock's quants to bytes in weight order
// and its group scales to floats (G weights per group: sc[g] = d * scale of group g; MINS:
// sc[256/G + g] = dmin * min, w = sc[g] * q - sc[256/G + g]), once per row and superblock; the
// dot products then read 16 quants per load with the group scale factored out.
template <class T> struct KT { static constexpr bool OK = false; };

template <> struct KT<gguf::TQ2_K> {
  static constexpr bool OK = true, SIGNED = false, MINS = true;
  static constexpr int G = 16;
  template <class V> static void prep(const uint8_t* b, uint8_t* q, float* sc) {
    const typename V::B s = V::load16(b);
    scales16<V, false>(V::nib_lo(s), V::fp16(b + 80), sc);
    scales16<V, false>(V::nib_hi(s), V::fp16(b + 82), sc + 16);
    // q[128h + 32s + l] = (b[16 + 32h + l] >> 2s) & 3: groups 8h + 2s (l < 16) and 8h + 2s + 1
    using Y = vec::Bytes32<V>;
    const auto three = Y::splat8(3);
    for (int h = 0; h < 2; ++h) {
      const auto v = Y::load(b + 16 + 32 * h);
      static_for<4>([&](auto sc_) {
        constexpr int s2 = decltype(sc_)::value;
        Y::store(q + 128 * h + 32 * s2, Y::and8(Y::template shr8<2 * s2>(v), three));
      });
    }
  }
};
template <> struct KT<gguf::TQ3_K> {
  static constexpr bool OK = true, SIGNED = true, MINS = false;
  static constexpr int G = 16;
  template <class V> static void prep(const uint8_t* b, uint8_t* q, float* sc) {
    const gguf::Bytes16 s6 = gguf::scales_q3k(b + 96);
    scales16<V, true>(V::sub8(V::from64(s6.lo, s6.hi), 32), V::fp16(b + 108), sc);
    // q[128h + 32s + l] = ((b[32 + 32h + l] >> 2s) & 3) - (bit 4h + s of b[l] ? 0 : 4)
    using Y = vec::Bytes32<V>;
    const auto three = Y::splat8(3), one = Y::splat8(1);
    const auto hm = Y::load(b);
    static_for<2>([&](auto hc) {
      constexpr int h = decltype(hc)::value;
      const auto ql = Y::load(b + 32 + 32 * h);
      static_for<4>([&](auto sc_) {
        constexpr int s2 = decltype(sc_)::value;
        const auto lo = Y::and8(Y::template shr8<2 * s2>(ql), three);
        const auto hb = Y::and8(Y::template shr8<4 * h + s2>(hm), one);
        Y::store(q + 128 * h + 32 * s2, Y::sub8(Y::or8(lo, Y::template shl8<2>(hb)), 4));
      });
    });
  }
};
template <class V>
inline void prep_k45(const uint8_t* b, const uint8_t* qs, const uint8_t* qh, uint8_t* q, float* sc) {
  const gguf::Bytes16 sm = gguf::scale_min_k4(b + 4);
  const float d = V::fp16(b), dmin = V::fp16(b + 2);
  alignas(64) float t[16];
  scales16<V, false>(V::from64(sm.lo, sm.hi), 1.f, t);
  for (int s = 0; s < 8; ++s) { sc[s] = d * t[s]; sc[8 + s] = dmin * t[8 + s]; }
  // q[64j + l] = low nibble of qs[32j + l] | bit 2j of qh[l] << 4; q[64j + 32 + l]: high, bit 2j+1
  using Y = vec::Bytes32<V>;
  const auto sixteen = Y::splat8(16);
  const auto h = qh ? Y::load(qh) : Y::splat8(0);
  static_for<4>([&](auto jc) {
    constexpr int j = decltype(jc)::value;
    const auto v = Y::load(qs + 32 * j);
    Y::store(q + 64 * j, Y::or8(Y::nib_lo(v), Y::and8(Y::template shl8<4>(Y::template shr8<2 * j>(h)), sixteen)));
    Y::store(q + 64 * j + 32, Y::or8(Y::nib_hi(v), Y::and8(Y::template shl8<4>(Y::template shr8<2 * j + 1>(h)), sixteen)));
  });
}
template <> struct KT<gguf::TQ4_K> {
  static constexpr bool OK = true, SIGNED = false, MINS = true;
  static constexpr int G = 32;
  template <class V> static void prep(const uint8_t* b, uint8_t* q, float* sc) { prep_k45<V>(b, b + 16, nullptr, q, sc); }
};
template <> struct KT<gguf::TQ5_K> {
  static constexpr bool OK = true, SIGNED = false, MINS = true;
  static constexpr int G = 32;
  template <class V> static void prep(const uint8_t* b, uint8_t* q, float* sc) { prep_k45<V>(b, b + 48, b + 16, q, sc); }
};
template <> struct KT<gguf::TQ6_K> {
  static constexpr bool OK = true, SIGNED = true, MINS = false;
  static constexpr int G = 16;
  template <class V> static void prep(const uint8_t* b, uint8_t* q, float* sc) {
    scales16<V, true>(V::load16(b + 192), V::fp16(b + 208), sc);
    // q[128h + 32k + l] = (4 bits of ql | bits 2k, 2k+1 of qh << 4) - 32, 32 bytes at a time
    using Y = vec::Bytes32<V>;
    const auto m30 = Y::splat8(0x30);
    for (int h = 0; h < 2; ++h) {
      const auto l0 = Y::load(b + 64 * h), l1 = Y::load(b + 64 * h + 32), hb = Y::load(b + 128 + 32 * h);
      uint8_t* o = q + 128 * h;
      Y::store(o, Y::sub8(Y::or8(Y::nib_lo(l0), Y::and8(Y::template shl8<4>(hb), m30)), 32));
      Y::store(o + 32, Y::sub8(Y::or8(Y::nib_lo(l1), Y::and8(Y::template shl8<2>(hb), m30)), 32));
      Y::store(o + 64, Y::sub8(Y::or8(Y::nib_hi(l0), Y::and8(hb, m30)), 32));
      Y::store(o + 96, Y::sub8(Y::or8(Y::nib_hi(l1), Y::and8(Y::template shr8<2>(hb), m30)), 32));
    }
  }
};
template <> struct KT<gguf::TIQ4_XS> {
  static constexpr bool OK = true, SIGNED = true, MINS = false;
  static constexpr int G = 32;
  template <class V> static void prep(const uint8_t* b, uint8_t* q, float* sc) {
    const float d = V::fp16(b);
    for (int s = 0; s < 8; ++s) {
      sc[s] = d * float(gguf::TIQ4_XS::scale(b, s));
      const typename V::B v = V::load16(b + 8 + 16 * s);
      store16<V>(q + 32 * s, V::lut16(gguf::kIQ4NL, V::nib_lo(v)));
      store16<V>(q + 32 * s + 16, V::lut16(gguf::kIQ4NL, V::nib_hi(v)));
    }
  }
  template <class V> static void store16(uint8_t* p, typename V::B v) { std::memcpy(p, &v, 16); }
};

// sx: the exact float32 sums of x per 32 values (the mins of the 32-weight groups).
template <class V, class T, int R>
void k_rows(const float* x, const float* sx, const uint8_t* qs, int64_t row_bytes, int64_t K, int64_t row, float* y) {
  using P = KT<T>;
  constexpr int C = C16 / V::W, NG = 256 / P::G;
  const int64_t nb = K / 256;
  alignas(64) uint8_t q[R][256];
  alignas(64) float sc[R][32];
  typename V::F acc[R];
  float macc[R];
  for (int r = 0; r < R; ++r) { acc[r] = V::zero(); macc[r] = 0.f; }
  for (int64_t b = 0; b < nb; ++b) {
    for (int r = 0; r < R; ++r) {
      const uint8_t* blk = qs + (row + r) * row_bytes + b * T::BYTES;
      for (int o = 0; o < T::BYTES; o += 64) prefetch_next<R>(blk + o, row_bytes);
      P::template prep<V>(blk, q[r], sc[r]);
    }
    const float* xb = x + 256 * b;
    float xs16[16];  // sums of x per 16 (the mins of the 16-weight groups)
    if constexpr (P::MINS && P::G == 16)
      for (int g = 0; g < 16; ++g) {
        float t = 0.f;
        for (int l = 0; l < 16; ++l) t += xb[16 * g + l];
        xs16[g] = t;
      }
    for (int s = 0; s < 8; ++s) {  // 32 weights a step: t0 weights 0-15, t1 16-31, rows innermost (q4k_rows)
      const float* xg = xb + 32 * s;
      typename V::F t0[R], t1[R];
      for (int r = 0; r < R; ++r) { t0[r] = V::zero(); t1[r] = V::zero(); }
      static_for<C>([&](auto cc) {
        constexpr int c = decltype(cc)::value;
        const typename V::F x0 = V::load(xg + c * V::W), x1 = V::load(xg + 16 + c * V::W);
        static_for<R>([&](auto rc) {
          constexpr int r = decltype(rc)::value;
          chunk32p<V, P::SIGNED, c>(q[r] + 32 * s, x0, x1, t0[r], t1[r]);
        });
      });
      static_for<R>([&](auto rc) {
        constexpr int r = decltype(rc)::value;
        if constexpr (P::G == 32) acc[r] = V::fma(V::set1(sc[r][s]), V::add(t0[r], t1[r]), acc[r]);
        else acc[r] = V::fma(V::set1(sc[r][2 * s + 1]), t1[r], V::fma(V::set1(sc[r][2 * s]), t0[r], acc[r]));
      });
    }
    if constexpr (P::MINS)
      for (int r = 0; r < R; ++r)
        for (int g = 0; g < NG; ++g) macc[r] += sc[r][NG + g] * (P::G == 32 ? sx[8 * b + g] : xs16[g]);
  }
  for (int r = 0; r < R; ++r) y[row + r] = V::reduce(acc[r]) - macc[r];
}

// Q4_K straight from its blocks (no byte pass): bytes 32j..32j+32 of qs hold sub-block 2j in their
// low nibbles and 2j+1 in their high ones, so one widened load feeds both (nibp). The activations are
// read in the loop, not held in registers: with four rows the 16 AVX2 registers would spill.
template <class V, int R>
void q4k_rows(const float* x, const float* sx, const uint8_t* qs, int64_t row_bytes, int64_t K, int64_t row, float* y) {
  constexpr int C = C16 / V::W, H = C / 2;  // chunks 0..H-1 of the unpacked bytes: scales; H..C-1: mins
  const int64_t nb = K / 256;
  alignas(64) float scb[2][R][8];
  typename V::F acc[R], macc[R];
  float mins[R];
  for (int r = 0; r < R; ++r) { acc[r] = V::zero(); macc[r] = V::zero(); mins[r] = 0.f; }
  // Block b's scales and mins into sc, the mins' term added (in block order, as before).
  auto prep = [&](int64_t b, float (*sc)[8]) {
    for (int r = 0; r < R; ++r) {
      const uint8_t* blk = qs + (row + r) * row_bytes + b * gguf::TQ4_K::BYTES;
      for (int o = 0; o < gguf::TQ4_K::BYTES; o += 64) prefetch_next<R>(blk + o, row_bytes);
      const gguf::Bytes16 sm = gguf::scale_min_k4(blk + 4);
      if constexpr (C == 1) {  // 16 lanes: the 8 scales and the 8 mins in one register
        alignas(64) float f[16];
        V::store(f, V::template u8<0>(V::from64(sm.lo, sm.hi)));
        const float d = V::fp16(blk);
        float m = 0.f;
        for (int i = 0; i < 8; ++i) {
          sc[r][i] = d * f[i];
          m += f[8 + i] * sx[8 * b + i];
        }
        mins[r] += V::fp16(blk + 2) * m;
      } else {
        // the scales and the mins each in a register of their own (AVX2: a move each, no insert or shift)
        const typename V::B s8 = V::from64(sm.lo, 0), m8 = V::from64(sm.hi, 0);
        typename V::F d, dmin;
        vec::fp16x2<V>(blk, d, dmin);
        static_for<C>([&](auto cc) {
          constexpr int c = decltype(cc)::value;
          if constexpr (c < H) V::store(sc[r] + c * V::W, V::mul(d, V::template u8<c>(s8)));
          else macc[r] = V::fma(V::mul(dmin, V::template u8<c - H>(m8)), V::load(sx + 8 * b + (c - H) * V::W), macc[r]);
        });
      }
    }
  };
  // Block b + 1's scales are decoded before block b's products: their loads (the first line of each
  // row's next block, often still on its way from memory) no longer hold up the FMAs that use them.
  prep(0, scb[0]);
  for (int64_t b = 0; b < nb; ++b) {
    if (b + 1 < nb) prep(b + 1, scb[(b + 1) & 1]);
    float(*sc)[8] = scb[b & 1];
    const float* xb = x + 256 * b;
    for (int j = 0; j < 4; ++j) {
      const float* xa = xb + 64 * j;  // sub-block 2j; 2j + 1 at xa + 32
      // Rows innermost: the R rows' independent FMA chains sit side by side in program order, so
      // the out-of-order window overlaps them (row by row, each row's chain of loads, widenings and
      // FMAs was a latency chain longer than the window covered: ~7 % slower on an AVX2 core).
      typename V::F ta[R], tc[R];
      for (int r = 0; r < R; ++r) { ta[r] = V::zero(); tc[r] = V::zero(); }
      static_for<C>([&](auto cc) {
        constexpr int c = decltype(cc)::value;
        static_for<2>([&](auto hh) {  // weights 0-15, then 16-31 of both sub-blocks
          constexpr int h = decltype(hh)::value;
          const typename V::F x0 = V::load(xa + 16 * h + c * V::W), x1 = V::load(xa + 32 + 16 * h + c * V::W);
          static_for<R>([&](auto rc) {
            constexpr int r = decltype(rc)::value;
            const uint8_t* q = qs + (row + r) * row_bytes + b * gguf::TQ4_K::BYTES + 16 + 32 * j + 16 * h;
            chunk_nib32p<V, c>(q, x0, x1, ta[r], tc[r]);
          });
        });
      });
      static_for<R>([&](auto rc) {
        constexpr int r = decltype(rc)::value;
        acc[r] = V::fma(V::set1(sc[r][2 * j + 1]), tc[r], V::fma(V::set1(sc[r][2 * j]), ta[r], acc[r]));
      });
    }
  }
  for (int r = 0; r < R; ++r) y[row + r] = V::reduce(acc[r]) - V::reduce(macc[r]) - mins[r];
}

// Rows per q4k_rows call: 3 with AVX2's 16 vector registers (4: ~5 % slower on a Zen 4 core held to
// AVX2, in cache and from memory), 4 elsewhere.
template <class V>
constexpr int q4k_group() { return V::W == 8 ? 3 : 4; }

// ---- raw F32 / F16 / BF16 rows
template <class V, class T, int R>
void half_rows(const float* x, const uint8_t* qs, int64_t row_bytes, int64_t K, int64_t row, float* y) {
  typename V::F acc[R];
  for (int r = 0; r < R; ++r) acc[r] = V::zero();
  for (int64_t i = 0; i < K; i += V::W) {
    const typename V::F xv = V::load(x + i);
    static_for<R>([&](auto rc) {
      constexpr int r = decltype(rc)::value;
      const uint8_t* p = qs + (row + r) * row_bytes;
      if ((i * int64_t(sizeof(float))) % 64 == 0) prefetch_next<R>(p + i * (row_bytes / K), row_bytes);  // 16 values: a line of F32
      typename V::F wv;
      if constexpr (std::is_same_v<T, gguf::TF32>) wv = V::load(reinterpret_cast<const float*>(p) + i);
      else if constexpr (std::is_same_v<T, gguf::TF16>) wv = V::load_f16(reinterpret_cast<const uint16_t*>(p) + i);
      else wv = V::load_bf16(reinterpret_cast<const uint16_t*>(p) + i);
      acc[r] = V::fma(wv, xv, acc[r]);
    });
  }
  for (int r = 0; r < R; ++r) y[row + r] = V::reduce(acc[r]);
}

// Rows [r0, r1) of y = W x for raw blocks of type T: 4 rows at a time, then single rows. False
// when T has no portable kernel here.
template <class V, class T>
bool raw_rows(const float* x, const float* sx, const uint8_t* qs, int64_t row_bytes, int64_t K, int64_t r0,
              int64_t r1, float* y) {
  int64_t r = r0;
  if constexpr (B32<T>::OK) {
    for (; r + 4 <= r1; r += 4) b32_rows<V, T, 4>(x, sx, qs, row_bytes, K, r, y);
    for (; r < r1; ++r) b32_rows<V, T, 1>(x, sx, qs, row_bytes, K, r, y);
    return true;
  } else if constexpr (std::is_same_v<T, gguf::TQ4_K>) {
    constexpr int R = q4k_group<V>();
    for (; r + R <= r1; r += R) q4k_rows<V, R>(x, sx, qs, row_bytes, K, r, y);
    if (R > 2 && r + 2 <= r1) q4k_rows<V, 2>(x, sx, qs, row_bytes, K, r, y), r += 2;  // a chunk's 4n rows: 0-2 left at R = 3
    for (; r < r1; ++r) q4k_rows<V, 1>(x, sx, qs, row_bytes, K, r, y);
    return true;
  } else if constexpr (KT<T>::OK) {
    for (; r + 4 <= r1; r += 4) k_rows<V, T, 4>(x, sx, qs, row_bytes, K, r, y);
    for (; r < r1; ++r) k_rows<V, T, 1>(x, sx, qs, row_bytes, K, r, y);
    return true;
  } else {
    for (; r + 4 <= r1; r += 4) half_rows<V, T, 4>(x, qs, row_bytes, K, r, y);
    for (; r < r1; ++r) half_rows<V, T, 1>(x, qs, row_bytes, K, r, y);
    return true;
  }
}

// ---- the decode step's elementwise work
template <class V>
inline float dot(const float* a, const float* b, int64_t n) {
  typename V::F acc0 = V::zero(), acc1 = V::zero();
  int64_t i = 0;
  for (; i + 2 * V::W <= n; i += 2 * V::W) {
    acc0 = V::fma(V::load(a + i), V::load(b + i), acc0);
    acc1 = V::fma(V::load(a + i + V::W), V::load(b + i + V::W), acc1);
  }
  float s = V::reduce(V::add(acc0, acc1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// s[0..4) = q . k_j for the four keys k + j * stride: their chains side by side (2 per key), so the
// FMAs do not wait on one another's latency; D a multiple of W.
template <class V>
inline void dot4(const float* q, const float* k, int64_t stride, int64_t D, float* s) {
  typename V::F a[4][2];
  for (int j = 0; j < 4; ++j) a[j][0] = a[j][1] = V::zero();
  int64_t i = 0;
  for (; i + 2 * V::W <= D; i += 2 * V::W)
    for (int h = 0; h < 2; ++h) {
      const typename V::F qv = V::load(q + i + h * V::W);
      for (int j = 0; j < 4; ++j) a[j][h] = V::fma(qv, V::load(k + j * stride + i + h * V::W), a[j][h]);
    }
  for (; i < D; i += V::W) {
    const typename V::F qv = V::load(q + i);
    for (int j = 0; j < 4; ++j) a[j][0] = V::fma(qv, V::load(k + j * stride + i), a[j][0]);
  }
  for (int j = 0; j < 4; ++j) s[j] = V::reduce(V::add(a[j][0], a[j][1]));
}

// out[0..NR W) += sum over t in [t0, t1) of p[t] * v[t * stride ..], out held in NR registers.
template <class V, int NR>
inline void weighted_rows(const float* p, const float* v, int64_t stride, int64_t t0, int64_t t1, float* out) {
  typename V::F acc[NR];
  for (int j = 0; j < NR; ++j) acc[j] = V::load(out + j * V::W);
  for (int64_t t = t0; t < t1; ++t) {
    const typename V::F pt = V::set1(p[t]);
    for (int j = 0; j < NR; ++j) acc[j] = V::fma(pt, V::load(v + t * stride + j * V::W), acc[j]);
  }
  for (int j = 0; j < NR; ++j) V::store(out + j * V::W, acc[j]);
}

// out = silu(g) * u
// Four registers at a time through vec::exp_n (the same values as one at a time).
template <class V>
inline void silu_mul(const float* g, const float* u, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 4 * V::W <= n; i += 4 * V::W) {
    typename V::F gv[4], e[4];
    for (int j = 0; j < 4; ++j) { gv[j] = V::load(g + i + j * V::W); e[j] = V::sub(V::zero(), gv[j]); }
    vec::exp_n<V, 4>(e);
    for (int j = 0; j < 4; ++j)
      V::store(out + i + j * V::W, V::mul(V::div(gv[j], V::add(e[j], V::set1(1.f))), V::load(u + i + j * V::W)));
  }
  for (; i + V::W <= n; i += V::W) {
    const typename V::F gv = V::load(g + i);
    const typename V::F e = vec::exp<V>(V::sub(V::zero(), gv));
    V::store(out + i, V::mul(V::div(gv, V::add(e, V::set1(1.f))), V::load(u + i)));
  }
  for (; i < n; ++i) out[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
}



// out = gelu(g) * u, gelu's tanh approximation written as g - g / (1 + exp(2y))
template <class V>
inline void gelu_mul(const float* g, const float* u, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 4 * V::W <= n; i += 4 * V::W) {
    typename V::F gv[4], e[4];
    for (int j = 0; j < 4; ++j) {
      gv[j] = V::load(g + i + j * V::W);
      const typename V::F g3 = V::mul(V::mul(gv[j], gv[j]), gv[j]);
      const typename V::F y = V::mul(V::set1(0.7978845608028654f), V::fma(V::set1(0.044715f), g3, gv[j]));
      e[j] = V::add(y, y);
    }
    vec::exp_n<V, 4>(e);
    for (int j = 0; j < 4; ++j)
      V::store(out + i + j * V::W,
               V::mul(V::sub(gv[j], V::div(gv[j], V::add(V::set1(1.f), e[j]))), V::load(u + i + j * V::W)));
  }
  for (; i + V::W <= n; i += V::W) {
    const typename V::F gv = V::load(g + i);
    const typename V::F g3 = V::mul(V::mul(gv, gv), gv);
    const typename V::F y = V::mul(V::set1(0.7978845608028654f), V::fma(V::set1(0.044715f), g3, gv));
    const typename V::F e = vec::exp<V>(V::add(y, y));
    V::store(out + i, V::mul(V::sub(gv, V::div(gv, V::add(V::set1(1.f), e))), V::load(u + i)));
  }
  for (; i < n; ++i) {
    const float c = 0.7978845608028654f;
    out[i] = 0.5f * g[i] * (1.f + std::tanh(c * (g[i] + 0.044715f * g[i] * g[i] * g[i]))) * u[i];
  }
}

// ---- the prefill's row work (prefill.cpp off AVX-512)
template <class V>
inline float max_of(const float* s, int64_t n) {
  float mx = -INFINITY;
  int64_t i = 0;
  if (n >= V::W) {
    typename V::F vm = V::load(s);
    if (n >= 4 * V::W) {  // four chains: max's latency, not its throughput, bounded one
      typename V::F m1 = V::load(s + V::W), m2 = V::load(s + 2 * V::W), m3 = V::load(s + 3 * V::W);
      for (i = 4 * V::W; i + 4 * V::W <= n; i += 4 * V::W) {
        vm = V::max(vm, V::load(s + i));
        m1 = V::max(m1, V::load(s + i + V::W));
        m2 = V::max(m2, V::load(s + i + 2 * V::W));
        m3 = V::max(m3, V::load(s + i + 3 * V::W));
      }
      vm = V::max(V::max(vm, m1), V::max(m2, m3));
    } else {
      i = V::W;
    }
    for (; i + V::W <= n; i += V::W) vm = V::max(vm, V::load(s + i));
    alignas(64) float t[V::W];
    V::store(t, vm);
    for (int j = 0; j < V::W; ++j) mx = t[j] > mx ? t[j] : mx;
  }
  for (; i < n; ++i) mx = s[i] > mx ? s[i] : mx;
  return mx;
}

// s[0..n) <- exp(scale * (s - mx)); returns their sum
template <class V>
inline float exp_scaled(float* s, int64_t n, float mx, float scale) {
  const typename V::F vs = V::set1(scale), vmx = V::set1(mx);
  typename V::F acc = V::zero();
  int64_t i = 0;
  for (; i + 4 * V::W <= n; i += 4 * V::W) {  // four at a time (vec::exp_n), summed in the same order
    typename V::F p[4];
    for (int j = 0; j < 4; ++j) p[j] = V::mul(V::sub(V::load(s + i + j * V::W), vmx), vs);
    vec::exp_n<V, 4>(p);
    for (int j = 0; j < 4; ++j) {
      V::store(s + i + j * V::W, p[j]);
      acc = V::add(acc, p[j]);
    }
  }
  for (; i + V::W <= n; i += V::W) {
    const typename V::F p = vec::exp<V>(V::mul(V::sub(V::load(s + i), vmx), vs));
    V::store(s + i, p);
    acc = V::add(acc, p);
  }
  float sum = V::reduce(acc);
  for (; i < n; ++i) {
    s[i] = std::exp((s[i] - mx) * scale);
    sum += s[i];
  }
  return sum;
}

// y = a * inv * w (RMSNorm's second pass); the first is dot<V>(a, a, n)
template <class V>
inline void scale_mul(const float* a, float inv, const float* w, int64_t n, float* y) {
  const typename V::F vi = V::set1(inv);
  int64_t i = 0;
  for (; i + V::W <= n; i += V::W) V::store(y + i, V::mul(V::mul(V::load(a + i), vi), V::load(w + i)));
  for (; i < n; ++i) y[i] = a[i] * inv * w[i];
}

// One row of raw 32-weight blocks of type T decoded to float32 (the prefill GEMM's panels): the
// same products as T::dequant (d * q, + m where the type has one).
template <class V, class T>
void b32_decode_row(const uint8_t* row, int64_t K, float* out) {
  using P = B32<T>;
  constexpr int C = C16 / V::W;
  for (int64_t b = 0; b < K / 32; ++b) {
    const uint8_t* blk = row + b * T::BYTES;
    typename V::B lo, hi;
    P::template bytes<V>(blk, lo, hi);
    const typename V::F d = V::set1(V::fp16(blk));
    float* o = out + 32 * b;
    static_for<C>([&](auto cc) {
      constexpr int c = decltype(cc)::value;
      typename V::F w0 = V::mul(d, conv<V, P::SIGNED, c>(lo)), w1 = V::mul(d, conv<V, P::SIGNED, c>(hi));
      if constexpr (P::M_OFF >= 0) {
        const typename V::F m = V::set1(V::fp16(blk + P::M_OFF));
        w0 = V::add(w0, m);
        w1 = V::add(w1, m);
      }
      V::store(o + c * V::W, w0);
      V::store(o + 16 + c * V::W, w1);
    });
  }
}

// One row of the SoA layouts decoded to float32: qtype 0 (Q4_1: d * q + m) or 1 (Q8_0: d * q).
template <class V>
void soa_decode_row(const uint8_t* qs, const void* d, const void* m, int64_t qtype, int64_t K, int64_t r, float* out) {
  constexpr int C = C16 / V::W;
  const int64_t nb = K / 32;
  for (int64_t b = 0; b < nb; ++b) {
    const typename V::F dd = V::set1(h16<V>(d, r * nb + b));
    float* o = out + 32 * b;
    if (qtype == 0) {
      const uint8_t* q = qs + r * (K / 2) + b * 16;
      const typename V::F mm = V::set1(h16<V>(m, r * nb + b));
      static_for<C>([&](auto cc) {
        constexpr int c = decltype(cc)::value;
        typename V::F lo, hi;
        V::template nibp<c>(q, lo, hi);
        V::store(o + c * V::W, V::add(V::mul(dd, lo), mm));
        V::store(o + 16 + c * V::W, V::add(V::mul(dd, hi), mm));
      });
    } else {
      const uint8_t* q = qs + r * K + b * 32;
      static_for<C>([&](auto cc) {
        constexpr int c = decltype(cc)::value;
        V::store(o + c * V::W, V::mul(dd, V::template s8p<c>(q)));
        V::store(o + 16 + c * V::W, V::mul(dd, V::template s8p<c>(q + 16)));
      });
    }
  }
}

}  // namespace portable
}  // namespace opscope
