// Matvec and dequantization over GGUF blocks as stored in the file (no repacking): the generic
// path for every type without a tuned structure-of-arrays kernel.
//
// Templated kernels over the gguf_types.h traits, 4 rows at a time sharing the activation loads,
// exact float32 weights and float32 FMA accumulation:
//   rows_b32  32-weight blocks with one fp16 scale (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL): the
//             scale factored out of each block's dot product, the min/offset through block sums of x
//   rows_k    256-weight superblocks (the K types, IQ4_XS): quants decoded to bytes and group
//             scales to floats once per superblock and row, the scale factored out per 32-group
//   rows_raw  the rest (F32, F16, BF16): 16 weights decoded at a time, two FMA chains per row.
// Rows are split across threads by the caller (matvec_multi's at::parallel_for). The int8-activation
// ("q8") kernels of the same blocks are in raw_q8.cpp.
#include "gguf_types.h"
#include "qkernels.h"

#include <algorithm>
#include <type_traits>
#include <vector>
#if !defined(OPSCOPE_AVX512_RAW)
#include "portable.h"  // the AVX2 / NEON / baseline variants' kernels (vec.h traits)
#endif

namespace opscope {
namespace {

#if defined(OPSCOPE_AVX512_RAW)
using gguf::prefetch_next;  // the next group of rows, a group ahead of use (gguf_types.h)
#endif

template <class T, int R>
void rows_raw(const float* x, const Weights& w, int64_t row, float* y) {
  const int64_t nb = w.K / T::QK;
  const uint8_t* base = w.qs + row * w.row_bytes;
#if defined(OPSCOPE_AVX512_RAW)
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + b * T::QK;
    for (int r = 0; r < R; ++r) {
      __m512* a = acc[r];
      const uint8_t* blk = base + r * w.row_bytes + b * T::BYTES;
      if ((b * T::BYTES) % 64 < T::BYTES) prefetch_next<R>(blk, w.row_bytes);  // once per line
      T::decode(blk, [&](int c, __m512 wv) {
        a[c & 1] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(xb + 16 * c), a[c & 1]);
      });
    }
  }
  for (int r = 0; r < R; ++r) y[row + r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]));
#else
  float buf[T::QK];
  for (int r = 0; r < R; ++r) {
    float acc = 0.f;
    for (int64_t b = 0; b < nb; ++b) {
      T::dequant(base + r * w.row_bytes + b * T::BYTES, buf);
      const float* xb = x + b * T::QK;
      for (int j = 0; j < T::QK; ++j) acc += buf[j] * xb[j];
    }
    y[row + r] = acc;
  }
#endif
}

#if defined(OPSCOPE_AVX512_RAW)
// The 32-weight block types with a scalar scale per block (trait::quants): the scale factored out
// of the block's dot product, as the tuned SoA kernels do. Per 16 blocks and row the fp16 scales
// are gathered and converted at once; per block and row: t = q[0:16].x0 + q[16:32].x1, acc += d*t.
// The offset or min m (w = d*q + m) enters once per 16 blocks as m . (block sums of x).
template <class T, class = void> struct factored : std::false_type {};
template <class T> struct factored<T, std::void_t<decltype(T::M_PER_D)>> : std::true_type {};

template <class T, class = void> struct five_bit : std::false_type {};
template <class T> struct five_bit<T, std::void_t<decltype(T::QH_OFF)>> : std::true_type {};

// Q5_0/Q5_1 (five_bit): with n the 16 nibble bytes of a block widened to 16 lanes (lane j: weight
// j low, j+16 high) and h = n >> 4, the block's dot product without 5th bits is
// n.x0 + h.(x1 - 16 x0) (no mask for the low nibbles), and the 5th bits add 16 x where they are
// set: masked loads of 16 x. xs holds per block 16 x[0:32] then x1 - 16 x0 (48 floats).
void prepare_x16(const float* x, int64_t K, float* xs) {
  const __m512 sixteen = _mm512_set1_ps(16.f);
  for (int64_t b = 0; b < K / 32; ++b) {
    const __m512 x0 = _mm512_loadu_ps(x + 32 * b), x1 = _mm512_loadu_ps(x + 32 * b + 16);
    _mm512_storeu_ps(xs + 48 * b, _mm512_mul_ps(x0, sixteen));
    _mm512_storeu_ps(xs + 48 * b + 16, _mm512_mul_ps(x1, sixteen));
    _mm512_storeu_ps(xs + 48 * b + 32, _mm512_fnmadd_ps(x0, sixteen, x1));
  }
}

