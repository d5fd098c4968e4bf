// Prefill GEMM over quantized weights: y = x @ W^T for many rows of x (a prompt), exact float32.
//
// W is never expanded whole: output rows of W are cut into panels of a few dozen rows; a thread
// decodes one panel into its own buffer (a few hundred KB, so it stays in L2), multiplies it with
// every row of x (single-threaded sgemm), and moves to its next panel. The threads work on different
// panels, so the only shared data are x (read) and y (disjoint columns). The panel count is a
// multiple of the thread count, so small matrices (k/v projections) still split evenly.
//
// qglu fuses an MLP's gate and up projections with the activation: per panel, gate and up rows of
// the same hidden units are multiplied and act(g) * u written, so the [M, hidden] gate and up
// outputs and the activation's passes over them never exist.
//
// The decoders give exactly gguf.quants.dequantize's values (see gguf_types.h); the sum order
// inside the GEMM is MKL's, as for torch.mm on the dequantized matrix.
#include "qtensors.h"
#include "gguf_types.h"

#include <ATen/Parallel.h>
#include <torch/library.h>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

// MKL's Fortran sgemm, exported by torch's own library where torch is built with MKL (weak: a
// torch without it falls back to at::mm on each panel).
extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                       const float* beta, float* c, const int* ldc) __attribute__((weak));
// MKL's per-thread thread count: 1 inside a worker, so sgemm never splits a panel again (torch turns
// MKL's dynamic adjustment off). The C entry point (mkl_service.h's mkl_set_num_threads_local is a
// macro for it; the lower-case symbol is the Fortran one, which takes a pointer).
extern "C" int MKL_Set_Num_Threads_Local(int n) __attribute__((weak));

