"""210_unet_level: d = relu(conv3x3 stride 2 (C -> 2C)(x)); u = convtranspose 2x2 stride 2 (2C -> C)(d);
y = relu(conv3x3 (2C -> C)(cat[x, u])). All with bias."""

TASK = "210_unet_level"

# ----------------------------------------------------------------------------------------
# CPU
# ----------------------------------------------------------------------------------------
CPU_COMMON = r"""
#include <stdlib.h>
#include <algorithm>

struct P {
  const float *x, *wd, *bd, *wu, *bu, *wf, *bf;
  float* y;
  long N, C, H, W, Hd, Wd;
};

// in: x, down.weight (2C, C, 3, 3), down.bias, up.weight (2C, C, 2, 2), up.bias, fuse.weight (C, 2C, 3, 3), fuse.bias
static int get_args(const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out, P& p) {
  if (n_in != 7 || n_out != 1) return 1;
  for (int i = 0; i < 7; ++i) if (in[i].dtype != kf::KF_FLOAT32) return 1;
  if (out[0].dtype != kf::KF_FLOAT32 || in[0].ndim != 4) return 1;
  p.N = in[0].shape[0]; p.C = in[0].shape[1]; p.H = in[0].shape[2]; p.W = in[0].shape[3];
  const long C = p.C;
  p.Hd = (p.H - 1) / 2 + 1;
  p.Wd = (p.W - 1) / 2 + 1;
  if (2 * p.Hd != p.H || 2 * p.Wd != p.W) return 1;  // the concat needs the upsampled size to match
  const kf::Tensor &wd = in[1], &wu = in[3], &wf = in[5];
  if (wd.ndim != 4 || wd.shape[0] != 2 * C || wd.shape[1] != C || wd.shape[2] != 3 || wd.shape[3] != 3) return 1;
  if (wu.ndim != 4 || wu.shape[0] != 2 * C || wu.shape[1] != C || wu.shape[2] != 2 || wu.shape[3] != 2) return 1;
  if (wf.ndim != 4 || wf.shape[0] != C || wf.shape[1] != 2 * C || wf.shape[2] != 3 || wf.shape[3] != 3) return 1;
  if (in[2].numel() != 2 * C || in[4].numel() != C || in[6].numel() != C) return 1;
  if (out[0].numel() != in[0].numel()) return 1;
  p.x = (const float*)in[0].data;
  p.wd = (const float*)wd.data;
  p.bd = (const float*)in[2].data;
  p.wu = (const float*)wu.data;
  p.bu = (const float*)in[4].data;
  p.wf = (const float*)wf.data;
  p.bf = (const float*)in[6].data;
  p.y = (float*)out[0].data;
  return 0;
}
"""

CPU_NAIVE = r"""
extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  P p;
  if (get_args(in, n_in, out, n_out, p)) return 1;
  const long N = p.N, C = p.C, H = p.H, W = p.W, Hd = p.Hd, Wd = p.Wd;
  if (N * C * H * W == 0) return 0;
  const long nd = N * 2 * C * Hd * Wd, nu = N * C * H * W;
  float* d = (float*)ctx->scratch_alloc(ctx, sizeof(float) * (nd + nu));
  if (!d) return 2;
  float* u = d + nd;
  for (long n = 0; n < N; ++n)
    for (long co = 0; co < 2 * C; ++co)
      for (long i = 0; i < Hd; ++i)
        for (long j = 0; j < Wd; ++j) {
          float acc = p.bd[co];
          for (long ci = 0; ci < C; ++ci)
            for (int kh = 0; kh < 3; ++kh)
              for (int kw = 0; kw < 3; ++kw) {
                const long ih = 2 * i - 1 + kh, iw = 2 * j - 1 + kw;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                acc += p.wd[((co * C + ci) * 3 + kh) * 3 + kw] * p.x[((n * C + ci) * H + ih) * W + iw];
              }
          d[((n * 2 * C + co) * Hd + i) * Wd + j] = acc > 0.f ? acc : 0.f;
        }
  for (long n = 0; n < N; ++n)
    for (long co = 0; co < C; ++co)
      for (long oh = 0; oh < H; ++oh)
        for (long ow = 0; ow < W; ++ow) {
          const long i = oh / 2, a = oh % 2, j = ow / 2, b = ow % 2;
          float acc = p.bu[co];
          for (long ci = 0; ci < 2 * C; ++ci)
            acc += d[((n * 2 * C + ci) * Hd + i) * Wd + j] * p.wu[((ci * C + co) * 2 + a) * 2 + b];
          u[((n * C + co) * H + oh) * W + ow] = acc;
        }
  for (long n = 0; n < N; ++n)
    for (long co = 0; co < C; ++co)
      for (long oh = 0; oh < H; ++oh)
        for (long ow = 0; ow < W; ++ow) {
          float acc = p.bf[co];
          for (long ci = 0; ci < 2 * C; ++ci) {
            const float* src = ci < C ? p.x + (n * C + ci) * H * W : u + (n * C + ci - C) * H * W;
            for (int kh = 0; kh < 3; ++kh)
              for (int kw = 0; kw < 3; ++kw) {
                const long ih = oh - 1 + kh, iw = ow - 1 + kw;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                acc += p.wf[((co * 2 * C + ci) * 3 + kh) * 3 + kw] * src[ih * W + iw];
              }
          }
          p.y[((n * C + co) * H + oh) * W + ow] = acc > 0.f ? acc : 0.f;
        }
  ctx->scratch_free(ctx, d);
  return 0;
}
"""

