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
//                       dot products (AVX512-VNNI), fp32 accumulation of the block sums.
// Rows are split across threads with at::parallel_for (torch's OpenMP pool, torch.set_num_threads).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <cmath>
#include <sched.h>
#include <cstdint>
#include <vector>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t QK = 32;  // elements per GGUF block for Q4_1 and Q8_0
constexpr int64_t ROW_GRAIN = 16;

inline float h2f(const c10::Half* p, int64_t i) { return static_cast<float>(p[i]); }

#if defined(__AVX512F__)
inline float hsum512(__m512 v) { return _mm512_reduce_add_ps(v); }

// 4 rows at a time share every activation load and give 4 independent FMA chains.
template <int R>
void q4_1_rows_f32_avx512(const float* x, const float* sx, const uint8_t* qs, const c10::Half* d,
                          const c10::Half* m, int64_t K, int64_t row, float* y) {
  const int64_t nb = K / QK;
  __m512 acc[R];
  float macc[R];
  for (int r = 0; r < R; ++r) { acc[r] = _mm512_setzero_ps(); macc[r] = 0.f; }
  const __m512i lo_mask = _mm512_set1_epi32(0x0F);
  for (int64_t b = 0; b < nb; ++b) {
    const __m512 x0 = _mm512_loadu_ps(x + b * QK);
    const __m512 x1 = _mm512_loadu_ps(x + b * QK + 16);
    for (int r = 0; r < R; ++r) {
      const int64_t rr = row + r;
      const __m512i w = _mm512_cvtepu8_epi32(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + rr * (K / 2) + b * 16)));
      const __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(w, lo_mask));
      const __m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(w, 4));
      const __m512 t = _mm512_fmadd_ps(hi, x1, _mm512_mul_ps(lo, x0));
      acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(h2f(d, rr * nb + b)), t, acc[r]);
      macc[r] += h2f(m, rr * nb + b) * sx[b];
    }
  }
  for (int r = 0; r < R; ++r) y[row + r] = hsum512(acc[r]) + macc[r];
}

template <int R>
void q8_0_rows_f32_avx512(const float* x, const int8_t* qs, const c10::Half* d, int64_t K,
                          int64_t row, float* y) {
  const int64_t nb = K / QK;
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const __m512 x0 = _mm512_loadu_ps(x + b * QK);
    const __m512 x1 = _mm512_loadu_ps(x + b * QK + 16);
    for (int r = 0; r < R; ++r) {
      const int8_t* q = qs + (row + r) * K + b * QK;
      const __m512 w0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
          reinterpret_cast<const __m128i*>(q))));
      const __m512 w1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
          reinterpret_cast<const __m128i*>(q + 16))));
      const __m512 t = _mm512_fmadd_ps(w1, x1, _mm512_mul_ps(w0, x0));
      acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(h2f(d, (row + r) * nb + b)), t, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) y[row + r] = hsum512(acc[r]);
}
#endif

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define OPSCOPE_HAVE_VNNI 1
// Activations as int8 (qy) with a scale per block (dy); u8 nibbles x s8 activations → int32.
template <int R>
void q4_1_rows_q8_vnni(const int8_t* qy, const float* dy, const float* sx, const uint8_t* qs,
                       const c10::Half* d, const c10::Half* m, int64_t K, int64_t row, float* y) {
  const int64_t nb = K / QK;
  __m256 acc[R];
  float macc[R];
  for (int r = 0; r < R; ++r) { acc[r] = _mm256_setzero_ps(); macc[r] = 0.f; }
  const __m128i lo_mask = _mm_set1_epi8(0x0F);
  for (int64_t b = 0; b < nb; ++b) {
    const __m256i yv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qy + b * QK));
    for (int r = 0; r < R; ++r) {
      const int64_t rr = row + r;
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + rr * (K / 2) + b * 16));
      const __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), lo_mask),
                                         _mm_and_si128(v, lo_mask));
      const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q, yv);
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(h2f(d, rr * nb + b) * dy[b]), _mm256_cvtepi32_ps(p), acc[r]);
      macc[r] += h2f(m, rr * nb + b) * sx[b];
    }
  }
  for (int r = 0; r < R; ++r) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc[r]), _mm256_extractf128_ps(acc[r], 1));
    const __m128 s2 = _mm_add_ps(s, _mm_movehl_ps(s, s));
    y[row + r] = _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1))) + macc[r];
  }
}

