// Shared declarations of the quantized matvec kernels (kernels.cpp) for the ops and the decode step.
#pragma once
#include <c10/util/Half.h>
#include <cstdint>
#include <vector>

namespace opscope {

constexpr int64_t QK = 32;  // elements per GGUF block for Q4_1 and Q8_0

// qtype codes: 0 = Q4_1 and 1 = Q8_0 repacked structure-of-arrays (kernels.cpp); QTYPE_RAW + t =
// raw GGUF blocks of ggml type t as stored in the file (raw.cpp, gguf_types.h).
constexpr int64_t QTYPE_RAW = 16;
constexpr int64_t QTYPE_Q4_0_SOA = 2;  // the DecodeModel's code for Q4_0 held as Q4_1 (m = -8 d)

// One weight matrix [N, K]. Pointers only: the owner keeps the tensors alive.
struct Weights {
  int64_t qtype;
  const uint8_t* qs;  // SoA quants, or the raw blocks [N, row_bytes]
  const c10::Half* d;  // SoA only
  const c10::Half* m;  // SoA Q4_1 only
  int64_t N, K;
  int64_t ggml_type = -1;  // raw only
  int64_t row_bytes = 0;  // raw only
  // SoA Q4_1 holding Q4_0 with m = -8 d exactly (engine.kernels.packing): the SIMD kernels take the
  // offset from d and never read m, a tenth fewer bytes per weight (set by the DecodeModel, whose
  // qtype QTYPE_Q4_0_SOA says so; m stays valid for every other reader).
  bool m_from_d = false;
  bool raw() const { return qtype >= QTYPE_RAW; }
};

// Activations quantized per 256 values for the K types' int8 kernels (raw_q8.cpp; llama.cpp's
// block_q8_K): int8 values in plain order and in Q4_K/Q5_K's sub-block order, the scale per 256,
// the sums of the int8 values per 16 and per 32.
struct Q8K {
  std::vector<int8_t> q, q4, qx;  // q4, qx (IQ4_XS's order) and bs32: the 512-bit kernels only
  std::vector<float> d;
  std::vector<int16_t> bs16, bs32;
};

// Per-call activation buffers, reused so the decode step allocates nothing.
struct Scratch {
  Q8K k;
  std::vector<float> sx, dy, sxf;  // sxf: exact float32 block sums of x (raw-block kernels)
  std::vector<int8_t> qy, qyp;
  void ensure(int64_t K) {
    if ((int64_t)qy.size() < K) {
      qy.resize(K); qyp.resize(K); sx.resize(K / QK); dy.resize(K / QK); sxf.resize(K / QK + 1);
    }
  }
};

// ys[i] = Ws[i] @ x for n matrices sharing the input x (length K), in one parallel region.
// q8: quantize x to int8 per block and use integer dot products (where the CPU has VNNI).
void matvec_multi(const float* x, int64_t K, const Weights* ws, float* const* ys, int n, bool q8, Scratch& s);

// Row r of W dequantized to float32 (K values).
void dequantize_row(const Weights& w, int64_t r, float* out);

// Raw GGUF blocks (raw.cpp): weights per block of a ggml type (0: no kernel), bytes per row of K
// weights (-1: no kernel or K not a whole number of blocks), rows [r0, r1) of y = W x, one row
// dequantized (SIMD decoder; the scalar one for tests).
int64_t raw_block_size(int64_t ggml_type);
int64_t raw_row_bytes(int64_t ggml_type, int64_t K);
// sx: sums of x per 32-block (the min/offset terms of the 32-weight block types).
void raw_rows(const Weights& w, const float* x, const float* sx, int64_t r0, int64_t r1, float* y);
void raw_dequantize_row(const Weights& w, int64_t r, float* out);
// int8 activations (raw_q8.cpp): whether ggml type t has such a kernel in this build (AVX-512
// x (K a multiple of 256) quantized for the K types, rows [r0, r1) of y = W x_q.
// VNNI), in blocks of 32 (per-32 activations, kernels.cpp's) or 256 (Q8K); 0: none.
int raw_q8_block(int64_t ggml_type);
bool raw_has_q8(int64_t ggml_type);
void prepare_q8k(const float* x, int64_t K, Q8K& a);
// The int8 activations: per 32 (qy plain order, dy scales, sx = dy * sums of qy) and per 256.
struct Act8 {
  const int8_t* qy;
  const float* dy;
  const float* sx;
  const Q8K* k;
};
void raw_rows_q8(const Weights& w, const Act8& a, int64_t r0, int64_t r1, float* y);
void raw_dequantize_row_scalar(const Weights& w, int64_t r, float* out);

// Which generation of the SIMD kernels runs (1 or 2): for the A/B benchmarks only.
void set_kernel_variant(int v);

bool built_with_avx512();
bool built_with_vnni();
bool built_with_int8_soa();  // int8 activations for the repacked Q4_1 / Q8_0 (VNNI or AVX2)

}  // namespace opscope
