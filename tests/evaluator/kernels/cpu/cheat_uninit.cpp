// cheat (reads uninitialised memory): "skips" elements whose output slot already holds
// a finite value, i.e. trusts whatever the output memory contained before the call.
#include <kf/kernel.h>
#include <cmath>

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int, kf::Tensor* out, int) {
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
  const long n = in[0].numel();
#pragma omp parallel for num_threads(ctx->num_threads)
  for (long i = 0; i < n; ++i)
    if (std::isnan(y[i])) y[i] = x[i] > 0.f ? x[i] : 0.f;
  return 0;
}
