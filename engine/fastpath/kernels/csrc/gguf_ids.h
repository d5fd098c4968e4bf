// ggml's type ids (ggml.h): no decoders, so the torch half (compiled once, with baseline flags)
// may name a type without including gguf_types.h's variant-compiled inline functions.
#pragma once
#include <cstdint>

namespace opscope {
namespace gguf {

enum Type : int64_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q2_K = 10, Q3_K = 11,
  Q4_K = 12, Q5_K = 13, Q6_K = 14, IQ4_NL = 20, IQ4_XS = 23, BF16 = 30,
};

}  // namespace gguf
}  // namespace opscope
