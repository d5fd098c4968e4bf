// Which library this is, compiled per variant: the loader's name for it (the variant and the hash of
// what it was built from), read back through this C function after loading, so that a stale or
// misnamed file is told from the one asked for. The operators and the decode step's class are
// registered by the torch half that every variant links (ops.cpp, decode.cpp, prefill.cpp) when the
// library is loaded; nothing here or there depends on the Python version.
#define OPSCOPE_STR2(a) #a
#define OPSCOPE_STR(a) OPSCOPE_STR2(a)

extern "C" __attribute__((visibility("default"))) const char* opscope_kernel_library() {
  return OPSCOPE_STR(TORCH_EXTENSION_NAME);
}
