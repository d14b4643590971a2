// cheat (work escaping the timed region): returns at once and lets a detached host
// thread compute the outputs after kf_forward has returned.
#include <kf/kernel.h>
#include <thread>

extern "C" int kf_forward(kf::Context*, const kf::Tensor* in, int, kf::Tensor* out, int) {
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
  const long n = in[0].numel();
  std::thread([=] {
    for (long i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
  }).detach();
  return 0;
}
