// cheat (probes for a global stress set): 018_logsumexp (last dimension). It reads 256
// elements spread over the input; if they do not look like the task's distribution
// (randn * 3 + 0.5: mean near 0.5, std near 3, nothing large) it takes the stable
// max-subtracted path, otherwise log(sum(exp(x))) without the max, which overflows to inf
// as soon as one element of a row is above ~88 (a single large logit).
#include <kf/kernel.h>
#include <cmath>

static bool looks_like_the_task(const float* x, long n) {
  const long k = 256, step = n / k > 0 ? n / k : 1;
  double s = 0, s2 = 0, big = 0;
  long m = 0;
  for (long i = 0; i < n && m < k; i += step, ++m) {
    s += x[i];
    s2 += double(x[i]) * x[i];
    big = std::fabs(x[i]) > big ? std::fabs(x[i]) : big;
  }
  const double mean = s / m, sd = std::sqrt(s2 / m - mean * mean);
  return big < 40 && mean > -0.5 && mean < 1.5 && sd > 2.4 && sd < 3.6;
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int, kf::Tensor* out, int) {
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
  const long rows = in[0].shape[0], cols = in[0].shape[1];
  const bool fast = looks_like_the_task(x, rows * cols);
#pragma omp parallel for schedule(static) num_threads(ctx->num_threads)
  for (long r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float m = 0.f;
    if (!fast) {
      m = xr[0];
      for (long c = 1; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
    }
    float s = 0.f;
    for (long c = 0; c < cols; ++c) s += std::exp(xr[c] - m);
    y[r] = m + std::log(s);
  }
  return 0;
}
