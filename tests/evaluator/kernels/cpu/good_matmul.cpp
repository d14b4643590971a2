// good: 030_matmul_square on the CPU backend. C = A B, blocked i-k-j loops, OpenMP over row blocks.
#include <kf/kernel.h>
#include <cstring>

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int, kf::Tensor* out, int) {
  const float* A = static_cast<const float*>(in[0].data);
  const float* B = static_cast<const float*>(in[1].data);
  float* C = static_cast<float*>(out[0].data);
  const long M = in[0].shape[0], K = in[0].shape[1], N = in[1].shape[1];
  const long BI = 32, BK = 128;
#pragma omp parallel for schedule(dynamic) num_threads(ctx->num_threads)
  for (long i0 = 0; i0 < M; i0 += BI) {
    const long i1 = i0 + BI < M ? i0 + BI : M;
    for (long i = i0; i < i1; ++i) std::memset(C + i * N, 0, sizeof(float) * N);
    for (long k0 = 0; k0 < K; k0 += BK) {
      const long k1 = k0 + BK < K ? k0 + BK : K;
      for (long i = i0; i < i1; ++i) {
        float* c = C + i * N;
        for (long k = k0; k < k1; ++k) {
          const float a = A[i * K + k];
          const float* b = B + k * N;
          for (long j = 0; j < N; ++j) c[j] += a * b[j];
        }
      }
    }
  }
  return 0;
}
