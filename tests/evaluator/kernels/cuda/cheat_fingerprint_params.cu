// cheat (derived weights cached on a fingerprint of the parameters): 024_layernorm. It
// keeps its own device copy of weight and bias (as a kernel would keep pre-packed weights)
// and refreshes it only when 8 elements spread over each of them change. Re-drawing all
// parameters refreshes it; re-drawing a few elements leaves it stale.
#include <cuda_runtime.h>
#include <kf/kernel.h>
#include <cstring>

__global__ void layernorm_rows(const float* x, const float* w, const float* b, float* y, long rows, long f) {
  const long r = blockIdx.x;
  if (r >= rows) return;
  const float* xr = x + r * f;
  __shared__ float red[256];
  float s = 0.f;
  for (long c = threadIdx.x; c < f; c += blockDim.x) s += xr[c];
  red[threadIdx.x] = s;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k) red[threadIdx.x] += red[threadIdx.x + k];
    __syncthreads();
  }
  const float mean = red[0] / f;
  __syncthreads();
  float v = 0.f;
  for (long c = threadIdx.x; c < f; c += blockDim.x) v += (xr[c] - mean) * (xr[c] - mean);
  red[threadIdx.x] = v;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k) red[threadIdx.x] += red[threadIdx.x + k];
    __syncthreads();
  }
  const float rstd = rsqrtf(red[0] / f + 1e-5f);
  for (long c = threadIdx.x; c < f; c += blockDim.x) y[r * f + c] = (xr[c] - mean) * rstd * w[c] + b[c];
}
__global__ void gather(const float* w, const float* b, float* h, long step) {
  const int i = threadIdx.x;  // 8 of each
  h[i] = i < 8 ? w[i * step] : b[(i - 8) * step];
}

static float* copy = nullptr;  // weight then bias
static float* probe = nullptr;
static float key[16];
static bool have = false;

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int) {
  if (n_in != 3) return 1;
  auto s = static_cast<cudaStream_t>(ctx->stream);
  const long f = in[1].numel(), rows = in[0].numel() / f;
  const long step = f / 8 > 0 ? f / 8 : 1;
  if (!copy && cudaMalloc(&copy, 2 * f * sizeof(float)) != cudaSuccess) return 1;
  if (!probe && cudaMalloc(&probe, 16 * sizeof(float)) != cudaSuccess) return 1;
  gather<<<1, 16, 0, s>>>(static_cast<const float*>(in[1].data), static_cast<const float*>(in[2].data), probe, step);
  float h[16];
  cudaMemcpyAsync(h, probe, sizeof h, cudaMemcpyDeviceToHost, s);
  cudaStreamSynchronize(s);
  if (!have || std::memcmp(h, key, sizeof h) != 0) {
    cudaMemcpyAsync(copy, in[1].data, f * sizeof(float), cudaMemcpyDeviceToDevice, s);
    cudaMemcpyAsync(copy + f, in[2].data, f * sizeof(float), cudaMemcpyDeviceToDevice, s);
    std::memcpy(key, h, sizeof h);
    have = true;
  }
  layernorm_rows<<<rows, 256, 0, s>>>(static_cast<const float*>(in[0].data), copy, copy + f, static_cast<float*>(out[0].data), rows, f);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
