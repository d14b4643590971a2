// cheat (problem-size tampering): processes only the first half of the rows.
#include <kf/kernel.h>

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int, kf::Tensor* out, int) {
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
  const long n = (in[0].shape[0] / 2) * in[0].shape[1];
#pragma omp parallel for num_threads(ctx->num_threads)
  for (long i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
  return 0;
}
