// Fused dequantize-matvec over GGUF Q4_1 / Q8_0 blocks, and a dequantize+GEMM path for prefill.
//
// Weights stay in the GGUF's quantized form, repacked once at load into structure-of-arrays per
// row (quants contiguous, fp16 scales beside them) so one load feeds a SIMD register:
//   Q4_1: qs [N, K/2] uint8 (byte j of a block: element j in the low nibble, j+16 in the high),
//         d [N, K/32] fp16, m [N, K/32] fp16;            value = d * q + m
//   Q8_0: qs [N, K] int8, d [N, K/32] fp16;               value = d * q
// Two activation modes:
//   act_mode 0 ("f32"): weights dequantized exactly to fp32 in registers, fp32 FMA accumulation.
//   act_mode 1 ("q8"):  activations quantized per 32-block to int8 (llama.cpp's Q8 scheme), integer
//                       dot products (AVX512-VNNI), fp32 accumulation of the block sums. Raw blocks
//                       of the types raw_q8.cpp covers take the same path there (the K types with
//                       activations per 256); the other raw types run float32 whatever q8 says.
// Rows are split across threads with at::parallel_for (torch's OpenMP pool, torch.set_num_threads).
#include "qkernels.h"

#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "pool.h"
#if !defined(__AVX512F__) || defined(OPSCOPE_PORTABLE_512)
#include "portable.h"  // the AVX2 / NEON / baseline variants' kernels (vec.h traits)
#endif
#if !defined(__AVX512F__)
#include "int8.h"  // the avx2 / avx2-vnni / neon variants' int8-activation kernels
#endif
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace opscope {
namespace {

constexpr int64_t GROUP_GRAIN = 4;  // 4-row groups per thread at least: tiny matrices stay on one thread

inline float h2f(const c10::Half* p, int64_t i) { return static_cast<float>(p[i]); }

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define OPSCOPE_HAVE_VNNI 1  // integer dot products (vpdpbusd) for the q8 activation mode
#endif

#include "simd_v1.h"
#include "simd_v2.h"

// Portable fallback: plain loops (the compiler vectorizes what it can for the build machine).
void q4_1_row_scalar(const float* x, const float* sx, const uint8_t* qs, const c10::Half* d,
                     const c10::Half* m, int64_t K, int64_t row, float* y) {
  const int64_t nb = K / QK;
  float acc = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* q = qs + row * (K / 2) + b * 16;
    const float* xb = x + b * QK;
    float t = 0.f;
    for (int j = 0; j < 16; ++j) t += float(q[j] & 0x0F) * xb[j] + float(q[j] >> 4) * xb[j + 16];
    acc += h2f(d, row * nb + b) * t + h2f(m, row * nb + b) * sx[b];
  }
  y[row] = acc;
}

void q8_0_row_scalar(const float* x, const int8_t* qs, const c10::Half* d, int64_t K, int64_t row,
                     float* y) {
  const int64_t nb = K / QK;
  float acc = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    const int8_t* q = qs + row * K + b * QK;
    float t = 0.f;
    for (int j = 0; j < QK; ++j) t += float(q[j]) * x[b * QK + j];
    acc += h2f(d, row * nb + b) * t;
  }
  y[row] = acc;
}

// Scalar rows with int8 activations (tails of the q8 path: same arithmetic as the SIMD kernels).
void q4_1_row_scalar_q8(const int8_t* qy, const float* dy, const float* sx, const uint8_t* qs,
                        const c10::Half* d, const c10::Half* m, int64_t K, int64_t row, float* y) {
  const int64_t nb = K / QK;
  float acc = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* q = qs + row * (K / 2) + b * 16;
    const int8_t* yb = qy + b * QK;
    int32_t t = 0;
    for (int j = 0; j < 16; ++j) t += int32_t(q[j] & 0x0F) * yb[j] + int32_t(q[j] >> 4) * yb[j + 16];
    acc += h2f(d, row * nb + b) * dy[b] * float(t) + h2f(m, row * nb + b) * sx[b];
  }
  y[row] = acc;
}

void q8_0_row_scalar_q8(const int8_t* qy, const float* dy, const int8_t* qs, const c10::Half* d, int64_t K,
                        int64_t row, float* y) {
  const int64_t nb = K / QK;
  float acc = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    int32_t t = 0;
    for (int j = 0; j < QK; ++j) t += int32_t(qs[row * K + b * QK + j]) * qy[b * QK + j];
    acc += h2f(d, row * nb + b) * dy[b] * float(t);
  }
  y[row] = acc;
}