// Signed x signed through the u8 x s8 instruction: |w| x (sign(w) * y).
template <int R>
void q8_0_rows_q8_vnni(const int8_t* qy, const float* dy, const int8_t* qs, const c10::Half* d,
                       int64_t K, int64_t row, float* y) {
  const int64_t nb = K / QK;
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const __m256i yv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qy + b * QK));
    for (int r = 0; r < R; ++r) {
      const int64_t rr = row + r;
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + rr * K + b * QK));
      const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(w, w),
                                            _mm256_sign_epi8(yv, w));
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(h2f(d, rr * nb + b) * dy[b]), _mm256_cvtepi32_ps(p), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc[r]), _mm256_extractf128_ps(acc[r], 1));
    const __m128 s2 = _mm_add_ps(s, _mm_movehl_ps(s, s));
    y[row + r] = _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
  }
}
#endif

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

// Per-block sums of x (the Q4_1 "+m" term) and, for act_mode 1, x quantized to int8 per block.
void prepare_activation(const float* x, int64_t K, bool quantize, float* sx, int8_t* qy, float* dy) {
  for (int64_t b = 0; b < K / QK; ++b) {
    const float* xb = x + b * QK;
    float s = 0.f, amax = 0.f;
    for (int j = 0; j < QK; ++j) { s += xb[j]; amax = std::max(amax, std::fabs(xb[j])); }
    sx[b] = s;
    if (!quantize) continue;
    const float scale = amax / 127.f;
    const float inv = scale > 0.f ? 1.f / scale : 0.f;
    dy[b] = scale;
    for (int j = 0; j < QK; ++j) qy[b * QK + j] = static_cast<int8_t>(std::nearbyint(xb[j] * inv));
  }
}

struct Weights {
  int64_t qtype;  // 0 = Q4_1, 1 = Q8_0
  const uint8_t* qs;
  const c10::Half* d;
  const c10::Half* m;
  int64_t N, K;
};

struct Act {
  const float* x;
  const float* sx;
  const int8_t* qy;
  const float* dy;
};

// Rows [r0, r1) of one output vector; whole 4-row groups take the SIMD path.
void rows_range(const Weights& w, const Act& a, bool q8, int64_t r0, int64_t r1, float* y) {
  int64_t r = r0;
#if defined(__AVX512F__)
  for (; r + 4 <= r1; r += 4) {
#if defined(OPSCOPE_HAVE_VNNI)
    if (q8) {
      if (w.qtype == 0) q4_1_rows_q8_vnni<4>(a.qy, a.dy, a.sx, w.qs, w.d, w.m, w.K, r, y);
      else q8_0_rows_q8_vnni<4>(a.qy, a.dy, reinterpret_cast<const int8_t*>(w.qs), w.d, w.K, r, y);
      continue;
    }
#endif
    if (w.qtype == 0) q4_1_rows_f32_avx512<4>(a.x, a.sx, w.qs, w.d, w.m, w.K, r, y);
    else q8_0_rows_f32_avx512<4>(a.x, reinterpret_cast<const int8_t*>(w.qs), w.d, w.K, r, y);
  }
#endif
  for (; r < r1; ++r) {
    if (w.qtype == 0) q4_1_row_scalar(a.x, a.sx, w.qs, w.d, w.m, w.K, r, y);
    else q8_0_row_scalar(a.x, reinterpret_cast<const int8_t*>(w.qs), w.d, w.K, r, y);
  }
}

Weights make_weights(int64_t qtype, const torch::Tensor& qs, const torch::Tensor& d,
                     const c10::optional<torch::Tensor>& m, int64_t K) {
  TORCH_CHECK(qtype == 0 || qtype == 1, "qtype must be 0 (Q4_1) or 1 (Q8_0)");
  TORCH_CHECK(K % QK == 0, "K must be a multiple of 32, got ", K);
  TORCH_CHECK(qs.is_contiguous() && d.is_contiguous() && d.scalar_type() == at::kHalf, "bad packed weights");
  TORCH_CHECK(qtype == 1 || (m.has_value() && m->is_contiguous()), "Q4_1 needs mins");
  const int64_t N = d.size(0);
  TORCH_CHECK(d.size(1) == K / QK, "scales do not match K");
  TORCH_CHECK(qs.numel() == N * (qtype == 0 ? K / 2 : K), "quants do not match N x K");
  return Weights{qtype, reinterpret_cast<const uint8_t*>(qs.data_ptr()), d.data_ptr<c10::Half>(),
                 qtype == 0 ? m->data_ptr<c10::Half>() : nullptr, N, K};
}

torch::Tensor matvec(const torch::Tensor& x2, const Weights& w, bool q8) {
  const int64_t M = x2.size(0), K = w.K, nb = K / QK;
  auto out = torch::empty({M, w.N}, x2.options());
  std::vector<float> sx(M * nb), dy(M * nb);
  std::vector<int8_t> qy(q8 ? M * K : 0);
  const float* xp = x2.data_ptr<float>();
  for (int64_t i = 0; i < M; ++i)
    prepare_activation(xp + i * K, K, q8, sx.data() + i * nb, q8 ? qy.data() + i * K : nullptr,
                       dy.data() + i * nb);
  float* yp = out.data_ptr<float>();
  at::parallel_for(0, (w.N + 3) / 4, ROW_GRAIN / 4, [&](int64_t g0, int64_t g1) {
    for (int64_t i = 0; i < M; ++i) {
      const Act a{xp + i * K, sx.data() + i * nb, q8 ? qy.data() + i * K : nullptr, dy.data() + i * nb};
      rows_range(w, a, q8, g0 * 4, std::min(g1 * 4, w.N), yp + i * w.N);
    }
  });
  return out;
}

}  // namespace