CPU_PLANES = r"""
// 3x3 conv, padding 1, stride S, over the channel concatenation [x1 (C1), x2 (C2)], + bias
// (+ relu); one output plane per OpenMP task, each tap adds weight x an input row.
static void conv_planes(const float* x1, long C1, const float* x2, long C2, long H, long W, int S, const float* w,
                        const float* b, long CO, float* y, long N, long Ho, long Wo, int nt) {
  const long CI = C1 + C2;
#pragma omp parallel for schedule(static) num_threads(nt)
  for (long pl = 0; pl < N * CO; ++pl) {
    const long n = pl / CO, co = pl % CO;
    float* yp = y + pl * Ho * Wo;
    for (long i = 0; i < Ho * Wo; ++i) yp[i] = b[co];
    for (long ci = 0; ci < CI; ++ci) {
      const float* xp = ci < C1 ? x1 + (n * C1 + ci) * H * W : x2 + (n * C2 + ci - C1) * H * W;
      for (int kh = 0; kh < 3; ++kh)
        for (int kw = 0; kw < 3; ++kw) {
          const float wv = w[((co * CI + ci) * 3 + kh) * 3 + kw];
          // columns with 0 <= S*ow - 1 + kw < W
          const long o0 = kw == 0 ? 1 : 0;
          long o1 = (W - kw) / S + 1;
          if (o1 > Wo) o1 = Wo;
          for (long oh = 0; oh < Ho; ++oh) {
            const long ih = S * oh - 1 + kh;
            if (ih < 0 || ih >= H) continue;
            const float* xr = xp + ih * W - 1 + kw;
            float* yr = yp + oh * Wo;
#pragma omp simd
            for (long ow = o0; ow < o1; ++ow) yr[ow] += wv * xr[S * ow];
          }
        }
    }
    for (long i = 0; i < Ho * Wo; ++i) yp[i] = yp[i] > 0.f ? yp[i] : 0.f;
  }
}

// transposed conv 2x2 stride 2: each input pixel scatters a 2x2 block per output channel.
static void up_planes(const float* d, const float* wu, const float* bu, float* u, long N, long C2, long CO, long Hd,
                      long Wd, int nt) {
  const long H = 2 * Hd, W = 2 * Wd;
#pragma omp parallel for schedule(static) num_threads(nt)
  for (long pl = 0; pl < N * CO; ++pl) {
    const long n = pl / CO, co = pl % CO;
    float* up = u + pl * H * W;
    for (long i = 0; i < H * W; ++i) up[i] = bu[co];
    for (long ci = 0; ci < C2; ++ci) {
      const float* dp = d + (n * C2 + ci) * Hd * Wd;
      const float* wp = wu + (ci * CO + co) * 4;
      const float w00 = wp[0], w01 = wp[1], w10 = wp[2], w11 = wp[3];
      for (long i = 0; i < Hd; ++i) {
        float* r0 = up + (2 * i) * W;
        float* r1 = r0 + W;
        const float* dr = dp + i * Wd;
        for (long j = 0; j < Wd; ++j) {
          const float v = dr[j];
          r0[2 * j] += v * w00;
          r0[2 * j + 1] += v * w01;
          r1[2 * j] += v * w10;
          r1[2 * j + 1] += v * w11;
        }
      }
    }
  }
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  P p;
  if (get_args(in, n_in, out, n_out, p)) return 1;
  const long N = p.N, C = p.C, H = p.H, W = p.W, Hd = p.Hd, Wd = p.Wd;
  if (N * C * H * W == 0) return 0;
  const int nt = ctx->num_threads > 0 ? ctx->num_threads : 1;
  const long nd = N * 2 * C * Hd * Wd, nu = N * C * H * W;
  float* d = (float*)ctx->scratch_alloc(ctx, sizeof(float) * (nd + nu));
  if (!d) return 2;
  float* u = d + nd;
  conv_planes(p.x, C, nullptr, 0, H, W, 2, p.wd, p.bd, 2 * C, d, N, Hd, Wd, nt);
  up_planes(d, p.wu, p.bu, u, N, 2 * C, C, Hd, Wd, nt);
  conv_planes(p.x, C, u, C, H, W, 1, p.wf, p.bf, C, p.y, N, H, W, nt);
  ctx->scratch_free(ctx, d);
  return 0;
}
"""

