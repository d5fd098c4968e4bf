// Matvec over the K types' superblocks as stored in the file with int8 activations (act_mode 1,
// "q8"): llama.cpp's ggml_vec_dot_qN_K_q8_K scheme on AVX-512 VNNI.
//
// The activations are quantized once per call to Q8_K-style blocks (prepare_q8k): per 256 values
// one float scale amax/127, int8 values rounded to nearest (even), and the sums of the int8 values
// per 16 and per 32 (the mins' and offsets' terms). Per superblock and row the quants are decoded
// to four 64-byte vectors of unsigned bytes u (0..63), multiplied with the int8 activations by
// vpmaddubsw (pairs of u8*s8 summed to int16: at most 2*63*128, no saturation) and summed, times
// the group's scale as int16, by vpdpwssd into int32: the superblock's dot product is exact in
// int32 and meets the float scales (d * activation scale) once. Offsets (w = sc*(u - o)) come off
// as o * sum_g sc_g * (sum of activations of group g), mins (w = d*sc*u - dmin*mn) the same way
// with dmin. The result is exactly (dequantized weights) . (dequantized int8 activations) up to
// float32 rounding of the per-superblock terms and their summation.
//
// Rows are taken one at a time (R = 1), each prefetching the next row a row ahead
// (gguf::prefetch_next): the matrix is then read as one stream from its first byte to its last,
// the pattern the hardware prefetchers follow. Four rows side by side (R = 4, as the float32
// kernels do to share each activation load) are four short streams they do not follow, and their
// light int8 arithmetic then waits on memory (measured in docs/decisions/cpu-variants.md). The
// arithmetic, and so every result, is the same either way.
//
// Weights of 16-weight groups (Q2_K, Q3_K, Q6_K) decode in plain weight order; Q4_K/Q5_K's nibble
// layout puts sub-blocks s, s+2 in the low nibbles of 64 bytes and s+1, s+3 in the high ones, so
// the activations are also kept in that order (Q8K::q4).
#include "gguf_types.h"
#include "qkernels.h"
#if !defined(__AVX512F__)
#include "int8.h"  // the avx2 and neon variants' int8 kernels (the AVX-512 ones are below)
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

namespace opscope {

void prepare_q8k(const float* x, int64_t K, Q8K& a) {
  const int64_t nb = K / 256;
  a.q.resize(K);
  a.q4.resize(K);
  a.qx.resize(K);
  a.d.resize(nb);
  a.bs16.resize(nb * 16);
  a.bs32.resize(nb * 8);
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + 256 * b;
    int8_t* q = a.q.data() + 256 * b;
    float amax = 0.f;
    for (int j = 0; j < 256; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float scale = amax / 127.f;
    const float inv = scale > 0.f ? 1.f / scale : 0.f;
    a.d[b] = scale;
    for (int j = 0; j < 256; ++j) q[j] = static_cast<int8_t>(std::nearbyint(xb[j] * inv));
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int j = 0; j < 16; ++j) s += q[16 * g + j];
      a.bs16[16 * b + g] = int16_t(s);
    }
#if defined(OPSCOPE_AVX512_RAW) && defined(__AVX512VNNI__)  // the sums and orders only the 512-bit kernels read
    for (int g = 0; g < 8; ++g) a.bs32[8 * b + g] = int16_t(a.bs16[16 * b + 2 * g] + a.bs16[16 * b + 2 * g + 1]);
    int8_t* o = a.q4.data() + 256 * b;
    for (int z = 0; z < 2; ++z)  // per 128: sub-blocks 0, 2, 1, 3
      for (int k = 0; k < 4; ++k) std::copy_n(q + 128 * z + 32 * ((k % 2) * 2 + k / 2), 32, o + 128 * z + 32 * k);
    int8_t* ox = a.qx.data() + 256 * b;
    for (int z = 0; z < 2; ++z)  // per 128: first halves of sub-blocks 0..3, then second halves
      for (int k = 0; k < 8; ++k) std::copy_n(q + 128 * z + 32 * (k % 4) + 16 * (k / 4), 16, ox + 128 * z + 16 * k);
#endif
  }
}

