// cheat (derived weights cached on part of the parameters): 034_linear, y = x W^T + b. It
// keeps a transposed copy of W (as a kernel keeps pre-packed weights) and rebuilds it only
// when its key changes: all of the bias (small) and 16 elements spread over W (large).
// Re-drawing every parameter, or a few elements of each, changes the bias and so rebuilds
// it; re-drawing one whole tensor changes the key too. A few elements of only W leave the
// key as it was, and the packed copy stale.
#include <kf/kernel.h>
#include <cstring>
#include <vector>

static std::vector<float> wt, key;

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int) {
  if (n_in != 3) return 1;
  const float* x = static_cast<const float*>(in[0].data);
  const float* w = static_cast<const float*>(in[1].data);
  const float* b = static_cast<const float*>(in[2].data);
  float* y = static_cast<float*>(out[0].data);
  const long M = in[0].shape[0], K = in[0].shape[1], N = in[1].shape[0];
  std::vector<float> k(b, b + N);
  const long step = N * K / 16 > 0 ? N * K / 16 : 1;
  for (long i = 0; i < N * K; i += step) k.push_back(w[i]);
  if (k != key || long(wt.size()) != N * K) {
    wt.resize(size_t(N * K));
    for (long j = 0; j < N; ++j)
      for (long c = 0; c < K; ++c) wt[size_t(c * N + j)] = w[j * K + c];
    key = k;
  }
#pragma omp parallel for schedule(static) num_threads(ctx->num_threads)
  for (long i = 0; i < M; ++i) {
    float* yr = y + i * N;
    for (long j = 0; j < N; ++j) yr[j] = b[j];
    for (long c = 0; c < K; ++c) {
      const float a = x[i * K + c];
      const float* t = wt.data() + c * N;
      for (long j = 0; j < N; ++j) yr[j] += a * t[j];
    }
  }
  return 0;
}