CPU_COBLOCK = r"""
#include <vector>
#define CB @CB@

// 3x3 conv (padding 1, stride S) over [x1 (C1), x2 (C2)] + bias + relu. OpenMP task =
// (sample, CB output channels, output row): each zero-padded input row is loaded once and
// feeds CB accumulator rows kept in L1 (SIMD over the output row).
template <int S>
static void conv_block(const float* x1, long C1, const float* x2, long C2, long H, long W, const float* w,
                       const float* b, long CO, float* y, long N, long Ho, long Wo, int nt) {
  const long CI = C1 + C2, nb = (CO + CB - 1) / CB;
#pragma omp parallel num_threads(nt)
  {
    std::vector<float> accv((size_t)CB * Wo), xpv((size_t)W + 3);
    float* acc = accv.data();
    float* xp = xpv.data();
#pragma omp for schedule(static)
    for (long task = 0; task < N * nb * Ho; ++task) {
      const long oh = task % Ho, t2 = task / Ho, cb0 = (t2 % nb) * CB, n = t2 / nb;
      const int cb = (int)std::min<long>(CB, CO - cb0);
      for (int j = 0; j < cb; ++j)
        for (long ow = 0; ow < Wo; ++ow) acc[(long)j * Wo + ow] = b[cb0 + j];
      for (long ci = 0; ci < CI; ++ci) {
        const float* src = ci < C1 ? x1 + (n * C1 + ci) * H * W : x2 + (n * C2 + ci - C1) * H * W;
        for (int kh = 0; kh < 3; ++kh) {
          const long ih = S * oh - 1 + kh;
          if (ih < 0 || ih >= H) continue;
          const float* xr = src + ih * W;
          xp[0] = 0.f;
          for (long i = 0; i < W; ++i) xp[i + 1] = xr[i];
          xp[W + 1] = 0.f;
          xp[W + 2] = 0.f;
          for (int j = 0; j < cb; ++j) {
            const float* wp = w + (((cb0 + j) * CI + ci) * 3 + kh) * 3;
            const float w0 = wp[0], w1 = wp[1], w2 = wp[2];
            float* a = acc + (long)j * Wo;
#pragma omp simd
            for (long ow = 0; ow < Wo; ++ow) a[ow] += w0 * xp[S * ow] + w1 * xp[S * ow + 1] + w2 * xp[S * ow + 2];
          }
        }
      }
      for (int j = 0; j < cb; ++j) {
        float* yr = y + ((n * CO + cb0 + j) * Ho + oh) * Wo;
        const float* a = acc + (long)j * Wo;
        for (long ow = 0; ow < Wo; ++ow) yr[ow] = a[ow] > 0.f ? a[ow] : 0.f;
      }
    }
  }
}

// transposed conv 2x2 stride 2: task = (sample, CB output channels, input row i) writes
// output rows 2i and 2i+1 of CB channels, reading each input row once.
static void up_block(const float* d, const float* wu, const float* bu, float* u, long N, long C2, long CO, long Hd,
                     long Wd, int nt) {
  const long H = 2 * Hd, W = 2 * Wd, nb = (CO + CB - 1) / CB;
#pragma omp parallel for schedule(static) num_threads(nt)
  for (long task = 0; task < N * nb * Hd; ++task) {
    const long i = task % Hd, t2 = task / Hd, cb0 = (t2 % nb) * CB, n = t2 / nb;
    const int cb = (int)std::min<long>(CB, CO - cb0);
    for (int j = 0; j < cb; ++j) {
      float* r0 = u + ((n * CO + cb0 + j) * H + 2 * i) * W;
      for (long q = 0; q < 2 * W; ++q) r0[q] = bu[cb0 + j];
    }
    for (long ci = 0; ci < C2; ++ci) {
      const float* dr = d + ((n * C2 + ci) * Hd + i) * Wd;
      for (int j = 0; j < cb; ++j) {
        const float* wp = wu + (ci * CO + cb0 + j) * 4;
        const float w00 = wp[0], w01 = wp[1], w10 = wp[2], w11 = wp[3];
        float* r0 = u + ((n * CO + cb0 + j) * H + 2 * i) * W;
        float* r1 = r0 + W;
#pragma omp simd
        for (long q = 0; q < Wd; ++q) {
          const float v = dr[q];
          r0[2 * q] += v * w00;
          r0[2 * q + 1] += v * w01;
          r1[2 * q] += v * w10;
          r1[2 * q + 1] += v * w11;
        }
      }
    }
  }
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  P p;
  if (get_args(in, n_in, out, n_out, p)) return 1;
  const long N = p.N, C = p.C, H = p.H, W = p.W, Hd = p.Hd, Wd = p.Wd;
  if (N * C * H * W == 0) return 0;
  const int nt = ctx->num_threads > 0 ? ctx->num_threads : 1;
  const long nd = N * 2 * C * Hd * Wd, nu = N * C * H * W;
  float* d = (float*)ctx->scratch_alloc(ctx, sizeof(float) * (nd + nu));
  if (!d) return 2;
  float* u = d + nd;
  conv_block<2>(p.x, C, nullptr, 0, H, W, p.wd, p.bd, 2 * C, d, N, Hd, Wd, nt);
  up_block(d, p.wu, p.bu, u, N, 2 * C, C, Hd, Wd, nt);
  conv_block<1>(p.x, C, u, C, H, W, p.wf, p.bf, C, p.y, N, H, W, nt);
  ctx->scratch_free(ctx, d);
  return 0;
}
"""

