// A wrong elementwise kernel for any task with one float input and one float output of
// the same size (y = x / 2): bench/evaluator/peak_memory.sh uses it to measure the GPU
// memory of a verification that fails, which asks the candidate more questions (other
// poison, other inputs) with the failing call's tensors still alive.
#include <cuda_runtime.h>
#include <kf/kernel.h>

__global__ void k_half(const float* __restrict__ x, float* __restrict__ y, long n) {
  for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
    y[i] = 0.5f * x[i];
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  if (n_in != 1 || n_out != 1 || in[0].dtype != kf::KF_FLOAT32 || out[0].dtype != kf::KF_FLOAT32) return 1;
  if (in[0].numel() != out[0].numel()) return 1;
  const long n = out[0].numel();
  if (n > 0)
    k_half<<<4096, 256, 0, static_cast<cudaStream_t>(ctx->stream)>>>(static_cast<const float*>(in[0].data),
                                                                     static_cast<float*>(out[0].data), n);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
