"""204_residual_block: ResNet basic block with train-mode batch norm.

y = relu(bn1(conv1(x))); out = relu(x + bn2(conv2(y))), 3x3 convs (padding 1, no bias),
batch norm with the batch's statistics (biased variance, eps 1e-5).
"""

TASK = "204_residual_block"

# ----------------------------------------------------------------------------------------
# CPU
# ----------------------------------------------------------------------------------------
# Argument checks and unpacking, the same in the CPU and the CUDA sources.
ARGS = r"""static int get_dims(const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out, long& N, long& C, long& H, long& W) {
  if (n_in != 13 || n_out != 1) return 1;
  const kf::Tensor& x = in[0];
  if (x.ndim != 4 || x.dtype != kf::KF_FLOAT32 || out[0].dtype != kf::KF_FLOAT32) return 1;
  N = x.shape[0]; C = x.shape[1]; H = x.shape[2]; W = x.shape[3];
  for (int i = 1; i <= 6; ++i) if (in[i].dtype != kf::KF_FLOAT32) return 1;
  for (int i : {1, 4}) {
    if (in[i].ndim != 4 || in[i].shape[0] != C || in[i].shape[1] != C || in[i].shape[2] != 3 || in[i].shape[3] != 3) return 1;
  }
  for (int i : {2, 3, 5, 6}) if (in[i].numel() != C) return 1;
  if (out[0].numel() != x.numel()) return 1;
  return 0;
}
"""

CPU_COMMON = r"""
#include <stdlib.h>
#include <initializer_list>

""" + ARGS + r"""
// Batch statistics of channel c over (N, H, W) in double -> per-channel scale and shift.
static void bn_coef_channel(const float* y, long N, long C, long HW, long c, const float* g, const float* b,
                            float* sc, float* sh) {
  double s = 0.0, q = 0.0;
  for (long n = 0; n < N; ++n) {
    const float* p = y + (n * C + c) * HW;
    double s1 = 0.0, q1 = 0.0;
    for (long i = 0; i < HW; ++i) {
      const double v = p[i];
      s1 += v;
      q1 += v * v;
    }
    s += s1;
    q += q1;
  }
  const double cnt = (double)N * (double)HW;
  const double mean = s / cnt;
  double var = q / cnt - mean * mean;
  if (var < 0.0) var = 0.0;
  const double k = (double)g[c] / sqrt(var + 1e-5);
  sc[c] = (float)k;
  sh[c] = (float)((double)b[c] - mean * k);
}
"""

CPU_NAIVE = r"""
static void conv3x3(const float* x, const float* w, float* y, long N, long C, long H, long W) {
  for (long n = 0; n < N; ++n)
    for (long co = 0; co < C; ++co)
      for (long oh = 0; oh < H; ++oh)
        for (long ow = 0; ow < W; ++ow) {
          float acc = 0.f;
          for (long ci = 0; ci < C; ++ci)
            for (int kh = 0; kh < 3; ++kh) {
              const long ih = oh - 1 + kh;
              if (ih < 0 || ih >= H) continue;
              for (int kw = 0; kw < 3; ++kw) {
                const long iw = ow - 1 + kw;
                if (iw < 0 || iw >= W) continue;
                acc += w[((co * C + ci) * 3 + kh) * 3 + kw] * x[((n * C + ci) * H + ih) * W + iw];
              }
            }
          y[((n * C + co) * H + oh) * W + ow] = acc;
        }
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  long N, C, H, W;
  if (get_dims(in, n_in, out, n_out, N, C, H, W)) return 1;
  const long HW = H * W, tot = N * C * HW;
  if (tot == 0) return 0;
  const float* x = (const float*)in[0].data;
  float* y = (float*)out[0].data;
  float* t = (float*)ctx->scratch_alloc(ctx, sizeof(float) * (tot + 4 * C));
  if (!t) return 2;
  float *sc1 = t + tot, *sh1 = sc1 + C, *sc2 = sh1 + C, *sh2 = sc2 + C;
  conv3x3(x, (const float*)in[1].data, t, N, C, H, W);
  for (long c = 0; c < C; ++c) bn_coef_channel(t, N, C, HW, c, (const float*)in[2].data, (const float*)in[3].data, sc1, sh1);
  for (long i = 0; i < tot; ++i) {
    const long c = (i / HW) % C;
    t[i] = fmaxf(t[i] * sc1[c] + sh1[c], 0.f);
  }
  conv3x3(t, (const float*)in[4].data, y, N, C, H, W);
  for (long c = 0; c < C; ++c) bn_coef_channel(y, N, C, HW, c, (const float*)in[5].data, (const float*)in[6].data, sc2, sh2);
  for (long i = 0; i < tot; ++i) {
    const long c = (i / HW) % C;
    y[i] = fmaxf(x[i] + y[i] * sc2[c] + sh2[c], 0.f);
  }
  ctx->scratch_free(ctx, t);
  return 0;
}
"""

