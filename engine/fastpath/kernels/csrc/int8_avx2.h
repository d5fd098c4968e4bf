// The int8-activation matvecs (act_mode 1, llama.cpp's q8 scheme) of the repacked Q4_1 / Q8_0
// layouts and of the raw 32-weight blocks (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL) at 256 bits: the avx2 variant multiplies bytes with maddubs + madd (32 weights per
// pair of instructions), the avx2-vnni variant (AVX-VNNI: Alder Lake, Zen 5) with one vpdpbusd.
// Same arithmetic as kernels.cpp's scalar q8 rows: per block d * dy * (integer dot) (+ m * sx for
// Q4_1, sx the quantized block's sum times its scale); only the float32 summation order differs.
// The AVX-512 variants have their own (simd_v2.h).
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <utility>

#include "portable.h"
#include "vec.h"

namespace opscope {
namespace int8x {

// acc + the 8 int32 sums of 4 adjacent u8 x s8 products (no saturation for |u8| <= 128, |s8| <= 127:
// 2 * 128 * 127 < 2^15, so maddubs's int16 pairs are exact)
inline __m256i dot_u8s8(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

// The 32 nibbles of a Q4_1 SoA block (byte j: element j low, j + 16 high) in element order.
inline __m256i q4_block(const uint8_t* q) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
  const __m128i m = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}

using portable::h16;
using portable::prefetch_next;


// The row loop of the 32-weight layouts with activations per 32 (qy): block(n, b, yv, macc) returns
// {d * dy, int32 dot product} of row n's block b and adds any min term to macc.
template <int R, class Block>
void rows32_q8(const int8_t* qy, int64_t K, int64_t row, float* y, Block&& block) {
  __m256 acc[R];
  float macc[R];
  for (int r = 0; r < R; ++r) { acc[r] = _mm256_setzero_ps(); macc[r] = 0.f; }
  for (int64_t b = 0; b < K / 32; ++b) {
    const __m256i yv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qy + 32 * b));
    for (int r = 0; r < R; ++r) {
      const auto [s, p] = block(row + r, b, yv, macc[r]);
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(s), _mm256_cvtepi32_ps(p), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) y[row + r] = vec::VecAVX2::reduce(acc[r]) + macc[r];
}

// MD: Q4_0 held as Q4_1 with m = -8 d (m never read)
template <int R, bool MD>
void soa_q4_1_rows_q8(const int8_t* qy, const float* dy, const float* sx, const uint8_t* qs, const void* d,
                      const void* m, int64_t K, int64_t row, float* y) {
  const int64_t nb = K / 32;
  rows32_q8<R>(qy, K, row, y, [&](int64_t n, int64_t b, __m256i yv, float& macc) {
    const float dd = h16<vec::VecAVX2>(d, n * nb + b);
    macc += (MD ? -8.f * dd : h16<vec::VecAVX2>(m, n * nb + b)) * sx[b];
    if (b % 4 == 0) prefetch_next<R>(qs + n * (K / 2) + 16 * b, K / 2);  // once per 64-byte line
    return std::pair{dd * dy[b], dot_u8s8(_mm256_setzero_si256(), q4_block(qs + n * (K / 2) + 16 * b), yv)};
  });
}

template <int R>
void soa_q8_0_rows_q8(const int8_t* qy, const float* dy, const int8_t* qs, const void* d, int64_t K, int64_t row,
                      float* y) {
  const int64_t nb = K / 32;
  rows32_q8<R>(qy, K, row, y, [&](int64_t n, int64_t b, __m256i yv, float&) {
    if (b % 2 == 0) prefetch_next<R>(reinterpret_cast<const uint8_t*>(qs + n * K + 32 * b), K);
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + n * K + 32 * b));
    // |w| as unsigned bytes, y with w's sign: the same products, u8 x s8 as maddubs wants
    const __m256i p = dot_u8s8(_mm256_setzero_si256(), _mm256_sign_epi8(w, w), _mm256_sign_epi8(yv, w));
    return std::pair{h16<vec::VecAVX2>(d, n * nb + b) * dy[b], p};
  });
}

