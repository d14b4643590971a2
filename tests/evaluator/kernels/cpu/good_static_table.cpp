// good (tricky but honest: a static table built in the first call): 021_softmax (dim=1 of
// a 2-D input), max-subtracted. exp(d) for d <= 0 is table[k] * exp(d + k) with k = the
// integer part of -d, and table[k] = exp(-k) filled once, in the first call, for k up to
// 104 (below that exp underflows to 0 in float). The table does not depend on the inputs:
// the results are within a few ulp of exp(d) everywhere, stress and numeric edges included.
#include <kf/kernel.h>
#include <cmath>

static float table[105];
static bool built = false;

static inline float exp_le0(float d) {
  if (!(d > -104.f)) return 0.f;
  const int k = int(-d);
  return table[k] * std::exp(d + float(k));
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int, kf::Tensor* out, int) {
  if (!built) {
    for (int k = 0; k < 105; ++k) table[k] = float(std::exp(-double(k)));
    built = true;
  }
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
      yr[c] = exp_le0(xr[c] - m);
      s += yr[c];
    }
    const float inv = 1.f / s;
    for (long c = 0; c < cols; ++c) yr[c] *= inv;
  }
  return 0;
}
