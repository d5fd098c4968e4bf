// The vector work of the decode step and the prefill (rowwork.cpp, compiled per variant with its
// flags), called by the torch-facing half (torch_unity.cpp), which is compiled once per platform
// and torch with the architecture's baseline flags: it holds no vector code of its own.
#pragma once
#include <cstdint>

#include "qkernels.h"

namespace opscope {
namespace rows {

float dot(const float* a, const float* b, int64_t n);
// out = x * rsqrt(mean(x^2) + eps) * w, the sum of squares in double (the decode step's)
void rmsnorm(const float* x, const float* w, int64_t n, double eps, float* out);
// y = a * inv * w (the prefill's RMSNorm rows)
void scale_mul(const float* a, float inv, const float* w, int64_t n, float* y);
// out = act(g) * u over n values; act 0: SiLU, 1: GELU (tanh approximation)
void glu(const float* g, const float* u, int64_t n, int64_t act, float* out);
// s[0..n) <- exp(scale * (s - max s)); returns their sum
float softmax_exp(float* s, int64_t n, float scale);
// nh queries of length D (query i at q + i * D; nh at most 8) that share keys 0..last (key t at
// k + t * stride, value t at v + t * stride): query i's scores into sc + i * sstride, its
// softmax(q . k * scale) @ v into out + i * D.
void attend(const float* q, int64_t nh, const float* k, const float* v, int64_t stride, int64_t last, int64_t D,
            float scale, float* sc, int64_t sstride, float* out);
// Rows [r0, r0 + n) of w decoded to float32 into buf (row i at buf + i * K).
void decode_panel(const Weights& w, int64_t r0, int64_t n, float* buf);
// x (K values, K a multiple of 32) to int8 per 32 as the decode step's int8 mode does
// (kernels.cpp's prepare_activation: scale d = amax / 127, nearest with ties to even, bit for bit),
// with s = d * the block's sum of int8 values and, where s16 is not null, the same per 16.
// n16, where not null: the int8 sums per 16 themselves.
void quantize_q8(const float* x, int64_t K, int8_t* q, float* d, float* s, float* s16, int32_t* n16);
// out[0..D) = rotate-half RoPE of x with c, s (each [D]; out does not overlap x).
void rope_half(const float* x, const float* c, const float* s, int64_t D, float* out);
// y[0..n) = a * x (y does not overlap x).
void scale(const float* x, float a, int64_t n, float* y);
// dst[0..n) = src rounded to bfloat16 (to nearest even; a NaN stays a NaN), as torch's conversion does.
void to_bf16(const float* src, uint16_t* dst, int64_t n);

// ---- The int8 prefill GEMM (the int8-activation mode's prefill, llama.cpp's scheme): weights as
// quants u with a float scale s and offset c per (row, group of GS = 32 or 16 weights), w = s*u + c;
// the activations int8 per (token, 32) with scale da, and per group ds = da * the group's sum of
// int8 values. Rows are taken in panels of n = 16, 32 or 48; a panel's quants are laid out
// [K/GS groups][GS/4 quads][n rows][4 bytes] (one zmm = 16 rows by 4 k, a ymm 8, a NEON q 4; with
// ARM's i8mm [GS/8][n rows][8 bytes]: a NEON q 2 rows by 8 k, smmla's operand), s and c
// [K/GS][n]. The group size of w's int8 GEMM in this build (the variants with int8 kernels): 32 for
// the 32-weight block types and Q4_K, Q5_K, IQ4_XS; 16 for Q2_K, Q3_K, Q6_K; 0: none (other types
// or shapes).
int int8_group_size(const Weights& w);
// The width of w's quants in the panel: 8 (Q8_0 and the IQ4 tables: signed, c = 0, where this build's
// dot product multiplies signed bytes, else moved up by 128), 6 (Q6_K) or at most 5.
int int8_quant_bits(const Weights& w);
// Whether w's panels hold its quants widened to int16 ([K/GS][GS/2 pairs][n rows][2 int16]): the
// signed 8-bit quants where this build's dot product is maddubs (AVX2 without VNNI), whose int16
// pairs would saturate; vpmaddwd multiplies them as they are (docs/decisions/cpu-variants.md). Such
// panels take twice the bytes, and the GEMM reads the activations widened too (Int8Rows::qa16).
bool int8_wide(const Weights& w);
// Rows [r0, r0 + n) of w into a panel (u: K * n bytes, twice that where int8_wide; s, c: K / GS * n
// floats); returns the panel's kappa (int8_offset_ratio, or -8 for Q4_0 held as Q4_1).
int int8_decode_panel(const Weights& w, int64_t r0, int64_t n, uint8_t* u, float* s, float* c);
// A prompt's int8 activations (quantize_q8 per row): qa [M, K], da [M, K / 32], ds [M, K / gs]
// (float32: da * the group's int8 sum), n16 [M, K / 16] (the int8 sums per 16). ds is derivable from
// da and n16, and kept: derived in the tile, Q4_1/Q5_1 prefill ran 3-8 % slower on AVX2 (a broadcast
// load became a convert, a multiply and a broadcast inside the register-bound 3 x 16 tile).
struct Int8Rows {
  const int8_t* qa;
  const float *da, *ds;
  const int32_t* n16;
  int64_t M;
  const int16_t* qa16 = nullptr;  // qa widened (widen_q8, all M rows), for int8_wide panels
};
// q [M, K] sign-extended to int16 in the layout the int8_wide GEMM reads: each group of the tile's
// tokens with their pairs of k side by side ([K/2][tokens][2]), the last M % tokens rows as they are.
void widen_q8(const int8_t* q, int64_t M, int64_t K, int16_t* out);
// kappa where w's panels have c = kappa * s in every group (the offset of shifted or centred quants:
// Q4_0 -8, Q8_0 and the IQ4 tables -128 where moved up by it): the GEMM then adds kappa * the int8
// sum into the integer dot product instead of a float32 term per group (one fma per 16 outputs
// fewer, and no cancellation of two large terms); 0: none.
int int8_offset_ratio(const Weights& w);
// y[m * ldy + j] = sum over k of w[r0 + j][k] * a[m][k] for the panel's n rows j and tokens m < a.M;
// bits = int8_quant_bits(w), kappa: int8_decode_panel's.
void int8_gemm_panel(int64_t gs, int bits, int kappa, const uint8_t* u, const float* s, const float* c, int64_t n,
                     int64_t K, const Int8Rows& a, float* y, int64_t ldy);

}  // namespace rows


}  // namespace opscope
