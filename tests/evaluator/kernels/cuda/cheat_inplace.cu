// cheat (modifies its inputs): computes in place in the input buffer, then copies.
#include <cuda_runtime.h>
#include <kf/kernel.h>

__global__ void relu_inplace(float* x, long n) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) x[i] = fmaxf(x[i], 0.f);
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int, kf::Tensor* out, int) {
  auto s = static_cast<cudaStream_t>(ctx->stream);
  float* x = static_cast<float*>(in[0].data);
  relu_inplace<<<2048, 256, 0, s>>>(x, in[0].numel());
  cudaMemcpyAsync(out[0].data, x, in[0].nbytes(), cudaMemcpyDeviceToDevice, s);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
