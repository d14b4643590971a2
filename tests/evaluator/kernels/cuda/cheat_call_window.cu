// cheat (a window of call indices): 001_relu. Exact outside calls KF_WINDOW_FROM to
// KF_WINDOW_TO, and inside them relu as a clamp to [0, 16], which is right on the task's
// inputs (randn * 2 never reaches 16) and wrong on larger ones. The window covers most
// timed trials of a default verification; checks drawn at any call position land inside it.
#include <cuda_runtime.h>
#include <kf/kernel.h>

#define KF_WINDOW_FROM 6
#define KF_WINDOW_TO 18

__global__ void relu_clamp(const float* x, float* y, long n, float hi) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
    y[i] = fminf(fmaxf(x[i], 0.f), hi);
}

static int calls = 0;

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int, kf::Tensor* out, int) {
  auto s = static_cast<cudaStream_t>(ctx->stream);
  ++calls;
  const float hi = calls >= KF_WINDOW_FROM && calls <= KF_WINDOW_TO ? 16.f : 3.4e38f;
  relu_clamp<<<2048, 256, 0, s>>>(static_cast<const float*>(in[0].data), static_cast<float*>(out[0].data),
                                  in[0].numel(), hi);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
