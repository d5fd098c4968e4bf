// Prefill GEMM over quantized weights: y = x @ W^T for many rows of x (a prompt), exact float32.
//
// W is never expanded whole: output rows of W are cut into panels of a few dozen rows; a thread
// decodes one panel into its own buffer (a few hundred KB, so it stays in L2), multiplies it with
// every row of x (single-threaded sgemm), and takes the next panel. The threads work on different
// panels, so the only shared data are x (read) and y (disjoint columns). Panels are handed out by
// an atomic counter (for_each_panel), not split statically: a thread whose core is taken by another
// process for a while no longer holds up the whole GEMM, the other takes its panels (llama.cpp's
// matmuls hand out chunks the same way). Several panels per thread, so the last one to finish
// waits for at most a small one.
//
// qglu fuses an MLP's gate and up projections with the activation: per panel, gate and up rows of
// the same hidden units are multiplied and act(g) * u written, so the [M, hidden] gate and up
// outputs and the activation's passes over them never exist.
//
// The decoders give exactly gguf.quants.dequantize's values (see gguf_types.h); the sum order
// inside the GEMM is MKL's, as for torch.mm on the dequantized matrix.
#include "gguf_ids.h"
#include "qtensors.h"
#include "rowwork.h"  // the panels' decoders and the row work, compiled per variant

#include <ATen/Parallel.h>
#include <torch/library.h>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

// MKL's Fortran sgemm, exported by torch's own library where torch is built with MKL (weak: a
// torch without it falls back to at::mm on each panel).
extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                       const float* beta, float* c, const int* ldc) __attribute__((weak));
// MKL's per-thread thread count: 1 inside a worker, so sgemm never splits a panel again (torch turns
// MKL's dynamic adjustment off). The C entry point (mkl_service.h's mkl_set_num_threads_local is a
// macro for it; the lower-case symbol is the Fortran one, which takes a pointer).
extern "C" int MKL_Set_Num_Threads_Local(int n) __attribute__((weak));

// MKL on one thread for a worker's scope, the thread's previous setting restored when it ends.
struct MklOneThread {
  int before = MKL_Set_Num_Threads_Local != nullptr ? MKL_Set_Num_Threads_Local(1) : 0;
  MklOneThread() = default;
  MklOneThread(const MklOneThread&) = delete;
  MklOneThread& operator=(const MklOneThread&) = delete;
  ~MklOneThread() {
    if (MKL_Set_Num_Threads_Local != nullptr) MKL_Set_Num_Threads_Local(before);
  }
};
// MKL's packed-matrix GEMM (CBLAS, LP64 like sgemm_ above; weak for the same reason): the prompt's
// rows are packed into MKL's internal layout once per GEMM and every panel reuses them. A plain
// sgemm_ per panel packs them again for each panel: 5-15 % of the GEMM at 24-96-row panels.
extern "C" size_t cblas_sgemm_pack_get_size(int identifier, int m, int n, int k) __attribute__((weak));
extern "C" void cblas_sgemm_pack(int layout, int identifier, int trans, int m, int n, int k, float alpha,
                                 const float* src, int ld, float* dest) __attribute__((weak));
extern "C" void cblas_sgemm_compute(int layout, int transa, int transb, int m, int n, int k, const float* a,
                                    int lda, const float* b, int ldb, float beta, float* c, int ldc)
    __attribute__((weak));

namespace opscope {
namespace {

std::atomic<int64_t> g_panel_bytes{256 << 10};  // dequantized panel size aimed at (benchmarks tune it)
std::atomic<int> g_use_blas{1};
std::atomic<int> g_enabled{1};  // 0: qlinear keeps its older dequantize-tile + at::linear path (A/B)

// The prompt's rows x [M, K], and where MKL's packed GEMM is there, x packed once for every panel
// (CBLAS row-major: x is A, a panel B^T). Packed for the whole GEMM's N columns, not a panel's: MKL
// blocks K by the shape given at packing, and a panel size must not change the sum order (values
// equal bit for bit over any thread count and panel split).
struct Rows {
  enum { kRowMajor = 101, kNoTrans = 111, kTrans = 112, kPacked = 151, kAMatrix = 161 };
  const float* x;
  int64_t M, K;
  const float* packed = nullptr;

