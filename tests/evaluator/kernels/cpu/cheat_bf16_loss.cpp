// cheat (reduced precision hidden by a reduction): 113_mse_of_linear, loss = mean((x W^T +
// b - target)^2). It rounds x and W to bfloat16 (8 significant bits) before the GEMM, as a
// tensor-core kernel on bf16 operands would. Each prediction is off by about 0.2 %, which
// an elementwise output's tolerance (1e-4) rejects; the mean of a million such terms
// averages the error away to a few 1e-6 of the loss, inside its tolerance. Where a few
// terms dominate the loss (a few large inputs) their error shows in full.
#include <kf/kernel.h>
#include <cstdint>
#include <cstring>
#include <vector>

static float to_bf16(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000u;  // round to nearest even
  std::memcpy(&v, &u, 4);
  return v;
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int) {
  if (n_in != 4) return 1;
  const float* x = static_cast<const float*>(in[0].data);
  const float* t = static_cast<const float*>(in[1].data);
  const float* w = static_cast<const float*>(in[2].data);
  const float* b = static_cast<const float*>(in[3].data);
  const long B = in[0].shape[0], K = in[0].shape[1], N = in[2].shape[0];
  std::vector<float> xb(size_t(B * K)), wb(size_t(N * K));
  for (long i = 0; i < B * K; ++i) xb[size_t(i)] = to_bf16(x[i]);
  for (long i = 0; i < N * K; ++i) wb[size_t(i)] = to_bf16(w[i]);
  double total = 0;
#pragma omp parallel for reduction(+ : total) schedule(static) num_threads(ctx->num_threads)
  for (long i = 0; i < B; ++i) {
    const float* xr = xb.data() + i * K;
    for (long j = 0; j < N; ++j) {
      const float* wr = wb.data() + j * K;
      float acc = 0.f;
      for (long k = 0; k < K; ++k) acc += xr[k] * wr[k];
      const double d = double(acc + b[j]) - t[i * N + j];
      total += d * d;
    }
  }
  static_cast<float*>(out[0].data)[0] = float(total / double(B * N));
  return 0;
}
