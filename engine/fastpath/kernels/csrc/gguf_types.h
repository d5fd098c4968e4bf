// Decode traits of the GGUF block types, read straight from the blocks as stored in the file.
//
// Each trait T has
//   QK, BYTES                        weights per block, bytes per block
//   dequant(blk, out)                portable scalar decoder: QK float32 weights
//   decode(blk, f)                   AVX-512 decoder: calls f(c, w) for c = 0 .. QK/16-1 with the
//                                    16 weights [16c, 16c+16) as float32, already scaled (the K
//                                    types first decode the superblock's quants to bytes with
//                                    512-bit operations, 64 weights per instruction)
// and the 32-weight types with one fp16 scale per block also the matvec form of raw.cpp's
// rows_b32: D_OFF / M_OFF (byte offsets of the fp16 scale and min, -1: no min field), M_PER_D
// (an offset folded into a min, e.g. Q4_0's q - 8 as m = -8 d) and quants(blk, q0, q1), the
// unscaled weights, so the scale multiplies a block's dot product once.
// dequant and decode produce exactly gguf.quants.dequantize's values: every scale * quant product
// is exact in float32 (an fp16 scale has 11 significant bits, a sub-scale at most 8, a quant at
// most 7), so the one rounding of the types with a min ("d*q - m") is the same fused or not.
// Layouts follow ggml's block_* structs (ggml-common.h).
#pragma once
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#if defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif
#include "gguf_ids.h"
#include "vec.h"
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && !defined(OPSCOPE_PORTABLE_512)
#define OPSCOPE_AVX512_RAW 1
#endif

