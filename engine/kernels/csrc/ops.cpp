// Fused dequantize-matvec and dequantize+GEMM as a torch operator over packed GGUF blocks.
#include "qtensors.h"

#include <ATen/Parallel.h>
#include <torch/library.h>
#include <sched.h>

namespace opscope {

Weights make_weights(int64_t qtype, const at::Tensor& qs, const at::Tensor& d,
                     const c10::optional<at::Tensor>& m, int64_t K) {
  TORCH_CHECK(qtype == 0 || qtype == 1, "qtype must be 0 (Q4_1) or 1 (Q8_0)");
  TORCH_CHECK(K % QK == 0, "K must be a multiple of 32, got ", K);
  TORCH_CHECK(qs.is_contiguous() && d.is_contiguous() && d.scalar_type() == at::kHalf, "bad packed weights");
  TORCH_CHECK(qtype == 1 || (m.has_value() && m->is_contiguous() && m->scalar_type() == at::kHalf),
              "Q4_1 needs fp16 mins");
  const int64_t N = d.size(0);
  TORCH_CHECK(d.dim() == 2 && d.size(1) == K / QK, "scales do not match K=", K);
  TORCH_CHECK(qs.numel() * qs.element_size() == N * (qtype == 0 ? K / 2 : K), "quants do not match N x K");
  return Weights{qtype, reinterpret_cast<const uint8_t*>(qs.data_ptr()), d.data_ptr<c10::Half>(),
                 qtype == 0 ? m->data_ptr<c10::Half>() : nullptr, N, K};
}

at::Tensor dequantize(const at::Tensor& qs, const at::Tensor& d, const c10::optional<at::Tensor>& m,
                      int64_t qtype, int64_t K, c10::ScalarType dtype) {
  const Weights w = make_weights(qtype, qs, d, m, K);
  auto out = at::empty({w.N, K}, at::TensorOptions().dtype(at::kFloat));
  float* o = out.data_ptr<float>();
  at::parallel_for(0, w.N, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) dequantize_row(w, r, o + r * K);
  });
  return dtype == at::kFloat ? out : out.to(dtype);
}

// y = x @ W^T for packed W. Fewer than gemm_min_rows rows: the fused matvec, row by row; more
// (prefill): dequantize W once to gemm_dtype and run torch's GEMM (oneDNN/MKL); result in float32.
at::Tensor qlinear(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d,
                   const c10::optional<at::Tensor>& m, int64_t qtype, int64_t act_mode,
                   int64_t gemm_min_rows, c10::ScalarType gemm_dtype) {
  TORCH_CHECK(x.scalar_type() == at::kFloat, "qlinear takes float32 activations, got ", x.scalar_type());
  const int64_t K = x.size(-1);
  const Weights w = make_weights(qtype, qs, d, m, K);
  auto x2 = x.reshape({-1, K}).contiguous();
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = w.N;
  if (x2.size(0) >= gemm_min_rows) {
    auto wd = dequantize(qs, d, m, qtype, K, gemm_dtype);
    return at::linear(x2.to(gemm_dtype), wd).to(at::kFloat).reshape(out_shape);
  }
  auto out = at::empty({x2.size(0), w.N}, x2.options());
  Scratch scratch;
  for (int64_t i = 0; i < x2.size(0); ++i) {
    float* y = out.data_ptr<float>() + i * w.N;
    matvec_multi(x2.data_ptr<float>() + i * K, K, &w, &y, 1, act_mode == 1, scratch);
  }
  return out.reshape(out_shape);
}

// Binds torch's OpenMP thread i to cpus[i % n] (thread pinning: no migration between cores).
std::vector<int64_t> pin_threads(std::vector<int64_t> cpus) {
  TORCH_CHECK(!cpus.empty(), "pin_threads needs at least one cpu");
  const int n = at::get_num_threads();
  std::vector<int64_t> bound(n, -1);
  at::parallel_for(0, n, 1, [&](int64_t, int64_t) {
    const int tid = at::get_thread_num();
    cpu_set_t set;
    CPU_ZERO(&set);
    const int64_t cpu = cpus[tid % cpus.size()];
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof(set), &set) == 0 && tid < n) bound[tid] = cpu;
  });
  return bound;
}

}  // namespace opscope

// The dispatcher op lets torch.compile trace through QuantLinear (its fake kernel is registered
// from Python, which handles symbolic shapes); eager calls cost one dispatcher hop.
TORCH_LIBRARY(opscope, lib) {
  lib.def("qlinear(Tensor x, Tensor qs, Tensor d, Tensor? m, int qtype, int act_mode, int gemm_min_rows, "
          "ScalarType gemm_dtype) -> Tensor");
}

TORCH_LIBRARY_IMPL(opscope, CPU, lib) { lib.impl("qlinear", &opscope::qlinear); }