// kmovw straight from memory (a load): compilers otherwise go through a general register, and
// the kmovw from there takes a vector port.
inline __mmask16 load_mask16(const uint8_t* p) {
  __mmask16 k;
  asm("kmovw %1, %0" : "=k"(k) : "m"(*reinterpret_cast<const uint16_t*>(p)));
  return k;
}

// x16_1 = 16 x1 and xd = x1 - 16 x0 are shared by the rows (registers); 16 x0 is loaded per row
// under the row's mask.
template <class T>
inline __m512 five_dot(const uint8_t* blk, __m512 x0, const float* xs, __m512 x16_1, __m512 xd) {
  const __m512i n = _mm512_cvtepu8_epi32(gguf::load16(blk + T::QS_OFF));
  __mmask32 k;
  asm("kmovd %1, %0" : "=k"(k) : "m"(*reinterpret_cast<const uint32_t*>(blk + T::QH_OFF)));
  const __mmask16 k0 = __mmask16(k), k1 = __mmask16(_kshiftri_mask32(k, 16));
  __m512 t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(n), x0, _mm512_maskz_loadu_ps(k0, xs));
  t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(n, 4)), xd, t);
  return _mm512_mask_add_ps(t, k1, t, x16_1);
}

template <class T, int R>
void rows_b32(const float* x, const float* sx, const float* xs, const Weights& w, int64_t row, float* y) {
  // In segments of up to SEG blocks: first the scales of every block of the segment (gathered 16
  // at a time, so the gathers' latency is off the dot products' path), then the dot products.
  constexpr int64_t SEG = 256;
  const int64_t nb = w.K / 32;
  __m512 acc[R], macc[R];
  const uint8_t* rp[R];
  gguf::start_rows<R>(w.qs, w.row_bytes, row, acc, macc, rp);
  alignas(64) float dbuf[R][SEG];
  for (int64_t s0 = 0; s0 < nb; s0 += SEG) {
    const int64_t ns = std::min<int64_t>(SEG, nb - s0);
    for (int64_t c = 0; c < ns; c += 16) {
      const __mmask16 mask = gguf::first_n(ns - c);
      const __m512 sxv = _mm512_maskz_loadu_ps(mask, sx + s0 + c);
      for (int r = 0; r < R; ++r) {
        const uint8_t* base = rp[r] + (s0 + c) * T::BYTES;
        const __m512 dv = gguf::gather_fp16<T::BYTES>(base + T::D_OFF, mask);
        _mm512_store_ps(dbuf[r] + c, dv);
        if constexpr (T::M_OFF >= 0) macc[r] = _mm512_fmadd_ps(gguf::gather_fp16<T::BYTES>(base + T::M_OFF, mask), sxv, macc[r]);
        else if constexpr (T::M_PER_D != 0.f)
          macc[r] = _mm512_fmadd_ps(dv, _mm512_mul_ps(sxv, _mm512_set1_ps(T::M_PER_D)), macc[r]);
      }
    }
    for (int64_t b = 0; b < ns; ++b) {
      const int64_t bb = s0 + b;
      const __m512 x0 = _mm512_loadu_ps(x + bb * 32), x1 = _mm512_loadu_ps(x + bb * 32 + 16);
      __m512 x16_1 = _mm512_setzero_ps(), xd = _mm512_setzero_ps();
      if constexpr (five_bit<T>::value) {
        x16_1 = _mm512_loadu_ps(xs + bb * 48 + 16);
        xd = _mm512_loadu_ps(xs + bb * 48 + 32);
        asm("" : "+v"(x16_1), "+v"(xd));  // kept in registers, not reloaded per row
      }
      gguf::static_for<R>([&](auto rc) {
        constexpr int r = decltype(rc)::value;
        const uint8_t* blk = rp[r] + bb * T::BYTES;
        if ((bb * T::BYTES) % 64 < T::BYTES) prefetch_next<R>(blk, w.row_bytes);
        __m512 t;
        if constexpr (five_bit<T>::value) {
          t = five_dot<T>(blk, x0, xs + bb * 48, x16_1, xd);
        } else {
          __m512 q0, q1;
          T::quants(blk, q0, q1);
          t = _mm512_fmadd_ps(q1, x1, _mm512_mul_ps(q0, x0));
        }
        acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(dbuf[r][b]), t, acc[r]);
      });
    }
  }
  for (int r = 0; r < R; ++r) y[row + r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r], macc[r]));
}