// Per-block sums of x for the Q4_1 "+m" term (of the quantized x for q8) and, for q8, x quantized
// to int8 per block with its scale: qy in plain order and qyp in the pair order the 512-bit Q4_1 kernel reads (for blocks A, B:
// A[0:16] B[0:16] A[16:32] B[16:32], matching low nibbles of both, then high nibbles of both).
void prepare_activation(const float* x, int64_t K, bool quantize, float* sx, int8_t* qy, int8_t* qyp, float* dy) {
  const int64_t nb = K / QK;
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + b * QK;
    float s = 0.f, amax = 0.f;
    for (int j = 0; j < QK; ++j) { s += xb[j]; amax = std::max(amax, std::fabs(xb[j])); }
    sx[b] = s;
    if (!quantize) continue;
    const float scale = amax / 127.f;
    const float inv = scale > 0.f ? 1.f / scale : 0.f;
    dy[b] = scale;
    int32_t qsum = 0;
    for (int j = 0; j < QK; ++j) {
      qy[b * QK + j] = static_cast<int8_t>(std::nearbyint(xb[j] * inv));
      qsum += qy[b * QK + j];
    }
    // The Q4_1 "+m" term takes the sum of the *quantized* block (llama.cpp's q8_1 "s"), so the
    // product is exactly (d*q + m) . x_q: the rounding errors meet the centred weights w, not the
    // all-positive d*q, whose error is several times larger (measured: mean KL 4e-2 vs 6e-3).
    sx[b] = scale * float(qsum);
  }
  if (!quantize) return;
  for (int64_t b = 0; b + 1 < nb; b += 2) {
    const int8_t* a = qy + b * QK;
    int8_t* o = qyp + b * QK;
    std::copy_n(a, 16, o);
    std::copy_n(a + QK, 16, o + 16);
    std::copy_n(a + 16, 16, o + 32);
    std::copy_n(a + QK + 16, 16, o + 48);
  }
  if (nb % 2) std::copy_n(qy + (nb - 1) * QK, QK, qyp + (nb - 1) * QK);
}

struct Act {
  const float* x;
  const float* sxf;
  const float* sx;
  const int8_t* qy;
  const int8_t* qyp;
  const float* dy;
  const Q8K* k;  // the K types' int8 activations (when q8 and some matrix has such a kernel)
};

int g_variant = 2;  // 1: first kernels (per-block scalar scale conversion), 2: current

#if defined(__AVX512F__)
void group4(const Weights& w, const Act& a, bool q8, int64_t r, float* y) {
  const int8_t* q8w = reinterpret_cast<const int8_t*>(w.qs);
#if defined(OPSCOPE_HAVE_VNNI)
  if (q8 && g_variant == 1) {
    if (w.qtype == 0) q4_1_rows_q8_vnni<4>(a.qy, a.dy, a.sx, w.qs, w.d, w.m, w.K, r, y);
    else q8_0_rows_q8_vnni<4>(a.qy, a.dy, q8w, w.d, w.K, r, y);
    return;
  }
  if (q8) {
    if (w.qtype == 0 && w.m_from_d) q4_1_rows_q8_v2<4, true>(a.qyp, a.dy, a.sx, w.qs, w.d, w.m, w.K, r, y);
    else if (w.qtype == 0) q4_1_rows_q8_v2<4>(a.qyp, a.dy, a.sx, w.qs, w.d, w.m, w.K, r, y);
    else q8_0_rows_q8_v2<4>(a.qy, a.dy, q8w, w.d, w.K, r, y);
    return;
  }
#endif
  if (g_variant == 1) {
    if (w.qtype == 0) q4_1_rows_f32_avx512<4>(a.x, a.sx, w.qs, w.d, w.m, w.K, r, y);
    else q8_0_rows_f32_avx512<4>(a.x, q8w, w.d, w.K, r, y);
    return;
  }
  if (w.qtype == 0 && w.m_from_d) q4_1_rows_f32_v2<4, true>(a.x, a.sx, w.qs, w.d, w.m, w.K, r, y);
  else if (w.qtype == 0) q4_1_rows_f32_v2<4>(a.x, a.sx, w.qs, w.d, w.m, w.K, r, y);
  else q8_0_rows_f32_v2<4>(a.x, q8w, w.d, w.K, r, y);
}
#endif

