// good (tricky but honest: a static table built in the first call): 021_softmax (dim=1 of
// a 2-D input), max-subtracted. exp(d) for d <= 0 is table[k] * exp(d + k) with k the
// integer part of -d; table[k] = exp(-k) for k up to 104 is filled on the device in the
// first call. The table does not depend on the inputs: within a few ulp of exp(d).
#include <cuda_runtime.h>
#include <kf/kernel.h>
#include <cmath>

__global__ void fill(float* t) {
  if (threadIdx.x < 105) t[threadIdx.x] = (float)exp(-(double)threadIdx.x);
}

__device__ float exp_le0(const float* t, float d) {
  if (!(d > -104.f)) return 0.f;
  const int k = (int)(-d);
  return t[k] * expf(d + (float)k);
}

__global__ void softmax_rows(const float* x, float* y, const float* t, long rows, long cols) {
  const long r = blockIdx.x;
  if (r >= rows) return;
  const float* xr = x + r * cols;
  float* yr = y + r * cols;
  __shared__ float red[256];
  float m = -INFINITY;
  for (long c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
  red[threadIdx.x] = m;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
    __syncthreads();
  }
  m = red[0];
  __syncthreads();
  float sum = 0.f;
  for (long c = threadIdx.x; c < cols; c += blockDim.x) {
    const float e = exp_le0(t, xr[c] - m);
    yr[c] = e;
    sum += e;
  }
  red[threadIdx.x] = sum;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
    __syncthreads();
  }
  const float inv = 1.f / red[0];
  for (long c = threadIdx.x; c < cols; c += blockDim.x) yr[c] *= inv;
}

static float* table = nullptr;

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int, kf::Tensor* out, int) {
  auto s = static_cast<cudaStream_t>(ctx->stream);
  if (!table) {
    if (cudaMalloc(&table, 105 * sizeof(float)) != cudaSuccess) return 1;
    fill<<<1, 128, 0, s>>>(table);
  }
  const long rows = in[0].shape[0], cols = in[0].shape[1];
  softmax_rows<<<(unsigned)rows, 256, 0, s>>>(static_cast<const float*>(in[0].data), static_cast<float*>(out[0].data),
                                              table, rows, cols);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