namespace opscope {
namespace gguf {

inline uint32_t u32(const uint8_t* p) { uint32_t v; std::memcpy(&v, p, 4); return v; }
inline uint16_t u16(const uint8_t* p) { uint16_t v; std::memcpy(&v, p, 2); return v; }
inline float fp16(const uint8_t* p) {
#if defined(__F16C__)
  return _cvtsh_ss(u16(p));  // one instruction; the portable conversion costs ~15 per block
#else
  return vec::half_to_float(u16(p));  // own conversion: no torch header here (the NEON test driver)
#endif
}

// f(std::integral_constant<int, i>) for i = 0 .. N-1, unrolled: shift counts become immediates.
template <class F, int... I>
inline void static_for_impl(F&& f, std::integer_sequence<int, I...>) { (f(std::integral_constant<int, I>{}), ...); }
template <int N, class F>
inline void static_for(F&& f) { static_for_impl(f, std::make_integer_sequence<int, N>{}); }

constexpr int8_t kIQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
alignas(64) constexpr float nl_table_ps[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// 16 bytes as two 64-bit halves (lo: bytes 0-7), computed in general registers: the scalar decoders
// copy them out, the SIMD ones move them to a vector directly (through a buffer, the 16-byte load
// would wait for the narrower stores, no store forwarding: measured about a third of the K types'
// int8 kernels' time).
struct Bytes16 {
  uint64_t lo, hi;
  void to(uint8_t* out) const { std::memcpy(out, &lo, 8); std::memcpy(out + 8, &hi, 8); }
};

// Q4_K / Q5_K: 8 six-bit scales and 8 six-bit mins packed in 12 bytes, unpacked to bytes 0-7 =
// scales, 8-15 = mins (ggml's get_scale_min_k4, eight at a time).
inline Bytes16 scale_min_k4(const uint8_t* q) {
  uint64_t lo;
  std::memcpy(&lo, q, 8);
  const uint32_t u2 = u32(q + 8);
  const uint64_t six = lo & 0x3f3f3f3f3f3f3f3full;  // scales 0-3 | mins 0-3
  const uint64_t top = ((lo >> 6) & 0x0303030303030303ull) << 4;
  const uint64_t high = (uint64_t(u2 & 0x0f0f0f0fu) | (uint64_t((u2 >> 4) & 0x0f0f0f0fu) << 32)) | top;  // 4-7 | 4-7
  return {(six & 0xffffffffull) | (high << 32), (six >> 32) | (high & 0xffffffff00000000ull)};
}

// Q3_K: 16 six-bit scales packed in 12 bytes, unpacked to 16 bytes (still offset by 32).
inline Bytes16 scales_q3k(const uint8_t* s) {
  uint64_t a01;
  std::memcpy(&a01, s, 8);
  const uint64_t t = u32(s + 8);
  constexpr uint64_t k1 = 0x0303030303030303ull, k2 = 0x0f0f0f0f0f0f0f0full;
  // bytes 0-7: a01 & k2 | bits (t >> 0 | t >> 2 per 32-bit half) << 4; bytes 8-15: a01 >> 4 ...
  const uint64_t t02 = (t & 0xffffffffull) | ((t >> 2) << 32), t46 = ((t >> 4) & 0xffffffffull) | ((t >> 6) << 32);
  return {(a01 & k2) | ((t02 & k1) << 4), ((a01 >> 4) & k2) | ((t46 & k1) << 4)};
}

#if defined(OPSCOPE_AVX512_RAW)
inline __m128i load16(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
inline __m128i lo_nib(__m128i v) { return _mm_and_si128(v, _mm_set1_epi8(0x0F)); }
inline __m128i hi_nib(__m128i v) { return _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(0x0F)); }
inline __m512 u8_ps(__m128i v) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v)); }
inline __m512 s8_ps(__m128i v) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v)); }
inline __m128i shr8(__m128i v, int n) { return _mm_srl_epi16(v, _mm_cvtsi32_si128(n)); }
inline __m128i iq4nl_table() { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4NL)); }
// 16 bytes of nibbles (byte j: weight j low, j+16 high) as float32 weights 0..15, 16..31: one
// widening for both halves.
inline void nibbles32(const uint8_t* p, __m512& q0, __m512& q1) {
  const __m512i w = _mm512_cvtepu8_epi32(load16(p));
  q0 = _mm512_cvtepi32_ps(_mm512_and_si512(w, _mm512_set1_epi32(0x0F)));
  q1 = _mm512_cvtepi32_ps(_mm512_srli_epi32(w, 4));
}
// Q5_0/Q5_1 quants: nibbles plus the 5th bit of weight j in bit j of the 32-bit qh. Each half of qh
// is loaded straight into a mask register (a load, where a shift of the mask would take a vector
// port).
inline void fives32(const uint8_t* p, const uint8_t* qh, __m512& q0, __m512& q1) {
  const __m512i w = _mm512_cvtepu8_epi32(load16(p)), sixteen = _mm512_set1_epi32(16);
  const __mmask16 k0 = _load_mask16(reinterpret_cast<__mmask16*>(const_cast<uint8_t*>(qh)));
  const __mmask16 k1 = _load_mask16(reinterpret_cast<__mmask16*>(const_cast<uint8_t*>(qh + 2)));
  const __m512i lo = _mm512_and_si512(w, _mm512_set1_epi32(0x0F)), hi = _mm512_srli_epi32(w, 4);
  q0 = _mm512_cvtepi32_ps(_mm512_mask_add_epi32(lo, k0, lo, sixteen));
  q1 = _mm512_cvtepi32_ps(_mm512_mask_add_epi32(hi, k1, hi, sixteen));
}
// The K types decode a superblock's quants with 512-bit byte operations into a 256-byte buffer
// (64 weights per instruction), then hand out 16 weights at a time widened from that buffer.
inline __m512i load64(const uint8_t* p) { return _mm512_loadu_si512(p); }
inline __m512i bcast32(const uint8_t* p) {  // 32 bytes in both halves
  return _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512i bytes(int v) { return _mm512_set1_epi8(char(v)); }
// 16-bit shift counts a (lower 32 bytes) and b (upper 32 bytes)
inline __m512i counts(int a, int b) {
  return _mm512_inserti64x4(_mm512_set1_epi16(short(a)), _mm256_set1_epi16(short(b)), 1);
}
inline __m512i bits2(int a, int b) {  // byte masks: bit a in the lower 32 bytes, bit b in the upper
  return _mm512_inserti64x4(_mm512_set1_epi8(char(1 << a)), _mm256_set1_epi8(char(1 << b)), 1);
}
inline void store64(uint8_t* p, __m512i v) { _mm512_store_si512(p, v); }
inline __m128i v16(Bytes16 b) { return _mm_set_epi64x(int64_t(b.hi), int64_t(b.lo)); }
inline __m128i scale_min_k4_v(const uint8_t* q) { return v16(scale_min_k4(q)); }
inline __m128i scales_q3k_v(const uint8_t* s) { return v16(scales_q3k(s)); }
// The fp16 scales of up to 16 blocks of BYTES bytes each (at p, p + BYTES, ...; the lanes past mask
// zero), gathered and converted at once: raw.cpp's and raw_q8.cpp's 32-weight kernels.
inline __mmask16 first_n(int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1); }
template <int BYTES>
inline __m512 gather_fp16(const uint8_t* p, __mmask16 mask) {
  const __m512i idx = _mm512_setr_epi32(0, BYTES, 2 * BYTES, 3 * BYTES, 4 * BYTES, 5 * BYTES, 6 * BYTES, 7 * BYTES,
                                        8 * BYTES, 9 * BYTES, 10 * BYTES, 11 * BYTES, 12 * BYTES, 13 * BYTES,
                                        14 * BYTES, 15 * BYTES);
  const __m512i g = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mask, idx, p, 1);
  return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g));
}
// Software prefetch of the same place R rows on, the next group of rows (contiguous after this
// one): a group ahead of use, more lines in flight than the hardware prefetcher keeps for R short
// row streams (decode step, one thread, CPU time on a loaded machine: the Q8_0, BF16, Q2_K and
// Q6_K files 1.2-1.8x tok/s). raw.cpp's float32 and raw_q8.cpp's int8 matvecs.
template <int R>
inline void prefetch_next(const uint8_t* p, int64_t row_bytes) {
  _mm_prefetch(reinterpret_cast<const char*>(p + R * row_bytes), _MM_HINT_T0);
}
// A group of R rows of blocks from row `row` on (rows row_bytes apart): their pointers, and their
// float32 accumulators zeroed (arrays of the caller's, which stay in registers).
template <int R>
inline void start_rows(const uint8_t* qs, int64_t row_bytes, int64_t row, __m512* acc, __m512* macc, const uint8_t** rp) {
  for (int r = 0; r < R; ++r) {
    acc[r] = macc[r] = _mm512_setzero_ps();
    rp[r] = qs + (row + r) * row_bytes;
  }
}

