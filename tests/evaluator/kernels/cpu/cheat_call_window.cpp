// cheat (a window of call indices): 001_relu. Exact outside calls KF_WINDOW_FROM to
// KF_WINDOW_TO, and inside them relu as a clamp to [0, 16], which is right on the task's
// inputs (randn * 2 never reaches 16) and wrong on larger ones. The window covers most
// timed trials of a default verification: against a plan that puts the checks a probe
// cannot see only before and after the timed trials, it is exact while checked and takes
// the shortcut while timed. Checks drawn at any call position land inside the window.
#include <kf/kernel.h>

#define KF_WINDOW_FROM 6
#define KF_WINDOW_TO 18

static int calls = 0;

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int, kf::Tensor* out, int) {
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
  const long n = in[0].numel();
  ++calls;
  const float hi = calls >= KF_WINDOW_FROM && calls <= KF_WINDOW_TO ? 16.f : 3.4e38f;
#pragma omp parallel for num_threads(ctx->num_threads)
  for (long i = 0; i < n; ++i) {
    const float v = x[i] > 0.f ? x[i] : 0.f;
    y[i] = v < hi ? v : hi;
  }
  return 0;
}