CPU_ROWAXPY = r"""
// One (sample, output channel) plane per task: every (input channel, tap) adds weight x a
// shifted input row to the output row (unit stride, vectorised).
static void conv3x3(const float* x, const float* w, float* y, long N, long C, long H, long W, int nt) {
#pragma omp parallel for schedule(static) num_threads(nt)
  for (long pl = 0; pl < N * C; ++pl) {
    const long n = pl / C, co = pl % C;
    float* yp = y + pl * H * W;
    for (long i = 0; i < H * W; ++i) yp[i] = 0.f;
    for (long ci = 0; ci < C; ++ci) {
      const float* xp = x + (n * C + ci) * H * W;
      for (int kh = 0; kh < 3; ++kh)
        for (int kw = 0; kw < 3; ++kw) {
          const float wv = w[((co * C + ci) * 3 + kh) * 3 + kw];
          long o0 = 1 - kw, o1 = W + 1 - kw;
          if (o0 < 0) o0 = 0;
          if (o1 > W) o1 = W;
          for (long oh = 0; oh < H; ++oh) {
            const long ih = oh - 1 + kh;
            if (ih < 0 || ih >= H) continue;
            const float* xr = xp + ih * W - 1 + kw;
            float* yr = yp + oh * W;
#pragma omp simd
            for (long ow = o0; ow < o1; ++ow) yr[ow] += wv * xr[ow];
          }
        }
    }
  }
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  long N, C, H, W;
  if (get_dims(in, n_in, out, n_out, N, C, H, W)) return 1;
  const long HW = H * W, tot = N * C * HW;
  if (tot == 0) return 0;
  const int nt = ctx->num_threads > 0 ? ctx->num_threads : 1;
  const float* x = (const float*)in[0].data;
  float* y = (float*)out[0].data;
  float* t = (float*)ctx->scratch_alloc(ctx, sizeof(float) * (tot + 4 * C));
  if (!t) return 2;
  float *sc1 = t + tot, *sh1 = sc1 + C, *sc2 = sh1 + C, *sh2 = sc2 + C;
  conv3x3(x, (const float*)in[1].data, t, N, C, H, W, nt);
#pragma omp parallel for schedule(static) num_threads(nt)
  for (long c = 0; c < C; ++c) bn_coef_channel(t, N, C, HW, c, (const float*)in[2].data, (const float*)in[3].data, sc1, sh1);
#pragma omp parallel for schedule(static) num_threads(nt)
  for (long pl = 0; pl < N * C; ++pl) {
    const float a = sc1[pl % C], b = sh1[pl % C];
    float* p = t + pl * HW;
#pragma omp simd
    for (long i = 0; i < HW; ++i) p[i] = fmaxf(p[i] * a + b, 0.f);
  }
  conv3x3(t, (const float*)in[4].data, y, N, C, H, W, nt);
#pragma omp parallel for schedule(static) num_threads(nt)
  for (long c = 0; c < C; ++c) bn_coef_channel(y, N, C, HW, c, (const float*)in[5].data, (const float*)in[6].data, sc2, sh2);
#pragma omp parallel for schedule(static) num_threads(nt)
  for (long pl = 0; pl < N * C; ++pl) {
    const float a = sc2[pl % C], b = sh2[pl % C];
    float* p = y + pl * HW;
    const float* xp = x + pl * HW;
#pragma omp simd
    for (long i = 0; i < HW; ++i) p[i] = fmaxf(xp[i] + p[i] * a + b, 0.f);
  }
  ctx->scratch_free(ctx, t);
  return 0;
}
"""

