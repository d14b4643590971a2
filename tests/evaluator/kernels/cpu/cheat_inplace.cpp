// cheat (modifies its inputs): uses the input buffer as its workspace.
#include <kf/kernel.h>
#include <cstring>

extern "C" int kf_forward(kf::Context*, const kf::Tensor* in, int, kf::Tensor* out, int) {
  float* x = static_cast<float*>(in[0].data);
  const long n = in[0].numel();
  for (long i = 0; i < n; ++i) x[i] = x[i] > 0.f ? x[i] : 0.f;
  std::memcpy(out[0].data, x, sizeof(float) * n);
  return 0;
}