  Rows(const float* x_, int64_t M_, int64_t K_, int64_t N) : x(x_), M(M_), K(K_) {
    if (cblas_sgemm_pack_get_size == nullptr || cblas_sgemm_pack == nullptr || cblas_sgemm_compute == nullptr ||
        sgemm_ == nullptr || !g_use_blas.load(std::memory_order_relaxed))
      return;
    // MKL's packed form is several times x's size (9 MB for 512 x 576 here): the caller thread keeps
    // one buffer, uninitialised, so a GEMM neither zero-fills nor page-faults a fresh one.
    thread_local std::unique_ptr<float[]> buf;
    thread_local size_t cap = 0;
    const size_t need = cblas_sgemm_pack_get_size(kAMatrix, int(M), int(N), int(K)) / sizeof(float) + 1;
    if (need > cap) {
      buf.reset(new float[need]);
      cap = need;
    }
    cblas_sgemm_pack(kRowMajor, kAMatrix, kNoTrans, int(M), int(N), int(K), 1.f, x, int(K), buf.get());
    packed = buf.get();
  }
};

// c[M, n] (row stride ldc) = x[M, K] @ p[n, K]^T, on this thread only (inside for_each_panel's
// MklOneThread).
void panel_gemm(const Rows& xs, const float* p, int64_t n, float* c, int64_t ldc) {
  const float* x = xs.x;
  const int64_t M = xs.M, K = xs.K;
  if (xs.packed != nullptr) {
    cblas_sgemm_compute(Rows::kRowMajor, Rows::kPacked, Rows::kTrans, int(M), int(n), int(K), xs.packed,
                        int(K), p, int(K), 0.f, c, int(ldc));
    return;
  }
  if (sgemm_ != nullptr && g_use_blas.load(std::memory_order_relaxed)) {
    // Column-major view: c^T [n, M] (ld ldc) = p (stored [n, K] row-major: op "t", ld K) . x^T (ld K).
    const int mi = int(n), ni = int(M), ki = int(K), lda = int(K), ldb = int(K), ldci = int(ldc);
    const float one = 1.f, zero = 0.f;
    sgemm_("T", "N", &mi, &ni, &ki, &one, p, &lda, x, &ldb, &zero, c, &ldci);
    return;
  }
  auto opts = at::TensorOptions().dtype(at::kFloat);
  auto xt = at::from_blob(const_cast<float*>(x), {M, K}, opts);
  auto pt = at::from_blob(const_cast<float*>(p), {n, K}, opts);
  auto ct = at::from_blob(c, {M, n}, {ldc, 1}, opts);
  at::mm_out(ct, xt, pt.t());
}

// Panels of at most the panel budget's rows, and at least PANELS_PER_THREAD per thread where the
// rows allow, so that dynamic scheduling can even out; rows a multiple of PANEL_QUANTUM and at least
// PANEL_MIN: MKL's sgemm runs narrower or ragged panels 5-15 % slower (its AVX2 kernel takes 24
// rows at a time, the AVX-512 one 16 or 48).
constexpr int64_t PANELS_PER_THREAD = 4, PANEL_QUANTUM = 24, PANEL_MIN = 48;

struct Panels {
  int64_t rows, count;
};

Panels plan_panels(int64_t N, int64_t K, int64_t threads) {
  const auto up = [](int64_t r) { return (r + PANEL_QUANTUM - 1) / PANEL_QUANTUM * PANEL_QUANTUM; };
  const int64_t cap = std::max<int64_t>(PANEL_MIN, g_panel_bytes.load() / (4 * K) / PANEL_QUANTUM * PANEL_QUANTUM);
  const int64_t want = std::max((N + cap - 1) / cap, threads > 1 ? PANELS_PER_THREAD * threads : 1);
  const int64_t rows = std::min<int64_t>(N, std::min(cap, std::max(PANEL_MIN, up((N + want - 1) / want))));
  return {rows, (N + rows - 1) / rows};
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

// f(r0, n, buf) for every panel [r0, r0 + n) of N output rows, buf a thread's own float32 buffer of
// rows * K. One worker per thread; each takes the next panel from a shared counter until none is
// left.
template <class F>
void for_each_panel(const Panels& pl, int64_t N, int64_t K, F&& f) {
  const int64_t threads = at::get_num_threads();
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min(threads, pl.count), 1, [&](int64_t, int64_t) {
    const MklOneThread one;  // sgemm must not split a panel again
    Buffers& bufs = buffers();
    float* buf = bufs.get(bufs.panel, pl.rows * K);
    for (int64_t p = next.fetch_add(1, std::memory_order_relaxed); p < pl.count;
         p = next.fetch_add(1, std::memory_order_relaxed)) {
      const int64_t r0 = p * pl.rows;
      f(r0, std::min(pl.rows, N - r0), buf);
    }
  });
}

// h[0..n) = act(g) * u, act 0: SiLU, 1: GELU (tanh approximation).
void glu_vec(float* h, const float* u, int64_t n, int64_t act) {
  rows::glu(h, u, n, act, h);
}

// glu_vec over a panel's row; its last < 16 values go through the vector code too, padded, so that
// a value's bits do not depend on where a panel boundary falls (panels are 24-row multiples).
void glu_row(float* h, const float* u, int64_t n, int64_t act) {
  const int64_t body = n / 16 * 16;
  glu_vec(h, u, body, act);
  if (body == n) return;
  float hh[16] = {}, uu[16] = {};
  std::copy(h + body, h + n, hh);
  std::copy(u + body, u + n, uu);
  glu_vec(hh, uu, 16, act);
  std::copy(hh, hh + (n - body), h + body);
}

// glu_row of bf16 gate and up values (bits as uint16), the result in float32: widened a chunk at a
// time (exactly: a bf16 is the top half of a float), so the bits equal glu_row's on the widened rows.
void glu_row_bf16(float* out, const uint16_t* h, const uint16_t* u, int64_t n, int64_t act) {
  constexpr int64_t CHUNK = 512;  // a multiple of 16: glu_row's vector blocks fall where they would
  alignas(64) float uu[CHUNK];
  for (int64_t j = 0; j < n; j += CHUNK) {
    const int64_t m = std::min(CHUNK, n - j);
    for (int64_t i = 0; i < m; ++i) {
      const uint32_t hb = uint32_t(h[j + i]) << 16, ub = uint32_t(u[j + i]) << 16;
      std::memcpy(out + j + i, &hb, 4);
      std::memcpy(uu + i, &ub, 4);
    }
    glu_row(out + j, uu, m, act);
  }
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
  const float* xp = x2.data_ptr<float>();
  float* yp = out.data_ptr<float>();
  const Panels pl = plan_panels(N, K, at::get_num_threads());
  const Rows xs(xp, M, K, N);
  for_each_panel(pl, N, K, [&](int64_t r0, int64_t n, float* buf) {
    rows::decode_panel(w, r0, n, buf);
    panel_gemm(xs, buf, n, yp + r0, N);
  });
  return out.reshape(out_shape(x, N));
}

namespace {

// float32 [M, N] = xb @ W^T, xb bfloat16 [M, K], with bf16 products (for CPUs that multiply bf16
// natively: oneDNN's AVX512-BF16 or AMX GEMM). W is decoded a tile at a time (at most 16 MiB of
// bf16: a large output head is never whole); a tile's panels are decoded to float32 in each
// thread's own buffer and rounded to bf16 from there, in parallel, then the tile is one
// multi-threaded GEMM.
// ``out`` float32 (the default) or bfloat16: the GEMM's own output, unconverted, for a caller that
// reads it once (prefill_glu_bf16).
at::Tensor bf16_gemm(const at::Tensor& xb, const Weights& w, at::ScalarType out_dtype = at::kFloat) {
  const int64_t M = xb.size(0), K = w.K, N = w.N;
  if (w.raw() && w.ggml_type == gguf::BF16 && w.row_bytes == 2 * K) {
    // already bfloat16, row by row: the GEMM reads the file's rows (decoding them to float32 and
    // rounding back gives the same bits, and a copy of the matrix)
    const auto wb = at::from_blob(const_cast<uint8_t*>(w.qs), {N, K}, xb.options());
    return at::mm(xb, wb.t()).to(out_dtype);
  }
  const int64_t tile = std::min(N, std::max<int64_t>(64, (int64_t(8) << 20) / K / 64 * 64));
  auto wb = at::empty({tile, K}, xb.options());
  auto* wp = reinterpret_cast<uint16_t*>(wb.data_ptr<at::BFloat16>());
  at::Tensor out;
  for (int64_t t0 = 0; t0 < N; t0 += tile) {
    const int64_t n = std::min(tile, N - t0);
    for_each_panel(plan_panels(n, K, at::get_num_threads()), n, K, [&](int64_t r0, int64_t pn, float* buf) {
      rows::decode_panel(w, t0 + r0, pn, buf);
      rows::to_bf16(buf, wp + r0 * K, pn * K);
    });
    auto y = at::mm(xb, wb.narrow(0, 0, n).t());
    if (n == N) return y.to(out_dtype);
    if (!out.defined()) out = at::empty({M, N}, xb.options().dtype(out_dtype));
    out.narrow(1, t0, n).copy_(y);
  }
  return out;
}

}  // namespace

// y = x @ W^T, float32 in and out, the products in bfloat16 (bf16_gemm).
at::Tensor prefill_gemm_bf16(const at::Tensor& x, const Weights& w) {
  return bf16_gemm(rows_of(x, w.K).to(at::kBFloat16), w).reshape(out_shape(x, w.N));
}

namespace {

// x (float32 [M, K]) quantized per token and group of 32, as the decode step's int8 mode does, with
// the offsets' terms da * (sum of the int8 values) per 32 and per 16 (the 16-weight group types').
struct Act8Rows {
  at::Tensor qa, da, ds, ds16, n16;  // int8 [M, K]; float32 [M, K / 32] (da, ds), [M, K / 16]; int32 [M, K / 16]
};

// ``sums16``: also the sums per 16, which only the 16-weight-group types read.
Act8Rows quantize_rows(const at::Tensor& x2, bool sums16) {
  const int64_t M = x2.size(0), K = x2.size(1), G = K / 32;
  Act8Rows a{at::empty({M, K}, x2.options().dtype(at::kChar)), at::empty({M, G}, x2.options()),
             at::empty({M, G}, x2.options()), at::empty({sums16 ? M : 0, 2 * G}, x2.options()),
             at::empty({M, 2 * G}, x2.options().dtype(at::kInt))};
  const float* xp = x2.data_ptr<float>();
  int8_t* qp = a.qa.data_ptr<int8_t>();
  float *dp = a.da.data_ptr<float>(), *sp = a.ds.data_ptr<float>(), *s16 = a.ds16.data_ptr<float>();
  int32_t* n16 = a.n16.data_ptr<int32_t>();
  at::parallel_for(0, M, 8, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      rows::quantize_q8(xp + i * K, K, qp + i * K, dp + i * G, sp + i * G, sums16 ? s16 + i * 2 * G : nullptr,
                        n16 + i * 2 * G);
    }
  });
  return a;
}

// float32 [M, N_i] = x @ W_i^T for each weight (x's int8 rows shared: q, k and v; gate and up): the
// panels of 48 rows (a weight's last 16 or 32) of every weight handed out to the threads from one
// shared counter in one parallel region; each decodes its panel into the kernel's layout, then runs
// it over every token, writing float32 straight into that weight's output.
std::vector<at::Tensor> int8_gemms(const Act8Rows& a, const std::vector<Weights>& ws) {
  constexpr int64_t PW = 48;
  struct Panel {
    size_t w;
    int64_t r0, n;
  };
  const int64_t M = a.qa.size(0), K = a.qa.size(1);
  std::vector<at::Tensor> ys;
  std::vector<Panel> panels;
  for (size_t i = 0; i < ws.size(); ++i) {
    TORCH_CHECK(ws[i].K == K, "the weights' rows must have the activations' length ", K);
    ys.push_back(at::empty({M, ws[i].N}, a.da.options()));
    for (int64_t r0 = 0; r0 < ws[i].N; r0 += PW) panels.push_back({i, r0, std::min(PW, ws[i].N - r0)});
  }
  const int8_t* qa = a.qa.data_ptr<int8_t>();
  const float* da = a.da.data_ptr<float>();
  const int32_t* n16 = a.n16.data_ptr<int32_t>();
  bool wide = false;  // some panels in int16 (rows::int8_wide): the activations widened once for all
  for (const Weights& w : ws) wide = wide || rows::int8_wide(w);
  at::Tensor a16 = wide ? at::empty({M, K}, a.qa.options().dtype(at::kShort)) : at::Tensor();
  if (wide)  // in blocks of 16 rows (a multiple of the tile's tokens), the last one to M
    at::parallel_for(0, (M + 15) / 16, 1, [&](int64_t b0, int64_t b1) {
      const int64_t i0 = 16 * b0, i1 = std::min(M, 16 * b1);
      rows::widen_q8(qa + i0 * K, i1 - i0, K, a16.data_ptr<int16_t>() + i0 * K);
    });
  const int16_t* qa16 = wide ? a16.data_ptr<int16_t>() : nullptr;
  const int64_t count = int64_t(panels.size());
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min<int64_t>(at::get_num_threads(), count), 1, [&](int64_t, int64_t) {
    std::vector<uint8_t> u(PW * K * (wide ? 2 : 1));
    std::vector<float> s(PW * (K / 16)), c(PW * (K / 16));
    for (int64_t p = next.fetch_add(1, std::memory_order_relaxed); p < count;
         p = next.fetch_add(1, std::memory_order_relaxed)) {
      const Panel& pl = panels[p];
      const Weights& w = ws[pl.w];
      const int64_t gs = rows::int8_group_size(w), N = w.N;
      const rows::Int8Rows acts{qa, da, (gs == 32 ? a.ds : a.ds16).data_ptr<float>(), n16, M, qa16};
      const int kappa = rows::int8_decode_panel(w, pl.r0, pl.n, u.data(), s.data(), c.data());
      rows::int8_gemm_panel(gs, rows::int8_quant_bits(w), kappa, u.data(), s.data(), c.data(), pl.n, K, acts,
                            ys[pl.w].data_ptr<float>() + pl.r0, N);
    }
  });
  return ys;
}

