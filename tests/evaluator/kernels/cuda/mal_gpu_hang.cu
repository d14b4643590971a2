// malicious: a kernel that never ends.
#include <cuda_runtime.h>
#include <kf/kernel.h>

__global__ void spin(volatile int* flag) { while (*flag == 0) {} }

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor*, int, kf::Tensor* out, int) {
  cudaMemsetAsync(out[0].data, 0, 4, static_cast<cudaStream_t>(ctx->stream));
  spin<<<1, 1, 0, static_cast<cudaStream_t>(ctx->stream)>>>(static_cast<volatile int*>(out[0].data));
  return 0;
}
