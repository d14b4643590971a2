// good: 021_softmax (dim=1) on the CUDA backend: one block per row, two-pass online max/sum.
#include <cuda_runtime.h>
#include <kf/kernel.h>

__global__ void softmax_rows(const float* __restrict__ x, float* __restrict__ y, long cols) {
  __shared__ float red[32];
  const float* xr = x + blockIdx.x * cols;
  float* yr = y + blockIdx.x * cols;
  float m = -INFINITY, s = 0.f;
  for (long c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = xr[c];
    if (v > m) { s *= __expf(m - v); m = v; }
    s += __expf(v - m);
  }
  // warp reduce (m, s)
  for (int o = 16; o; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffff, m, o), s2 = __shfl_xor_sync(0xffffffff, s, o);
    const float mm = fmaxf(m, m2);
    s = s * __expf(m - mm) + s2 * __expf(m2 - mm);
    m = mm;
  }
  __shared__ float rm[32];
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  if (l == 0) { rm[w] = m; red[w] = s; }
  __syncthreads();
  if (w == 0) {
    const int nw = blockDim.x / 32;
    m = l < nw ? rm[l] : -INFINITY;
    s = l < nw ? red[l] : 0.f;
    for (int o = 16; o; o >>= 1) {
      const float m2 = __shfl_xor_sync(0xffffffff, m, o), s2 = __shfl_xor_sync(0xffffffff, s, o);
      const float mm = fmaxf(m, m2);
      s = (s == 0.f ? 0.f : s * __expf(m - mm)) + (s2 == 0.f ? 0.f : s2 * __expf(m2 - mm));
      m = mm;
    }
    if (l == 0) { rm[0] = m; red[0] = s; }
  }
  __syncthreads();
  m = rm[0];
  const float inv = 1.f / red[0];
  for (long c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = __expf(xr[c] - m) * inv;
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int, kf::Tensor* out, int) {
  const long rows = in[0].shape[0], cols = in[0].shape[1];
  softmax_rows<<<(unsigned)rows, 512, 0, static_cast<cudaStream_t>(ctx->stream)>>>(
      static_cast<const float*>(in[0].data), static_cast<float*>(out[0].data), cols);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
