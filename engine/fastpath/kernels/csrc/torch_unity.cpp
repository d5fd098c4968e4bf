// The torch-facing half of the library (the operators, the decode step, the prefill) as one
// translation unit. Each of these files includes ATen's and pybind11's headers, and parsing them is
// most of its compile: as one unit they are parsed once per variant instead of three times (a
// variant's compile here: 69 s of CPU time as six units, 42 s with this one; docs/decisions/cpu-variants.md).
#include "ops.cpp"
#include "decode.cpp"
#include "prefill.cpp"
