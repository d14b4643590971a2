// cheat (work escaping the timed region): a host thread launches the kernel after
// kf_forward has returned (the harness's device sync happens before the launch).
#include <cuda_runtime.h>
#include <kf/kernel.h>
#include <chrono>
#include <thread>

__global__ void relu(const float* x, float* y, long n) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) y[i] = fmaxf(x[i], 0.f);
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int, kf::Tensor* out, int) {
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
  const long n = in[0].numel();
  const int dev = ctx->device;
  std::thread([=] {
    cudaSetDevice(dev);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    relu<<<2048, 256, 0, s>>>(x, y, n);
    cudaStreamSynchronize(s);
  }).detach();
  return 0;
}
