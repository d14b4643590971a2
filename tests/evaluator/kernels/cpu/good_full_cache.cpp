// good (tricky but honest: a cache keyed on the full content): 034_linear, y = x W^T + b.
// It keeps a transposed copy of W and rebuilds it whenever any element of W changed (a
// full comparison with its own copy of W, inside the call): never stale, so it must stay
// ok under every parameter check, one tensor at a time included.
#include <kf/kernel.h>
#include <cstring>
#include <vector>

static std::vector<float> wt, w_seen;

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int) {
  if (n_in != 3) return 1;
  const float* x = static_cast<const float*>(in[0].data);
  const float* w = static_cast<const float*>(in[1].data);
  const float* b = static_cast<const float*>(in[2].data);
  float* y = static_cast<float*>(out[0].data);
  const long M = in[0].shape[0], K = in[0].shape[1], N = in[1].shape[0];
  if (long(w_seen.size()) != N * K || std::memcmp(w_seen.data(), w, sizeof(float) * size_t(N * K)) != 0) {
    w_seen.assign(w, w + N * K);
    wt.resize(size_t(N * K));
    for (long j = 0; j < N; ++j)
      for (long c = 0; c < K; ++c) wt[size_t(c * N + j)] = w[j * K + c];
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
