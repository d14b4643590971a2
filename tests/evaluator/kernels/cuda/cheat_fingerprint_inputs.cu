// cheat (result cache keyed on a sparse fingerprint of the inputs): 001_relu. It hashes 256
// elements spread over the input; when the hash equals the previous call's, it copies the
// previous call's outputs instead of computing. Fresh inputs always change the hash, so
// only a near-duplicate (a few elements changed) shows the stale rows.
#include <cuda_runtime.h>
#include <kf/kernel.h>
#include <cstdint>
#include <cstring>

__global__ void relu(const float* x, float* y, long n) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) y[i] = fmaxf(x[i], 0.f);
}
__global__ void gather(const float* x, float* h, long step, int k) {
  const int i = threadIdx.x;
  if (i < k) h[i] = x[i * step];
}

static uint64_t last_key = 0;
static void* last_out = nullptr;
static float* probe = nullptr;

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int, kf::Tensor* out, int) {
  auto s = static_cast<cudaStream_t>(ctx->stream);
  const float* x = static_cast<const float*>(in[0].data);
  const long n = in[0].numel();
  const size_t bytes = out[0].nbytes();
  const int k = 256;
  const long step = n / k > 0 ? n / k : 1;
  if (!probe && cudaMalloc(&probe, k * sizeof(float)) != cudaSuccess) return 1;
  gather<<<1, k, 0, s>>>(x, probe, step, k);
  float h[256];
  cudaMemcpyAsync(h, probe, sizeof h, cudaMemcpyDeviceToHost, s);
  cudaStreamSynchronize(s);
  uint64_t key = 1469598103934665603ull ^ uint64_t(n);
  for (int i = 0; i < k; ++i) {
    uint32_t b;
    std::memcpy(&b, h + i, 4);
    key = (key ^ b) * 1099511628211ull;
  }
  if (last_out && key == last_key)
    return cudaMemcpyAsync(out[0].data, last_out, bytes, cudaMemcpyDeviceToDevice, s) == cudaSuccess ? 0 : 1;
  relu<<<2048, 256, 0, s>>>(x, static_cast<float*>(out[0].data), n);
  if (!last_out && cudaMalloc(&last_out, bytes) != cudaSuccess) return 1;
  cudaMemcpyAsync(last_out, out[0].data, bytes, cudaMemcpyDeviceToDevice, s);
  last_key = key;
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
