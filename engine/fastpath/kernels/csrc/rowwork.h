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
// One query of length D against keys 0..last (key t at k + t * stride, value t at v + t * stride):
// scores into sc, out = softmax(q . k * scale) @ v.
void attend(const float* q, const float* k, const float* v, int64_t stride, int64_t last, int64_t D, float scale,
            float* sc, float* out);
// Rows [r0, r0 + n) of w decoded to float32 into buf (row i at buf + i * K).
void decode_panel(const Weights& w, int64_t r0, int64_t n, float* buf);
// dst[0..n) = src rounded to bfloat16 (to nearest even; a NaN stays a NaN), as torch's conversion does.
void to_bf16(const float* src, uint16_t* dst, int64_t n);

}  // namespace rows
}  // namespace opscope
