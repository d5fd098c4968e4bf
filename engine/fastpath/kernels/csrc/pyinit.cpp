// The module's entry point, compiled per variant. Python imports each variant's library under its
// own name and so calls PyInit_<that name>; the module itself is defined once, in the torch half
// that every variant links (decode.cpp: PYBIND11_MODULE(opscope_qlinear)).
#include <Python.h>

#define OPSCOPE_CAT2(a, b) a##b
#define OPSCOPE_CAT(a, b) OPSCOPE_CAT2(a, b)

extern "C" PyObject* PyInit_opscope_qlinear();

PyMODINIT_FUNC OPSCOPE_CAT(PyInit_, TORCH_EXTENSION_NAME)(void) { return PyInit_opscope_qlinear(); }