CPU_COBLOCK = r"""
#include <vector>
#include <algorithm>
#define CB @CB@

// Task = (sample, block of CB output channels, output row): the zero-padded input row of
// each (input channel, kh) is loaded once (with bn1+relu applied on the fly when pre != 0)
// and feeds CB output rows held in an L1-resident accumulator.
static void conv3x3(const float* x, const float* w, float* y, long N, long C, long H, long W,
                    const float* psc, const float* psh, int nt) {
  const long nb = (C + CB - 1) / CB;
#pragma omp parallel num_threads(nt)
  {
    std::vector<float> accv((size_t)CB * W), xpv((size_t)W + 2);
    float* acc = accv.data();
    float* xp = xpv.data();
#pragma omp for schedule(static)
    for (long task = 0; task < N * nb * H; ++task) {
      const long oh = task % H, t2 = task / H, cb0 = (t2 % nb) * CB, n = t2 / nb;
      const int cb = (int)std::min<long>(CB, C - cb0);
      for (long i = 0; i < (long)CB * W; ++i) acc[i] = 0.f;
      for (long ci = 0; ci < C; ++ci) {
        for (int kh = 0; kh < 3; ++kh) {
          const long ih = oh - 1 + kh;
          if (ih < 0 || ih >= H) continue;
          const float* xr = x + ((n * C + ci) * H + ih) * W;
          xp[0] = 0.f;
          xp[W + 1] = 0.f;
          if (psc) {
            const float a = psc[ci], b = psh[ci];
#pragma omp simd
            for (long i = 0; i < W; ++i) xp[i + 1] = fmaxf(xr[i] * a + b, 0.f);
          } else {
            for (long i = 0; i < W; ++i) xp[i + 1] = xr[i];
          }
          for (int j = 0; j < cb; ++j) {
            const float* wp = w + (((cb0 + j) * C + ci) * 3 + kh) * 3;
            const float w0 = wp[0], w1 = wp[1], w2 = wp[2];
            float* a = acc + (long)j * W;
#pragma omp simd
            for (long ow = 0; ow < W; ++ow) a[ow] += w0 * xp[ow] + w1 * xp[ow + 1] + w2 * xp[ow + 2];
          }
        }
      }
      for (int j = 0; j < cb; ++j) memcpy(y + ((n * C + cb0 + j) * H + oh) * W, acc + (long)j * W, sizeof(float) * W);
    }
  }
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  long N, C, H, W;
  if (get_dims(in, n_in, out, n_out, N, C, H, W)) return 1;
  const long HW = H * W, tot = N * C * HW;
  if (tot == 0) return 0;
  const int nt = ctx->num_threads > 0 ? ctx->num_threads : 1;
  const float* x = (const float*)in[0].data;
  float* y = (float*)out[0].data;
  float* t = (float*)ctx->scratch_alloc(ctx, sizeof(float) * (tot + 4 * C));
  if (!t) return 2;
  float *sc1 = t + tot, *sh1 = sc1 + C, *sc2 = sh1 + C, *sh2 = sc2 + C;
  // conv1 -> raw t; bn1 + relu are folded into conv2's input-row loads.
  conv3x3(x, (const float*)in[1].data, t, N, C, H, W, nullptr, nullptr, nt);
#pragma omp parallel for schedule(static) num_threads(nt)
  for (long c = 0; c < C; ++c) bn_coef_channel(t, N, C, HW, c, (const float*)in[2].data, (const float*)in[3].data, sc1, sh1);
  conv3x3(t, (const float*)in[4].data, y, N, C, H, W, sc1, sh1, nt);
#pragma omp parallel for schedule(static) num_threads(nt)
  for (long c = 0; c < C; ++c) bn_coef_channel(y, N, C, HW, c, (const float*)in[5].data, (const float*)in[6].data, sc2, sh2);
#pragma omp parallel for schedule(static) num_threads(nt)
  for (long pl = 0; pl < N * C; ++pl) {
    const float a = sc2[pl % C], b = sh2[pl % C];
    float* p = y + pl * HW;
    const float* xp = x + pl * HW;
#pragma omp simd
    for (long i = 0; i < HW; ++i) p[i] = fmaxf(xp[i] + p[i] * a + b, 0.f);
  }
  ctx->scratch_free(ctx, t);
  return 0;
}
"""