// The K types (gguf_types.h prep): per superblock and row the quants are decoded to bytes and the
// group scales to floats in buffers once, then read back 16 weights per load. Groups of 32 with
// their scale factored out (t = q[0:16].x0 + q[16:32].x1, acc += sc*t) and the mins through the
// 32-block sums of x, like rows_b32; groups of 16 scaled per chunk (w = sc*q [- mn], acc += w.x).
// Q4_K (NIB_OFF): the nibbles widened to 32-bit lanes straight from the block and turned into
// floats by a 16-entry vpermps (it reads the index's low 4 bits: no mask, no conversion).
template <class T, class = void> struct nibble_direct : std::false_type {};
template <class T> struct nibble_direct<T, std::void_t<decltype(T::NIB_OFF)>> : std::true_type {};

// IQ4_XS (NL_OFF): the same through the IQ4_NL table as float32 (sub-block s: 16 bytes, low
// nibbles weights 0..15, high 16..31).
template <class T, class = void> struct table_direct : std::false_type {};
template <class T> struct table_direct<T, std::void_t<decltype(T::NL_OFF)>> : std::true_type {};

template <class T, int R>
void rows_k(const float* x, const float* sx, const Weights& w, int64_t row, float* y) {
  constexpr int NG = 256 / T::G;
  const int64_t nb = w.K / 256;
  alignas(64) uint8_t q[2][R][256];
  alignas(64) float sc[2][R][32];
  __m512 acc[R];
  __m256 macc[R];
  for (int r = 0; r < R; ++r) { acc[r] = _mm512_setzero_ps(); macc[r] = _mm256_setzero_ps(); }
  auto prep = [&](int64_t b, int i) {
    for (int r = 0; r < R; ++r) {
      const uint8_t* blk = w.qs + (row + r) * w.row_bytes + b * T::BYTES;
      for (int o = 0; o < T::BYTES; o += 64) prefetch_next<R>(blk + o, w.row_bytes);
      if constexpr (nibble_direct<T>::value || table_direct<T>::value) T::scales(blk, sc[i][r]);
      else T::prep(blk, q[i][r], sc[i][r]);
    }
  };
  // Block b + 1's scales (and bytes) before block b's products: their loads no longer hold up the
  // FMAs (portable.h's q4k_rows does the same; docs/decisions/cpu-variants.md, session 23).
  prep(0, 0);
  for (int64_t b = 0; b < nb; ++b) {
    if (b + 1 < nb) prep(b + 1, int((b + 1) & 1));
    // Read the buffers back from memory: a widening load and a broadcast each, both load-port
    // work, where the compiler would otherwise keep them in registers and extract and permute.
    // Opaque pointers to the filled buffers: the reads cannot be forwarded from the stores, and
    // (unlike a memory clobber) the accumulators stay in registers.
    const uint8_t* qp = &q[b & 1][0][0];
    const float* sp = &sc[b & 1][0][0];
    asm volatile("" : "+r"(qp), "+r"(sp) : "m"(q), "m"(sc));
    const float* xb = x + b * 256;
    auto qv = [&](int r, int c) {
      return T::SIGNED ? gguf::s8m_ps(qp + 256 * r + T::off(c)) : gguf::u8m_ps(qp + 256 * r + T::off(c));
    };
    if constexpr (nibble_direct<T>::value) {
      const __m512 tab = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
      gguf::static_for<4>([&](auto jc) {  // sub-blocks 2j (low nibbles), 2j+1 (high) of 32 bytes
        constexpr int j = decltype(jc)::value;
        const __m512 x0 = _mm512_loadu_ps(xb + 64 * j), x1 = _mm512_loadu_ps(xb + 64 * j + 16);
        const __m512 x2 = _mm512_loadu_ps(xb + 64 * j + 32), x3 = _mm512_loadu_ps(xb + 64 * j + 48);
        gguf::static_for<R>([&](auto rc) {
          constexpr int r = decltype(rc)::value;
          const uint8_t* nib = w.qs + (row + r) * w.row_bytes + b * T::BYTES + T::NIB_OFF + 32 * j;
          const __m512i w0 = _mm512_cvtepu8_epi32(gguf::load16(nib)), w1 = _mm512_cvtepu8_epi32(gguf::load16(nib + 16));
          const __m512 te = _mm512_fmadd_ps(_mm512_permutexvar_ps(w1, tab), x1, _mm512_mul_ps(_mm512_permutexvar_ps(w0, tab), x0));
          const __m512 to = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(w1, 4), tab), x3,
                                            _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(w0, 4), tab), x2));
          acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(sp[32 * r + 2 * j]), te, acc[r]);
          acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(sp[32 * r + 2 * j + 1]), to, acc[r]);
        });
      });
      const __m256 sxv = _mm256_loadu_ps(sx + 8 * b);
      for (int r = 0; r < R; ++r) macc[r] = _mm256_fmadd_ps(_mm256_load_ps(sp + 32 * r + NG), sxv, macc[r]);
    } else if constexpr (table_direct<T>::value) {
      alignas(64) static constexpr float table[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                      1, 13, 25, 38, 53, 69, 89, 113};
      const __m512 tab = _mm512_load_ps(table);
      gguf::static_for<8>([&](auto sc_) {
        constexpr int s = decltype(sc_)::value;
        const __m512 x0 = _mm512_loadu_ps(xb + 32 * s), x1 = _mm512_loadu_ps(xb + 32 * s + 16);
        gguf::static_for<R>([&](auto rc) {
          constexpr int r = decltype(rc)::value;
          const uint8_t* nib = w.qs + (row + r) * w.row_bytes + b * T::BYTES + T::NL_OFF + 16 * s;
          const __m512i v = _mm512_cvtepu8_epi32(gguf::load16(nib));
          const __m512 t = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), tab), x1,
                                           _mm512_mul_ps(_mm512_permutexvar_ps(v, tab), x0));
          acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(sp[32 * r + s]), t, acc[r]);
        });
      });
    } else if constexpr (T::G == 32) {
      gguf::static_for<8>([&](auto sc_) {
        constexpr int s = decltype(sc_)::value;
        const __m512 x0 = _mm512_loadu_ps(xb + 32 * s), x1 = _mm512_loadu_ps(xb + 32 * s + 16);
        gguf::static_for<R>([&](auto rc) {
          constexpr int r = decltype(rc)::value;
          const __m512 t = _mm512_fmadd_ps(qv(r, 2 * s + 1), x1, _mm512_mul_ps(qv(r, 2 * s), x0));
          acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(sp[32 * r + s]), t, acc[r]);
        });
      });
      if constexpr (T::MINS) {
        const __m256 sxv = _mm256_loadu_ps(sx + 8 * b);
        for (int r = 0; r < R; ++r) macc[r] = _mm256_fmadd_ps(_mm256_load_ps(sp + 32 * r + NG), sxv, macc[r]);
      }
    } else {
      gguf::static_for<16>([&](auto cc) {
        constexpr int c = decltype(cc)::value;
        const __m512 xc = _mm512_loadu_ps(xb + 16 * c);
        gguf::static_for<R>([&](auto rc) {
          constexpr int r = decltype(rc)::value;
          const __m512 v = qv(r, c);
          const float* g = sp + 32 * r;
          const __m512 wv = T::MINS ? _mm512_fmsub_ps(v, _mm512_set1_ps(g[c]), _mm512_set1_ps(g[NG + c]))
                                    : _mm512_mul_ps(v, _mm512_set1_ps(g[c]));
          acc[r] = _mm512_fmadd_ps(wv, xc, acc[r]);
        });
      });
    }
  }
  for (int r = 0; r < R; ++r)  // w = sc*q - mn: the mins' term subtracted
    y[row + r] = _mm512_reduce_add_ps(_mm512_sub_ps(acc[r], _mm512_zextps256_ps512(macc[r])));
}
#endif  // OPSCOPE_AVX512_RAW

}  // namespace

