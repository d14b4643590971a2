// compile error: a missing declaration and a type error.
#include <kf/kernel.h>

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int, kf::Tensor* out, int) {
  float* y = out[0].data;   // void* to float* without a cast
  undefined_helper(y);
  return 0;
}