# ----------------------------------------------------------------------------------------
# CUDA
# ----------------------------------------------------------------------------------------
CUDA_COMMON = r"""
#include <initializer_list>
""" + ARGS + r"""
// Partial batch statistics: block (c, p) sums slice p of channel c's N*HW values in double.
__global__ void k_stats(const float* __restrict__ y, long N, long C, long HW, int P, double* __restrict__ part) {
  __shared__ double ss[256], sq[256];
  const long c = blockIdx.x, tot = N * HW, per = (tot + P - 1) / P;
  const long b = (long)blockIdx.y * per;
  const long e = b + per < tot ? b + per : tot;
  double s = 0.0, q = 0.0;
  for (long i = b + threadIdx.x; i < e; i += blockDim.x) {
    const long n = i / HW, p = i - n * HW;
    const double v = y[(n * C + c) * HW + p];
    s += v;
    q += v * v;
  }
  ss[threadIdx.x] = s;
  sq[threadIdx.x] = q;
  __syncthreads();
  for (int o = 128; o > 0; o >>= 1) {
    if ((int)threadIdx.x < o) {
      ss[threadIdx.x] += ss[threadIdx.x + o];
      sq[threadIdx.x] += sq[threadIdx.x + o];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    part[(c * P + blockIdx.y) * 2] = ss[0];
    part[(c * P + blockIdx.y) * 2 + 1] = sq[0];
  }
}

// Fixed-order reduction of the P partials of each channel -> scale, shift.
__global__ void k_coef(const double* __restrict__ part, long P, long C, double cnt, const float* __restrict__ g,
                       const float* __restrict__ b, float* __restrict__ sc, float* __restrict__ sh) {
  __shared__ double ss[256], sq[256];
  const long c = blockIdx.x;
  double s = 0.0, q = 0.0;
  for (long p = threadIdx.x; p < P; p += blockDim.x) {
    s += part[(c * P + p) * 2];
    q += part[(c * P + p) * 2 + 1];
  }
  ss[threadIdx.x] = s;
  sq[threadIdx.x] = q;
  __syncthreads();
  for (int o = 128; o > 0; o >>= 1) {
    if ((int)threadIdx.x < o) {
      ss[threadIdx.x] += ss[threadIdx.x + o];
      sq[threadIdx.x] += sq[threadIdx.x + o];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const double mean = ss[0] / cnt;
    double var = sq[0] / cnt - mean * mean;
    if (var < 0.0) var = 0.0;
    const double k = (double)g[c] / sqrt(var + 1e-5);
    sc[c] = (float)k;
    sh[c] = (float)((double)b[c] - mean * k);
  }
}

__global__ void k_bnrelu(float* __restrict__ t, const float* __restrict__ sc, const float* __restrict__ sh, long tot, long C, long HW) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < tot; i += (long)gridDim.x * blockDim.x) {
    const long c = (i / HW) % C;
    t[i] = fmaxf(t[i] * sc[c] + sh[c], 0.f);
  }
}

__global__ void k_final(const float* __restrict__ x, float* __restrict__ y, const float* __restrict__ sc, const float* __restrict__ sh,
                        long tot, long C, long HW) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < tot; i += (long)gridDim.x * blockDim.x) {
    const long c = (i / HW) % C;
    y[i] = fmaxf(x[i] + y[i] * sc[c] + sh[c], 0.f);
  }
}

static unsigned ew_grid(long tot) {
  long g = (tot + 255) / 256;
  return (unsigned)(g < 65536L * 16 ? g : 65536L * 16);
}
"""