#if defined(OPSCOPE_AVX512_RAW) && defined(__AVX512VNNI__)
#define OPSCOPE_RAW_Q8 1
namespace {
using namespace gguf;

// One superblock decoded for the integer dot product: u[j] the unsigned quants of weights
// [64j, 64j+64) (in Q8K::q4 order for Q4_K/Q5_K), sc the group scales as int16 (G16: 16 scales;
// G32: 8 scales, then the 8 mins), mn the 16 mins of Q2_K.
struct Dec {
  __m512i u[4];
  __mmask64 neg[4];  // SIGNED types: where the weight is negative (u its magnitude)
  __m256i sc, mn;
  float d, dmin;
};

inline __m512i nib_lo(__m512i v) { return _mm512_and_si512(v, bytes(0x0F)); }
inline __m512i nib_hi(__m512i v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), bytes(0x0F)); }

struct Q2 {  // w = d*sc*u - dmin*mn
  static constexpr int BYTES = 84;
  static constexpr bool G32 = false, MINS = true, SIGNED = false;
  static constexpr int ORDER = 0, OFF_SHIFT = -1;
  static void dec(const uint8_t* b, Dec& o) {
    const __m128i s = load16(b);
    o.sc = _mm256_cvtepu8_epi16(lo_nib(s));
    o.mn = _mm256_cvtepu8_epi16(hi_nib(s));
    o.d = fp16(b + 80);
    o.dmin = fp16(b + 82);
    for (int h = 0; h < 2; ++h) {
      const __m512i v = bcast32(b + 16 + 32 * h);
      o.u[2 * h] = _mm512_and_si512(_mm512_srlv_epi16(v, counts(0, 2)), bytes(3));
      o.u[2 * h + 1] = _mm512_and_si512(_mm512_srlv_epi16(v, counts(4, 6)), bytes(3));
    }
  }
};

struct Q3 {  // w = d*sc*(u - 4), u = low 2 bits + 4 * high bit
  static constexpr int BYTES = 110;
  static constexpr bool G32 = false, MINS = false, SIGNED = false;
  static constexpr int ORDER = 0, OFF_SHIFT = 2;
  static void dec(const uint8_t* b, Dec& o) {
    o.sc = _mm256_cvtepi8_epi16(_mm_sub_epi8(scales_q3k_v(b + 96), _mm_set1_epi8(32)));
    o.d = fp16(b + 108);
    const __m512i hm = bcast32(b);
    for (int h = 0; h < 2; ++h) {
      const __m512i v = bcast32(b + 32 + 32 * h);
      for (int p = 0; p < 2; ++p) {
        const __m512i lo = _mm512_and_si512(_mm512_srlv_epi16(v, counts(4 * p, 4 * p + 2)), bytes(3));
        const __mmask64 set = _mm512_test_epi8_mask(hm, bits2(4 * h + 2 * p, 4 * h + 2 * p + 1));
        o.u[2 * h + p] = _mm512_mask_add_epi8(lo, set, lo, bytes(4));
      }
    }
  }
};

