// A whole batch-1 decode step of a Llama-family model in one call: no per-op dispatch, no
// per-token allocation but the logits, four parallel regions per layer.
//
// Same math as engine.models.llama (rotate-half RoPE from the model's inv_freq, RMSNorm, grouped
// KV heads, SiLU-gated MLP), reading and writing the model's own KV cache tensors so that a prefill
// run by the torch model and decode steps run here share one cache.
// Registered as a torch custom class and operators (torch/library.h), not as a Python extension
// module: the library then depends on torch's C++ libraries only, not on the Python it runs under
// (docs/decisions/cpu-variants.md). ATen, not <torch/extension.h>: that also parses the whole C++
// frontend (torch/all.h), the largest part of this file's compile time.
#include <ATen/ATen.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <ATen/Parallel.h>
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "pool.h"
#include "qtensors.h"
#include "rowwork.h"

namespace opscope {
namespace {

// (qtype, qs, d, m, bias): one quantized matrix as handed over from Python (SoA: qs, d, m; raw
// GGUF blocks: qs alone, d and m None; QTYPE_Q4_0_SOA: Q4_0 in the Q4_1 layout, PackedWeight.spec).
using LinSpec = std::tuple<int64_t, at::Tensor, c10::optional<at::Tensor>, c10::optional<at::Tensor>,
                           c10::optional<at::Tensor>>;

struct Linear {
  Weights w;
  std::vector<at::Tensor> keep;  // owns the packed tensors the pointers in w refer to
  const float* bias = nullptr;
};

Linear make_linear(const LinSpec& s, int64_t K) {
  Linear l;
  const int64_t qtype = std::get<0>(s);  // QTYPE_Q4_0_SOA: the Q4_1 layout, m = -8 d (m not read)
  l.w = make_weights(qtype == QTYPE_Q4_0_SOA ? 0 : qtype, std::get<1>(s), std::get<2>(s), std::get<3>(s), K);
  l.w.m_from_d = qtype == QTYPE_Q4_0_SOA;
  l.keep = {std::get<1>(s)};
  if (std::get<2>(s)) l.keep.push_back(*std::get<2>(s));
  if (std::get<3>(s)) l.keep.push_back(*std::get<3>(s));
  if (std::get<4>(s)) {
    l.keep.push_back(std::get<4>(s)->contiguous().to(at::kFloat));
    l.bias = l.keep.back().data_ptr<float>();
  }
  return l;
}

// Rotate-half RoPE on `heads` vectors of length D: pairs (i, i + D/2).
void rope(float* v, int64_t heads, int64_t D, const float* cs, const float* sn) {
  const int64_t half = D / 2;
  for (int64_t h = 0; h < heads; ++h) {
    float* p = v + h * D;
    for (int64_t i = 0; i < half; ++i) {
      const float a = p[i], b = p[i + half];
      p[i] = a * cs[i] - b * sn[i];
      p[i + half] = b * cs[i] + a * sn[i];
    }
  }
}

}  // namespace

class DecodeModel : public torch::CustomClassHolder {
 public:
  DecodeModel(int64_t dim, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, int64_t hidden_dim,
              double eps, int64_t act_mode, const LinSpec& embed, at::Tensor inv_freq, at::Tensor final_norm,
              const LinSpec& lm_head)
      : C_(dim), H_(n_heads), KV_(n_kv_heads), D_(head_dim), F_(hidden_dim), eps_(eps), q8_(act_mode == 1),
        embed_(make_linear(embed, dim)), inv_freq_(inv_freq.contiguous().to(at::kFloat)),
        final_norm_(final_norm.contiguous().to(at::kFloat)), head_(make_linear(lm_head, dim)) {
    TORCH_CHECK(H_ % KV_ == 0 && D_ % 2 == 0 && inv_freq_.numel() == D_ / 2, "inconsistent head sizes");
    x_.resize(C_); h_.resize(std::max(C_, F_)); q_.resize(H_ * D_); k_.resize(KV_ * D_); v_.resize(KV_ * D_);
    att_.resize(H_ * D_); o_.resize(C_); g_.resize(F_); u_.resize(F_); cos_.resize(D_ / 2); sin_.resize(D_ / 2);
  }

  // attn_norm, mlp_norm, and the linears q, k, v, o, gate, up, down (all packed).
  void add_layer(at::Tensor attn_norm, at::Tensor mlp_norm, std::vector<LinSpec> lin) {
    TORCH_CHECK(lin.size() == 7, "a layer has 7 linears");
    Layer L;
    L.attn_norm = attn_norm.contiguous().to(at::kFloat);
    L.mlp_norm = mlp_norm.contiguous().to(at::kFloat);
    const int64_t in_dims[7] = {C_, C_, C_, H_ * D_, C_, C_, F_};
    for (int i = 0; i < 7; ++i) L.lin.push_back(make_linear(lin[i], in_dims[i]));
    layers_.push_back(std::move(L));
  }

