// Fused dequantize-matvec and dequantize+GEMM as a torch operator over packed GGUF blocks.
#include "qtensors.h"

#include <ATen/Parallel.h>
#include <torch/library.h>
#include <algorithm>
#if defined(__linux__)
#include <sched.h>
#endif

namespace opscope {

Weights make_weights(int64_t qtype, const at::Tensor& qs, const c10::optional<at::Tensor>& d,
                     const c10::optional<at::Tensor>& m, int64_t K) {
  TORCH_CHECK(qs.is_contiguous() && qs.dim() == 2, "quantized weights must be a contiguous 2-D tensor");
  if (qtype >= QTYPE_RAW) {
    const int64_t t = qtype - QTYPE_RAW, row_bytes = raw_row_bytes(t, K);
    TORCH_CHECK(raw_block_size(t) > 0, "no kernel for ggml type ", t);
    TORCH_CHECK(row_bytes > 0, "K must be a multiple of ", raw_block_size(t), " for ggml type ", t, ", got ", K);
    TORCH_CHECK(qs.scalar_type() == at::kByte && qs.size(1) == row_bytes, "raw blocks of ggml type ", t,
                " must be uint8 [N, ", row_bytes, "] for K=", K, ", got ", qs.sizes());
    Weights w{qtype, qs.data_ptr<uint8_t>(), nullptr, nullptr, qs.size(0), K};
    w.ggml_type = t;
    w.row_bytes = row_bytes;
    return w;
  }
  TORCH_CHECK(qtype == 0 || qtype == 1, "qtype must be 0 (Q4_1), 1 (Q8_0) or ", QTYPE_RAW, " + a ggml type");
  TORCH_CHECK(K % QK == 0, "K must be a multiple of 32, got ", K);
  TORCH_CHECK(d.has_value() && d->is_contiguous() && d->scalar_type() == at::kHalf, "bad packed weights");
  TORCH_CHECK(qtype == 1 || (m.has_value() && m->is_contiguous() && m->scalar_type() == at::kHalf),
              "Q4_1 needs fp16 mins");
  const int64_t N = d->size(0);
  TORCH_CHECK(d->dim() == 2 && d->size(1) == K / QK, "scales do not match K=", K);
  TORCH_CHECK(qs.numel() * qs.element_size() == N * (qtype == 0 ? K / 2 : K), "quants do not match N x K");
  return Weights{qtype, reinterpret_cast<const uint8_t*>(qs.data_ptr()), d->data_ptr<c10::Half>(),
                 qtype == 0 ? m->data_ptr<c10::Half>() : nullptr, N, K};
}

// prefill.cpp: y = x @ W^T decoded panel by panel (float32), and whether qlinear takes that path.
at::Tensor prefill_gemm(const at::Tensor& x, const Weights& w);
at::Tensor prefill_gemm_bf16(const at::Tensor& x, const Weights& w);
at::Tensor prefill_gemm_int8(const at::Tensor& x, const Weights& w);
bool prefill_enabled();

namespace {

// Rows [r0, r1) of w dequantized into out (row r at out + (r - r0) * K), in parallel.
void dequantize_rows(const Weights& w, int64_t r0, int64_t r1, float* out) {
  at::parallel_for(r0, r1, 16, [&](int64_t a, int64_t b) {
    for (int64_t r = a; r < b; ++r) dequantize_row(w, r, out + (r - r0) * w.K);
  });
}

// Rows of W per dequantized GEMM tile: about 8 MiB of float32, so the tile is reused from cache
// and prefill never holds a whole dense copy of a large matrix (the output head).
int64_t gemm_tile_rows(int64_t K) { return std::max<int64_t>(64, ((int64_t(2) << 20) / K) / 64 * 64); }

}  // namespace

at::Tensor dequantize(const at::Tensor& qs, const c10::optional<at::Tensor>& d,
                      const c10::optional<at::Tensor>& m, int64_t qtype, int64_t K, c10::ScalarType dtype) {
  const Weights w = make_weights(qtype, qs, d, m, K);
  auto out = at::empty({w.N, K}, at::TensorOptions().dtype(at::kFloat));
  dequantize_rows(w, 0, w.N, out.data_ptr<float>());
  return dtype == at::kFloat ? out : out.to(dtype);
}

// The portable scalar decoders (raw blocks only), for the tests: the path of builds without AVX-512.
at::Tensor dequantize_scalar(const at::Tensor& qs, int64_t qtype, int64_t K) {
  TORCH_CHECK(qtype >= QTYPE_RAW, "dequantize_scalar takes raw blocks");
  const Weights w = make_weights(qtype, qs, c10::nullopt, c10::nullopt, K);
  auto out = at::empty({w.N, K}, at::TensorOptions().dtype(at::kFloat));
  for (int64_t r = 0; r < w.N; ++r) raw_dequantize_row_scalar(w, r, out.data_ptr<float>() + r * K);
  return out;
}

// Embedding lookup: rows idx of W dequantized, [*idx.shape, K] float32.
at::Tensor qembedding(const at::Tensor& idx, const at::Tensor& qs, const c10::optional<at::Tensor>& d,
                      const c10::optional<at::Tensor>& m, int64_t qtype, int64_t K) {
  const Weights w = make_weights(qtype, qs, d, m, K);
  auto ids = idx.reshape({-1}).to(at::kLong).contiguous();
  const int64_t n = ids.numel();
  const int64_t* p = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i)
    TORCH_CHECK(p[i] >= 0 && p[i] < w.N, "token id ", p[i], " outside the vocabulary (", w.N, ")");
  auto out = at::empty({n, K}, at::TensorOptions().dtype(at::kFloat));
  float* o = out.data_ptr<float>();
  at::parallel_for(0, n, 64, [&](int64_t a, int64_t b) {
    for (int64_t i = a; i < b; ++i) dequantize_row(w, p[i], o + i * K);
  });
  std::vector<int64_t> shape(idx.sizes().begin(), idx.sizes().end());
  shape.push_back(K);
  return out.reshape(shape);
}