template <bool FIVE>
struct Q45 {  // w = d*sc*u - dmin*mn per 32-weight sub-block
  static constexpr int BYTES = FIVE ? 176 : 144;
  static constexpr bool G32 = true, MINS = true, SIGNED = false;
  static constexpr int ORDER = 1, OFF_SHIFT = -1;
  static void dec(const uint8_t* b, Dec& o) {
    o.sc = _mm256_cvtepu8_epi16(scale_min_k4_v(b + 4));
    o.d = fp16(b);
    o.dmin = fp16(b + 2);
    const uint8_t* qs = b + (FIVE ? 48 : 16);
    for (int z = 0; z < 2; ++z) {
      const __m512i v = load64(qs + 64 * z);
      o.u[2 * z] = nib_lo(v);
      o.u[2 * z + 1] = nib_hi(v);
      if constexpr (FIVE) {
        const __m512i qh = bcast32(b + 16);
        const __mmask64 klo = _mm512_test_epi8_mask(qh, bits2(4 * z, 4 * z + 2));
        const __mmask64 khi = _mm512_test_epi8_mask(qh, bits2(4 * z + 1, 4 * z + 3));
        o.u[2 * z] = _mm512_mask_add_epi8(o.u[2 * z], klo, o.u[2 * z], bytes(16));
        o.u[2 * z + 1] = _mm512_mask_add_epi8(o.u[2 * z + 1], khi, o.u[2 * z + 1], bytes(16));
      }
    }
  }
};

struct Q6 {  // w = d*sc*(u - 32)
  static constexpr int BYTES = 210;
  static constexpr bool G32 = false, MINS = false, SIGNED = false;
  static constexpr int ORDER = 0, OFF_SHIFT = 5;
  static void dec(const uint8_t* b, Dec& o) {
    o.sc = _mm256_cvtepi8_epi16(load16(b + 192));
    o.d = fp16(b + 208);
    for (int h = 0; h < 2; ++h) {
      const __m512i v = load64(b + 64 * h), qh = bcast32(b + 128 + 32 * h);
      const __m512i hlo = _mm512_slli_epi16(_mm512_srlv_epi16(qh, counts(0, 2)), 4);
      const __m512i hhi = _mm512_slli_epi16(_mm512_srlv_epi16(qh, counts(4, 6)), 4);
      o.u[2 * h] = _mm512_ternarylogic_epi32(nib_lo(v), hlo, bytes(0x30), 0xF8);  // a | (b & c)
      o.u[2 * h + 1] = _mm512_ternarylogic_epi32(nib_hi(v), hhi, bytes(0x30), 0xF8);
    }
  }
};

// IQ4_XS: w = d*sc*table[n]; the table's magnitudes as u, its signs (negative for n < 8) moved
// onto the activations (u <= 127, |y| <= 127: no saturation). Vector 2z holds the low nibbles of
// sub-blocks 4z..4z+3 (16 bytes each), 2z+1 the high ones: activations in Q8K::qx order.
struct QX {
  static constexpr int BYTES = 136;
  static constexpr bool G32 = true, MINS = false, SIGNED = true;
  static constexpr int ORDER = 2, OFF_SHIFT = -1;
  static void dec(const uint8_t* b, Dec& o) {
    o.sc = _mm256_cvtepi8_epi16(TIQ4_XS::scales_v(b));
    o.d = fp16(b);
    alignas(16) static constexpr uint8_t mag[16] = {127, 104, 83, 65, 49, 35, 22, 10, 1, 13, 25, 38, 53, 69, 89, 113};
    const __m512i t = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(mag)));
    for (int z = 0; z < 2; ++z) {
      const __m512i v = load64(b + 8 + 64 * z);
      const __m512i lo = nib_lo(v), hi = nib_hi(v);
      o.neg[2 * z] = _mm512_testn_epi8_mask(lo, bytes(8));
      o.neg[2 * z + 1] = _mm512_testn_epi8_mask(hi, bytes(8));
      o.u[2 * z] = _mm512_shuffle_epi8(t, lo);
      o.u[2 * z + 1] = _mm512_shuffle_epi8(t, hi);
    }
  }
};

// vpermw indices spreading the int16 scales over the 32 int16 products of vector j (ORDER 0:
// plain, groups of 16; 1: Q4_K's sub-blocks s, s+2 | s+1, s+3; 2: IQ4_XS's four sub-blocks)
template <int ORDER>
inline __m512i scale_index(int j) {
  alignas(64) int16_t ix[32];
  for (int i = 0; i < 32; ++i)
    ix[i] = ORDER == 1 ? int16_t(4 * (j / 2) + (j % 2) + 2 * (i / 16))
          : ORDER == 2 ? int16_t(4 * (j / 2) + i / 8)
                       : int16_t(4 * j + i / 8);
  return _mm512_load_si512(ix);
}

