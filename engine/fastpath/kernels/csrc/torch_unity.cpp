// The torch-facing half of the library (the operators, the decode step, the prefill) as one
// translation unit, compiled once per platform and torch with the architecture's baseline flags
// and linked into every variant's library: it holds no vector code (that is rowwork.cpp's, compiled
// per variant), and parsing ATen's and pybind11's headers is most of its compile
// (docs/decisions/cpu-variants.md).
#include "ops.cpp"
#include "decode.cpp"
#include "prefill.cpp"
