// The arithmetic ceilings of one AVX2 core (benchmarks/prefill_ceiling.py): multiply-adds per second
// of float32 FMA, of u8 x s8 dot products (maddubs + madd + add: 4-bit quants, unsigned) and of
// s8 x s8 ones (the sign trick: |w| kept, vpsignb on the activations per product, then the same).
// Independent accumulators, operands in registers: no loads, no scales, no conversions. The weight
// operands change every step (one vpaddb per weight register) so that nothing is hoisted.
//   arith_peak STEPS f|u|s  -> "<kind> <GMAC/s>"
#include <immintrin.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

__attribute__((noinline)) float fma_loop(long n, float s) {
  __m256 a[12];
  const __m256 x = _mm256_set1_ps(s), y = _mm256_set1_ps(1.0000001f);
  for (int i = 0; i < 12; i++) a[i] = _mm256_set1_ps(float(i));
  for (long k = 0; k < n; k++)
    for (int i = 0; i < 12; i++) a[i] = _mm256_fmadd_ps(a[i], y, x);
  __m256 t = a[0];
  for (int i = 1; i < 12; i++) t = _mm256_add_ps(t, a[i]);
  float o[8];
  _mm256_storeu_ps(o, t);
  return o[0];
}

// A GEMM tile's pattern: 2 weight registers, each used by 4 tokens (8 accumulators); signed weights
// take their |w| once per register, the activations' vpsignb per product.
template <bool SIGNED>
__attribute__((noinline)) int int8_loop(long n, int s) {
  __m256i a[8], x[4];
  __m256i w0 = _mm256_set1_epi8(SIGNED ? -7 : 7), w1 = _mm256_set1_epi8(SIGNED ? -5 : 5);
  const __m256i one = _mm256_set1_epi16(1), step = _mm256_set1_epi8(1);
  for (int i = 0; i < 8; i++) a[i] = _mm256_set1_epi32(i);
  for (int t = 0; t < 4; t++) x[t] = _mm256_set1_epi8(char(s + t));
  for (long k = 0; k < n; k++) {
    w0 = _mm256_add_epi8(w0, step), w1 = _mm256_add_epi8(w1, step);
    const __m256i u0 = SIGNED ? _mm256_abs_epi8(w0) : w0, u1 = SIGNED ? _mm256_abs_epi8(w1) : w1;
    for (int t = 0; t < 4; t++) {
      const __m256i p0 = _mm256_maddubs_epi16(u0, SIGNED ? _mm256_sign_epi8(x[t], w0) : x[t]);
      const __m256i p1 = _mm256_maddubs_epi16(u1, SIGNED ? _mm256_sign_epi8(x[t], w1) : x[t]);
      a[2 * t] = _mm256_add_epi32(a[2 * t], _mm256_madd_epi16(p0, one));
      a[2 * t + 1] = _mm256_add_epi32(a[2 * t + 1], _mm256_madd_epi16(p1, one));
    }
  }
  __m256i t = a[0];
  for (int i = 1; i < 8; i++) t = _mm256_add_epi32(t, a[i]);
  return _mm256_extract_epi32(t, 0);
}

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  const long n = atol(argv[1]);
  const char kind = argv[2][0];
  const double t0 = now();
  double macs;
  long sink;
  if (kind == 'f') sink = long(fma_loop(n, 1.f)), macs = 12.0 * 8 * n;
  else if (kind == 'u') sink = int8_loop<false>(n, 3), macs = 8.0 * 32 * n;
  else sink = int8_loop<true>(n, 3), macs = 8.0 * 32 * n;
  const double dt = now() - t0;
  printf("%c %.3f %ld\n", kind, macs / dt / 1e9, sink & 1);
  return 0;
}
