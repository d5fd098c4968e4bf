// A VNNI int8 GEMM microkernel with llama.cpp's per-32 scales, for benchmarks/int8_gemm_probe.py:
// how fast can an int8 prefill GEMM be on this CPU, against oneDNN's bf16 GEMM?
//
// Weights: panels of NB*16 rows; per group g of 32 k: [8 k4][NB][16 rows][4 bytes] unsigned (the
// quants u, e.g. Q4_0's 0..15), a float scale s and offset c per (row, group): w = s*u + c.
// Activations: int8 per token and group with a scale da and ds = da * sum(q) (the offset's term).
// y[t][n] = sum_g (s*da * sum_k u*q + c*ds). Built with -march=native; AVX-512 VNNI only.
//   int8_gemm_probe M N K REPS  -> "best_ms median_ms max_rel_err"
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

constexpr int T = 4, NB = 3, PW = 16 * NB;

static void tile(const uint8_t* W, const float* S, const float* C, const int8_t* A, const float* DA, const float* DS,
                 int K, float* out, int ldo) {
  __m512 acc[T][NB];
  for (auto& r : acc)
    for (auto& a : r) a = _mm512_setzero_ps();
  const int G = K / 32;
  for (int g = 0; g < G; ++g) {
    __m512i ia[T][NB];
    for (auto& r : ia)
      for (auto& a : r) a = _mm512_setzero_si512();
    const uint8_t* w = W + g * 512 * NB;
    for (int k4 = 0; k4 < 8; ++k4) {
      __m512i wv[NB];
      for (int b = 0; b < NB; ++b) wv[b] = _mm512_loadu_si512(w + 64 * (k4 * NB + b));
      for (int t = 0; t < T; ++t) {
        int32_t a4;
        __builtin_memcpy(&a4, A + t * K + 32 * g + 4 * k4, 4);
        const __m512i av = _mm512_set1_epi32(a4);
        for (int b = 0; b < NB; ++b) ia[t][b] = _mm512_dpbusd_epi32(ia[t][b], wv[b], av);
      }
    }
    for (int b = 0; b < NB; ++b) {
      const __m512 s = _mm512_loadu_ps(S + 16 * (g * NB + b)), c = _mm512_loadu_ps(C + 16 * (g * NB + b));
      for (int t = 0; t < T; ++t) {
        const __m512 sd = _mm512_mul_ps(s, _mm512_set1_ps(DA[t * G + g]));
        acc[t][b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[t][b]), sd, acc[t][b]);
        acc[t][b] = _mm512_fmadd_ps(c, _mm512_set1_ps(DS[t * G + g]), acc[t][b]);
      }
    }
  }
  for (int t = 0; t < T; ++t)
    for (int b = 0; b < NB; ++b) _mm512_storeu_ps(out + t * ldo + 16 * b, acc[t][b]);
}

static void gemm(int M, int N, int K, const std::vector<uint8_t>& W, const std::vector<float>& S,
                 const std::vector<float>& C, const std::vector<int8_t>& A, const std::vector<float>& DA,
                 const std::vector<float>& DS, std::vector<float>& O) {
  const int G = K / 32;
  for (int p = 0; p < N / PW; ++p)
    for (int m = 0; m < M; m += T)
      tile(W.data() + size_t(p) * PW * K, S.data() + size_t(p) * G * PW, C.data() + size_t(p) * G * PW,
           A.data() + size_t(m) * K, DA.data() + size_t(m) * G, DS.data() + size_t(m) * G, K,
           O.data() + size_t(m) * N + PW * p, N);
}

int main(int argc, char** argv) {
  if (argc != 5) return 2;
  const int M = atoi(argv[1]) / T * T, N = atoi(argv[2]) / PW * PW, K = atoi(argv[3]) / 32 * 32, reps = atoi(argv[4]);
  const int G = K / 32;
  srand(1);
  std::vector<uint8_t> W(size_t(N) * K);
  std::vector<float> S(size_t(N) * G), C(S.size()), DA(size_t(M) * G), DS(DA.size()), O(size_t(M) * N);
  std::vector<int8_t> A(size_t(M) * K);
  for (auto& x : W) x = rand() & 15;
  for (auto& x : A) x = int8_t(rand() % 255 - 127);
  for (size_t i = 0; i < S.size(); ++i) { S[i] = 1e-3f * (1 + rand() % 100); C[i] = -8 * S[i]; }
  for (int t = 0; t < M; ++t)
    for (int g = 0; g < G; ++g) {
      int sum = 0;
      for (int k = 0; k < 32; ++k) sum += A[size_t(t) * K + 32 * g + k];
      DA[t * G + g] = 1e-2f * (1 + rand() % 100);
      DS[t * G + g] = DA[t * G + g] * sum;
    }
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    gemm(M, N, K, W, S, C, A, DA, DS, O);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  // check a few outputs against the same sum in double, weights in the panel layout
  double err = 0;
  for (int i = 0; i < 64; ++i) {
    const int t = rand() % M, n = rand() % N, p = n / PW, b = n % PW / 16, l = n % 16;
    double ref = 0, mag = 0;
    for (int k = 0; k < K; ++k) {
      const int g = k / 32, k4 = k % 32 / 4;
      const uint8_t u = W[size_t(p) * PW * K + size_t(g) * 512 * NB + 64 * (k4 * NB + b) + 4 * l + k % 4];
      const size_t si = size_t(p) * G * PW + 16 * (g * NB + b) + l;
      const double w = double(S[si]) * u + C[si], a = double(DA[t * G + g]) * A[size_t(t) * K + k];
      ref += w * a;
      mag += std::fabs(w * a);
    }
    err = std::max(err, std::fabs(O[size_t(t) * N + n] - ref) / mag);
  }
  std::sort(ms.begin(), ms.end());
  printf("%.4f %.4f %.3g\n", ms[0], ms[ms.size() / 2], err);
  return 0;
}