// Raw 32-weight blocks of type T (portable.h's B32 gives the 32 quants as bytes), R rows.
template <class T, int R>
void b32_rows_q8(const int8_t* qy, const float* dy, const float* sx, const uint8_t* qs, int64_t row_bytes,
                 int64_t K, int64_t row, float* y) {
  using P = portable::B32<T>;
  using V = vec::VecAVX2;
  rows32_q8<R>(qy, K, row, y, [&](int64_t n, int64_t b, __m256i yv, float& macc) {
    const uint8_t* blk = qs + n * row_bytes + b * T::BYTES;
    if ((b * T::BYTES) % 64 < T::BYTES) prefetch_next<R>(blk, row_bytes);  // once per line
    __m128i lo, hi;
    P::template bytes<V>(blk, lo, hi);
    const __m256i q = _mm256_set_m128i(hi, lo);
    const __m256i p = P::SIGNED ? dot_u8s8(_mm256_setzero_si256(), _mm256_sign_epi8(q, q), _mm256_sign_epi8(yv, q))
                                : dot_u8s8(_mm256_setzero_si256(), q, yv);
    if constexpr (P::M_OFF >= 0) macc += V::fp16(blk + P::M_OFF) * sx[b];
    return std::pair{V::fp16(blk) * dy[b], p};
  });
}

// ---- The K types (256-weight superblocks) with activations per 256 (prepare_q8k: llama.cpp's
// q8_K): qy the int8 values in plain order, dy their scale per 256, bs16 / bs32 the sums of qy per 16
// and per 32. Per superblock and row, vector j holds the unsigned quants u of weights [32j, 32j+32);
// maddubs(u, y) sums pairs to int16 (|u| <= 127, |y| <= 127: no saturation), madd with the group
// scale (int16) to int32, so the superblock's dot product is exact in int32 and meets the float
// scales d * dy once. Offsets (w = d*sc*(u - o)) come off as o * sum_g sc_g * bs_g, mins
// (w = d*sc*u - dmin*mn) as dmin * sum_g mn_g * bs_g: the same arithmetic as raw_q8.cpp's AVX-512
// kernels, at 256 bits.
namespace kq {

// One row's superblock scales: G16 types 16 group scales (int16, plain order), G32 types the 8
// sub-block scales each twice in an int32 (a broadcast load gives the madd operand); mn the mins
// (int16 lanes matching bs16 or bs32), sc the offset types' scales as a vector.
struct Sc {
  alignas(32) int16_t g[16];
  alignas(32) int32_t p[8];
  __m256i sc, mn;
  float d, dmin;
};

inline __m256i ld32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline __m128i ld16(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
inline __m256i b8(int v) { return _mm256_set1_epi8(char(v)); }
// bit `from` of every byte moved to bit `to` (16-bit shifts: the bits crossing a byte land outside
// the mask the callers apply)
template <int from, int to>
inline __m256i move_bits(__m256i v) {
  if constexpr (from < to) return _mm256_slli_epi16(v, to - from);
  else if constexpr (from > to) return _mm256_srli_epi16(v, from - to);
  else return v;
}

inline void g32_scales(__m128i sc8, Sc& s) {  // 8 unsigned-or-signed int16 scales -> pairs
  _mm256_store_si256(reinterpret_cast<__m256i*>(s.p),
                     _mm256_set_m128i(_mm_unpackhi_epi16(sc8, sc8), _mm_unpacklo_epi16(sc8, sc8)));
}

struct Q2 {  // w = d*sc*u - dmin*mn, groups of 16, u = 2 bits
  static constexpr int BYTES = 84, OFF_SHIFT = -1;
  static constexpr bool G32 = false, MINS = true, SIGNED = false;
  static void scales(const uint8_t* b, Sc& s) {
    const __m128i v = ld16(b);
    const __m256i sc = _mm256_cvtepu8_epi16(_mm_and_si128(v, _mm_set1_epi8(0x0F)));
    _mm256_store_si256(reinterpret_cast<__m256i*>(s.g), sc);
    s.mn = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(0x0F)));
    s.d = gguf::fp16(b + 80);
    s.dmin = gguf::fp16(b + 82);
  }
  template <int k> static void quants(const uint8_t* b, __m256i& u0, __m256i& u1) {  // vectors 2k, 2k+1
    const __m256i v = ld32(b + 16 + 32 * (k / 2));
    u0 = _mm256_and_si256(_mm256_srli_epi16(v, 4 * (k % 2)), b8(3));
    u1 = _mm256_and_si256(_mm256_srli_epi16(v, 4 * (k % 2) + 2), b8(3));
  }
};

