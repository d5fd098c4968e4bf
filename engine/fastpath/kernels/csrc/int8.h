// The int8-activation kernels of the vec.h variants (AVX2 / AVX-VNNI at 256 bits, ARM64 NEON at 128):
// one API (int8x::soa_*_rows_q8, b32_rows_q8, kq::rows), one header per instruction set. The AVX-512
// variants have their own (simd_v2.h, raw_q8.cpp); the baseline has none (activations stay float32).
#pragma once
#include "vec.h"

#if !defined(__AVX512F__) && defined(OPSCOPE_VEC_AVX2)
#include "int8_avx2.h"
#define OPSCOPE_HAVE_INT8_VEC 1
#elif defined(OPSCOPE_VEC_NEON)
#include "int8_neon.h"
#define OPSCOPE_HAVE_INT8_VEC 1
#endif

#if defined(OPSCOPE_HAVE_INT8_VEC)
namespace opscope::int8x {
namespace kq {
// Calls fn(T{}) with the K type's decoder (the instruction set's kq::Q2 ... QX); false for the
// other types.
template <class Fn>
bool with_type(int64_t t, Fn&& fn) {
  switch (t) {
    case gguf::Q2_K: fn(Q2{}); return true;
    case gguf::Q3_K: fn(Q3{}); return true;
    case gguf::Q4_K: fn(Q45<false>{}); return true;
    case gguf::Q5_K: fn(Q45<true>{}); return true;
    case gguf::Q6_K: fn(Q6{}); return true;
    case gguf::IQ4_XS: fn(QX{}); return true;
    default: return false;
  }
}
}  // namespace kq

// Calls fn(T{}) with the raw 32-weight block type that has an int8 kernel here (b32_rows_q8); false
// for the others (Q8_0 is repacked at load and has its own, soa_q8_0_rows_q8).
template <class F>
bool with_b32_type(int64_t ggml_type, F&& fn) {
  switch (ggml_type) {
    case gguf::Q4_0: fn(gguf::TQ4_0{}); return true;
    case gguf::Q4_1: fn(gguf::TQ4_1{}); return true;
    case gguf::Q5_0: fn(gguf::TQ5_0{}); return true;
    case gguf::Q5_1: fn(gguf::TQ5_1{}); return true;
    case gguf::IQ4_NL: fn(gguf::TIQ4_NL{}); return true;
    default: return false;
  }
}
}  // namespace opscope::int8x
#endif
