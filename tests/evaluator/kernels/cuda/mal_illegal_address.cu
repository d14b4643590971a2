// malicious: writes to an address far outside any allocation (illegal address fault).
#include <cuda_runtime.h>
#include <kf/kernel.h>

__global__ void bad(float* y) { y[(1L << 40) + threadIdx.x] = 1.f; }

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor*, int, kf::Tensor* out, int) {
  bad<<<1, 32, 0, static_cast<cudaStream_t>(ctx->stream)>>>(static_cast<float*>(out[0].data));
  return 0;
}