# ----------------------------------------------------------------------------------------
# CUDA
# ----------------------------------------------------------------------------------------
CUDA_COMMON = CPU_COMMON.replace("#include <algorithm>\n", "")

CUDA_NAIVE = r"""
__global__ void k_down(P p, float* __restrict__ d) {
  const long C = p.C, H = p.H, W = p.W, Hd = p.Hd, Wd = p.Wd;
  const long idx = blockIdx.x * (long)blockDim.x + threadIdx.x;
  if (idx >= p.N * 2 * C * Hd * Wd) return;
  const long j = idx % Wd, i = (idx / Wd) % Hd, co = (idx / (Wd * Hd)) % (2 * C), n = idx / (Wd * Hd * 2 * C);
  float acc = p.bd[co];
  for (long ci = 0; ci < C; ++ci)
    for (int kh = 0; kh < 3; ++kh)
      for (int kw = 0; kw < 3; ++kw) {
        const long ih = 2 * i - 1 + kh, iw = 2 * j - 1 + kw;
        if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
        acc += p.wd[((co * C + ci) * 3 + kh) * 3 + kw] * p.x[((n * C + ci) * H + ih) * W + iw];
      }
  d[idx] = fmaxf(acc, 0.f);
}

__global__ void k_up(P p, const float* __restrict__ d, float* __restrict__ u) {
  const long C = p.C, H = p.H, W = p.W, Hd = p.Hd, Wd = p.Wd;
  const long idx = blockIdx.x * (long)blockDim.x + threadIdx.x;
  if (idx >= p.N * C * H * W) return;
  const long ow = idx % W, oh = (idx / W) % H, co = (idx / (W * H)) % C, n = idx / (W * H * C);
  const long i = oh / 2, a = oh % 2, j = ow / 2, b = ow % 2;
  float acc = p.bu[co];
  for (long ci = 0; ci < 2 * C; ++ci) acc += d[((n * 2 * C + ci) * Hd + i) * Wd + j] * p.wu[((ci * C + co) * 2 + a) * 2 + b];
  u[idx] = acc;
}

__global__ void k_fuse(P p, const float* __restrict__ u) {
  const long C = p.C, H = p.H, W = p.W;
  const long idx = blockIdx.x * (long)blockDim.x + threadIdx.x;
  if (idx >= p.N * C * H * W) return;
  const long ow = idx % W, oh = (idx / W) % H, co = (idx / (W * H)) % C, n = idx / (W * H * C);
  float acc = p.bf[co];
  for (long ci = 0; ci < 2 * C; ++ci) {
    const float* src = ci < C ? p.x + (n * C + ci) * H * W : u + (n * C + ci - C) * H * W;
    for (int kh = 0; kh < 3; ++kh)
      for (int kw = 0; kw < 3; ++kw) {
        const long ih = oh - 1 + kh, iw = ow - 1 + kw;
        if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
        acc += p.wf[((co * 2 * C + ci) * 3 + kh) * 3 + kw] * src[ih * W + iw];
      }
  }
  p.y[idx] = fmaxf(acc, 0.f);
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  P p;
  if (get_args(in, n_in, out, n_out, p)) return 1;
  const long N = p.N, C = p.C, H = p.H, W = p.W, Hd = p.Hd, Wd = p.Wd;
  if (N * C * H * W == 0) return 0;
  cudaStream_t st = (cudaStream_t)ctx->stream;
  const long nd = N * 2 * C * Hd * Wd, nu = N * C * H * W;
  float* d = (float*)ctx->scratch_alloc(ctx, sizeof(float) * (nd + nu));
  if (!d) return 2;
  float* u = d + nd;
  k_down<<<(unsigned)((nd + 255) / 256), 256, 0, st>>>(p, d);
  k_up<<<(unsigned)((nu + 255) / 256), 256, 0, st>>>(p, d, u);
  k_fuse<<<(unsigned)((nu + 255) / 256), 256, 0, st>>>(p, u);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
"""