template <class T, int R>
void rows_q8(const Q8K& a, const Weights& w, int64_t row, float* y) {
  const int64_t nb = w.K / 256;
  const int8_t* act = T::ORDER == 1 ? a.q4.data() : T::ORDER == 2 ? a.qx.data() : a.q.data();
  __m512i ix[4];
  for (int j = 0; j < 4; ++j) ix[j] = scale_index<T::ORDER>(j);
  __m512 acc[R];
  __m256 macc[R];
  for (int r = 0; r < R; ++r) { acc[r] = _mm512_setzero_ps(); macc[r] = _mm256_setzero_ps(); }
  for (int64_t b = 0; b < nb; ++b) {
    __m512i yv[4];
    for (int j = 0; j < 4; ++j) yv[j] = _mm512_loadu_si512(act + 256 * b + 64 * j);
    const __m256i bs16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.bs16.data() + 16 * b));
    const float dy = a.d[b];
    static_for<R>([&](auto rc) {
      constexpr int r = decltype(rc)::value;
      const uint8_t* blk = w.qs + (row + r) * w.row_bytes + b * T::BYTES;
      for (int o = 0; o < T::BYTES; o += 64) prefetch_next<R>(blk + o, w.row_bytes);  // as rows_k
      Dec o;
      T::dec(blk, o);
      const __m512i sc = _mm512_castsi256_si512(o.sc);
      __m512i si = _mm512_setzero_si512();
      for (int j = 0; j < 4; ++j) {
        __m512i yj = yv[j];
        if constexpr (T::SIGNED) yj = _mm512_mask_sub_epi8(yj, o.neg[j], _mm512_setzero_si512(), yj);
        si = _mm512_dpwssd_epi32(si, _mm512_maddubs_epi16(o.u[j], yj), _mm512_permutexvar_epi16(ix[j], sc));
      }
      if constexpr (T::OFF_SHIFT >= 0) {  // sc * (u - o): o * sum_g sc_g * (activation sum of g) off
        const __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(o.sc, bs16), T::OFF_SHIFT);
        si = _mm512_sub_epi32(si, _mm512_zextsi256_si512(off));
      }
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(si), _mm512_set1_ps(o.d * dy), acc[r]);
      if constexpr (T::MINS) {
        __m256i mi;
        if constexpr (T::G32) {
          const __m128i bs32 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a.bs32.data() + 8 * b));
          mi = _mm256_zextsi128_si256(_mm_madd_epi16(_mm256_extracti128_si256(o.sc, 1), bs32));
        } else {
          mi = _mm256_madd_epi16(o.mn, bs16);
        }
        macc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mi), _mm256_set1_ps(o.dmin * dy), macc[r]);
      }
    });
  }
  for (int r = 0; r < R; ++r)
    y[row + r] = _mm512_reduce_add_ps(_mm512_sub_ps(acc[r], _mm512_zextps256_ps512(macc[r])));
}

// The 32-weight types with activations quantized per 32 (kernels.cpp's prepare_activation, as
// llama.cpp's Q8_0/Q8_1): w = d*(u - OFF) [+ m], u unsigned (IQ4_NL: its table + 128). Two blocks
// per 512-bit vector (u: nibbles of block b, then of b+1, each as 16 low then 16 high), one
// vpdpbusd, the block scales d*dy spread over their 8 lanes each. The offset and the min meet the
// blocks' sums of the quantized activations (sx = dy * sum q) once per 16 blocks, as in rows_b32.
struct B32 {
  static constexpr int QK = 32;
};
struct B4_0 : B32 { static constexpr int BYTES = 18, M_OFF = -1, QS_OFF = 2, QH_OFF = -1, OFF = 8; static constexpr bool NL = false; };
struct B4_1 : B32 { static constexpr int BYTES = 20, M_OFF = 2, QS_OFF = 4, QH_OFF = -1, OFF = 0; static constexpr bool NL = false; };
struct B5_0 : B32 { static constexpr int BYTES = 22, M_OFF = -1, QS_OFF = 6, QH_OFF = 2, OFF = 16; static constexpr bool NL = false; };
struct B5_1 : B32 { static constexpr int BYTES = 24, M_OFF = 2, QS_OFF = 8, QH_OFF = 4, OFF = 0; static constexpr bool NL = false; };
struct BNL : B32 { static constexpr int BYTES = 18, M_OFF = -1, QS_OFF = 2, QH_OFF = -1, OFF = 128; static constexpr bool NL = true; };

