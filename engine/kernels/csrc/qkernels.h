// Shared declarations of the quantized matvec kernels (kernels.cpp) for the ops and the decode step.
#pragma once
#include <c10/util/Half.h>
#include <cstdint>
#include <vector>

namespace opscope {

constexpr int64_t QK = 32;  // elements per GGUF block for Q4_1 and Q8_0

// One packed weight matrix [N, K] (see kernels.cpp for the layout). Pointers only: the owner keeps
// the tensors alive.
struct Weights {
  int64_t qtype;  // 0 = Q4_1, 1 = Q8_0
  const uint8_t* qs;
  const c10::Half* d;
  const c10::Half* m;  // Q4_1 only
  int64_t N, K;
};

// Per-call activation buffers, reused so the decode step allocates nothing.
struct Scratch {
  std::vector<float> sx, dy;
  std::vector<int8_t> qy, qyp;
  void ensure(int64_t K) {
    if ((int64_t)qy.size() < K) { qy.resize(K); qyp.resize(K); sx.resize(K / QK); dy.resize(K / QK); }
  }
};

// ys[i] = Ws[i] @ x for n matrices sharing the input x (length K), in one parallel region.
// q8: quantize x to int8 per block and use integer dot products (where the CPU has VNNI).
void matvec_multi(const float* x, int64_t K, const Weights* ws, float* const* ys, int n, bool q8, Scratch& s);

// Row r of W dequantized to float32 (K values).
void dequantize_row(const Weights& w, int64_t r, float* out);

// Which generation of the SIMD kernels runs (1 or 2): for the A/B benchmarks only.
void set_kernel_variant(int v);

bool built_with_avx512();
bool built_with_vnni();

}  // namespace opscope