CUDA_TILED = r"""
#define COB @COB@
#define CK 8
#define TS 16

// 3x3 conv (padding 1, stride S) over [x1 (C1 channels), x2 (C2)] + bias + relu.
// Block = 16x16 output pixels x COB output channels of one sample; input channels in
// chunks of CK with the haloed input tile ((TS-1)*S+3 square) and the COB x CK x 9
// weights in shared memory; each thread accumulates COB channels of one pixel.
template <int S>
__global__ void __launch_bounds__(256) k_conv(const float* __restrict__ x1, int C1, const float* __restrict__ x2, int C2,
    int H, int W, const float* __restrict__ w, const float* __restrict__ b, int CO, float* __restrict__ y, int Ho,
    int Wo, int tilesX) {
  constexpr int IT = (TS - 1) * S + 3;
  __shared__ float xs[CK][IT][IT];
  __shared__ float ws[COB][CK][9];
  const int CI = C1 + C2;
  const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
  const int bx = blockIdx.x % tilesX, by = blockIdx.x / tilesX;
  const int co0 = blockIdx.y * COB;
  const long n = blockIdx.z;
  const int oh = by * TS + ty, ow = bx * TS + tx;
  const int ih0 = by * TS * S - 1, iw0 = bx * TS * S - 1;
  float acc[COB];
#pragma unroll
  for (int j = 0; j < COB; ++j) acc[j] = 0.f;
  for (int c0 = 0; c0 < CI; c0 += CK) {
    for (int i = threadIdx.x; i < CK * IT * IT; i += 256) {
      const int cc = i / (IT * IT), r = (i / IT) % IT, q = i % IT;
      const int ci = c0 + cc, ih = ih0 + r, iw = iw0 + q;
      float v = 0.f;
      if (ci < CI && ih >= 0 && ih < H && iw >= 0 && iw < W) {
        const float* src = ci < C1 ? x1 + (n * C1 + ci) * (long)H * W : x2 + (n * C2 + (ci - C1)) * (long)H * W;
        v = src[(long)ih * W + iw];
      }
      xs[cc][r][q] = v;
    }
    for (int i = threadIdx.x; i < COB * CK * 9; i += 256) {
      const int j = i / (CK * 9), rem = i % (CK * 9), cc = rem / 9, k = rem % 9;
      const int co = co0 + j, ci = c0 + cc;
      ws[j][cc][k] = (co < CO && ci < CI) ? w[((long)co * CI + ci) * 9 + k] : 0.f;
    }
    __syncthreads();
#pragma unroll 2
    for (int cc = 0; cc < CK; ++cc)
#pragma unroll
      for (int kh = 0; kh < 3; ++kh)
#pragma unroll
        for (int kw = 0; kw < 3; ++kw) {
          const float v = xs[cc][ty * S + kh][tx * S + kw];
#pragma unroll
          for (int j = 0; j < COB; ++j) acc[j] += ws[j][cc][kh * 3 + kw] * v;
        }
    __syncthreads();
  }
  if (oh >= Ho || ow >= Wo) return;
#pragma unroll
  for (int j = 0; j < COB; ++j) {
    const int co = co0 + j;
    if (co < CO) y[((n * CO + co) * Ho + oh) * (long)Wo + ow] = fmaxf(acc[j] + b[co], 0.f);
  }
}

// transposed conv 2x2 stride 2: one thread per input pixel x COB output channels, the
// block's C2 x COB x 4 weights in shared memory; each thread writes COB 2x2 blocks.
__global__ void __launch_bounds__(256) k_up(const float* __restrict__ d, const float* __restrict__ wu,
                                            const float* __restrict__ bu, float* __restrict__ u, int C2, int CO, int Hd,
                                            int Wd) {
  extern __shared__ float wsh[];  // [ci][j][4]
  const int co0 = blockIdx.y * COB;
  const long n = blockIdx.z;
  for (int i = threadIdx.x; i < C2 * COB * 4; i += 256) {
    const int ci = i / (COB * 4), j = (i / 4) % COB, k = i % 4;
    wsh[i] = co0 + j < CO ? wu[((long)ci * CO + co0 + j) * 4 + k] : 0.f;
  }
  __syncthreads();
  const long pix = (long)blockIdx.x * 256 + threadIdx.x;
  if (pix >= (long)Hd * Wd) return;
  const int i = (int)(pix / Wd), jx = (int)(pix % Wd);
  float acc[COB][4];
#pragma unroll
  for (int j = 0; j < COB; ++j)
#pragma unroll
    for (int k = 0; k < 4; ++k) acc[j][k] = 0.f;
  const float* dp = d + n * C2 * (long)Hd * Wd + pix;
  for (int ci = 0; ci < C2; ++ci) {
    const float v = dp[(long)ci * Hd * Wd];
    const float* wr = wsh + ci * COB * 4;
#pragma unroll
    for (int j = 0; j < COB; ++j)
#pragma unroll
      for (int k = 0; k < 4; ++k) acc[j][k] += v * wr[j * 4 + k];
  }
  const long H = 2L * Hd, W = 2L * Wd;
#pragma unroll
  for (int j = 0; j < COB; ++j) {
    const int co = co0 + j;
    if (co >= CO) break;
    const float bv = bu[co];
    float* r0 = u + ((n * CO + co) * H + 2 * i) * W + 2 * jx;
    r0[0] = acc[j][0] + bv;
    r0[1] = acc[j][1] + bv;
    r0[W] = acc[j][2] + bv;
    r0[W + 1] = acc[j][3] + bv;
  }
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  P p;
  if (get_args(in, n_in, out, n_out, p)) return 1;
  const long N = p.N, C = p.C, H = p.H, W = p.W, Hd = p.Hd, Wd = p.Wd;
  if (N * C * H * W == 0) return 0;
  if (N > 65535 || 2 * C > 65535L * COB || H > (1L << 20) || W > (1L << 20)) return 1;
  cudaStream_t st = (cudaStream_t)ctx->stream;
  const long nd = N * 2 * C * Hd * Wd, nu = N * C * H * W;
  float* d = (float*)ctx->scratch_alloc(ctx, sizeof(float) * (nd + nu));
  if (!d) return 2;
  float* u = d + nd;
  {
    const int tx = (int)((Wd + TS - 1) / TS), ty = (int)((Hd + TS - 1) / TS);
    k_conv<2><<<dim3((unsigned)(tx * ty), (unsigned)((2 * C + COB - 1) / COB), (unsigned)N), 256, 0, st>>>(
        p.x, (int)C, nullptr, 0, (int)H, (int)W, p.wd, p.bd, (int)(2 * C), d, (int)Hd, (int)Wd, tx);
  }
  {
    const size_t shm = sizeof(float) * 2 * C * COB * 4;
    if (shm > 48 * 1024) return 1;
    k_up<<<dim3((unsigned)((Hd * Wd + 255) / 256), (unsigned)((C + COB - 1) / COB), (unsigned)N), 256, shm, st>>>(
        d, p.wu, p.bu, u, (int)(2 * C), (int)C, (int)Hd, (int)Wd);
  }
  {
    const int tx = (int)((W + TS - 1) / TS), ty = (int)((H + TS - 1) / TS);
    k_conv<1><<<dim3((unsigned)(tx * ty), (unsigned)((C + COB - 1) / COB), (unsigned)N), 256, 0, st>>>(
        p.x, (int)C, u, (int)C, (int)H, (int)W, p.wf, p.bf, (int)C, p.y, (int)H, (int)W, tx);
  }
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
"""

