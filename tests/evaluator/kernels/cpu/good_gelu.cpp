// good: 002_gelu (exact, erf form) on the CPU backend.
#include <kf/kernel.h>
#include <cmath>

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int, kf::Tensor* out, int) {
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
  const long n = in[0].numel();
#pragma omp parallel for schedule(static) num_threads(ctx->num_threads)
  for (long i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.f + std::erf(x[i] * 0.70710678118654752f));
  return 0;
}
