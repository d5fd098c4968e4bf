// Checks the int8 prefill GEMM (rowwork.cpp: a panel's quants laid out for the variant's dot
// product or smmla, then its tiles) without torch's libraries, only its c10 headers (Weights holds
// c10::Half pointers): built for any target (the ARM64 variants cross-compiled and run under
// qemu-aarch64, tests/engine/fastpath/test_kernels_portable.py), it reads test vectors made on the
// host from gguf.quants.dequantize and float64 numpy and compares.
//
// Input (little-endian): records of int64 ggml_type, N, K, row_bytes, M; N * row_bytes raw block
// bytes; M * K float32 activations x; M * N float64 y (reference: W times x rounded to int8 per 32
// as engine.testing.q8 does); M * N float64 bound (|W| |x rounded|). The driver quantizes x with the
// library's own rows::quantize_q8, as the prefill does. Output: "multiply NAME" (the instruction the
// tile multiplies with: a test asserts it, so that a run on the wrong path cannot pass), then one
// line per record, "gemm TYPE N K M worst" (worst = max |y - y_ref| / bound, "-" where this build
// has no int8 GEMM for the type); exit 1 if any exceeds 1e-5.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "../csrc/rowwork.cpp"

namespace opscope {
// what rowwork.cpp asks of the rest of the library: the block size, and the float32 decoders (the
// float32 prefill's, not checked here)
int64_t raw_block_size(int64_t ggml_type) {
  int64_t qk = 0;
  gguf::with_type(ggml_type, [&](auto t) { qk = decltype(t)::QK; });
  return qk;
}
void dequantize_row(const Weights&, int64_t, float*) { std::abort(); }
}  // namespace opscope

using namespace opscope;

namespace {

template <class T>
bool read(FILE* f, T* p, size_t n) { return std::fread(p, sizeof(T), n, f) == n; }

// y [M, N] by the int8 GEMM on x [M, K] quantized as the prefill does (prefill.cpp's
// quantize_rows); false where this build has none for the type.
bool gemm(int64_t type, const std::vector<uint8_t>& raw, int64_t row_bytes, int64_t N, int64_t K, int64_t M,
          const std::vector<float>& x, std::vector<float>& y) {
  Weights w{QTYPE_RAW + type, raw.data(), nullptr, nullptr, N, K, type, row_bytes};
  const int64_t gs = rows::int8_group_size(w);
  if (gs == 0) return false;
  std::vector<int8_t> q(M * K);
  std::vector<float> da(M * (K / 32)), s32(M * (K / 32)), s16(M * (K / 16));
  std::vector<int32_t> n16(M * (K / 16));
  for (int64_t m = 0; m < M; ++m)
    rows::quantize_q8(x.data() + m * K, K, q.data() + m * K, da.data() + m * (K / 32), s32.data() + m * (K / 32),
                      s16.data() + m * (K / 16), n16.data() + m * (K / 16));
  const bool wide = rows::int8_wide(w);  // int16 panels and activations
  std::vector<int16_t> q16(wide ? M * K : 0);
  if (wide) rows::widen_q8(q.data(), M, K, q16.data());
  std::vector<uint8_t> u(N * K * (wide ? 2 : 1));
  std::vector<float> s(N * (K / gs)), c(N * (K / gs));
  const int kappa = rows::int8_decode_panel(w, 0, N, u.data(), s.data(), c.data());
  const rows::Int8Rows acts{q.data(), da.data(), (gs == 32 ? s32 : s16).data(), n16.data(), M,
                            wide ? q16.data() : nullptr};
  rows::int8_gemm_panel(gs, rows::int8_quant_bits(w), kappa, u.data(), s.data(), c.data(), N, K, acts, y.data(), N);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) { std::fprintf(stderr, "usage: %s VECTORS\n", argv[0]); return 2; }
  FILE* f = std::fopen(argv[1], "rb");
  if (!f) { std::perror(argv[1]); return 2; }
  std::printf("multiply %s\n", opscope::rows::kInt8Multiply);
  bool ok = true;
  int64_t hdr[5];
  while (read(f, hdr, 5)) {
    const int64_t type = hdr[0], N = hdr[1], K = hdr[2], row_bytes = hdr[3], M = hdr[4];
    std::vector<uint8_t> raw(N * row_bytes);
    std::vector<float> x(M * K), y(M * N);
    std::vector<double> ref(M * N), bound(M * N);
    if (!(read(f, raw.data(), raw.size()) && read(f, x.data(), x.size()) && read(f, ref.data(), ref.size()) &&
          read(f, bound.data(), bound.size()))) {
      std::fprintf(stderr, "truncated vectors\n");
      return 2;
    }
    std::printf("gemm %lld %lld %lld %lld ", (long long)type, (long long)N, (long long)K, (long long)M);
    if (!gemm(type, raw, row_bytes, N, K, M, x, y)) {
      std::printf("-\n");
      continue;
    }
    double worst = 0.0;
    for (size_t i = 0; i < y.size(); ++i) worst = std::fmax(worst, std::fabs(y[i] - ref[i]) / std::fmax(bound[i], 1e-30));
    std::printf("%.3g\n", worst);
    ok = ok && worst <= 1e-5;
  }
  return ok ? 0 : 1;
}