#if !defined(__AVX512F__) || defined(OPSCOPE_PORTABLE_512)
// The SoA layouts through the portable kernels (exact float32), 4 rows at a time, then single rows.
void portable_rows(const Weights& w, const Act& a, int64_t r0, int64_t r1, float* y) {
  using V = vec::Vec;
  int64_t r = r0;
  if (w.qtype == 0 && w.m_from_d) {
    for (; r + 4 <= r1; r += 4) portable::soa_q4_1_rows<V, 4, true>(a.x, a.sx, w.qs, w.d, w.m, w.K, r, y);
    for (; r < r1; ++r) portable::soa_q4_1_rows<V, 1, true>(a.x, a.sx, w.qs, w.d, w.m, w.K, r, y);
  } else if (w.qtype == 0) {
    for (; r + 4 <= r1; r += 4) portable::soa_q4_1_rows<V, 4, false>(a.x, a.sx, w.qs, w.d, w.m, w.K, r, y);
    for (; r < r1; ++r) portable::soa_q4_1_rows<V, 1, false>(a.x, a.sx, w.qs, w.d, w.m, w.K, r, y);
  } else {
    const int8_t* q = reinterpret_cast<const int8_t*>(w.qs);
    for (; r + 4 <= r1; r += 4) portable::soa_q8_0_rows<V, 4>(a.x, q, w.d, w.K, r, y);
    for (; r < r1; ++r) portable::soa_q8_0_rows<V, 1>(a.x, q, w.d, w.K, r, y);
  }
}
#endif

#if defined(OPSCOPE_HAVE_INT8_VEC)
// The SoA layouts with int8 activations at 256 bits, 4 rows at a time, then single rows.
void int8_rows(const Weights& w, const Act& a, int64_t r0, int64_t r1, float* y) {
  int64_t r = r0;
  if (w.qtype == 0 && w.m_from_d) {
    for (; r + 4 <= r1; r += 4) int8x::soa_q4_1_rows_q8<4, true>(a.qy, a.dy, a.sx, w.qs, w.d, w.m, w.K, r, y);
    for (; r < r1; ++r) int8x::soa_q4_1_rows_q8<1, true>(a.qy, a.dy, a.sx, w.qs, w.d, w.m, w.K, r, y);
  } else if (w.qtype == 0) {
    for (; r + 4 <= r1; r += 4) int8x::soa_q4_1_rows_q8<4, false>(a.qy, a.dy, a.sx, w.qs, w.d, w.m, w.K, r, y);
    for (; r < r1; ++r) int8x::soa_q4_1_rows_q8<1, false>(a.qy, a.dy, a.sx, w.qs, w.d, w.m, w.K, r, y);
  } else {
    const int8_t* q = reinterpret_cast<const int8_t*>(w.qs);
    for (; r + 4 <= r1; r += 4) int8x::soa_q8_0_rows_q8<4>(a.qy, a.dy, q, w.d, w.K, r, y);
    for (; r < r1; ++r) int8x::soa_q8_0_rows_q8<1>(a.qy, a.dy, q, w.d, w.K, r, y);
  }
}
#endif

// Rows [r0, r1) of one output vector; whole 4-row groups take the SIMD path.
void rows_range(const Weights& w, const Act& a, bool q8, int64_t r0, int64_t r1, float* y) {
  if (w.raw()) {  // int8 activations where the type has a kernel for them, else float32
    if (q8 && raw_has_q8(w.ggml_type)) return raw_rows_q8(w, Act8{a.qy, a.dy, a.sx, a.k}, r0, r1, y);
    return raw_rows(w, a.x, a.sxf, r0, r1, y);
  }
  int64_t r = r0;
#if defined(__AVX512F__)
#if defined(OPSCOPE_PORTABLE_512)
  if (!q8) return portable_rows(w, a, r0, r1, y);
#endif
  for (; r + 4 <= r1; r += 4) group4(w, a, q8, r, y);
#else
  if (!q8) return portable_rows(w, a, r0, r1, y);
#if defined(OPSCOPE_HAVE_INT8_VEC)
  return int8_rows(w, a, r0, r1, y);
#endif
#endif
  for (; r < r1 && q8; ++r) {
    if (w.qtype == 0) q4_1_row_scalar_q8(a.qy, a.dy, a.sx, w.qs, w.d, w.m, w.K, r, y);
    else q8_0_row_scalar_q8(a.qy, a.dy, reinterpret_cast<const int8_t*>(w.qs), w.d, w.K, r, y);
  }
  for (; r < r1; ++r) {
    if (w.qtype == 0) q4_1_row_scalar(a.x, a.sx, w.qs, w.d, w.m, w.K, r, y);
    else q8_0_row_scalar(a.x, reinterpret_cast<const int8_t*>(w.qs), w.d, w.K, r, y);
  }
}

