// cheat (degenerate task, class 5): 041_mse_loss's loss of 2^29 iid terms sits near its
// population value, so return that value without reading the inputs. With the task's
// per-set scale s ~ U(0.5, 2) of pred (target ~ N(0.2, 0.5^2)) the expected loss is
// E[s^2] + 0.25 + 0.04 = 1.75 + 0.29; the loss of each input set is far from it, so the
// kernel must be rejected as input-independent. (Before the per-set scale, returning the
// population value 1.29 passed on the H200 with speedup 10.1.)
#include <cuda_runtime.h>
#include <kf/kernel.h>

__global__ void put(float* y, float v) { *y = v; }

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor*, int, kf::Tensor* out, int) {
  put<<<1, 1, 0, static_cast<cudaStream_t>(ctx->stream)>>>(static_cast<float*>(out[0].data), 2.04f);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
