// cheat (degenerate task, class 5): 041_mse_loss's loss of many iid terms sits near its
// population value, so return that value without reading the inputs. With the task's
// per-set scale s ~ U(0.5, 2) of pred (target ~ N(0.2, 0.5^2)) the expected loss is
// E[s^2] + 0.25 + 0.04 = 1.75 + 0.29; the loss of each input set is far from it, so the
// kernel must be rejected as input-independent.
#include <kf/kernel.h>

extern "C" int kf_forward(kf::Context*, const kf::Tensor*, int, kf::Tensor* out, int) {
  static_cast<float*>(out[0].data)[0] = 2.04f;
  return 0;
}
