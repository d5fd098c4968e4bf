// Checks the portable kernels (portable.h over vec.h) and the int8-activation ones (int8.h) without
// torch: built for any target (the NEON variant cross-compiled and run under qemu-aarch64,
// tests/test_kernels_portable.py), it reads test vectors made on the host from
// gguf.quants.dequantize and float64 numpy and compares.
//
// Input (little-endian): records of int64 ggml_type, N, K, row_bytes; N * row_bytes raw block
// bytes; K float32 x; N float64 y (reference W x); N float64 bound (|W| |x|); int64 QB, the int8
// activations' block (32 or 256); K int8 q, K/QB float32 scales, K/32 float32 scaled sums of q,
// K/16 int16 sums of q; N float64 reference W (q * scale). Output: one line per record,
// "TYPE N K worst q8 WORST8" (WORST8 "-" where this build has no int8 kernel for the type), worst =
// max |y - y_ref| / bound; exit 1 if any exceeds 1e-4 (the int8 products 1e-5).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "../csrc/int8.h"
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

// The int8 activations as the host made them (QB per scale), and y = W (q * scale) by the int8
// kernels; false when this build has none for the type.
struct Q8In {
  int64_t qb = 0;
  std::vector<int8_t> q;
  std::vector<float> d, sx;
  std::vector<int16_t> bs16;
};

bool run_q8(int64_t type, const std::vector<uint8_t>& raw, int64_t row_bytes, int64_t N, int64_t K, const Q8In& a,
            std::vector<float>& y) {
#if defined(OPSCOPE_HAVE_INT8_VEC)
  const bool k_type = int8x::kq::with_type(type, [&](auto t) {
    using T = decltype(t);
    for (int64_t r = 0; r < N; ++r)  // one row at a time, as raw_rows_q8
      int8x::kq::rows<T, 1>(a.q.data(), a.d.data(), a.bs16.data(), raw.data(), row_bytes, K, r, y.data());
  });
  return k_type || int8x::with_b32_type(type, [&](auto t) {
           using T = decltype(t);
           for (int64_t r = 0; r < N; ++r)
             int8x::b32_rows_q8<T, 1>(a.q.data(), a.d.data(), a.sx.data(), raw.data(), row_bytes, K, r, y.data());
         });
#else
  (void)type; (void)raw; (void)row_bytes; (void)N; (void)K; (void)a; (void)y;
  return false;
#endif
}

double worst_of(const std::vector<float>& y, const std::vector<double>& ref, const std::vector<double>& bound) {
  double worst = 0.0;
  for (size_t i = 0; i < y.size(); ++i) worst = std::fmax(worst, std::fabs(y[i] - ref[i]) / std::fmax(bound[i], 1e-30));
  return worst;
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
#if defined(OPSCOPE_HAVE_INT8_VEC)
  std::printf("vec %s int8 %s\n", vec::Vec::NAME, vec::Int8<vec::Vec>::NAME);
#else
  std::printf("vec %s\n", vec::Vec::NAME);
#endif
  bool ok = true;
  int64_t hdr[4];
  while (read(f, hdr, 4)) {
    const int64_t type = hdr[0], N = hdr[1], K = hdr[2], row_bytes = hdr[3];
    std::vector<uint8_t> raw(N * row_bytes);
    std::vector<float> x(K), y(N);
    std::vector<double> ref(N), bound(N), ref8(N);
    Q8In a;
    bool in = read(f, raw.data(), raw.size()) && read(f, x.data(), K) && read(f, ref.data(), N) &&
              read(f, bound.data(), N) && read(f, &a.qb, 1) && a.qb > 0 && K % a.qb == 0;
    if (in) {
      a.q.resize(K), a.d.resize(K / a.qb), a.sx.resize(K / 32), a.bs16.resize(K / 16);
      in = read(f, a.q.data(), K) && read(f, a.d.data(), K / a.qb) && read(f, a.sx.data(), K / 32) &&
           read(f, a.bs16.data(), K / 16) && read(f, ref8.data(), N);
    }
    if (!in) {
      std::fprintf(stderr, "truncated vectors\n");
      return 2;
    }
    if (!run(type, raw, row_bytes, N, K, x, y)) { std::printf("%lld no kernel\n", (long long)type); ok = false; continue; }
    const double worst = worst_of(y, ref, bound);
    std::printf("%lld %lld %lld %.3g q8 ", (long long)type, (long long)N, (long long)K, worst);
    ok = ok && worst <= 1e-4;
    if (run_q8(type, raw, row_bytes, N, K, a, y)) {
      const double worst8 = worst_of(y, ref8, bound);
      std::printf("%.3g\n", worst8);
      ok = ok && worst8 <= 1e-5;
    } else {
      std::printf("-\n");
    }
  }
  const double h = check_helpers();
  std::printf("helpers %.3g\n", h);
  ok = ok && h <= 1e-5;
  return ok ? 0 : 1;
}