struct Q3 {  // w = d*sc*(u - 4), u = 2 low bits + 4 * hmask bit
  static constexpr int BYTES = 110, OFF_SHIFT = 2;
  static constexpr bool G32 = false, MINS = false, SIGNED = false;
  static void scales(const uint8_t* b, Sc& s) {
    const gguf::Bytes16 q = gguf::scales_q3k(b + 96);
    const __m128i c = _mm_sub_epi8(_mm_set_epi64x(int64_t(q.hi), int64_t(q.lo)), _mm_set1_epi8(32));
    s.sc = _mm256_cvtepi8_epi16(c);
    _mm256_store_si256(reinterpret_cast<__m256i*>(s.g), s.sc);
    s.d = gguf::fp16(b + 108);
  }
  template <int k> static void quants(const uint8_t* b, __m256i& u0, __m256i& u1) {
    const __m256i v = ld32(b + 32 + 32 * (k / 2)), hm = ld32(b);
    const __m256i l0 = _mm256_and_si256(_mm256_srli_epi16(v, 4 * (k % 2)), b8(3));
    const __m256i l1 = _mm256_and_si256(_mm256_srli_epi16(v, 4 * (k % 2) + 2), b8(3));
    u0 = _mm256_or_si256(l0, _mm256_and_si256(move_bits<2 * k, 2>(hm), b8(4)));
    u1 = _mm256_or_si256(l1, _mm256_and_si256(move_bits<2 * k + 1, 2>(hm), b8(4)));
  }
};

template <bool FIVE>
struct Q45 {  // w = d*sc*u - dmin*mn per sub-block of 32; Q5_K's 5th bit from qh
  static constexpr int BYTES = FIVE ? 176 : 144, OFF_SHIFT = -1;
  static constexpr bool G32 = true, MINS = true, SIGNED = false;
  static void scales(const uint8_t* b, Sc& s) {
    const gguf::Bytes16 q = gguf::scale_min_k4(b + 4);
    g32_scales(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(q.lo))), s);
    s.mn = _mm256_zextsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(q.hi))));
    s.d = gguf::fp16(b);
    s.dmin = gguf::fp16(b + 2);
  }
  template <int k> static void quants(const uint8_t* b, __m256i& u0, __m256i& u1) {
    const __m256i v = ld32(b + (FIVE ? 48 : 16) + 32 * k);
    u0 = _mm256_and_si256(v, b8(0x0F));
    u1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), b8(0x0F));
    if constexpr (FIVE) {
      const __m256i qh = ld32(b + 16);
      u0 = _mm256_or_si256(u0, _mm256_and_si256(move_bits<2 * k, 4>(qh), b8(0x10)));
      u1 = _mm256_or_si256(u1, _mm256_and_si256(move_bits<2 * k + 1, 4>(qh), b8(0x10)));
    }
  }
};

struct Q6 {  // w = d*sc*(u - 32), u = 4 bits of ql | 2 bits of qh << 4, groups of 16
  static constexpr int BYTES = 210, OFF_SHIFT = 5;
  static constexpr bool G32 = false, MINS = false, SIGNED = false;
  static void scales(const uint8_t* b, Sc& s) {
    s.sc = _mm256_cvtepi8_epi16(ld16(b + 192));
    _mm256_store_si256(reinterpret_cast<__m256i*>(s.g), s.sc);
    s.d = gguf::fp16(b + 208);
  }
  // vector 4h + j: ql[64h + 32(j%2) + l]'s low (j < 2) or high nibble, bits 2j, 2j+1 of qh[32h + l]
  template <int k> static void quants(const uint8_t* b, __m256i& u0, __m256i& u1) {
    constexpr int h = k / 2, j = 2 * (k % 2);
    const __m256i l0 = ld32(b + 64 * h), l1 = ld32(b + 64 * h + 32), qh = ld32(b + 128 + 32 * h);
    const __m256i n0 = j ? _mm256_srli_epi16(l0, 4) : l0, n1 = j ? _mm256_srli_epi16(l1, 4) : l1;
    u0 = _mm256_or_si256(_mm256_and_si256(n0, b8(0x0F)), _mm256_and_si256(move_bits<2 * j, 4>(qh), b8(0x30)));
    u1 = _mm256_or_si256(_mm256_and_si256(n1, b8(0x0F)), _mm256_and_si256(move_bits<2 * j + 2, 4>(qh), b8(0x30)));
  }
};