int64_t raw_block_size(int64_t ggml_type) {
  int64_t qk = 0;
  gguf::with_type(ggml_type, [&](auto t) { qk = decltype(t)::QK; });
  return qk;
}

int64_t raw_row_bytes(int64_t ggml_type, int64_t K) {
  int64_t n = -1;
  gguf::with_type(ggml_type, [&](auto t) {
    using T = decltype(t);
    if (K % T::QK == 0) n = K / T::QK * T::BYTES;
  });
  return n;
}

void raw_rows(const Weights& w, const float* x, const float* sx, int64_t r0, int64_t r1, float* y) {
  gguf::with_type(w.ggml_type, [&](auto t) {
    using T = decltype(t);
    int64_t r = r0;
#if defined(OPSCOPE_AVX512_RAW)
    if constexpr (factored<T>::value) {
      const float* xs = nullptr;
      if constexpr (five_bit<T>::value) {
        thread_local std::vector<float> buf;
        buf.resize(w.K / 32 * 48);
        prepare_x16(x, w.K, buf.data());
        xs = buf.data();
      }
      for (; r + 4 <= r1; r += 4) rows_b32<T, 4>(x, sx, xs, w, r, y);
      for (; r < r1; ++r) rows_b32<T, 1>(x, sx, xs, w, r, y);
      return;
    }
    if constexpr (T::QK == 256) {
      for (; r + 4 <= r1; r += 4) rows_k<T, 4>(x, sx, w, r, y);
      for (; r < r1; ++r) rows_k<T, 1>(x, sx, w, r, y);
      return;
    }
#else
    if (portable::raw_rows<vec::Vec, T>(x, sx, w.qs, w.row_bytes, w.K, r0, r1, y)) return;
#endif
    for (; r + 4 <= r1; r += 4) rows_raw<T, 4>(x, w, r, y);
    for (; r < r1; ++r) rows_raw<T, 1>(x, w, r, y);
  });
}

void raw_dequantize_row(const Weights& w, int64_t r, float* out) {
  gguf::with_type(w.ggml_type, [&](auto t) {
    using T = decltype(t);
    const uint8_t* row = w.qs + r * w.row_bytes;
    for (int64_t b = 0; b < w.K / T::QK; ++b) {
      float* ob = out + b * T::QK;
#if defined(OPSCOPE_AVX512_RAW)
      T::decode(row + b * T::BYTES, [&](int c, __m512 wv) { _mm512_storeu_ps(ob + 16 * c, wv); });
#else
      T::dequant(row + b * T::BYTES, ob);
#endif
    }
  });
}

void raw_dequantize_row_scalar(const Weights& w, int64_t r, float* out) {
  gguf::with_type(w.ggml_type, [&](auto t) {
    using T = decltype(t);
    const uint8_t* row = w.qs + r * w.row_bytes;
    for (int64_t b = 0; b < w.K / T::QK; ++b) T::dequant(row + b * T::BYTES, out + b * T::QK);
  });
}

}  // namespace opscope