CUDA_CUBLAS = r"""
#include <cublas_v2.h>
#define COL_BYTES (@COLMB@L << 20)

static unsigned ew_grid(long tot) {
  long g = (tot + 255) / 256;
  return (unsigned)(g < 65536L * 16 ? g : 65536L * 16);
}

// im2col for a 3x3 conv (padding 1, stride S) over [x1 (C1), x2 (C2)], samples [n0, n0 + s):
// col[s][ci * 9 + kh * 3 + kw][oh * Wo + ow].
__global__ void k_im2col(const float* __restrict__ x1, long C1, const float* __restrict__ x2, long C2, long H, long W,
                         int S, long Ho, long Wo, float* __restrict__ col, long n0, long ns) {
  const long CI = C1 + C2, K = CI * 9, HWo = Ho * Wo, tot = ns * K * HWo;
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < tot; i += (long)gridDim.x * blockDim.x) {
    const long p = i % HWo, k = (i / HWo) % K, s = i / (HWo * K);
    const long ci = k / 9, kh = (k % 9) / 3, kw = k % 3;
    const long ih = (p / Wo) * S - 1 + kh, iw = (p % Wo) * S - 1 + kw;
    const long n = n0 + s;
    float v = 0.f;
    if (ih >= 0 && ih < H && iw >= 0 && iw < W)
      v = ci < C1 ? x1[((n * C1 + ci) * H + ih) * W + iw] : x2[((n * C2 + ci - C1) * H + ih) * W + iw];
    col[i] = v;
  }
}

__global__ void k_bias_relu(float* __restrict__ y, const float* __restrict__ b, long tot, long C, long HW) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < tot; i += (long)gridDim.x * blockDim.x)
    y[i] = fmaxf(y[i] + b[(i / HW) % C], 0.f);
}

// g[n][co * 4 + a * 2 + b][i * Wd + j] (+ bias) -> u[n][co][2i + a][2j + b]
__global__ void k_scatter(const float* __restrict__ g, const float* __restrict__ bu, float* __restrict__ u, long N, long C,
                          long Hd, long Wd) {
  const long H = 2 * Hd, W = 2 * Wd, tot = N * C * H * W;
  for (long o = blockIdx.x * (long)blockDim.x + threadIdx.x; o < tot; o += (long)gridDim.x * blockDim.x) {
    const long ow = o % W, oh = (o / W) % H, co = (o / (W * H)) % C, n = o / (W * H * C);
    const long r = co * 4 + (oh & 1) * 2 + (ow & 1);
    u[o] = g[(n * 4 * C + r) * Hd * Wd + (oh >> 1) * Wd + (ow >> 1)] + bu[co];
  }
}

// One 3x3 conv as im2col + strided-batched SGEMM per sample chunk:
// y_n (CO x HWo) = w (CO x K) * col_n (K x HWo), then bias + relu.
static int conv(cublasHandle_t h, cudaStream_t st, const float* x1, long C1, const float* x2, long C2, long H, long W,
                int S, long Ho, long Wo, const float* w, const float* b, long CO, float* y, float* col, long chunk, long N) {
  const long K = 9 * (C1 + C2), HWo = Ho * Wo;
  const float one = 1.f, zero = 0.f;
  for (long n0 = 0; n0 < N; n0 += chunk) {
    const long s = N - n0 < chunk ? N - n0 : chunk;
    k_im2col<<<ew_grid(s * K * HWo), 256, 0, st>>>(x1, C1, x2, C2, H, W, S, Ho, Wo, col, n0, s);
    if (cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, (int)HWo, (int)CO, (int)K, &one, col, (int)HWo,
                                  (long long)K * HWo, w, (int)K, 0LL, &zero, y + n0 * CO * HWo, (int)HWo,
                                  (long long)CO * HWo, (int)s) != CUBLAS_STATUS_SUCCESS)
      return 4;
  }
  k_bias_relu<<<ew_grid(N * CO * HWo), 256, 0, st>>>(y, b, N * CO * HWo, CO, HWo);
  return 0;
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  P p;
  if (get_args(in, n_in, out, n_out, p)) return 1;
  const long N = p.N, C = p.C, H = p.H, W = p.W, Hd = p.Hd, Wd = p.Wd;
  if (N * C * H * W == 0) return 0;
  if (H * W > 2147483647L || 18 * C > 2147483647L || N > 2147483647L) return 1;
  cudaStream_t st = (cudaStream_t)ctx->stream;
  cublasHandle_t h = (cublasHandle_t)ctx->cublas;
  const long nd = N * 2 * C * Hd * Wd, nu = N * C * H * W;
  const size_t per = sizeof(float) * 18 * C * H * W;  // the larger (fuse) conv's im2col per sample
  long chunk = (long)(COL_BYTES / per);
  if (chunk < 1) chunk = 1;
  if (chunk > N) chunk = N;
  const size_t db = ((size_t)nd * sizeof(float) + 255) & ~(size_t)255;
  const size_t ub = ((size_t)nu * sizeof(float) + 255) & ~(size_t)255;
  const size_t gb = ((size_t)N * 4 * C * Hd * Wd * sizeof(float) + 255) & ~(size_t)255;
  char* mem = (char*)ctx->scratch_alloc(ctx, db + ub + gb + per * chunk);
  if (!mem) return 2;
  float* d = (float*)mem;
  float* u = (float*)(mem + db);
  float* g = (float*)(mem + db + ub);
  float* col = (float*)(mem + db + ub + gb);
  int rc = conv(h, st, p.x, C, nullptr, 0, H, W, 2, Hd, Wd, p.wd, p.bd, 2 * C, d, col, chunk, N);
  if (rc) return rc;
  // transposed conv: g_n^T (HWd x 4C) = d_n^T (HWd x 2C) * wu (2C x 4C, row-major) per sample
  const float one = 1.f, zero = 0.f;
  if (cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_T, (int)(Hd * Wd), (int)(4 * C), (int)(2 * C), &one, d,
                                (int)(Hd * Wd), (long long)2 * C * Hd * Wd, p.wu, (int)(4 * C), 0LL, &zero, g,
                                (int)(Hd * Wd), (long long)4 * C * Hd * Wd, (int)N) != CUBLAS_STATUS_SUCCESS)
    return 4;
  k_scatter<<<ew_grid(nu), 256, 0, st>>>(g, p.bu, u, N, C, Hd, Wd);
  rc = conv(h, st, p.x, C, u, C, H, W, 1, H, W, p.wf, p.bf, C, p.y, col, chunk, N);
  if (rc) return rc;
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
"""


