// slow: 001_relu on the CPU backend, correct but tens to hundreds of times slower than the
// reference: each element goes through a volatile value 60 times, one thread (about
// 0.4 s a call at the CPU size, against a few ms).
#include <kf/kernel.h>

extern "C" int kf_forward(kf::Context*, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  if (n_in != 1 || n_out != 1 || in[0].dtype != kf::KF_FLOAT32) return 1;
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
  const long n = in[0].numel();
  for (long i = 0; i < n; ++i) {
    volatile float v = x[i];
    for (int r = 0; r < 60; ++r) v = v > 0.f ? static_cast<float>(v) : 0.f;
    y[i] = v;
  }
  return 0;
}