  // The model's KV cache buffers, [B, S, KV, D] float32 each (engine.models.llama.KVCache); sequence 0 is used.
  void set_cache(std::vector<at::Tensor> k, std::vector<at::Tensor> v) {
    TORCH_CHECK(k.size() == layers_.size() && v.size() == layers_.size(), "one cache per layer");
    for (size_t l = 0; l < k.size(); ++l) {
      TORCH_CHECK(k[l].is_contiguous() && v[l].is_contiguous() && k[l].scalar_type() == at::kFloat &&
                  k[l].size(2) == KV_ && k[l].size(3) == D_, "cache must be contiguous float32 [B, S, KV, D]");
    }
    kc_ = std::move(k);
    vc_ = std::move(v);
    S_ = kc_.empty() ? 0 : kc_[0].size(1);
    scores_.assign(H_ * S_, 0.f);
  }

  // Logits [1, 1, V] for `token` at position `pos`; writes K/V at `pos` into the cache.
  at::Tensor step(int64_t token, int64_t pos) {
    TORCH_CHECK(pos >= 0 && pos < S_, "position ", pos, " outside the KV cache (", S_, ")");
    TORCH_CHECK(token >= 0 && token < embed_.w.N, "token id ", token, " outside the vocabulary");
    dequantize_row(embed_.w, token, x_.data());  // the embedding row read from its blocks
    for (int64_t i = 0; i < D_ / 2; ++i) {
      const float f = float(pos) * inv_freq_.data_ptr<float>()[i];
      cos_[i] = std::cos(f);
      sin_[i] = std::sin(f);
    }
    lap(P_OTHER);
    for (size_t l = 0; l < layers_.size(); ++l) layer(l, pos);
    rows::rmsnorm(x_.data(), final_norm_.data_ptr<float>(), C_, eps_, h_.data());
    auto logits = at::empty({1, 1, head_.w.N}, at::TensorOptions().dtype(at::kFloat));
    float* y = logits.data_ptr<float>();
    lap(P_OTHER);
    matvec_multi(h_.data(), C_, &head_.w, &y, 1, q8_, scratch_);
    lap(P_HEAD);
    return logits;
  }

  // Seconds spent per phase of the step since the last call (where the time of a token goes); on
  // enables the clock reads for the steps that follow.
  c10::Dict<std::string, double> profile(bool on) {
    static const char* names[P_N] = {"qkv", "attention", "o", "gate_up", "down", "head", "other"};
    c10::Dict<std::string, double> out;
    for (int i = 0; i < P_N; ++i) out.insert(names[i], t_[i]);
    t_.fill(0.0);
    prof_ = on;
    last_ = std::chrono::steady_clock::now();
    return out;
  }

 private:
  struct Layer {
    at::Tensor attn_norm, mlp_norm;
    std::vector<Linear> lin;  // q, k, v, o, gate, up, down
  };

  void matvecs(const float* in, int64_t K, std::initializer_list<std::pair<const Linear*, float*>> outs) {
    Weights ws[4];
    float* ys[4];
    int n = 0;
    for (auto& [lin, y] : outs) { ws[n] = lin->w; ys[n++] = y; }
    matvec_multi(in, K, ws, ys, n, q8_, scratch_);
    for (auto& [lin, y] : outs)
      if (lin->bias) for (int64_t i = 0; i < lin->w.N; ++i) y[i] += lin->bias[i];
  }

  enum Phase { P_QKV, P_ATT, P_O, P_GU, P_DOWN, P_HEAD, P_OTHER, P_N };
  void lap(Phase p) {
    if (!prof_) return;
    const auto t = std::chrono::steady_clock::now();
    t_[p] += std::chrono::duration<double>(t - last_).count();
    last_ = t;
  }

  void layer(size_t l, int64_t pos) {
    Layer& L = layers_[l];
    rows::rmsnorm(x_.data(), L.attn_norm.data_ptr<float>(), C_, eps_, h_.data());
    lap(P_OTHER);
    matvecs(h_.data(), C_, {{&L.lin[0], q_.data()}, {&L.lin[1], k_.data()}, {&L.lin[2], v_.data()}});
    lap(P_QKV);
    rope(q_.data(), H_, D_, cos_.data(), sin_.data());
    rope(k_.data(), KV_, D_, cos_.data(), sin_.data());
    float* kc = kc_[l].data_ptr<float>();
    float* vc = vc_[l].data_ptr<float>();
    std::copy_n(k_.data(), KV_ * D_, kc + pos * KV_ * D_);  // row `pos` of [S, KV, D]
    std::copy_n(v_.data(), KV_ * D_, vc + pos * KV_ * D_);
    attention(kc, vc, pos);
    lap(P_ATT);
    matvecs(att_.data(), H_ * D_, {{&L.lin[3], o_.data()}});
    lap(P_O);
    for (int64_t i = 0; i < C_; ++i) x_[i] += o_[i];
    rows::rmsnorm(x_.data(), L.mlp_norm.data_ptr<float>(), C_, eps_, h_.data());
    lap(P_OTHER);
    matvecs(h_.data(), C_, {{&L.lin[4], g_.data()}, {&L.lin[5], u_.data()}});
    lap(P_GU);
    rows::glu(g_.data(), u_.data(), F_, 0, h_.data());
    lap(P_OTHER);
    matvecs(h_.data(), F_, {{&L.lin[6], o_.data()}});
    lap(P_DOWN);
    for (int64_t i = 0; i < C_; ++i) x_[i] += o_[i];
  }