def generate(header, indent):
    F = "composite"
    out = []

    def add(backend, variant, tech, body):
        out.append((backend, variant, F, tech, header(TASK, backend, F, variant, tech) + body))

    add("cpu", "naive",
        "Direct loops for the strided down conv, the transposed conv and the fuse conv (reading the concatenation from its two sources), single-threaded with per-tap bounds checks.",
        CPU_COMMON + CPU_NAIVE)
    add("cpu", "omp_planes_rowaxpy",
        "Output planes over OpenMP threads; each conv tap adds weight x a (strided) input row with SIMD, the transposed conv scatters 2x2 blocks per input pixel, and the concat is read in place.",
        CPU_COMMON + CPU_PLANES)
    for cb in (4, 8):
        add("cpu", f"omp_coblock{cb}",
            f"OpenMP tasks of (sample, {cb} output channels, output row): zero-padded input rows loaded once feed {cb} L1-resident accumulator rows with SIMD, bias + relu in the write-out, the concat read in place.",
            CPU_COMMON + CPU_COBLOCK.replace("@CB@", str(cb)))
    add("cuda", "naive_b256",
        "One thread per output element for each of the down conv, transposed conv and fuse conv, all operands read from global memory.",
        CUDA_COMMON + CUDA_NAIVE)
    for cob in (8, 16):
        add("cuda", f"smem_tiled_co{cob}",
            f"16x16-pixel x {cob}-channel register-blocked conv tiles with haloed (stride-aware) input tiles and weights in shared memory, the concat read from its two sources in the tile load, and a register-blocked transposed conv with shared weights.",
            CUDA_COMMON + CUDA_TILED.replace("@COB@", str(cob)))
    add("cuda", "cublas_im2col_sgemm",
        "Both 3x3 convs as im2col + strided-batched cuBLAS SGEMM per sample chunk (the concat gathered in place), the transposed conv as one batched SGEMM plus a bias scatter kernel.",
        CUDA_COMMON + CUDA_CUBLAS.replace("@COLMB@", "512"))
    return out