// Blocks b (and b+1 when TWO) of a row as 64 unsigned bytes in the activations' plain order.
template <class T, bool TWO>
inline __m512i b32_quants(const uint8_t* blk) {
  const __m256i n0 = _mm256_broadcastsi128_si256(load16(blk + T::QS_OFF));
  const __m256i n1 = TWO ? _mm256_broadcastsi128_si256(load16(blk + T::BYTES + T::QS_OFF)) : _mm256_setzero_si256();
  const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(n0), n1, 1);
  const __m512i sh = _mm512_set_epi64(0x0004000400040004ll, 0x0004000400040004ll, 0, 0,
                                      0x0004000400040004ll, 0x0004000400040004ll, 0, 0);
  __m512i u = _mm512_and_si512(_mm512_srlv_epi16(v, sh), bytes(0x0F));
  if constexpr (T::NL) {
    alignas(16) static constexpr uint8_t tab[16] = {1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241};
    u = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(tab))), u);
  }
  if constexpr (T::QH_OFF >= 0) {
    uint64_t h = u32(blk + T::QH_OFF);
    if (TWO) h |= uint64_t(u32(blk + T::BYTES + T::QH_OFF)) << 32;
    u = _mm512_mask_add_epi8(u, _cvtu64_mask64(h), u, bytes(16));
  }
  return u;
}

template <class T, int R>
void rows_b32_q8(const Act8& a, const Weights& w, int64_t row, float* y) {
  const int64_t nb = w.K / 32;
  __m512 acc[R], macc[R];
  const uint8_t* rp[R];
  start_rows<R>(w.qs, w.row_bytes, row, acc, macc, rp);
  alignas(64) float dbuf[R][16];
  const __m512i pair = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  for (int64_t c = 0; c < nb; c += 16) {
    const int64_t n = std::min<int64_t>(16, nb - c);
    const __mmask16 mask = first_n(n);
    const __m512 dyv = _mm512_maskz_loadu_ps(mask, a.dy + c), sxv = _mm512_maskz_loadu_ps(mask, a.sx + c);
    for (int r = 0; r < R; ++r) {
      const uint8_t* base = rp[r] + c * T::BYTES;
      const __m512 dv = gather_fp16<T::BYTES>(base, mask);
      _mm512_store_ps(dbuf[r], _mm512_mul_ps(dv, dyv));
      if constexpr (T::M_OFF >= 0) macc[r] = _mm512_fmadd_ps(gather_fp16<T::BYTES>(base + T::M_OFF, mask), sxv, macc[r]);
      if constexpr (T::OFF != 0) macc[r] = _mm512_fmadd_ps(dv, _mm512_mul_ps(sxv, _mm512_set1_ps(-float(T::OFF))), macc[r]);
    }
    int64_t b = 0;
    for (; b + 2 <= n; b += 2) {
      const __m512i yv = _mm512_loadu_si512(a.qy + (c + b) * 32);
      static_for<R>([&](auto rc) {
        constexpr int r = decltype(rc)::value;
        const uint8_t* blk = rp[r] + (c + b) * T::BYTES;
        // as rows_b32, once per line: pairs start 2 * BYTES <= 64 bytes apart, so exactly one
        // starts within the first 2 * BYTES bytes of each line
        if (((c + b) * T::BYTES) % 64 < 2 * T::BYTES) prefetch_next<R>(blk, w.row_bytes);
        const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), b32_quants<T, true>(blk), yv);
        const __m512 s = _mm512_permutexvar_ps(pair, _mm512_castpd_ps(_mm512_castpd128_pd512(
                             _mm_load_sd(reinterpret_cast<const double*>(dbuf[r] + b)))));
        acc[r] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(p), acc[r]);
      });
    }
    if (b < n) {  // an odd last block: the upper half zero
      const __m512i yv = _mm512_maskz_loadu_epi8(0xFFFFFFFFull, a.qy + (c + b) * 32);
      for (int r = 0; r < R; ++r) {
        const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), b32_quants<T, false>(rp[r] + (c + b) * T::BYTES), yv);
        acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(dbuf[r][b]), _mm512_cvtepi32_ps(p), acc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) y[row + r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r], macc[r]));
}

