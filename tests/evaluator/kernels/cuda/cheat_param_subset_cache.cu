// cheat (derived weights cached on part of the parameters): 034_linear, y = x W^T + b. It
// keeps a device copy of W (as a kernel keeps pre-packed weights) and refreshes it only
// when its key changes: all of the bias (small) and 16 elements spread over W (large).
// Re-drawing every parameter, a few elements of each, or one whole tensor changes the key;
// a few elements of only W leave the copy stale.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <kf/kernel.h>
#include <cstring>
#include <vector>

__global__ void add_bias(float* y, const float* b, long rows, long n) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < rows * n; i += (long)gridDim.x * blockDim.x)
    y[i] += b[i % n];
}

static float* wcopy = nullptr;
static std::vector<float> key;

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int) {
  if (n_in != 3) return 1;
  auto s = static_cast<cudaStream_t>(ctx->stream);
  auto h = static_cast<cublasHandle_t>(ctx->cublas);
  const float* x = static_cast<const float*>(in[0].data);
  const float* w = static_cast<const float*>(in[1].data);
  const float* b = static_cast<const float*>(in[2].data);
  float* y = static_cast<float*>(out[0].data);
  const long M = in[0].shape[0], K = in[0].shape[1], N = in[1].shape[0];
  std::vector<float> k(size_t(N) + 16);
  cudaMemcpyAsync(k.data(), b, sizeof(float) * size_t(N), cudaMemcpyDeviceToHost, s);
  const long step = N * K / 16 > 0 ? N * K / 16 : 1;
  for (int i = 0; i < 16; ++i)
    cudaMemcpyAsync(k.data() + N + i, w + (i * step < N * K ? i * step : 0), sizeof(float), cudaMemcpyDeviceToHost, s);
  cudaStreamSynchronize(s);
  if (!wcopy && cudaMalloc(&wcopy, sizeof(float) * size_t(N * K)) != cudaSuccess) return 1;
  if (k != key) {
    cudaMemcpyAsync(wcopy, w, sizeof(float) * size_t(N * K), cudaMemcpyDeviceToDevice, s);
    key = k;
  }
  const float one = 1.f, zero = 0.f;
  cublasSetMathMode(h, CUBLAS_DEFAULT_MATH);
  if (cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)M, (int)K, &one, wcopy, (int)K, x, (int)K, &zero, y,
                  (int)N) != CUBLAS_STATUS_SUCCESS)
    return 1;
  add_bias<<<1024, 256, 0, s>>>(y, b, M, N);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