at::Tensor int8_gemm(const Act8Rows& a, const Weights& w) { return int8_gemms(a, {w})[0]; }

void check_int8(const Weights& w) {
  TORCH_CHECK(rows::int8_group_size(w) > 0, "no int8 prefill GEMM for this weight type in this build ",
              "(the variants with int8 kernels; the quantized types but F16/BF16; rows a multiple of 16)");
}

}  // namespace

// y = x @ W^T with x quantized to int8 per 32 (the int8-activation mode's scheme), float32 out.
at::Tensor prefill_gemm_int8(const at::Tensor& x, const Weights& w) {
  check_int8(w);
  return int8_gemm(quantize_rows(rows_of(x, w.K), rows::int8_group_size(w) == 16), w).reshape(out_shape(x, w.N));
}

// prefill_glu with int8 gate and up products (x quantized once); the activation in float32.
at::Tensor prefill_glu_int8(const at::Tensor& x, const Weights& g, const Weights& u, int64_t act) {
  TORCH_CHECK(g.N == u.N && g.K == u.K, "gate and up projections differ in shape");
  TORCH_CHECK(act == 0 || act == 1, "act must be 0 (SiLU) or 1 (GELU tanh), got ", act);
  check_int8(g);
  check_int8(u);
  const bool sums16 = rows::int8_group_size(g) == 16 || rows::int8_group_size(u) == 16;
  auto hu = int8_gemms(quantize_rows(rows_of(x, g.K), sums16), {g, u});
  auto &h = hu[0], &up = hu[1];
  const int64_t M = h.size(0), N = g.N;
  float* hp = h.data_ptr<float>();
  const float* upp = up.data_ptr<float>();
  at::parallel_for(0, M, 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) glu_row(hp + i * N, upp + i * N, N, act);
  });
  return h.reshape(out_shape(x, N));
}

