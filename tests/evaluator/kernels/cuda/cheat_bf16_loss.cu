// cheat (reduced precision hidden by a reduction): 113_mse_of_linear, loss = mean((x W^T +
// b - target)^2). It rounds x and W to bfloat16 and runs the GEMM on them through cuBLAS
// (tensor cores, fp32 accumulation). Each prediction is off by about 0.2 %, which an
// elementwise output's tolerance rejects; the mean of 16M such terms averages the error
// away, inside the loss's tolerance. Where a few terms dominate the loss their error shows.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <kf/kernel.h>

__global__ void to_bf16(const float* a, __nv_bfloat16* b, long n) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
    b[i] = __float2bfloat16_rn(a[i]);
}
__global__ void sq_err(const float* p, const float* bias, const float* t, long rows, long n, double* acc) {
  double s = 0;
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < rows * n; i += (long)gridDim.x * blockDim.x) {
    const double d = double(p[i] + bias[i % n]) - t[i];
    s += d * d;
  }
  atomicAdd(acc, s);
}
__global__ void finish(const double* acc, float* y, double count) { *y = float(*acc / count); }

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int) {
  if (n_in != 4) return 1;
  auto s = static_cast<cudaStream_t>(ctx->stream);
  auto h = static_cast<cublasHandle_t>(ctx->cublas);
  const long B = in[0].shape[0], K = in[0].shape[1], N = in[2].shape[0];
  auto* xb = static_cast<__nv_bfloat16*>(ctx->scratch_alloc(ctx, size_t(B * K) * 2));
  auto* wb = static_cast<__nv_bfloat16*>(ctx->scratch_alloc(ctx, size_t(N * K) * 2));
  auto* pred = static_cast<float*>(ctx->scratch_alloc(ctx, size_t(B * N) * 4));
  auto* acc = static_cast<double*>(ctx->scratch_alloc(ctx, 8));
  if (!xb || !wb || !pred || !acc) return 1;
  to_bf16<<<1024, 256, 0, s>>>(static_cast<const float*>(in[0].data), xb, B * K);
  to_bf16<<<1024, 256, 0, s>>>(static_cast<const float*>(in[2].data), wb, N * K);
  const float one = 1.f, zero = 0.f;
  // Row-major pred[B, N] = x W^T is column-major pred^T = W x^T.
  if (cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)B, (int)K, &one, wb, CUDA_R_16BF, (int)K, xb, CUDA_R_16BF,
                   (int)K, &zero, pred, CUDA_R_32F, (int)N, CUBLAS_COMPUTE_32F,
                   CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
    return 1;
  cudaMemsetAsync(acc, 0, 8, s);
  sq_err<<<1024, 256, 0, s>>>(pred, static_cast<const float*>(in[3].data), static_cast<const float*>(in[1].data), B, N,
                              acc);
  finish<<<1, 1, 0, s>>>(acc, static_cast<float*>(out[0].data), double(B) * double(N));
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
