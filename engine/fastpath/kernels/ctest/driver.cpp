// Checks the portable kernels (portable.h over vec.h) without torch: built for any target (the
// NEON variant cross-compiled and run under qemu-aarch64, tests/test_kernels_portable.py), it reads
// test vectors made on the host from gguf.quants.dequantize and float64 numpy and compares.
//
// Input (little-endian): records of int64 ggml_type, N, K, row_bytes; N * row_bytes raw block
// bytes; K float32 x; N float64 y (reference W x); N float64 bound (|W| |x|). Output: one line per
// record, "TYPE N K worst", worst = max |y - y_ref| / bound; exit 1 if any exceeds 1e-4.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "../csrc/portable.h"

using namespace opscope;

namespace {

template <class T>
bool read(FILE* f, T* p, size_t n) { return std::fread(p, sizeof(T), n, f) == n; }

// y = W x over the rows, 4 at a time as the library splits them (and single tail rows).
bool run(int64_t type, const std::vector<uint8_t>& raw, int64_t row_bytes, int64_t N, int64_t K,
         const std::vector<float>& x, std::vector<float>& y) {
  std::vector<float> sx(K / 32 + 1, 0.f);
  for (int64_t b = 0; b < K / 32; ++b)
    for (int j = 0; j < 32; ++j) sx[b] += x[32 * b + j];
  return gguf::with_type(type, [&](auto t) {
    portable::raw_rows<vec::Vec, decltype(t)>(x.data(), sx.data(), raw.data(), row_bytes, K, 0, N, y.data());
  });
}

// the decode step's elementwise helpers against libm
double check_helpers() {
  std::vector<float> a(100), b(100), out(100);
  for (int i = 0; i < 100; ++i) { a[i] = 0.1f * float(i - 50); b[i] = 0.03f * float(i % 7); }
  double worst = 0.0, ref = 0.0, mag = 0.0;
  for (int i = 0; i < 100; ++i) { ref += double(a[i]) * b[i]; mag += std::fabs(double(a[i]) * b[i]); }
  worst = std::fabs(portable::dot<vec::Vec>(a.data(), b.data(), 100) - ref) / mag;
  portable::silu_mul<vec::Vec>(a.data(), b.data(), 100, out.data());
  for (int i = 0; i < 100; ++i) {
    const double s = double(a[i]) / (1.0 + std::exp(-double(a[i]))) * b[i];
    worst = std::fmax(worst, std::fabs(out[i] - s) / (std::fabs(s) + 1e-6));
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) { std::fprintf(stderr, "usage: %s VECTORS\n", argv[0]); return 2; }
  FILE* f = std::fopen(argv[1], "rb");
  if (!f) { std::perror(argv[1]); return 2; }
  std::printf("vec %s\n", vec::Vec::NAME);
  bool ok = true;
  int64_t hdr[4];
  while (read(f, hdr, 4)) {
    const int64_t type = hdr[0], N = hdr[1], K = hdr[2], row_bytes = hdr[3];
    std::vector<uint8_t> raw(N * row_bytes);
    std::vector<float> x(K), y(N);
    std::vector<double> ref(N), bound(N);
    if (!read(f, raw.data(), raw.size()) || !read(f, x.data(), K) || !read(f, ref.data(), N) || !read(f, bound.data(), N)) {
      std::fprintf(stderr, "truncated vectors\n");
      return 2;
    }
    if (!run(type, raw, row_bytes, N, K, x, y)) { std::printf("%lld no kernel\n", (long long)type); ok = false; continue; }
    double worst = 0.0;
    for (int64_t i = 0; i < N; ++i) worst = std::fmax(worst, std::fabs(y[i] - ref[i]) / std::fmax(bound[i], 1e-30));
    std::printf("%lld %lld %lld %.3g\n", (long long)type, (long long)N, (long long)K, worst);
    ok = ok && worst <= 1e-4;
  }
  const double h = check_helpers();
  std::printf("helpers %.3g\n", h);
  ok = ok && h <= 1e-5;
  return ok ? 0 : 1;
}
