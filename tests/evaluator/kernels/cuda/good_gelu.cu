// good: 002_gelu (erf form) on the CUDA backend.
#include <cuda_runtime.h>
#include <kf/kernel.h>

__global__ void gelu(const float* __restrict__ x, float* __restrict__ y, long n) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.f + erff(v * 0.70710678118654752f));
  }
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int, kf::Tensor* out, int) {
  gelu<<<4096, 256, 0, static_cast<cudaStream_t>(ctx->stream)>>>(static_cast<const float*>(in[0].data),
                                                                   static_cast<float*>(out[0].data), in[0].numel());
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