// y = x @ W^T. Fewer than gemm_min_rows rows: the fused matvec, row by row; more (prefill): W
// dequantized tile by tile to gemm_dtype, each tile through torch's GEMM (oneDNN/MKL); float32 out.
at::Tensor qlinear(const at::Tensor& x, const at::Tensor& qs, const c10::optional<at::Tensor>& d,
                   const c10::optional<at::Tensor>& m, int64_t qtype, int64_t act_mode,
                   int64_t gemm_min_rows, c10::ScalarType gemm_dtype) {
  TORCH_CHECK(x.scalar_type() == at::kFloat, "qlinear takes float32 activations, got ", x.scalar_type());
  const int64_t K = x.size(-1);
  const Weights w = make_weights(qtype, qs, d, m, K);
  auto x2 = x.reshape({-1, K}).contiguous();
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = w.N;
  // prefill.cpp: panels decoded per thread (exact float32), or decoded and rounded to bf16 per thread
  if (x2.size(0) >= gemm_min_rows && gemm_dtype == at::kChar) return prefill_gemm_int8(x2, w).reshape(out_shape);
  if (x2.size(0) >= gemm_min_rows && prefill_enabled() && (gemm_dtype == at::kFloat || gemm_dtype == at::kBFloat16))
    return (gemm_dtype == at::kFloat ? prefill_gemm(x2, w) : prefill_gemm_bf16(x2, w)).reshape(out_shape);
  if (x2.size(0) >= gemm_min_rows) {
    const int64_t tile = std::min(w.N, gemm_tile_rows(K));
    auto out = at::empty({x2.size(0), w.N}, x2.options());
    auto xg = x2.to(gemm_dtype);
    auto wt = at::empty({tile, K}, at::TensorOptions().dtype(at::kFloat));
    for (int64_t r0 = 0; r0 < w.N; r0 += tile) {
      const int64_t n = std::min(tile, w.N - r0);
      dequantize_rows(w, r0, r0 + n, wt.data_ptr<float>());
      auto wg = wt.narrow(0, 0, n);
      auto y = at::linear(xg, gemm_dtype == at::kFloat ? wg : wg.to(gemm_dtype));
      if (n == w.N) return y.to(at::kFloat).reshape(out_shape);
      out.narrow(1, r0, n).copy_(y);
    }
    return out.reshape(out_shape);
  }
  auto out = at::empty({x2.size(0), w.N}, x2.options());
  Scratch scratch;
  for (int64_t i = 0; i < x2.size(0); ++i) {
    float* y = out.data_ptr<float>() + i * w.N;
    matvec_multi(x2.data_ptr<float>() + i * K, K, &w, &y, 1, act_mode == 1, scratch);
  }
  return out.reshape(out_shape);
}

// Binds torch's OpenMP thread i to cpus[i % n] (thread pinning: no migration between cores); -1
// for a thread left unbound (macOS has no API that binds a thread to a core).
std::vector<int64_t> pin_threads(std::vector<int64_t> cpus) {
  TORCH_CHECK(!cpus.empty(), "pin_threads needs at least one cpu");
  const int n = at::get_num_threads();
  std::vector<int64_t> bound(n, -1);
#if defined(__linux__)
  at::parallel_for(0, n, 1, [&](int64_t, int64_t) {
    const int tid = at::get_thread_num();
    cpu_set_t set;
    CPU_ZERO(&set);
    const int64_t cpu = cpus[tid % cpus.size()];
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof(set), &set) == 0 && tid < n) bound[tid] = cpu;
  });
#endif
  return bound;
}

}  // namespace opscope

// The dispatcher op lets torch.compile trace through QuantLinear (its fake kernel is registered
// from Python, which handles symbolic shapes); eager calls cost one dispatcher hop.
TORCH_LIBRARY(opscope, lib) {
  lib.def("qlinear(Tensor x, Tensor qs, Tensor? d, Tensor? m, int qtype, int act_mode, int gemm_min_rows, "
          "ScalarType gemm_dtype) -> Tensor");
  lib.def("qembedding(Tensor idx, Tensor qs, Tensor? d, Tensor? m, int qtype, int K) -> Tensor");
}

TORCH_LIBRARY_IMPL(opscope, CPU, lib) {
  lib.impl("qlinear", &opscope::qlinear);
  lib.impl("qembedding", &opscope::qembedding);
}