  // One query per head over keys 0..pos. A chunk of work is up to 8 heads of one KV group (they
  // read the same keys), fewer where that leaves under two chunks per thread.
  void attention(const float* kc, const float* vc, int64_t pos) {
    const float scale = 1.f / std::sqrt(float(D_));
    const int64_t rep = H_ / KV_, threads = at::get_num_threads();
    const int64_t nh = std::clamp<int64_t>(H_ / (2 * std::max<int64_t>(1, threads)), 1, std::min<int64_t>(rep, 8));
    const int64_t per_group = (rep + nh - 1) / nh;
    // shared out by the work pool (pool.h: no wait for a descheduled worker)
    WorkPool::get().run(KV_ * per_group, threads, [&](int64_t c) {
      const int64_t g = c / per_group, h = g * rep + (c % per_group) * nh;  // key t at kc + g * D_ + t * KV_ * D_
      rows::attend(q_.data() + h * D_, std::min(nh, (g + 1) * rep - h), kc + g * D_, vc + g * D_, KV_ * D_, pos, D_,
                   scale, scores_.data() + h * S_, S_, att_.data() + h * D_);
    });
  }

  int64_t C_, H_, KV_, D_, F_, S_ = 0;
  double eps_;
  bool q8_;
  Linear embed_;
  at::Tensor inv_freq_, final_norm_;
  Linear head_;
  std::vector<Layer> layers_;
  std::vector<at::Tensor> kc_, vc_;
  std::vector<float> x_, h_, q_, k_, v_, att_, o_, g_, u_, cos_, sin_, scores_;
  Scratch scratch_;
  bool prof_ = false;
  std::array<double, P_N> t_{};
  std::chrono::steady_clock::time_point last_;
};

}  // namespace opscope

namespace {
// The operators' forms of the helpers (an operator takes int64_t and returns a value or nothing).
int64_t set_kernel_variant_op(int64_t v) {
  opscope::set_kernel_variant(int(v));
  return v;
}
}  // namespace

// Called from Python as torch.ops.opscope.<name> and torch.classes.opscope.DecodeModel (the loader's
// Kernels object names them as the module's attributes were). The calls release the GIL, as the
// dispatcher does for every operator and custom-class method.
TORCH_LIBRARY_FRAGMENT(opscope, lib) {
  using opscope::DecodeModel;
  lib.def("dequantize", &opscope::dequantize);  // quantized weights to a dense [N, K] tensor
  lib.def("dequantize_scalar", &opscope::dequantize_scalar);  // raw GGUF blocks, portable decoders
  lib.def("raw_row_bytes", &opscope::raw_row_bytes);  // bytes per row of K weights of a ggml type (-1: no kernel)
  lib.def("raw_block_size", &opscope::raw_block_size);  // weights per block of a ggml type (0: no kernel)
  lib.def("pin_threads", &opscope::pin_threads);  // bind torch's OpenMP threads to the given cpus
  lib.def("has_avx512", &opscope::built_with_avx512);
  lib.def("has_vnni", &opscope::built_with_vnni);
  lib.def("has_int8_soa", &opscope::built_with_int8_soa);
  lib.def("raw_has_q8", &opscope::raw_has_q8);  // whether raw blocks of a ggml type have an int8 kernel here
  lib.def("set_kernel_variant", &set_kernel_variant_op);  // 1 or 2: which SIMD kernels run (benchmarks)
  lib.class_<DecodeModel>("DecodeModel")
      .def(torch::init<int64_t, int64_t, int64_t, int64_t, int64_t, double, int64_t, opscope::LinSpec, at::Tensor,
                       at::Tensor, opscope::LinSpec>())
      .def("add_layer", &DecodeModel::add_layer)
      .def("set_cache", &DecodeModel::set_cache)
      .def("step", &DecodeModel::step)
      .def("profile", &DecodeModel::profile);  // seconds per phase since the last call; on: time the next steps
}
