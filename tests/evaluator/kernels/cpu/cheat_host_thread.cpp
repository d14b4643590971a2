// cheat (work escaping the timed region): returns at once and lets a detached host
// thread compute the outputs after kf_forward has returned. The thread starts with a
// 2 ms pause: on small test tensors it could otherwise finish before the return (then no
// work escapes and there is nothing to detect), which made the sandbox test flaky.
#include <kf/kernel.h>
#include <chrono>
#include <thread>

extern "C" int kf_forward(kf::Context*, const kf::Tensor* in, int, kf::Tensor* out, int) {
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
  const long n = in[0].numel();
  std::thread([=] {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    for (long i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
  }).detach();
  return 0;
}