inline __m128i load16a(const uint8_t* p) { return _mm_load_si128(reinterpret_cast<const __m128i*>(p)); }
inline __m512 u8m_ps(const uint8_t* p) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(load16a(p))); }
inline __m512 s8m_ps(const uint8_t* p) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load16a(p))); }
#endif

struct TF32 {
  static constexpr int QK = 16, BYTES = 64;
  static void dequant(const uint8_t* b, float* o) { std::memcpy(o, b, 64); }
#if defined(OPSCOPE_AVX512_RAW)
  template <class F> static void decode(const uint8_t* b, F&& f) { f(0, _mm512_loadu_ps(b)); }
#endif
};

struct TF16 {
  static constexpr int QK = 16, BYTES = 32;
  static void dequant(const uint8_t* b, float* o) { for (int j = 0; j < 16; ++j) o[j] = fp16(b + 2 * j); }
#if defined(OPSCOPE_AVX512_RAW)
  template <class F> static void decode(const uint8_t* b, F&& f) {
    f(0, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b))));
  }
#endif
};

struct TBF16 {
  static constexpr int QK = 16, BYTES = 32;
  static void dequant(const uint8_t* b, float* o) {
    for (int j = 0; j < 16; ++j) { const uint32_t v = uint32_t(u16(b + 2 * j)) << 16; std::memcpy(o + j, &v, 4); }
  }
#if defined(OPSCOPE_AVX512_RAW)
  template <class F> static void decode(const uint8_t* b, F&& f) {
    const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)));
    f(0, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
  }
#endif
};

// Q4_0: fp16 d, 16 bytes of nibbles (byte j: element j low, j+16 high); w = d * (q - 8)
struct TQ4_0 {
  static constexpr int QK = 32, BYTES = 18;
  static void dequant(const uint8_t* b, float* o) {
    const float d = fp16(b);
    for (int j = 0; j < 16; ++j) { o[j] = d * float((b[2 + j] & 0xF) - 8); o[j + 16] = d * float((b[2 + j] >> 4) - 8); }
  }
#if defined(OPSCOPE_AVX512_RAW)
  // matvec form (rows_b32): w = d * q + m with q unscaled, m = -8 d
  static constexpr int D_OFF = 0, M_OFF = -1;
  static constexpr float M_PER_D = -8.f;
  static void quants(const uint8_t* b, __m512& q0, __m512& q1) { nibbles32(b + 2, q0, q1); }
  template <class F> static void decode(const uint8_t* b, F&& f) {
    const __m512 d = _mm512_set1_ps(fp16(b));
    const __m128i v = load16(b + 2), eight = _mm_set1_epi8(8);
    f(0, _mm512_mul_ps(s8_ps(_mm_sub_epi8(lo_nib(v), eight)), d));
    f(1, _mm512_mul_ps(s8_ps(_mm_sub_epi8(hi_nib(v), eight)), d));
  }
#endif
};

// Q4_1: fp16 d, fp16 m, 16 bytes of nibbles; w = d * q + m
struct TQ4_1 {
  static constexpr int QK = 32, BYTES = 20;
  static void dequant(const uint8_t* b, float* o) {
    const float d = fp16(b), m = fp16(b + 2);
    for (int j = 0; j < 16; ++j) { o[j] = d * float(b[4 + j] & 0xF) + m; o[j + 16] = d * float(b[4 + j] >> 4) + m; }
  }
#if defined(OPSCOPE_AVX512_RAW)
  static constexpr int D_OFF = 0, M_OFF = 2;
  static constexpr float M_PER_D = 0.f;
  static void quants(const uint8_t* b, __m512& q0, __m512& q1) { nibbles32(b + 4, q0, q1); }
  template <class F> static void decode(const uint8_t* b, F&& f) {
    const __m512 d = _mm512_set1_ps(fp16(b)), m = _mm512_set1_ps(fp16(b + 2));
    const __m128i v = load16(b + 4);
    f(0, _mm512_fmadd_ps(u8_ps(lo_nib(v)), d, m));
    f(1, _mm512_fmadd_ps(u8_ps(hi_nib(v)), d, m));
  }
#endif
};