// OPSCOPE_DECODE_POOL=0: the matvecs through at::parallel_for (OpenMP) instead (A/B benchmarks).
bool use_pool() {
  static const bool on = [] {
    const char* v = std::getenv("OPSCOPE_DECODE_POOL");
    return v == nullptr || std::string(v) != "0";
  }();
  return on;
}

}  // namespace

void matvec_multi(const float* x, int64_t K, const Weights* ws, float* const* ys, int n, bool q8, Scratch& s) {
#if !defined(OPSCOPE_HAVE_VNNI) && !defined(OPSCOPE_HAVE_INT8_VEC)
  q8 = false;  // no integer dot product here: the exact fp32 path instead
#endif
  s.ensure(K);
  // per 32: the SoA layouts' sums (and int8 copy for q8), raw 32-weight types' int8 copy; per 256:
  // the K types' int8 copy
  bool per32 = false, raw = false, per256 = false;
  for (int i = 0; i < n; ++i) {
    const int q8_block = q8 && ws[i].raw() ? raw_q8_block(ws[i].ggml_type) : 0;
    if (!ws[i].raw() || q8_block == 32) per32 = true;
    if (ws[i].raw()) raw = true;
    if (q8_block == 256) per256 = true;
  }
  if (per32) prepare_activation(x, K, q8, s.sx.data(), s.qy.data(), s.qyp.data(), s.dy.data());
  if (per256) prepare_q8k(x, K, s.k);
  if (raw)
    for (int64_t b = 0; b < K / QK; ++b) {
      float t = 0.f;
      for (int j = 0; j < QK; ++j) t += x[b * QK + j];
      s.sxf[b] = t;
    }
  const Act a{x, s.sxf.data(), s.sx.data(), s.qy.data(), s.qyp.data(), s.dy.data(), &s.k};
  std::vector<int64_t> start(n + 1, 0);  // prefix sums of 4-row groups over the matrices
  for (int i = 0; i < n; ++i) start[i + 1] = start[i] + (ws[i].N + 3) / 4;
  auto groups = [&](int64_t g0, int64_t g1) {
    for (int i = 0; i < n; ++i) {
      const int64_t lo = std::max(g0, start[i]), hi = std::min(g1, start[i + 1]);
      if (lo < hi) rows_range(ws[i], a, q8, (lo - start[i]) * 4, std::min((hi - start[i]) * 4, ws[i].N), ys[i]);
    }
  };
  const int threads = at::get_num_threads();
  if (!use_pool()) return at::parallel_for(0, start[n], GROUP_GRAIN, groups);
  // chunks handed out dynamically (pool.h): about 8 per thread, at least GROUP_GRAIN groups each
  const int64_t chunk = std::max<int64_t>(GROUP_GRAIN, start[n] / (8 * std::max(1, threads)));
  const int64_t chunks = (start[n] + chunk - 1) / chunk;
  WorkPool::get().run(chunks, threads, [&](int64_t c) { groups(c * chunk, std::min(start[n], (c + 1) * chunk)); });
}

void dequantize_row(const Weights& w, int64_t r, float* out) {
  if (w.raw()) return raw_dequantize_row(w, r, out);
  const int64_t nb = w.K / QK;
  for (int64_t b = 0; b < nb; ++b) {
    const float dd = h2f(w.d, r * nb + b);
    float* ob = out + b * QK;
    if (w.qtype == 0) {
      const uint8_t* q = w.qs + r * (w.K / 2) + b * 16;
      const float mm = h2f(w.m, r * nb + b);
      for (int j = 0; j < 16; ++j) { ob[j] = dd * (q[j] & 0x0F) + mm; ob[j + 16] = dd * (q[j] >> 4) + mm; }
    } else {
      const int8_t* q = reinterpret_cast<const int8_t*>(w.qs) + r * w.K + b * QK;
      for (int j = 0; j < QK; ++j) ob[j] = dd * q[j];
    }
  }
}

void set_kernel_variant(int v) { g_variant = v; }

bool built_with_avx512() {
#if defined(__AVX512F__)
  return true;
#else
  return false;
#endif
}

bool built_with_int8_soa() {
#if defined(OPSCOPE_HAVE_VNNI) || defined(OPSCOPE_HAVE_INT8_VEC)
  return true;
#else
  return false;
#endif
}

bool built_with_vnni() {
#if defined(OPSCOPE_HAVE_VNNI)
  return true;
#else
  return false;
#endif
}

}  // namespace opscope