// Dense [N, K] weights (float32 or bfloat16) from the packed blocks, rows in parallel.
torch::Tensor dequantize(torch::Tensor qs, torch::Tensor d, c10::optional<torch::Tensor> m,
                         int64_t qtype, int64_t K, c10::ScalarType dtype) {
  const Weights w = make_weights(qtype, qs, d, m, K);
  auto out = torch::empty({w.N, K}, torch::dtype(torch::kFloat32));
  float* o = out.data_ptr<float>();
  const int64_t nb = K / QK;
  at::parallel_for(0, w.N, ROW_GRAIN, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t b = 0; b < nb; ++b) {
        const float dd = h2f(w.d, r * nb + b);
        float* ob = o + r * K + b * QK;
        if (qtype == 0) {
          const uint8_t* q = w.qs + r * (K / 2) + b * 16;
          const float mm = h2f(w.m, r * nb + b);
          for (int j = 0; j < 16; ++j) { ob[j] = dd * (q[j] & 0x0F) + mm; ob[j + 16] = dd * (q[j] >> 4) + mm; }
        } else {
          const int8_t* q = reinterpret_cast<const int8_t*>(w.qs) + r * K + b * QK;
          for (int j = 0; j < QK; ++j) ob[j] = dd * q[j];
        }
      }
    }
  });
  return dtype == torch::kFloat32 ? out : out.to(dtype);
}

// y = x @ W^T for packed W. Up to gemm_min_rows - 1 rows: the fused matvec; more rows (prefill):
// dequantize W once to gemm_dtype and run torch's GEMM (oneDNN/MKL), result in x's dtype (fp32).
torch::Tensor qlinear(torch::Tensor x, torch::Tensor qs, torch::Tensor d, c10::optional<torch::Tensor> m,
                      int64_t qtype, int64_t act_mode, int64_t gemm_min_rows, c10::ScalarType gemm_dtype) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32, "qlinear takes float32 activations");
  const int64_t K = x.size(-1);
  const Weights w = make_weights(qtype, qs, d, m, K);
  auto x2 = x.reshape({-1, K}).contiguous();
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = w.N;
  if (x2.size(0) >= gemm_min_rows) {
    auto wd = dequantize(qs, d, m, qtype, K, gemm_dtype);
    return at::linear(x2.to(gemm_dtype), wd).to(torch::kFloat32).reshape(out_shape);
  }
  return matvec(x2, w, act_mode == 1).reshape(out_shape);
}

// Binds torch's OpenMP thread i to cpus[i % n] (thread pinning: no migration between cores).
std::vector<int64_t> pin_threads(std::vector<int64_t> cpus) {
  TORCH_CHECK(!cpus.empty(), "pin_threads needs at least one cpu");
  std::vector<int64_t> bound(at::get_num_threads(), -1);
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    const int tid = at::get_thread_num();
    cpu_set_t set;
    CPU_ZERO(&set);
    const int64_t cpu = cpus[tid % cpus.size()];
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof(set), &set) == 0 && tid < (int)bound.size()) bound[tid] = cpu;
  });
  return bound;
}

bool has_avx512() {
#if defined(__AVX512F__)
  return true;
#else
  return false;
#endif
}

bool has_vnni() {
#if defined(OPSCOPE_HAVE_VNNI)
  return true;
#else
  return false;
#endif
}

// The dispatcher op lets torch.compile trace through QuantLinear (its fake kernel is registered
// from Python, which handles symbolic shapes); eager calls cost one dispatcher hop.
TORCH_LIBRARY(opscope, lib) {
  lib.def("qlinear(Tensor x, Tensor qs, Tensor d, Tensor? m, int qtype, int act_mode, int gemm_min_rows, "
          "ScalarType gemm_dtype) -> Tensor");
}

TORCH_LIBRARY_IMPL(opscope, CPU, lib) { lib.impl("qlinear", &qlinear); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, mod) {
  mod.def("qlinear", &qlinear, "fused dequantize-matvec / dequantize+GEMM over packed GGUF blocks");
  mod.def("dequantize", &dequantize, "packed GGUF blocks to a dense [N, K] tensor");
  mod.def("pin_threads", &pin_threads, "bind torch's OpenMP threads to the given cpus");
  mod.def("has_avx512", &has_avx512);
  mod.def("has_vnni", &has_vnni);
}
