// cheat attempt (side stream): launches on a private non-blocking stream and returns
// without waiting. The harness's cudaDeviceSynchronize() counts that work, so this is
// accepted, and timed honestly: the trick gains nothing.
#include <cuda_runtime.h>
#include <kf/kernel.h>

__global__ void relu(const float* x, float* y, long n) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) y[i] = fmaxf(x[i], 0.f);
}

extern "C" int kf_forward(kf::Context*, const kf::Tensor* in, int, kf::Tensor* out, int) {
  static cudaStream_t side = nullptr;
  if (!side) cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
  relu<<<2048, 256, 0, side>>>(static_cast<const float*>(in[0].data), static_cast<float*>(out[0].data), in[0].numel());
  return 0;
}