template <class Fn>
bool with_q8_type(int64_t t, Fn&& fn) {
  switch (t) {
    case Q2_K: fn(Q2{}); return true;
    case Q3_K: fn(Q3{}); return true;
    case Q4_K: fn(Q45<false>{}); return true;
    case Q5_K: fn(Q45<true>{}); return true;
    case Q6_K: fn(Q6{}); return true;
    case IQ4_XS: fn(QX{}); return true;
    case Q4_0: fn(B4_0{}); return true;
    case Q4_1: fn(B4_1{}); return true;
    case Q5_0: fn(B5_0{}); return true;
    case Q5_1: fn(B5_1{}); return true;
    case IQ4_NL: fn(BNL{}); return true;
    default: return false;
  }
}
template <class T, class = void> struct per32 : std::false_type {};
template <class T> struct per32<T, std::void_t<decltype(T::QK)>> : std::true_type {};
}  // namespace
#endif

int raw_q8_block(int64_t ggml_type) {
  int qk = 0;
#if defined(OPSCOPE_RAW_Q8)
  with_q8_type(ggml_type, [&](auto t) { qk = per32<decltype(t)>::value ? 32 : 256; });
#elif defined(OPSCOPE_HAVE_INT8_VEC)
  if (int8x::with_b32_type(ggml_type, [](auto) {})) qk = 32;
  if (int8x::kq::with_type(ggml_type, [](auto) {})) qk = 256;
#else
  (void)ggml_type;
#endif
  return qk;
}

bool raw_has_q8(int64_t ggml_type) { return raw_q8_block(ggml_type) > 0; }

void raw_rows_q8(const Weights& w, const Act8& a, int64_t r0, int64_t r1, float* y) {
#if defined(OPSCOPE_RAW_Q8)
  with_q8_type(w.ggml_type, [&](auto t) {
    using T = decltype(t);
    for (int64_t r = r0; r < r1; ++r) {
      if constexpr (per32<T>::value) rows_b32_q8<T, 1>(a, w, r, y);
      else rows_q8<T, 1>(*a.k, w, r, y);
    }
  });
#elif defined(OPSCOPE_HAVE_INT8_VEC)
  int8x::with_b32_type(w.ggml_type, [&](auto t) {
    using T = decltype(t);
    for (int64_t r = r0; r < r1; ++r) int8x::b32_rows_q8<T, 1>(a.qy, a.dy, a.sx, w.qs, w.row_bytes, w.K, r, y);
  });
  int8x::kq::with_type(w.ggml_type, [&](auto t) {
    using T = decltype(t);
    const Q8K& k = *a.k;
    for (int64_t r = r0; r < r1; ++r) int8x::kq::rows<T, 1>(k.q.data(), k.d.data(), k.bs16.data(), w.qs, w.row_bytes, w.K, r, y);
  });
#else
  (void)w; (void)a; (void)r0; (void)r1; (void)y;
#endif
}

}  // namespace opscope