CUDA_NAIVE = r"""
#define SP 64

__global__ void k_conv(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y, long N, long C, long H, long W) {
  const long idx = blockIdx.x * (long)blockDim.x + threadIdx.x;
  if (idx >= N * C * H * W) return;
  const long ow = idx % W, oh = (idx / W) % H, co = (idx / (W * H)) % C, n = idx / (W * H * C);
  float acc = 0.f;
  for (long ci = 0; ci < C; ++ci)
    for (int kh = 0; kh < 3; ++kh) {
      const long ih = oh - 1 + kh;
      if (ih < 0 || ih >= H) continue;
      for (int kw = 0; kw < 3; ++kw) {
        const long iw = ow - 1 + kw;
        if (iw < 0 || iw >= W) continue;
        acc += w[((co * C + ci) * 3 + kh) * 3 + kw] * x[((n * C + ci) * H + ih) * W + iw];
      }
    }
  y[idx] = acc;
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  long N, C, H, W;
  if (get_dims(in, n_in, out, n_out, N, C, H, W)) return 1;
  const long HW = H * W, tot = N * C * HW;
  if (tot == 0) return 0;
  if (C > 2147483647L) return 1;
  cudaStream_t st = (cudaStream_t)ctx->stream;
  const float* x = (const float*)in[0].data;
  float* y = (float*)out[0].data;
  const size_t tb = ((size_t)tot * sizeof(float) + 255) & ~(size_t)255;
  char* mem = (char*)ctx->scratch_alloc(ctx, tb + sizeof(double) * 2 * SP * C + sizeof(float) * 4 * C);
  if (!mem) return 2;
  float* t = (float*)mem;
  double* part = (double*)(mem + tb);
  float* sc1 = (float*)(part + 2 * SP * C);
  float *sh1 = sc1 + C, *sc2 = sh1 + C, *sh2 = sc2 + C;
  const double cnt = (double)N * (double)HW;
  const long cg = (tot + 255) / 256;
  k_conv<<<(unsigned)cg, 256, 0, st>>>(x, (const float*)in[1].data, t, N, C, H, W);
  k_stats<<<dim3((unsigned)C, SP), 256, 0, st>>>(t, N, C, HW, SP, part);
  k_coef<<<(unsigned)C, 256, 0, st>>>(part, SP, C, cnt, (const float*)in[2].data, (const float*)in[3].data, sc1, sh1);
  k_bnrelu<<<ew_grid(tot), 256, 0, st>>>(t, sc1, sh1, tot, C, HW);
  k_conv<<<(unsigned)cg, 256, 0, st>>>(t, (const float*)in[4].data, y, N, C, H, W);
  k_stats<<<dim3((unsigned)C, SP), 256, 0, st>>>(y, N, C, HW, SP, part);
  k_coef<<<(unsigned)C, 256, 0, st>>>(part, SP, C, cnt, (const float*)in[5].data, (const float*)in[6].data, sc2, sh2);
  k_final<<<ew_grid(tot), 256, 0, st>>>(x, y, sc2, sh2, tot, C, HW);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
"""