// y_i = x @ W_i^T for several weights that read the same x (q, k and v), x quantized to int8 once
// and every weight's panels in one parallel region.
std::vector<at::Tensor> prefill_gemms_int8(const at::Tensor& x, const std::vector<Weights>& ws) {
  TORCH_CHECK(!ws.empty(), "no weights");
  bool sums16 = false;
  for (const Weights& w : ws) check_int8(w), sums16 = sums16 || rows::int8_group_size(w) == 16;
  auto ys = int8_gemms(quantize_rows(rows_of(x, ws[0].K), sums16), ws);
  for (size_t i = 0; i < ws.size(); ++i) ys[i] = ys[i].reshape(out_shape(x, ws[i].N));
  return ys;
}

// The group size of the int8 prefill GEMM for this weight type and shape here: 32, 16, or 0 (none).
int64_t int8_prefill_group(int64_t qtype, int64_t K, int64_t N) {
  Weights w{qtype, nullptr, nullptr, nullptr, N, K};
  if (qtype >= QTYPE_RAW) w.ggml_type = qtype - QTYPE_RAW;
  return rows::int8_group_size(w);
}

// prefill_glu with the gate and up products in bfloat16 (bf16_gemm); the activation in float32.
at::Tensor prefill_glu_bf16(const at::Tensor& x, const Weights& g, const Weights& u, int64_t act) {
  TORCH_CHECK(g.N == u.N && g.K == u.K, "gate and up projections differ in shape");
  TORCH_CHECK(act == 0 || act == 1, "act must be 0 (SiLU) or 1 (GELU tanh), got ", act);
  auto xb = rows_of(x, g.K).to(at::kBFloat16);
  const int64_t M = xb.size(0), N = g.N;
  // The products stay bf16 (the GEMM's output) until the activation reads them: one pass that
  // widens both and writes the float32 result, not a conversion of each and a third pass.
  const auto h = bf16_gemm(xb, g, at::kBFloat16), up = bf16_gemm(xb, u, at::kBFloat16);
  const auto* hp = reinterpret_cast<const uint16_t*>(h.data_ptr<at::BFloat16>());
  const auto* upp = reinterpret_cast<const uint16_t*>(up.data_ptr<at::BFloat16>());
  auto out = at::empty({M, N}, xb.options().dtype(at::kFloat));
  float* op = out.data_ptr<float>();
  at::parallel_for(0, M, 16, [&](int64_t a, int64_t b) {
    for (int64_t i = a; i < b; ++i) glu_row_bf16(op + i * N, hp + i * N, upp + i * N, N, act);
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
  const float* xp = x2.data_ptr<float>();
  float* hp = out.data_ptr<float>();
  const Panels pl = plan_panels(N, K, at::get_num_threads());
  const Rows xs(xp, M, K, N);
  for_each_panel(pl, N, K, [&](int64_t r0, int64_t n, float* buf) {
    Buffers& bufs = buffers();
    float* tmp = bufs.get(bufs.tmp, M * n);
    rows::decode_panel(g, r0, n, buf);
    panel_gemm(xs, buf, n, hp + r0, N);
    rows::decode_panel(u, r0, n, buf);
    panel_gemm(xs, buf, n, tmp, n);
    for (int64_t i = 0; i < M; ++i) glu_row(hp + i * N + r0, tmp + i * n, n, act);
  });
  return out.reshape(out_shape(x, N));
}

// Prefill attention, exact float32: RoPE (rotate-half) on q and k, k and v written into the KV cache
// at [start, start + T), then causal attention over the cache's first start + T positions with
// grouped KV heads, out [B, T, H * D] in o_proj's layout (no transpose copy). Work items are (batch,
// kv head, block of Bq queries): the rep = H / Kh query heads of one kv head share the item, so the
// scores are one [rep * Bq, e] sgemm against the keys 0..e the block can see, then a masked softmax
// (vec::exp), then one [Bq, D] sgemm per head straight into the output rows. The division by the
// softmax sum is applied to the D outputs, not the e probabilities.
namespace {

// Row-wise s[0..n) ← exp(scale * (s - max)), s[n..e) ← 0; returns the sum of the n values.
float softmax_row(float* s, int64_t n, int64_t e, float scale) {
  const float total = rows::softmax_exp(s, n, scale);
  std::fill(s + n, s + e, 0.f);
  return total;
}

// C[m, n] (row stride ldc) = A[m, k] (row stride lda) @ B^T, B [n, k] (row stride ldb); this thread.
void gemm_abt(const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc, int64_t m,
              int64_t n, int64_t k) {
  if (sgemm_ != nullptr) {  // column-major: C^T [n, m] = B (op T) . A^T
    const int mi = int(n), ni = int(m), ki = int(k), la = int(ldb), lb = int(lda), lc = int(ldc);
    const float one = 1.f, zero = 0.f;
    sgemm_("T", "N", &mi, &ni, &ki, &one, b, &la, a, &lb, &zero, c, &lc);
    return;
  }
  auto opts = at::TensorOptions().dtype(at::kFloat);
  auto ct = at::from_blob(c, {m, n}, {ldc, 1}, opts);
  at::mm_out(ct, at::from_blob(const_cast<float*>(a), {m, k}, {lda, 1}, opts),
             at::from_blob(const_cast<float*>(b), {n, k}, {ldb, 1}, opts).t());
}

// C[m, n] (row stride ldc) = A[m, k] (row stride lda) @ B, B [k, n] (row stride ldb); this thread.
void gemm_ab(const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc, int64_t m,
             int64_t n, int64_t k) {
  if (sgemm_ != nullptr) {  // column-major: C^T [n, m] = B^T (op N) . A^T (op N)
    const int mi = int(n), ni = int(m), ki = int(k), la = int(ldb), lb = int(lda), lc = int(ldc);
    const float one = 1.f, zero = 0.f;
    sgemm_("N", "N", &mi, &ni, &ki, &one, b, &la, a, &lb, &zero, c, &lc);
    return;
  }
  auto opts = at::TensorOptions().dtype(at::kFloat);
  auto ct = at::from_blob(c, {m, n}, {ldc, 1}, opts);
  at::mm_out(ct, at::from_blob(const_cast<float*>(a), {m, k}, {lda, 1}, opts),
             at::from_blob(const_cast<float*>(b), {k, n}, {ldb, 1}, opts));
}

struct AttnItem {
  int64_t b, g, i0, cost;
};

std::atomic<int64_t> g_attn_block{64};  // queries per work item (benchmarks tune it)

at::Tensor prefill_attn(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                        const at::Tensor& cos_in, const at::Tensor& sin_in, const at::Tensor& kcache,
                        const at::Tensor& vcache, int64_t start, double scale_in) {
  TORCH_CHECK(q_in.dim() == 4 && k_in.dim() == 4 && v_in.dim() == 4, "prefill_attn takes q, k, v as [B, T, heads, D]");
  for (const at::Tensor* t : {&q_in, &k_in, &v_in, &cos_in, &sin_in, &kcache, &vcache})
    TORCH_CHECK(t->scalar_type() == at::kFloat, "prefill_attn takes float32 tensors");
  const int64_t B = q_in.size(0), T = q_in.size(1), H = q_in.size(2), D = q_in.size(3), Kh = k_in.size(2);
  TORCH_CHECK(k_in.sizes() == v_in.sizes() && k_in.size(0) == B && k_in.size(1) == T && k_in.size(3) == D,
              "k and v must be [B, T, kv heads, D] like q");
  TORCH_CHECK(H % Kh == 0 && D % 2 == 0, "query heads must be a multiple of kv heads, D even");
  TORCH_CHECK(kcache.is_contiguous() && vcache.is_contiguous() && kcache.dim() == 4 &&
                  kcache.sizes() == vcache.sizes() && kcache.size(0) >= B && kcache.size(2) == Kh &&
                  kcache.size(3) == D && start >= 0 && start + T <= kcache.size(1),
              "the KV cache must be contiguous [B, S, kv heads, D] with room for positions up to ", start + T);
  auto q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  auto cs = cos_in.reshape({-1, D}).contiguous(), sn = sin_in.reshape({-1, D}).contiguous();
  TORCH_CHECK(cs.size(0) == T && sn.size(0) == T, "cos/sin must be [1, T, 1, D] (one row of positions)");
  const int64_t S = kcache.size(1), rep = H / Kh, ldq = H * D, ldkv = Kh * D;
  const int64_t blk = std::max<int64_t>(1, g_attn_block.load(std::memory_order_relaxed));
  const float scale = scale_in > 0 ? float(scale_in) : 1.f / std::sqrt(float(D));
  auto out = at::empty({B, T, H * D}, q.options());
  const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  const float *cp = cs.data_ptr<float>(), *sp = sn.data_ptr<float>();
  float *kc = kcache.data_ptr<float>(), *vc = vcache.data_ptr<float>(), *op = out.data_ptr<float>();
  at::parallel_for(0, B * T, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / T, t = r % T;
      float* kdst = kc + (b * S + start + t) * ldkv;
      for (int64_t h = 0; h < Kh; ++h) rows::rope_half(kp + (r * Kh + h) * D, cp + t * D, sp + t * D, D, kdst + h * D);
      std::copy(vp + r * ldkv, vp + (r + 1) * ldkv, vc + (b * S + start + t) * ldkv);
    }
  });
  std::vector<AttnItem> items;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i0 = 0; i0 < T; i0 += blk)
      for (int64_t g = 0; g < Kh; ++g) items.push_back({b, g, i0, start + std::min(T, i0 + blk)});
  std::stable_sort(items.begin(), items.end(), [](const AttnItem& x, const AttnItem& y) { return x.cost > y.cost; });
  const int64_t nt = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), int64_t(items.size())));
  std::atomic<size_t> next{0};
  at::parallel_for(0, nt, 1, [&](int64_t, int64_t) {
    Buffers& bufs = buffers();
    // A block's rows are token-major (token i, head hh at row i * rep + hh): its queries are
    // contiguous runs of rep * D in q, and so are its outputs in out.
    std::vector<float> qb(rep * blk * D), ob(rep * blk * D), sums(rep * blk);
    const MklOneThread one;
    // Items sorted by cost, the longest first, each to the next thread free: a thread a neighbour
    // slows takes fewer (a round-robin deal waited for it at the end of every layer).
    for (size_t it = next.fetch_add(1, std::memory_order_relaxed); it < items.size();
         it = next.fetch_add(1, std::memory_order_relaxed)) {
      const AttnItem& w = items[it];
      const int64_t bq = std::min(blk, T - w.i0), e = w.cost, rows = rep * bq;
      float* sc = bufs.get(bufs.tmp, rows * e);
      for (int64_t i = 0; i < bq; ++i) {
        const int64_t tok = w.i0 + i;
        for (int64_t hh = 0; hh < rep; ++hh)
          rows::rope_half(qp + ((w.b * T + tok) * H + w.g * rep + hh) * D, cp + tok * D, sp + tok * D, D,
                   qb.data() + (i * rep + hh) * D);
      }
      const float* kb = kc + w.b * S * ldkv + w.g * D;
      const float* vb = vc + w.b * S * ldkv + w.g * D;
      gemm_abt(qb.data(), D, kb, ldkv, sc, e, rows, e, D);
      for (int64_t r = 0; r < rows; ++r) sums[r] = softmax_row(sc + r * e, start + w.i0 + r / rep + 1, e, scale);
      gemm_ab(sc, e, vb, ldkv, ob.data(), D, rows, D, e);
      for (int64_t i = 0; i < bq; ++i) {
        float* dst = op + (w.b * T + w.i0 + i) * ldq + w.g * rep * D;
        for (int64_t hh = 0; hh < rep; ++hh) {
          rows::scale(ob.data() + (i * rep + hh) * D, 1.f / sums[i * rep + hh], D, dst + hh * D);
        }
      }
    }
  });
  return out;
}