struct QX {  // IQ4_XS: w = d*sc*table[n], signed (its signs move onto the activations)
  static constexpr int BYTES = 136, OFF_SHIFT = -1;
  static constexpr bool G32 = true, MINS = false, SIGNED = true;
  static void scales(const uint8_t* b, Sc& s) {
    uint64_t s6 = 0;
    for (int i = 0; i < 8; ++i) s6 |= uint64_t(uint8_t(gguf::TIQ4_XS::scale(b, i))) << (8 * i);
    g32_scales(_mm_cvtepi8_epi16(_mm_cvtsi64_si128(int64_t(s6))), s);
    s.d = gguf::fp16(b);
  }
  // sub-blocks 2k, 2k+1: 16 bytes each, low nibbles = weights 0-15, high = 16-31
  template <int k> static void quants(const uint8_t* b, __m256i& u0, __m256i& u1) {
    const __m256i t = _mm256_broadcastsi128_si256(ld16(reinterpret_cast<const uint8_t*>(gguf::kIQ4NL)));
    const __m256i v = ld32(b + 8 + 32 * k);
    const __m256i lo = _mm256_and_si256(v, b8(0x0F)), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), b8(0x0F));
    u0 = _mm256_shuffle_epi8(t, _mm256_permute2x128_si256(lo, hi, 0x20));
    u1 = _mm256_shuffle_epi8(t, _mm256_permute2x128_si256(lo, hi, 0x31));
  }
};

// the madd operand of vector j: its scale in every int16 lane (G32), or group 2j's in the low
// 128 bits and 2j+1's in the high ones (G16)
template <class T>
inline __m256i scale_of(const Sc& s, int j) {
  if constexpr (T::G32) {
    return _mm256_set1_epi32(s.p[j]);
  } else {
    int32_t pair;
    std::memcpy(&pair, s.g + 2 * j, 4);
    const __m256i idx = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                         2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
    return _mm256_shuffle_epi8(_mm256_set1_epi32(pair), idx);
  }
}

template <class T>
inline __m256i dot_scaled(__m256i acc, __m256i u, __m256i y, __m256i sc) {
  const __m256i p = T::SIGNED ? _mm256_maddubs_epi16(_mm256_sign_epi8(u, u), _mm256_sign_epi8(y, u))
                              : _mm256_maddubs_epi16(u, y);
  return _mm256_add_epi32(acc, _mm256_madd_epi16(p, sc));
}

template <class T, int R>
void rows(const int8_t* qy, const float* dy, const int16_t* bs16, const int16_t* bs32, const uint8_t* qs,
          int64_t row_bytes, int64_t K, int64_t row, float* y) {
  const int64_t nb = K / 256;
  __m256 acc[R], macc[R];
  for (int r = 0; r < R; ++r) { acc[r] = _mm256_setzero_ps(); macc[r] = _mm256_setzero_ps(); }
  for (int64_t b = 0; b < nb; ++b) {
    const int8_t* yb = qy + 256 * b;
    const __m256i bs = T::G32 ? _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bs32 + 8 * b)))
                              : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bs16 + 16 * b));
    gguf::static_for<R>([&](auto rc) {
      constexpr int r = decltype(rc)::value;
      const uint8_t* blk = qs + (row + r) * row_bytes + b * T::BYTES;
      for (int o = 0; o < T::BYTES; o += 64) prefetch_next<R>(blk + o, row_bytes);
      Sc s;
      T::scales(blk, s);
      __m256i si = _mm256_setzero_si256();
      gguf::static_for<4>([&](auto kc) {
        constexpr int k = decltype(kc)::value;
        __m256i u0, u1;
        T::template quants<k>(blk, u0, u1);
        si = dot_scaled<T>(si, u0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(yb + 64 * k)), scale_of<T>(s, 2 * k));
        si = dot_scaled<T>(si, u1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(yb + 64 * k + 32)), scale_of<T>(s, 2 * k + 1));
      });
      if constexpr (T::OFF_SHIFT >= 0) si = _mm256_sub_epi32(si, _mm256_slli_epi32(_mm256_madd_epi16(s.sc, bs), T::OFF_SHIFT));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si), _mm256_set1_ps(s.d * dy[b]), acc[r]);
      if constexpr (T::MINS)
        macc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(s.mn, bs)), _mm256_set1_ps(s.dmin * dy[b]), macc[r]);
    });
  }
  for (int r = 0; r < R; ++r) y[row + r] = vec::VecAVX2::reduce(_mm256_sub_ps(acc[r], macc[r]));
}

}  // namespace kq

}  // namespace int8x
}  // namespace opscope