CUDA_TILED = r"""
#define COB @COB@
#define CK 8
#define TS 16

// Block = 16x16 output pixels x COB output channels of one sample. Input channels go in
// chunks of CK: the haloed 18x18 input tiles (bn1 + relu applied on load when PRE) and the
// COB x CK x 9 weights are staged in shared memory. The epilogue writes the raw conv output
// and this block's per-channel sum / sum of squares (warp shuffles, fixed order).
template <bool PRE>
__global__ void __launch_bounds__(256) k_conv(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
    const float* __restrict__ isc, const float* __restrict__ ish, double* __restrict__ part,
    int C, int H, int W, int tilesX, long P) {
  __shared__ float xs[CK][TS + 2][TS + 2];
  __shared__ float ws[COB][CK][9];
  __shared__ float red[2][COB][8];
  const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
  const int bx = blockIdx.x % tilesX, by = blockIdx.x / tilesX;
  const int co0 = blockIdx.y * COB;
  const long n = blockIdx.z;
  const int oh = by * TS + ty, ow = bx * TS + tx;
  float acc[COB];
#pragma unroll
  for (int j = 0; j < COB; ++j) acc[j] = 0.f;
  for (int c0 = 0; c0 < C; c0 += CK) {
    for (int i = threadIdx.x; i < CK * (TS + 2) * (TS + 2); i += 256) {
      const int cc = i / ((TS + 2) * (TS + 2)), r = (i / (TS + 2)) % (TS + 2), q = i % (TS + 2);
      const int ci = c0 + cc, ih = by * TS - 1 + r, iw = bx * TS - 1 + q;
      float v = 0.f;
      if (ci < C && ih >= 0 && ih < H && iw >= 0 && iw < W) {
        v = x[((n * C + ci) * H + ih) * (long)W + iw];
        if (PRE) v = fmaxf(v * isc[ci] + ish[ci], 0.f);
      }
      xs[cc][r][q] = v;
    }
    for (int i = threadIdx.x; i < COB * CK * 9; i += 256) {
      const int j = i / (CK * 9), rem = i % (CK * 9), cc = rem / 9, k = rem % 9;
      const int co = co0 + j, ci = c0 + cc;
      ws[j][cc][k] = (co < C && ci < C) ? w[((long)co * C + ci) * 9 + k] : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int cc = 0; cc < CK; ++cc)
#pragma unroll
      for (int kh = 0; kh < 3; ++kh)
#pragma unroll
        for (int kw = 0; kw < 3; ++kw) {
          const float v = xs[cc][ty + kh][tx + kw];
#pragma unroll
          for (int j = 0; j < COB; ++j) acc[j] += ws[j][cc][kh * 3 + kw] * v;
        }
    __syncthreads();
  }
  const bool valid = oh < H && ow < W;
  if (valid) {
#pragma unroll
    for (int j = 0; j < COB; ++j)
      if (co0 + j < C) y[((n * C + co0 + j) * H + oh) * (long)W + ow] = acc[j];
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int j = 0; j < COB; ++j) {
    float s = valid ? acc[j] : 0.f;
    float q = s * s;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      s += __shfl_xor_sync(0xffffffffu, s, o);
      q += __shfl_xor_sync(0xffffffffu, q, o);
    }
    if (lane == 0) {
      red[0][j][warp] = s;
      red[1][j][warp] = q;
    }
  }
  __syncthreads();
  if ((int)threadIdx.x < COB && co0 + (int)threadIdx.x < C) {
    const int j = threadIdx.x;
    double s = 0.0, q = 0.0;
    for (int k = 0; k < 8; ++k) {
      s += red[0][j][k];
      q += red[1][j][k];
    }
    const long blk = n * gridDim.x + blockIdx.x;
    part[((long)(co0 + j) * P + blk) * 2] = s;
    part[((long)(co0 + j) * P + blk) * 2 + 1] = q;
  }
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  long N, C, H, W;
  if (get_dims(in, n_in, out, n_out, N, C, H, W)) return 1;
  const long HW = H * W, tot = N * C * HW;
  if (tot == 0) return 0;
  if (N > 65535 || C > 65535L * COB || H > 1L << 20 || W > 1L << 20) return 1;
  const int tilesX = (int)((W + TS - 1) / TS), tilesY = (int)((H + TS - 1) / TS);
  if ((long)tilesX * tilesY > 2147483647L) return 1;
  const long P = N * tilesX * tilesY;
  cudaStream_t st = (cudaStream_t)ctx->stream;
  const float* x = (const float*)in[0].data;
  float* y = (float*)out[0].data;
  const size_t tb = ((size_t)tot * sizeof(float) + 255) & ~(size_t)255;
  char* mem = (char*)ctx->scratch_alloc(ctx, tb + sizeof(double) * 2 * P * C + sizeof(float) * 4 * C);
  if (!mem) return 2;
  float* t = (float*)mem;
  double* part = (double*)(mem + tb);
  float* sc1 = (float*)(part + 2 * P * C);
  float *sh1 = sc1 + C, *sc2 = sh1 + C, *sh2 = sc2 + C;
  const double cnt = (double)N * (double)HW;
  const dim3 grid((unsigned)(tilesX * tilesY), (unsigned)((C + COB - 1) / COB), (unsigned)N);
  k_conv<false><<<grid, 256, 0, st>>>(x, (const float*)in[1].data, t, nullptr, nullptr, part, (int)C, (int)H, (int)W, tilesX, P);
  k_coef<<<(unsigned)C, 256, 0, st>>>(part, P, C, cnt, (const float*)in[2].data, (const float*)in[3].data, sc1, sh1);
  k_conv<true><<<grid, 256, 0, st>>>(t, (const float*)in[4].data, y, sc1, sh1, part, (int)C, (int)H, (int)W, tilesX, P);
  k_coef<<<(unsigned)C, 256, 0, st>>>(part, P, C, cnt, (const float*)in[5].data, (const float*)in[6].data, sc2, sh2);
  k_final<<<ew_grid(tot), 256, 0, st>>>(x, y, sc2, sh2, tot, C, HW);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
"""