// Queries per attention work item (a value < 1 keeps it); returns the setting.
int64_t prefill_attn_config(int64_t block) {
  if (block > 0) g_attn_block = block;
  return g_attn_block.load();
}

// RMSNorm of float32 rows in one pass over each (torch's CPU rms_norm is a chain of elementwise
// ops: pow, mean, add, rsqrt, mul, mul, each a pass over [T, C]): y = x * rsqrt(mean(x^2) + eps) * w.
at::Tensor rms_norm(const at::Tensor& x_in, const at::Tensor& w_in, double eps) {
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && w_in.scalar_type() == at::kFloat, "rms_norm takes float32");
  const int64_t C = x_in.size(-1);
  TORCH_CHECK(w_in.numel() == C, "rms_norm weight has ", w_in.numel(), " elements, the rows ", C);
  auto x = x_in.contiguous(), w = w_in.contiguous();
  auto out = at::empty_like(x);
  const int64_t R = C == 0 ? 0 : x.numel() / C;
  const float *xp = x.data_ptr<float>(), *wp = w.data_ptr<float>();
  float* yp = out.data_ptr<float>();
  at::parallel_for(0, R, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, C)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* a = xp + r * C;
      float* y = yp + r * C;
      const float inv = 1.f / std::sqrt(rows::dot(a, a, C) / float(C) + float(eps));
      rows::scale_mul(a, inv, wp, C, y);
    }
  });
  return out;
}

}  // namespace

