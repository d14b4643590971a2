// cheat (checks it can count): exact for its first KF_SWITCH_AFTER calls, then relu as a
// clamp to [0, 16], which is right on the task's inputs (randn * 2 never reaches 16) and
// wrong on larger ones. Against checks that run in a fixed order before the timed trials,
// it is exact while checked and takes the shortcut while timed. verify_test runs it for
// several switch points (the line below is rewritten).
#include <kf/kernel.h>

#define KF_SWITCH_AFTER 8

static int calls = 0;

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int, kf::Tensor* out, int) {
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
  const long n = in[0].numel();
  const float hi = ++calls > KF_SWITCH_AFTER ? 16.f : 3.4e38f;
#pragma omp parallel for num_threads(ctx->num_threads)
  for (long i = 0; i < n; ++i) {
    const float v = x[i] > 0.f ? x[i] : 0.f;
    y[i] = v < hi ? v : hi;
  }
  return 0;
}
