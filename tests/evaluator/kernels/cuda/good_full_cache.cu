// good (tricky but honest: a cache keyed on the full content): 034_linear, y = x W^T + b.
// It keeps a device copy of W and compares all of W with it in every call (a kernel
// counts the differing elements); any difference refreshes the copy. Never stale, so it
// must stay ok under every parameter check, one tensor at a time included.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <kf/kernel.h>

__global__ void count_diff(const float* a, const float* b, long n, unsigned long long* d) {
  unsigned long long c = 0;
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
    c += __float_as_uint(a[i]) != __float_as_uint(b[i]);
  if (c) atomicAdd(d, c);
}
__global__ void add_bias(float* y, const float* b, long rows, long n) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < rows * n; i += (long)gridDim.x * blockDim.x)
    y[i] += b[i % n];
}

static float* wcopy = nullptr;
static unsigned long long* diff = nullptr;
static bool filled = false;

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int) {
  if (n_in != 3) return 1;
  auto s = static_cast<cudaStream_t>(ctx->stream);
  auto h = static_cast<cublasHandle_t>(ctx->cublas);
  const float* x = static_cast<const float*>(in[0].data);
  const float* w = static_cast<const float*>(in[1].data);
  const float* b = static_cast<const float*>(in[2].data);
  float* y = static_cast<float*>(out[0].data);
  const long M = in[0].shape[0], K = in[0].shape[1], N = in[1].shape[0];
  if (!wcopy && (cudaMalloc(&wcopy, sizeof(float) * size_t(N * K)) != cudaSuccess ||
                 cudaMalloc(&diff, sizeof *diff) != cudaSuccess))
    return 1;
  unsigned long long d = 1;
  if (filled) {
    cudaMemsetAsync(diff, 0, sizeof *diff, s);
    count_diff<<<1024, 256, 0, s>>>(w, wcopy, N * K, diff);
    cudaMemcpyAsync(&d, diff, sizeof d, cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
  }
  if (d) {
    cudaMemcpyAsync(wcopy, w, sizeof(float) * size_t(N * K), cudaMemcpyDeviceToDevice, s);
    filled = true;
  }
  const float one = 1.f, zero = 0.f;
  cublasSetMathMode(h, CUBLAS_DEFAULT_MATH);
  if (cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)M, (int)K, &one, wcopy, (int)K, x, (int)K, &zero, y,
                  (int)N) != CUBLAS_STATUS_SUCCESS)
    return 1;
  add_bias<<<1024, 256, 0, s>>>(y, b, M, N);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