// Q5_0: fp16 d, uint32 qh (bit j: 5th bit of element j), 16 bytes of nibbles; w = d * (q - 16)
struct TQ5_0 {
  static constexpr int QK = 32, BYTES = 22;
  static void dequant(const uint8_t* b, float* o) {
    const float d = fp16(b);
    const uint32_t qh = u32(b + 2);
    for (int j = 0; j < 16; ++j) {
      o[j] = d * float(int((b[6 + j] & 0xF) | (((qh >> j) & 1) << 4)) - 16);
      o[j + 16] = d * float(int((b[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16);
    }
  }
#if defined(OPSCOPE_AVX512_RAW)
  static constexpr int D_OFF = 0, M_OFF = -1;
  static constexpr float M_PER_D = -16.f;
  static constexpr int QH_OFF = 2, QS_OFF = 6;  // raw.cpp's rows_b32 reads the 5th bits itself
  static void quants(const uint8_t* b, __m512& q0, __m512& q1) { fives32(b + 6, b + 2, q0, q1); }
  template <class F> static void decode(const uint8_t* b, F&& f) {
    const __m512 d = _mm512_set1_ps(fp16(b));
    const uint32_t qh = u32(b + 2);
    const __m128i v = load16(b + 6), sixteen = _mm_set1_epi8(16);
    // q - 16, with 16 added back where the high bit is set
    const __m128i a = _mm_sub_epi8(lo_nib(v), sixteen), c = _mm_sub_epi8(hi_nib(v), sixteen);
    f(0, _mm512_mul_ps(s8_ps(_mm_mask_add_epi8(a, __mmask16(qh), a, sixteen)), d));
    f(1, _mm512_mul_ps(s8_ps(_mm_mask_add_epi8(c, __mmask16(qh >> 16), c, sixteen)), d));
  }
#endif
};

// Q5_1: fp16 d, fp16 m, uint32 qh, 16 bytes of nibbles; w = d * q + m
struct TQ5_1 {
  static constexpr int QK = 32, BYTES = 24;
  static void dequant(const uint8_t* b, float* o) {
    const float d = fp16(b), m = fp16(b + 2);
    const uint32_t qh = u32(b + 4);
    for (int j = 0; j < 16; ++j) {
      o[j] = d * float((b[8 + j] & 0xF) | (((qh >> j) & 1) << 4)) + m;
      o[j + 16] = d * float((b[8 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) + m;
    }
  }
#if defined(OPSCOPE_AVX512_RAW)
  static constexpr int D_OFF = 0, M_OFF = 2;
  static constexpr float M_PER_D = 0.f;
  static constexpr int QH_OFF = 4, QS_OFF = 8;
  static void quants(const uint8_t* b, __m512& q0, __m512& q1) { fives32(b + 8, b + 4, q0, q1); }
  template <class F> static void decode(const uint8_t* b, F&& f) {
    const __m512 d = _mm512_set1_ps(fp16(b)), m = _mm512_set1_ps(fp16(b + 2));
    const uint32_t qh = u32(b + 4);
    const __m128i v = load16(b + 8), sixteen = _mm_set1_epi8(16);
    const __m128i a = lo_nib(v), c = hi_nib(v);
    f(0, _mm512_fmadd_ps(u8_ps(_mm_mask_add_epi8(a, __mmask16(qh), a, sixteen)), d, m));
    f(1, _mm512_fmadd_ps(u8_ps(_mm_mask_add_epi8(c, __mmask16(qh >> 16), c, sixteen)), d, m));
  }
#endif
};

// Q8_0: fp16 d, 32 int8; w = d * q
struct TQ8_0 {
  static constexpr int QK = 32, BYTES = 34;
  static void dequant(const uint8_t* b, float* o) {
    const float d = fp16(b);
    for (int j = 0; j < 32; ++j) o[j] = d * float(int8_t(b[2 + j]));
  }
#if defined(OPSCOPE_AVX512_RAW)
  static constexpr int D_OFF = 0, M_OFF = -1;
  static constexpr float M_PER_D = 0.f;
  static void quants(const uint8_t* b, __m512& q0, __m512& q1) {
    q0 = s8_ps(load16(b + 2));
    q1 = s8_ps(load16(b + 18));
  }
  template <class F> static void decode(const uint8_t* b, F&& f) {
    const __m512 d = _mm512_set1_ps(fp16(b));
    f(0, _mm512_mul_ps(s8_ps(load16(b + 2)), d));
    f(1, _mm512_mul_ps(s8_ps(load16(b + 18)), d));
  }
#endif
};

// IQ4_NL: fp16 d, 16 bytes of nibbles indexing a fixed non-linear table; w = d * table[q]
struct TIQ4_NL {
  static constexpr int QK = 32, BYTES = 18;
  static void dequant(const uint8_t* b, float* o) {
    const float d = fp16(b);
    for (int j = 0; j < 16; ++j) {
      o[j] = d * float(kIQ4NL[b[2 + j] & 0xF]);
      o[j + 16] = d * float(kIQ4NL[b[2 + j] >> 4]);
    }
  }
#if defined(OPSCOPE_AVX512_RAW)
  static constexpr int D_OFF = 0, M_OFF = -1;
  static constexpr float M_PER_D = 0.f;
  // the table as float32 and looked up per 32-bit lane (vpermps reads the index's low 4 bits
  // only): no mask of the low nibbles, no conversion to float
  static void quants(const uint8_t* b, __m512& q0, __m512& q1) {
    alignas(64) static constexpr float table[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                    1, 13, 25, 38, 53, 69, 89, 113};
    const __m512 t = _mm512_load_ps(table);
    const __m512i w = _mm512_cvtepu8_epi32(load16(b + 2));
    q0 = _mm512_permutexvar_ps(w, t);
    q1 = _mm512_permutexvar_ps(_mm512_srli_epi32(w, 4), t);
  }
  // The table times d, then looked up like quants(): d * table[q] is exact in float32 (11 + 7
  // significant bits), so the values equal the per-weight products bit for bit.
  template <class F> static void decode(const uint8_t* b, F&& f) {
    const __m512 td = _mm512_mul_ps(_mm512_load_ps(nl_table_ps), _mm512_set1_ps(fp16(b)));
    const __m512i w = _mm512_cvtepu8_epi32(load16(b + 2));
    f(0, _mm512_permutexvar_ps(w, td));
    f(1, _mm512_permutexvar_ps(_mm512_srli_epi32(w, 4), td));
  }
#endif
};

// The K types (256-weight superblocks) share one shape: prep(blk, q, sc) decodes a superblock's
// quants to bytes with 512-bit operations (64 weights per instruction) into q (the 16 weights of
// chunk c at q + off(c), signed or not) and its group scales into sc: G weights per group,
// sc[g] = d * scale of group g, and for the types with mins (MINS) sc[256/G + g] = dmin * min, so
// w = sc[g] * q - sc[256/G + g]. decode_k hands these out 16 weights at a time; raw.cpp's rows_k
// factors sc[g] out of each group's dot product instead.
#if defined(OPSCOPE_AVX512_RAW)
template <class T, class F>
inline void decode_k(const uint8_t* b, F&& f) {
  alignas(64) uint8_t q[256];
  alignas(64) float sc[32];
  T::prep(b, q, sc);
  static_for<16>([&](auto cc) {
    constexpr int c = decltype(cc)::value, g = c * 16 / T::G;
    const __m512 v = T::SIGNED ? s8m_ps(q + T::off(c)) : u8m_ps(q + T::off(c));
    if constexpr (T::MINS) f(c, _mm512_fmsub_ps(v, _mm512_set1_ps(sc[g]), _mm512_set1_ps(sc[256 / T::G + g])));
    else f(c, _mm512_mul_ps(v, _mm512_set1_ps(sc[g])));
  });
}
#endif

// Q2_K (84 B): scales[16] (low nibble scale, high nibble min), qs[64] (2 bits), fp16 d, fp16 dmin.
// Group g of 16 weights: byte (g/8)*32 + (g%2)*16 + l, bits 2*((g%8)/2); w = d*sc*q - dmin*mn
struct TQ2_K {
  static constexpr int QK = 256, BYTES = 84;
  static void dequant(const uint8_t* b, float* o) {
    const float d = fp16(b + 80), dmin = fp16(b + 82);
    for (int g = 0; g < 16; ++g) {
      const float dl = d * float(b[g] & 0xF), ml = dmin * float(b[g] >> 4);
      const uint8_t* q = b + 16 + (g / 8) * 32 + (g % 2) * 16;
      const int sh = 2 * ((g % 8) / 2);
      for (int l = 0; l < 16; ++l) o[16 * g + l] = dl * float((q[l] >> sh) & 3) - ml;
    }
  }
#if defined(OPSCOPE_AVX512_RAW)
  static constexpr int G = 16;
  static constexpr bool SIGNED = false, MINS = true;
  static constexpr int off(int c) { return 16 * c; }
  static void prep(const uint8_t* b, uint8_t* q, float* sc) {
    const __m128i s = load16(b);
    _mm512_store_ps(sc, _mm512_mul_ps(u8_ps(lo_nib(s)), _mm512_set1_ps(fp16(b + 80))));
    _mm512_store_ps(sc + 16, _mm512_mul_ps(u8_ps(hi_nib(s)), _mm512_set1_ps(fp16(b + 82))));
    for (int h = 0; h < 2; ++h) {  // 128 weights from 32 bytes: shifts 0, 2 | 4, 6
      const __m512i v = bcast32(b + 16 + 32 * h);
      store64(q + 128 * h, _mm512_and_si512(_mm512_srlv_epi16(v, counts(0, 2)), bytes(3)));
      store64(q + 128 * h + 64, _mm512_and_si512(_mm512_srlv_epi16(v, counts(4, 6)), bytes(3)));
    }
  }
  template <class F> static void decode(const uint8_t* b, F&& f) { decode_k<TQ2_K>(b, f); }
#endif
};

// Q3_K (110 B): hmask[32], qs[64] (2 low bits), scales[12] (16 six-bit, offset 32), fp16 d.
// Group g: low bits as Q2_K; high bit (g/2) of hmask[(g%2)*16 + l], 4 subtracted where it is 0.
struct TQ3_K {
  static constexpr int QK = 256, BYTES = 110;
  static void dequant(const uint8_t* b, float* o) {
    const float d = fp16(b + 108);
    uint8_t sc[16];
    scales_q3k(b + 96).to(sc);
    for (int g = 0; g < 16; ++g) {
      const float dl = d * float(int(sc[g]) - 32);
      const uint8_t* q = b + 32 + (g / 8) * 32 + (g % 2) * 16;
      const uint8_t* hm = b + (g % 2) * 16;
      const int sh = 2 * ((g % 8) / 2), bit = g / 2;
      for (int l = 0; l < 16; ++l) o[16 * g + l] = dl * float(int((q[l] >> sh) & 3) - (((hm[l] >> bit) & 1) ? 0 : 4));
    }
  }
#if defined(OPSCOPE_AVX512_RAW)
  static constexpr int G = 16;
  static constexpr bool SIGNED = true, MINS = false;
  static constexpr int off(int c) { return 16 * c; }
  static void prep(const uint8_t* b, uint8_t* q, float* sc) {
    const __m128i centred = _mm_sub_epi8(scales_q3k_v(b + 96), _mm_set1_epi8(32));
    _mm512_store_ps(sc, _mm512_mul_ps(s8_ps(centred), _mm512_set1_ps(fp16(b + 108))));
    const __m512i hm = bcast32(b);
    for (int h = 0; h < 2; ++h) {  // low bits as Q2_K; 4 subtracted where hmask bit 4h+j is 0
      const __m512i v = bcast32(b + 32 + 32 * h);
      for (int p = 0; p < 2; ++p) {
        const __m512i lo = _mm512_and_si512(_mm512_srlv_epi16(v, counts(4 * p, 4 * p + 2)), bytes(3));
        const __mmask64 zero = _mm512_testn_epi8_mask(hm, bits2(4 * h + 2 * p, 4 * h + 2 * p + 1));
        store64(q + 128 * h + 64 * p, _mm512_mask_sub_epi8(lo, zero, lo, bytes(4)));
      }
    }
  }
  template <class F> static void decode(const uint8_t* b, F&& f) { decode_k<TQ3_K>(b, f); }
#endif
};

// Q4_K / Q5_K scalar decoder: fp16 d, dmin and the packed scales/mins at b; nibbles at qs; the 5th
// bits (Q5_K: bit s of qh[l] for weight l of sub-block s) at qh, or none.
inline void dequant_k45(const uint8_t* b, const uint8_t* qs, const uint8_t* qh, float* o) {
  const float d = fp16(b), dmin = fp16(b + 2);
  uint8_t sm[16];
  scale_min_k4(b + 4).to(sm);
  for (int s = 0; s < 8; ++s) {
    const float dl = d * float(sm[s]), ml = dmin * float(sm[8 + s]);
    const uint8_t* q = qs + 32 * (s / 2);
    for (int l = 0; l < 32; ++l) {
      const int hi = qh ? ((qh[l] >> s) & 1) << 4 : 0;
      o[32 * s + l] = dl * float((s % 2 ? q[l] >> 4 : q[l] & 0xF) | hi) - ml;
    }
  }
}

// Q4_K (144 B): fp16 d, fp16 dmin, scales[12] (8 six-bit scales + mins), qs[128].
// Sub-block s (32 weights): bytes qs[32*(s/2) ..], low nibbles for even s, high for odd.
struct TQ4_K {
  static constexpr int QK = 256, BYTES = 144;
  static void dequant(const uint8_t* b, float* o) { dequant_k45(b, b + 16, nullptr, o); }
#if defined(OPSCOPE_AVX512_RAW)
  static constexpr int G = 32;
  static constexpr bool SIGNED = false, MINS = true;
  // 64-byte halves z: low nibbles = sub-blocks 4z, 4z+2; high = 4z+1, 4z+3
  static constexpr int off(int c) {
    return (c / 8) * 128 + ((c / 2) % 2) * 64 + ((c / 4) % 2) * 32 + (c % 2) * 16;
  }
  static constexpr int NIB_OFF = 16;  // raw.cpp's rows_k reads the nibbles straight from here
  // sc[0..8) = d * scales, sc[8..16) = dmin * mins
  static void scales(const uint8_t* b, float* sc) {
    const __m512 dd = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(fp16(b)), _mm512_set1_ps(fp16(b + 2)));
    _mm512_store_ps(sc, _mm512_mul_ps(u8_ps(scale_min_k4_v(b + 4)), dd));
  }
  static void prep(const uint8_t* b, uint8_t* q, float* sc) {
    scales(b, sc);
    for (int z = 0; z < 2; ++z) {
      const __m512i v = load64(b + 16 + 64 * z);
      store64(q + 128 * z, _mm512_and_si512(v, bytes(0x0F)));
      store64(q + 128 * z + 64, _mm512_and_si512(_mm512_srli_epi16(v, 4), bytes(0x0F)));
    }
  }
  template <class F> static void decode(const uint8_t* b, F&& f) { decode_k<TQ4_K>(b, f); }
#endif
};

// Q5_K (176 B): fp16 d, fp16 dmin, scales[12], qh[32], qs[128]. As Q4_K, plus the 5th bit of
// weight l of sub-block s in bit s of qh[l].
struct TQ5_K {
  static constexpr int QK = 256, BYTES = 176;
  static void dequant(const uint8_t* b, float* o) { dequant_k45(b, b + 48, b + 16, o); }
#if defined(OPSCOPE_AVX512_RAW)
  static constexpr int G = 32;
  static constexpr bool SIGNED = false, MINS = true;
  static constexpr int off(int c) { return TQ4_K::off(c); }
  static void prep(const uint8_t* b, uint8_t* q, float* sc) {
    TQ4_K::scales(b, sc);
    const __m512i qh = bcast32(b + 16);
    for (int z = 0; z < 2; ++z) {  // as Q4_K, plus 16 where bit s of qh[l] is set
      const __m512i v = load64(b + 48 + 64 * z);
      const __m512i lo = _mm512_and_si512(v, bytes(0x0F)), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), bytes(0x0F));
      const __mmask64 klo = _mm512_test_epi8_mask(qh, bits2(4 * z, 4 * z + 2));
      const __mmask64 khi = _mm512_test_epi8_mask(qh, bits2(4 * z + 1, 4 * z + 3));
      store64(q + 128 * z, _mm512_mask_add_epi8(lo, klo, lo, bytes(16)));
      store64(q + 128 * z + 64, _mm512_mask_add_epi8(hi, khi, hi, bytes(16)));
    }
  }
  template <class F> static void decode(const uint8_t* b, F&& f) { decode_k<TQ5_K>(b, f); }
#endif
};

// Q6_K (210 B): ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16], fp16 d.
// Half h (128 weights), quarter k (32), l in 0..32: low bits from ql[64h + 32*(k%2) + l] (nibble
// k/2), high bits (2k) of qh[32h + l]; w = d * sc[8h + 2k + l/16] * (q - 32)
struct TQ6_K {
  static constexpr int QK = 256, BYTES = 210;
  static void dequant(const uint8_t* b, float* o) {
    const float d = fp16(b + 208);
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    for (int g = 0; g < 16; ++g) {
      const int h = g / 8, k = (g % 8) / 2, l0 = (g % 2) * 16;
      const float dl = d * float(sc[g]);
      const uint8_t* ql = b + 64 * h + 32 * (k % 2) + l0;
      const uint8_t* qh = b + 128 + 32 * h + l0;
      for (int l = 0; l < 16; ++l) {
        const int lo = k / 2 ? ql[l] >> 4 : ql[l] & 0xF;
        o[16 * g + l] = dl * float((lo | (((qh[l] >> (2 * k)) & 3) << 4)) - 32);
      }
    }
  }
#if defined(OPSCOPE_AVX512_RAW)
  static constexpr int G = 16;
  static constexpr bool SIGNED = true, MINS = false;
  static constexpr int off(int c) { return 16 * c; }
  static void prep(const uint8_t* b, uint8_t* q, float* sc) {
    _mm512_store_ps(sc, _mm512_mul_ps(s8_ps(load16(b + 192)), _mm512_set1_ps(fp16(b + 208))));
    for (int h = 0; h < 2; ++h) {  // quarters 0,1: low nibbles, qh bits 0,2; quarters 2,3: high, bits 4,6
      const __m512i v = load64(b + 64 * h), qh = bcast32(b + 128 + 32 * h);
      const __m512i lo = _mm512_and_si512(v, bytes(0x0F)), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), bytes(0x0F));
      const __m512i hlo = _mm512_slli_epi16(_mm512_srlv_epi16(qh, counts(0, 2)), 4);
      const __m512i hhi = _mm512_slli_epi16(_mm512_srlv_epi16(qh, counts(4, 6)), 4);
      // a | (b & 0x30): the two high bits in place; then the offset of 32
      store64(q + 128 * h, _mm512_sub_epi8(_mm512_ternarylogic_epi32(lo, hlo, bytes(0x30), 0xF8), bytes(32)));
      store64(q + 128 * h + 64, _mm512_sub_epi8(_mm512_ternarylogic_epi32(hi, hhi, bytes(0x30), 0xF8), bytes(32)));
    }
  }
  template <class F> static void decode(const uint8_t* b, F&& f) { decode_k<TQ6_K>(b, f); }
#endif
};