namespace opscope {
namespace {

std::atomic<int64_t> g_panel_bytes{256 << 10};  // dequantized panel size aimed at (benchmarks tune it)
std::atomic<int> g_use_blas{1};
std::atomic<int> g_enabled{1};  // 0: qlinear keeps its older dequantize-tile + at::linear path (A/B)

// Rows [r0, r0 + n) of w decoded to float32 into buf (row i at buf + i * K).
void decode_panel(const Weights& w, int64_t r0, int64_t n, float* buf) {
  const int64_t K = w.K;
#if defined(OPSCOPE_AVX512_RAW)
  if (w.raw()) {
    gguf::with_type(w.ggml_type, [&](auto t) {
      using T = decltype(t);
      for (int64_t i = 0; i < n; ++i) {
        const uint8_t* row = w.qs + (r0 + i) * w.row_bytes;
        float* o = buf + i * K;
        for (int64_t b = 0; b < K / T::QK; ++b)
          T::decode(row + b * T::BYTES, [&](int c, __m512 v) { _mm512_storeu_ps(o + b * T::QK + 16 * c, v); });
      }
    });
    return;
  }
  const int64_t nb = K / QK;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = r0 + i;
    float* o = buf + i * K;
    const c10::Half* d = w.d + r * nb;
    if (w.qtype == 0) {  // Q4_1 SoA: byte j of a block holds element j (low nibble) and j + 16
      const uint8_t* q = w.qs + r * (K / 2);
      const c10::Half* m = w.m + r * nb;
      for (int64_t b = 0; b < nb; ++b) {
        const __m512 dd = _mm512_set1_ps(float(d[b])), mm = _mm512_set1_ps(float(m[b]));
        __m512 q0, q1;
        gguf::nibbles32(q + b * 16, q0, q1);
        _mm512_storeu_ps(o + b * QK, _mm512_fmadd_ps(dd, q0, mm));
        _mm512_storeu_ps(o + b * QK + 16, _mm512_fmadd_ps(dd, q1, mm));
      }
    } else {  // Q8_0 SoA
      const int8_t* q = reinterpret_cast<const int8_t*>(w.qs) + r * K;
      for (int64_t b = 0; b < nb; ++b) {
        const __m512 dd = _mm512_set1_ps(float(d[b]));
        _mm512_storeu_ps(o + b * QK, _mm512_mul_ps(dd, gguf::s8_ps(gguf::load16(reinterpret_cast<const uint8_t*>(q + b * QK)))));
        _mm512_storeu_ps(o + b * QK + 16,
                         _mm512_mul_ps(dd, gguf::s8_ps(gguf::load16(reinterpret_cast<const uint8_t*>(q + b * QK + 16)))));
      }
    }
  }
#else
  for (int64_t i = 0; i < n; ++i) dequantize_row(w, r0 + i, buf + i * K);
#endif
}

// c[M, n] (row stride ldc) = x[M, K] @ p[n, K]^T, on this thread only.
void panel_gemm(const float* x, int64_t M, int64_t K, const float* p, int64_t n, float* c, int64_t ldc) {
  if (sgemm_ != nullptr && g_use_blas.load(std::memory_order_relaxed)) {
    // Column-major view: c^T [n, M] (ld ldc) = p (stored [n, K] row-major: op "t", ld K) . x^T (ld K).
    const int mi = int(n), ni = int(M), ki = int(K), lda = int(K), ldb = int(K), ldci = int(ldc);
    const float one = 1.f, zero = 0.f;
    const int before = MKL_Set_Num_Threads_Local != nullptr ? MKL_Set_Num_Threads_Local(1) : 0;
    sgemm_("T", "N", &mi, &ni, &ki, &one, p, &lda, x, &ldb, &zero, c, &ldci);
    if (MKL_Set_Num_Threads_Local != nullptr) MKL_Set_Num_Threads_Local(before);
    return;
  }
  auto opts = at::TensorOptions().dtype(at::kFloat);
  auto xt = at::from_blob(const_cast<float*>(x), {M, K}, opts);
  auto pt = at::from_blob(const_cast<float*>(p), {n, K}, opts);
  auto ct = at::from_blob(c, {M, n}, {ldc, 1}, opts);
  at::mm_out(ct, xt, pt.t());
}

// Panels: a multiple of the thread count, each of at most the panel budget's rows (16-aligned).
struct Panels {
  int64_t rows, count;
};

Panels plan_panels(int64_t N, int64_t K, int64_t threads) {
  const int64_t cap = std::max<int64_t>(16, g_panel_bytes.load() / (4 * K) / 16 * 16);
  int64_t count = threads * std::max<int64_t>(1, (N + threads * cap - 1) / (threads * cap));
  int64_t rows = (N + count - 1) / count;
  rows = std::min<int64_t>(N, (rows + 15) / 16 * 16);
  count = (N + rows - 1) / rows;
  return {rows, count};
}

struct Buffers {
  std::vector<float> panel, tmp;
  float* get(std::vector<float>& v, int64_t n) {
    if ((int64_t)v.size() < n) v.resize(n);
    return v.data();
  }
};

Buffers& buffers() {
  thread_local Buffers b;
  return b;
}


inline float act_scalar(float g, int64_t act) {
  if (act == 0) return g / (1.f + std::exp(-g));
  const float c = 0.7978845608028654f;  // sqrt(2/pi): gelu's tanh approximation
  return 0.5f * g * (1.f + std::tanh(c * (g + 0.044715f * g * g * g)));
}

// h[0..n) = act(g) * u, act 0: SiLU, 1: GELU (tanh approximation).
void glu_row(float* h, const float* u, int64_t n, int64_t act) {
  int64_t j = 0;
#if defined(OPSCOPE_AVX512_RAW)  // gguf::exp_ps, the decode step's exp, lives under this guard
  const __m512 one = _mm512_set1_ps(1.f);
  for (; j + 16 <= n; j += 16) {
    const __m512 g = _mm512_loadu_ps(h + j);
    __m512 a;
    if (act == 0) {
      a = _mm512_div_ps(g, _mm512_add_ps(one, gguf::exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g))));
    } else {  // 0.5 g (1 + tanh(y)) = g - g / (1 + exp(2y))
      const __m512 g3 = _mm512_mul_ps(_mm512_mul_ps(g, g), g);
      const __m512 y = _mm512_mul_ps(_mm512_set1_ps(0.7978845608028654f), _mm512_fmadd_ps(_mm512_set1_ps(0.044715f), g3, g));
      const __m512 e = gguf::exp_ps(_mm512_add_ps(y, y));
      a = _mm512_sub_ps(g, _mm512_div_ps(g, _mm512_add_ps(one, e)));
    }
    _mm512_storeu_ps(h + j, _mm512_mul_ps(a, _mm512_loadu_ps(u + j)));
  }
#endif
  for (; j < n; ++j) h[j] = act_scalar(h[j], act) * u[j];
}

at::Tensor rows_of(const at::Tensor& x, int64_t K) {
  TORCH_CHECK(x.scalar_type() == at::kFloat, "prefill GEMM takes float32 activations, got ", x.scalar_type());
  TORCH_CHECK(x.size(-1) == K, "activations have ", x.size(-1), " features, the weights ", K);
  return x.reshape({-1, K}).contiguous();
}

std::vector<int64_t> out_shape(const at::Tensor& x, int64_t N) {
  std::vector<int64_t> s(x.sizes().begin(), x.sizes().end());
  s.back() = N;
  return s;
}

}  // namespace

bool prefill_enabled() { return g_enabled.load(std::memory_order_relaxed) != 0; }