CUDA_CUBLAS = r"""
#include <cublas_v2.h>
#define SP 256
#define COL_BYTES (@COLMB@L << 20)

// im2col of samples [n0, n0 + S): col[s][ci * 9 + kh * 3 + kw][oh * W + ow] (zero padding),
// with bn1 + relu applied to in-bounds values when isc != null.
__global__ void k_im2col(const float* __restrict__ x, float* __restrict__ col, const float* __restrict__ isc,
                         const float* __restrict__ ish, long n0, long S, long C, long H, long W) {
  const long HW = H * W, K = C * 9, tot = S * K * HW;
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < tot; i += (long)gridDim.x * blockDim.x) {
    const long p = i % HW, k = (i / HW) % K, s = i / (HW * K);
    const long ci = k / 9, kh = (k % 9) / 3, kw = k % 3;
    const long oh = p / W, ow = p % W, ih = oh - 1 + kh, iw = ow - 1 + kw;
    float v = 0.f;
    if (ih >= 0 && ih < H && iw >= 0 && iw < W) {
      v = x[(((n0 + s) * C + ci) * H + ih) * W + iw];
      if (isc) v = fmaxf(v * isc[ci] + ish[ci], 0.f);
    }
    col[i] = v;
  }
}

// y_n (C x HW) = w (C x 9C) * col_n (9C x HW) per sample, as one strided-batched SGEMM per chunk.
static int conv(cublasHandle_t h, cudaStream_t st, const float* x, const float* w, float* y, float* col, long S,
                const float* isc, const float* ish, long N, long C, long H, long W) {
  const long HW = H * W, K = 9 * C;
  const float one = 1.f, zero = 0.f;
  for (long n0 = 0; n0 < N; n0 += S) {
    const long s = N - n0 < S ? N - n0 : S;
    k_im2col<<<ew_grid(s * K * HW), 256, 0, st>>>(x, col, isc, ish, n0, s, C, H, W);
    if (cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, (int)HW, (int)C, (int)K, &one, col, (int)HW,
                                  (long long)K * HW, w, (int)K, 0LL, &zero, y + n0 * C * HW, (int)HW,
                                  (long long)C * HW, (int)s) != CUBLAS_STATUS_SUCCESS)
      return 4;
  }
  return 0;
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  long N, C, H, W;
  if (get_dims(in, n_in, out, n_out, N, C, H, W)) return 1;
  const long HW = H * W, tot = N * C * HW;
  if (tot == 0) return 0;
  if (HW > 2147483647L || 9 * C > 2147483647L || N > 2147483647L) return 1;
  cudaStream_t st = (cudaStream_t)ctx->stream;
  cublasHandle_t h = (cublasHandle_t)ctx->cublas;
  const float* x = (const float*)in[0].data;
  float* y = (float*)out[0].data;
  const size_t per = sizeof(float) * 9 * C * HW;
  long S = (long)(COL_BYTES / per);
  if (S < 1) S = 1;
  if (S > N) S = N;
  const size_t tb = ((size_t)tot * sizeof(float) + 255) & ~(size_t)255;
  const size_t cb = (per * S + 255) & ~(size_t)255;
  char* mem = (char*)ctx->scratch_alloc(ctx, tb + cb + sizeof(double) * 2 * SP * C + sizeof(float) * 4 * C);
  if (!mem) return 2;
  float* t = (float*)mem;
  float* col = (float*)(mem + tb);
  double* part = (double*)(mem + tb + cb);
  float* sc1 = (float*)(part + 2 * SP * C);
  float *sh1 = sc1 + C, *sc2 = sh1 + C, *sh2 = sc2 + C;
  const double cnt = (double)N * (double)HW;
  int rc = conv(h, st, x, (const float*)in[1].data, t, col, S, nullptr, nullptr, N, C, H, W);
  if (rc) return rc;
  k_stats<<<dim3((unsigned)C, SP), 256, 0, st>>>(t, N, C, HW, SP, part);
  k_coef<<<(unsigned)C, 256, 0, st>>>(part, SP, C, cnt, (const float*)in[2].data, (const float*)in[3].data, sc1, sh1);
  rc = conv(h, st, t, (const float*)in[4].data, y, col, S, sc1, sh1, N, C, H, W);
  if (rc) return rc;
  k_stats<<<dim3((unsigned)C, SP), 256, 0, st>>>(y, N, C, HW, SP, part);
  k_coef<<<(unsigned)C, 256, 0, st>>>(part, SP, C, cnt, (const float*)in[5].data, (const float*)in[6].data, sc2, sh2);
  k_final<<<ew_grid(tot), 256, 0, st>>>(x, y, sc2, sh2, tot, C, HW);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
"""


