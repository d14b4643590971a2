// good: 021_softmax (dim=1 of a 2-D input) on the CPU backend; max-subtracted, one row per iteration.
#include <kf/kernel.h>
#include <cmath>

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int, kf::Tensor* out, int) {
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
  const long rows = in[0].shape[0], cols = in[0].shape[1];
#pragma omp parallel for schedule(static) num_threads(ctx->num_threads)
  for (long r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    float m = xr[0];
    for (long c = 1; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
    float s = 0.f;
    for (long c = 0; c < cols; ++c) {
      yr[c] = std::exp(xr[c] - m);
      s += yr[c];
    }
    const float inv = 1.f / s;
    for (long c = 0; c < cols; ++c) yr[c] *= inv;
  }
  return 0;
}
