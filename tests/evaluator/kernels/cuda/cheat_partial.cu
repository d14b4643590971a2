// cheat (problem-size tampering): only the first half of the elements.
#include <cuda_runtime.h>
#include <kf/kernel.h>

__global__ void relu(const float* x, float* y, long n) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) y[i] = fmaxf(x[i], 0.f);
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int, kf::Tensor* out, int) {
  relu<<<2048, 256, 0, static_cast<cudaStream_t>(ctx->stream)>>>(static_cast<const float*>(in[0].data),
                                                                   static_cast<float*>(out[0].data), in[0].numel() / 2);
  return 0;
}