def generate(header, indent):
    F = "composite"
    out = []

    def add(backend, variant, tech, body):
        out.append((backend, variant, F, tech, header(TASK, backend, F, variant, tech) + body))

    add("cpu", "naive",
        "Direct 3x3 convolutions with bounds checks per tap, single-threaded, then double-precision batch statistics and separate normalisation passes.",
        CPU_COMMON + CPU_NAIVE)
    add("cpu", "omp_planes_rowaxpy",
        "Output planes over OpenMP threads, each tap adds weight x a shifted input row to the output row (unit-stride SIMD), channel statistics in parallel.",
        CPU_COMMON + CPU_ROWAXPY)
    for cb in (4, 8):
        add("cpu", f"omp_coblock{cb}_fused",
            f"Each OpenMP task computes {cb} output channels of one output row from a zero-padded input row loaded once (bn1 + relu folded into conv2's row loads), accumulating in an L1-resident buffer.",
            CPU_COMMON + CPU_COBLOCK.replace("@CB@", str(cb)))
    add("cuda", "naive_b256",
        "One thread per conv output reading global memory directly, then block-per-(channel, slice) double statistics and elementwise bn/relu passes.",
        CUDA_COMMON + CUDA_NAIVE)
    for cob in (8, 16):
        add("cuda", f"smem_tiled_co{cob}_fused",
            f"16x16 pixel tiles x {cob} output channels per block with haloed input tiles and weights staged in shared memory, batch statistics reduced in the conv epilogue and bn1 + relu fused into conv2's tile loads.",
            CUDA_COMMON + CUDA_TILED.replace("@COB@", str(cob)))
    add("cuda", "cublas_im2col_sgemm",
        "Each conv is im2col (bn1 + relu fused into the second one's gather) plus a strided-batched cuBLAS SGEMM per sample chunk, with deterministic two-pass double statistics and a fused residual epilogue.",
        CUDA_COMMON + CUDA_CUBLAS.replace("@COLMB@", "512"))
    return out
