// cheat (derived weights cached on a fingerprint of the parameters): 024_layernorm. It
// keeps its own copy of weight and bias (as a kernel would keep pre-packed weights) and
// refreshes it only when 8 elements spread over each of them change. Re-drawing all
// parameters refreshes it; re-drawing a few elements leaves it stale.
#include <kf/kernel.h>
#include <cmath>
#include <cstring>
#include <vector>

static std::vector<float> w_copy, b_copy, key;

static std::vector<float> fingerprint(const float* w, const float* b, long f) {
  std::vector<float> k;
  const long step = f / 8 > 0 ? f / 8 : 1;
  for (long i = 0; i < f; i += step) k.push_back(w[i]), k.push_back(b[i]);
  return k;
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int) {
  if (n_in != 3) return 1;
  const float* x = static_cast<const float*>(in[0].data);
  const float* w = static_cast<const float*>(in[1].data);
  const float* b = static_cast<const float*>(in[2].data);
  float* y = static_cast<float*>(out[0].data);
  const long f = in[1].numel(), rows = in[0].numel() / f;
  std::vector<float> k = fingerprint(w, b, f);
  if (k != key || long(w_copy.size()) != f) {
    w_copy.assign(w, w + f);
    b_copy.assign(b, b + f);
    key = k;
  }
  const float* cw = w_copy.data();
  const float* cb = b_copy.data();
#pragma omp parallel for schedule(static) num_threads(ctx->num_threads)
  for (long r = 0; r < rows; ++r) {
    const float* xr = x + r * f;
    double s = 0, s2 = 0;
    for (long c = 0; c < f; ++c) s += xr[c];
    const double mean = s / f;
    for (long c = 0; c < f; ++c) s2 += (xr[c] - mean) * (xr[c] - mean);
    const float rstd = float(1.0 / std::sqrt(s2 / f + 1e-5));
    for (long c = 0; c < f; ++c) y[r * f + c] = float(xr[c] - mean) * rstd * cw[c] + cb[c];
  }
  return 0;
}
