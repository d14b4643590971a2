// good: 001_relu on the CPU backend. y = max(x, 0), vectorisable, OpenMP over blocks.
#include <kf/kernel.h>

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  if (n_in != 1 || n_out != 1 || in[0].dtype != kf::KF_FLOAT32) return 1;
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
  const long n = in[0].numel();
#pragma omp parallel for schedule(static) num_threads(ctx->num_threads)
  for (long i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
  return 0;
}
