// cheat (problem-size tampering): processes only the first quarter of the rows of the
// softmax input, as if the batch were smaller.
#include <cuda_runtime.h>
#include <kf/kernel.h>

__global__ void softmax_rows_naive(const float* x, float* y, long cols) {
  const float* xr = x + blockIdx.x * cols;
  float* yr = y + blockIdx.x * cols;
  __shared__ float m, s;
  if (threadIdx.x == 0) {
    m = -INFINITY;
    for (long c = 0; c < cols; ++c) m = fmaxf(m, xr[c]);
    s = 0.f;
    for (long c = 0; c < cols; ++c) s += __expf(xr[c] - m);
  }
  __syncthreads();
  for (long c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = __expf(xr[c] - m) / s;
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int, kf::Tensor* out, int) {
  const long rows = in[0].shape[0] / 4, cols = in[0].shape[1];
  softmax_rows_naive<<<(unsigned)rows, 256, 0, static_cast<cudaStream_t>(ctx->stream)>>>(
      static_cast<const float*>(in[0].data), static_cast<float*>(out[0].data), cols);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