// IQ4_XS (136 B): fp16 d, uint16 scales_h, scales_l[4], qs[128]. Sub-block s (32 weights): six-bit
// scale (low nibble s%2 of scales_l[s/2], high bits 2s of scales_h) - 32; nibbles of qs[16s..]
// through the IQ4_NL table (low: weights 0..15, high: 16..31).
struct TIQ4_XS {
  static constexpr int QK = 256, BYTES = 136;
  static int scale(const uint8_t* b, int s) {
    return int(((b[4 + s / 2] >> (4 * (s % 2))) & 0xF) | (((u16(b + 2) >> (2 * s)) & 3) << 4)) - 32;
  }
  static void dequant(const uint8_t* b, float* o) {
    const float d = fp16(b);
    for (int s = 0; s < 8; ++s) {
      const float dl = d * float(scale(b, s));
      const uint8_t* q = b + 8 + 16 * s;
      for (int j = 0; j < 16; ++j) {
        o[32 * s + j] = dl * float(kIQ4NL[q[j] & 0xF]);
        o[32 * s + j + 16] = dl * float(kIQ4NL[q[j] >> 4]);
      }
    }
  }
#if defined(OPSCOPE_AVX512_RAW)
  static constexpr int G = 32;
  static constexpr bool SIGNED = true, MINS = false;
  // 16-byte lanes of the 64-byte halves z = sub-blocks 4z..4z+3; low nibbles first
  static constexpr int off(int c) { return (c / 8) * 128 + (c % 2) * 64 + ((c / 2) % 4) * 16; }
  static constexpr int NL_OFF = 8;  // raw.cpp's rows_k reads the nibbles straight from here
  // the 8 scales (6 bits - 32) as bytes: nibble s of scales_l | bits 2s, 2s+1 of scales_h << 4
  static __m128i scales_v(const uint8_t* b) {
#if defined(__BMI2__)
    const uint64_t s6 = _pdep_u64(u32(b + 4), 0x0F0F0F0F0F0F0F0Full) | (_pdep_u64(u16(b + 2), 0x0303030303030303ull) << 4);
#else
    uint64_t s6 = 0;
    for (int s = 0; s < 8; ++s) s6 |= uint64_t(scale(b, s) + 32) << (8 * s);
#endif
    return _mm_sub_epi8(_mm_cvtsi64_si128(int64_t(s6)), _mm_set1_epi8(32));
  }
  static void scales(const uint8_t* b, float* sc) {
    _mm256_store_ps(sc, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(scales_v(b))), _mm256_set1_ps(fp16(b))));
  }
  static void prep(const uint8_t* b, uint8_t* q, float* sc) {
    scales(b, sc);
    const __m512i t = _mm512_broadcast_i32x4(iq4nl_table());
    for (int z = 0; z < 2; ++z) {
      const __m512i v = load64(b + 8 + 64 * z);
      store64(q + 128 * z, _mm512_shuffle_epi8(t, _mm512_and_si512(v, bytes(0x0F))));
      store64(q + 128 * z + 64, _mm512_shuffle_epi8(t, _mm512_and_si512(_mm512_srli_epi16(v, 4), bytes(0x0F))));
    }
  }
  // Per sub-block the table times its scale d * sc (exact: 11 + 6 + 7 significant bits, the same
  // values as prep's bytes times the scale), looked up per 32-bit lane straight from the nibbles.
  template <class F> static void decode(const uint8_t* b, F&& f) {
    alignas(32) float sc[8];
    scales(b, sc);
    const __m512 t = _mm512_load_ps(nl_table_ps);
    static_for<8>([&](auto sc_) {
      constexpr int s = decltype(sc_)::value;
      const __m512 td = _mm512_mul_ps(t, _mm512_set1_ps(sc[s]));
      const __m512i w = _mm512_cvtepu8_epi32(load16(b + NL_OFF + 16 * s));
      f(2 * s, _mm512_permutexvar_ps(w, td));
      f(2 * s + 1, _mm512_permutexvar_ps(_mm512_srli_epi32(w, 4), td));
    });
  }
#endif
};

// Calls fn(T{}) with the trait of ggml type t; false when t has none.
template <class Fn>
bool with_type(int64_t t, Fn&& fn) {
  switch (t) {
    case F32: fn(TF32{}); return true;
    case F16: fn(TF16{}); return true;
    case BF16: fn(TBF16{}); return true;
    case Q4_0: fn(TQ4_0{}); return true;
    case Q4_1: fn(TQ4_1{}); return true;
    case Q5_0: fn(TQ5_0{}); return true;
    case Q5_1: fn(TQ5_1{}); return true;
    case Q8_0: fn(TQ8_0{}); return true;
    case Q2_K: fn(TQ2_K{}); return true;
    case Q3_K: fn(TQ3_K{}); return true;
    case Q4_K: fn(TQ4_K{}); return true;
    case Q5_K: fn(TQ5_K{}); return true;
    case Q6_K: fn(TQ6_K{}); return true;
    case IQ4_NL: fn(TIQ4_NL{}); return true;
    case IQ4_XS: fn(TIQ4_XS{}); return true;
    default: return false;
  }
}

}  // namespace gguf
}  // namespace opscope