namespace {

at::Tensor qgemm_op(const at::Tensor& x, const at::Tensor& qs, const c10::optional<at::Tensor>& d,
                    const c10::optional<at::Tensor>& m, int64_t qtype) {
  return prefill_gemm(x, make_weights(qtype, qs, d, m, x.size(-1)));
}

at::Tensor qglu_op(const at::Tensor& x, const at::Tensor& gqs, const c10::optional<at::Tensor>& gd,
                   const c10::optional<at::Tensor>& gm, int64_t gtype, const at::Tensor& uqs,
                   const c10::optional<at::Tensor>& ud, const c10::optional<at::Tensor>& um, int64_t utype,
                   int64_t act, c10::optional<c10::ScalarType> gemm_dtype) {
  const int64_t K = x.size(-1);
  const Weights g = make_weights(gtype, gqs, gd, gm, K), u = make_weights(utype, uqs, ud, um, K);
  if (gemm_dtype.value_or(at::kFloat) == at::kBFloat16) return prefill_glu_bf16(x, g, u, act);
  if (gemm_dtype.value_or(at::kFloat) == at::kChar) return prefill_glu_int8(x, g, u, act);
  TORCH_CHECK(gemm_dtype.value_or(at::kFloat) == at::kFloat, "qglu: gemm_dtype float32, bfloat16 or int8");
  return prefill_glu(x, g, u, act);
}

// x @ W_i^T for each weight (q, k and v: one input) with int8 activations: x quantized once, one
// parallel region for every weight's panels.
std::vector<at::Tensor> qgemms_int8_op(const at::Tensor& x, at::TensorList qs, const c10::List<c10::optional<at::Tensor>>& d,
                                       const c10::List<c10::optional<at::Tensor>>& m, at::IntArrayRef qtype) {
  TORCH_CHECK(qs.size() == d.size() && qs.size() == m.size() && qs.size() == qtype.size(),
              "qgemms_int8: one qs, d, m and qtype per weight");
  std::vector<Weights> ws;
  for (size_t i = 0; i < qs.size(); ++i) ws.push_back(make_weights(qtype[i], qs[i], d.get(i), m.get(i), x.size(-1)));
  return prefill_gemms_int8(x, ws);
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
          "int utype, int act, ScalarType? gemm_dtype=None) -> Tensor");
  lib.def("prefill_attn(Tensor q, Tensor k, Tensor v, Tensor cos, Tensor sin, Tensor(a!) kcache, Tensor(b!) vcache, "
          "int start, float scale) -> Tensor");
  lib.def("rms_norm(Tensor x, Tensor w, float eps) -> Tensor");
  lib.def("qgemms_int8(Tensor x, Tensor[] qs, Tensor?[] d, Tensor?[] m, int[] qtype) -> Tensor[]");
  lib.def("prefill_attn_config(int block) -> int", &opscope::prefill_attn_config);
  lib.def("prefill_config(int panel_bytes, int use_blas, int enabled) -> int[]", &opscope::prefill_config);
  lib.def("int8_prefill_group(int qtype, int K, int N) -> int", &opscope::int8_prefill_group);
}

TORCH_LIBRARY_IMPL(opscope, CPU, lib) {
  lib.impl("qgemm", &opscope::qgemm_op);
  lib.impl("qglu", &opscope::qglu_op);
  lib.impl("prefill_attn", &opscope::prefill_attn);
  lib.impl("rms_norm", &opscope::rms_norm);
  lib.impl("qgemms_int8", &opscope::qgemms_int8_op);
}