// y = x @ W^T, x [..., K] float32 → [..., N] float32, W decoded panel by panel.
at::Tensor prefill_gemm(const at::Tensor& x, const Weights& w) {
  auto x2 = rows_of(x, w.K);
  const int64_t M = x2.size(0), K = w.K, N = w.N;
  auto out = at::empty({M, N}, x2.options());
  const Panels pl = plan_panels(N, K, at::get_num_threads());
  const float* xp = x2.data_ptr<float>();
  float* yp = out.data_ptr<float>();
  at::parallel_for(0, pl.count, 1, [&](int64_t p0, int64_t p1) {
    Buffers& bufs = buffers();
    float* buf = bufs.get(bufs.panel, pl.rows * K);
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t r0 = p * pl.rows, n = std::min(pl.rows, N - r0);
      decode_panel(w, r0, n, buf);
      panel_gemm(xp, M, K, buf, n, yp + r0, N);
    }
  });
  return out.reshape(out_shape(x, N));
}

// h = act(x @ G^T) * (x @ U^T): an MLP's gate and up projections and its activation, panel by panel.
at::Tensor prefill_glu(const at::Tensor& x, const Weights& g, const Weights& u, int64_t act) {
  TORCH_CHECK(g.N == u.N && g.K == u.K, "gate and up projections differ in shape");
  TORCH_CHECK(act == 0 || act == 1, "act must be 0 (SiLU) or 1 (GELU tanh), got ", act);
  auto x2 = rows_of(x, g.K);
  const int64_t M = x2.size(0), K = g.K, N = g.N;
  auto out = at::empty({M, N}, x2.options());
  const Panels pl = plan_panels(N, K, at::get_num_threads());
  const float* xp = x2.data_ptr<float>();
  float* hp = out.data_ptr<float>();
  at::parallel_for(0, pl.count, 1, [&](int64_t p0, int64_t p1) {
    Buffers& bufs = buffers();
    float* buf = bufs.get(bufs.panel, pl.rows * K);
    float* tmp = bufs.get(bufs.tmp, M * pl.rows);
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t r0 = p * pl.rows, n = std::min(pl.rows, N - r0);
      decode_panel(g, r0, n, buf);
      panel_gemm(xp, M, K, buf, n, hp + r0, N);
      decode_panel(u, r0, n, buf);
      panel_gemm(xp, M, K, buf, n, tmp, n);
      for (int64_t i = 0; i < M; ++i) glu_row(hp + i * N + r0, tmp + i * n, n, act);
    }
  });
  return out.reshape(out_shape(x, N));
}

namespace {

at::Tensor qgemm_op(const at::Tensor& x, const at::Tensor& qs, const c10::optional<at::Tensor>& d,
                    const c10::optional<at::Tensor>& m, int64_t qtype) {
  return prefill_gemm(x, make_weights(qtype, qs, d, m, x.size(-1)));
}

at::Tensor qglu_op(const at::Tensor& x, const at::Tensor& gqs, const c10::optional<at::Tensor>& gd,
                   const c10::optional<at::Tensor>& gm, int64_t gtype, const at::Tensor& uqs,
                   const c10::optional<at::Tensor>& ud, const c10::optional<at::Tensor>& um, int64_t utype,
                   int64_t act) {
  const int64_t K = x.size(-1);
  return prefill_glu(x, make_weights(gtype, gqs, gd, gm, K), make_weights(utype, uqs, ud, um, K), act);
}

// Benchmarks and tests (a negative value keeps a setting): the panel budget in bytes, whether MKL's
// sgemm is used (0: at::mm per panel), whether qlinear's float32 GEMM takes this path (0: the older
// dequantize-tile path); returns {panel bytes, sgemm used, enabled, sgemm available}.
std::vector<int64_t> prefill_config(int64_t panel_bytes, int64_t use_blas, int64_t enabled) {
  if (panel_bytes > 0) g_panel_bytes = panel_bytes;
  if (use_blas >= 0) g_use_blas = int(use_blas);
  if (enabled >= 0) g_enabled = int(enabled);
  return {g_panel_bytes.load(), g_use_blas.load(), g_enabled.load(), sgemm_ != nullptr ? 1 : 0};
}

}  // namespace
}  // namespace opscope

TORCH_LIBRARY_FRAGMENT(opscope, lib) {
  lib.def("qgemm(Tensor x, Tensor qs, Tensor? d, Tensor? m, int qtype) -> Tensor");
  lib.def("qglu(Tensor x, Tensor gqs, Tensor? gd, Tensor? gm, int gtype, Tensor uqs, Tensor? ud, Tensor? um, "
          "int utype, int act) -> Tensor");
  lib.def("prefill_config(int panel_bytes, int use_blas, int enabled) -> int[]", &opscope::prefill_config);
}

TORCH_LIBRARY_IMPL(opscope, CPU, lib) {
  lib.impl("qgemm", &opscope::qgemm_op);
  lib.impl("qglu", &opscope::qglu_op);
}
