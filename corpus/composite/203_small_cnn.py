"""203_small_cnn: three (conv3x3 + bias, eval batch norm, relu, maxpool 2) stages,
global average pool, linear classifier."""

TASK = "203_small_cnn"

# ----------------------------------------------------------------------------------------
# CPU
# ----------------------------------------------------------------------------------------
# Argument checks and unpacking, the same in the CPU and the CUDA sources.
ARGS = r"""static int get_args(const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out, Stage* st, long& N, long& H, long& W,
                    long& K) {
  if (n_in != 24 || n_out != 1) return 1;
  const kf::Tensor& x = in[0];
  if (x.ndim != 4 || x.dtype != kf::KF_FLOAT32 || out[0].dtype != kf::KF_FLOAT32) return 1;
  N = x.shape[0]; H = x.shape[2]; W = x.shape[3];
  long ci = x.shape[1];
  for (int s = 0; s < 3; ++s) {
    const kf::Tensor& w = in[1 + 4 * s];
    if (w.ndim != 4 || w.shape[1] != ci || w.shape[2] != 3 || w.shape[3] != 3 || w.dtype != kf::KF_FLOAT32) return 1;
    const long co = w.shape[0];
    for (int i : {2 + 4 * s, 3 + 4 * s, 4 + 4 * s, 15 + 3 * s, 16 + 3 * s})
      if (in[i].numel() != co || in[i].dtype != kf::KF_FLOAT32) return 1;
    st[s].w = (const float*)w.data;
    st[s].b = (const float*)in[2 + 4 * s].data;
    st[s].g = (const float*)in[3 + 4 * s].data;
    st[s].beta = (const float*)in[4 + 4 * s].data;
    st[s].rm = (const float*)in[15 + 3 * s].data;
    st[s].rv = (const float*)in[16 + 3 * s].data;
    st[s].CI = ci;
    st[s].CO = co;
    ci = co;
  }
  const kf::Tensor& hw = in[13];
  if (hw.ndim != 2 || hw.shape[1] != ci || hw.dtype != kf::KF_FLOAT32) return 1;
  K = hw.shape[0];
  if (in[14].numel() != K || out[0].numel() != N * K) return 1;
  if ((H >> 3) < 1 || (W >> 3) < 1) return 1;"""

CPU_COMMON = r"""
#include <stdlib.h>
#include <algorithm>

struct Stage {
  const float *w, *b, *g, *beta, *rm, *rv;
  long CI, CO;
};

// in: x, (conv w, conv b, bn w, bn b) x 3, head w, head b, (running mean, var, count) x 3.
""" + ARGS + r"""
  return 0;
}

// conv bias + eval batch norm folded to one scale / shift per channel.
static void fold(const Stage& s, float* sc, float* sh) {
  for (long c = 0; c < s.CO; ++c) {
    const float k = s.g[c] / sqrtf(s.rv[c] + 1e-5f);
    sc[c] = k;
    sh[c] = (s.b[c] - s.rm[c]) * k + s.beta[c];
  }
}

// global mean of the last stage's maps, then the linear head (fixed order).
static void head(const float* f, long N, long C, long HW, const float* hw, const float* hb, long K, float* y) {
  for (long n = 0; n < N; ++n)
    for (long k = 0; k < K; ++k) {
      float acc = 0.f;
      for (long c = 0; c < C; ++c) {
        const float* p = f + (n * C + c) * HW;
        float s = 0.f;
        for (long i = 0; i < HW; ++i) s += p[i];
        acc += hw[k * C + c] * (s / (float)HW);
      }
      y[n * K + k] = acc + hb[k];
    }
}
"""

CPU_NAIVE = r"""
static void conv(const float* x, const Stage& s, float* y, long N, long H, long W) {
  const long CI = s.CI, CO = s.CO;
  for (long n = 0; n < N; ++n)
    for (long co = 0; co < CO; ++co)
      for (long oh = 0; oh < H; ++oh)
        for (long ow = 0; ow < W; ++ow) {
          float acc = 0.f;
          for (long ci = 0; ci < CI; ++ci)
            for (int kh = 0; kh < 3; ++kh)
              for (int kw = 0; kw < 3; ++kw) {
                const long ih = oh - 1 + kh, iw = ow - 1 + kw;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                acc += s.w[((co * CI + ci) * 3 + kh) * 3 + kw] * x[((n * CI + ci) * H + ih) * W + iw];
              }
          y[((n * CO + co) * H + oh) * W + ow] = acc + s.b[co];
        }
}

static void bn_relu(float* y, const Stage& s, long N, long HW) {
  for (long n = 0; n < N; ++n)
    for (long c = 0; c < s.CO; ++c) {
      float* p = y + (n * s.CO + c) * HW;
      for (long i = 0; i < HW; ++i) {
        const float v = (p[i] - s.rm[c]) / sqrtf(s.rv[c] + 1e-5f) * s.g[c] + s.beta[c];
        p[i] = v > 0.f ? v : 0.f;
      }
    }
}

static void pool(const float* y, float* z, long NC, long H, long W) {
  const long Ho = H / 2, Wo = W / 2;
  for (long p = 0; p < NC; ++p)
    for (long i = 0; i < Ho; ++i)
      for (long j = 0; j < Wo; ++j) {
        const float* r = y + (p * H + 2 * i) * W + 2 * j;
        z[(p * Ho + i) * Wo + j] = fmaxf(fmaxf(r[0], r[1]), fmaxf(r[W], r[W + 1]));
      }
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  Stage st[3];
  long N, H, W, K;
  if (get_args(in, n_in, out, n_out, st, N, H, W, K)) return 1;
  long big = 0, pooled = 0;
  {
    long h = H, w = W;
    for (int s = 0; s < 3; ++s) {
      big = std::max(big, N * st[s].CO * h * w);
      h /= 2;
      w /= 2;
      pooled = std::max(pooled, N * st[s].CO * h * w);
    }
  }
  float* a = (float*)ctx->scratch_alloc(ctx, sizeof(float) * (big + pooled));
  if (!a) return 2;
  float* b = a + big;
  const float* cur = (const float*)in[0].data;
  long h = H, w = W;
  for (int s = 0; s < 3; ++s) {
    conv(cur, st[s], a, N, h, w);
    bn_relu(a, st[s], N, h * w);
    pool(a, b, N * st[s].CO, h, w);
    h /= 2;
    w /= 2;
    cur = b;
  }
  head(b, N, st[2].CO, h * w, (const float*)in[13].data, (const float*)in[14].data, K, (float*)out[0].data);
  ctx->scratch_free(ctx, a);
  return 0;
}
"""

CPU_FUSED = r"""
#include <vector>
#include <algorithm>
#define CB @CB@

// Task = (sample, block of CB output channels, pooled row): the two conv rows under the
// pooled row are accumulated for CB channels at once from zero-padded input rows (each
// loaded once per (input channel, input row)), then bias+bn+relu and the 2x2 max are
// applied on the way out.
static void stage(const float* x, const Stage& s, const float* sc, const float* sh, float* z, long N, long H, long W,
                  int nt) {
  const long CI = s.CI, CO = s.CO, Ho = H / 2, Wo = W / 2, nb = (CO + CB - 1) / CB;
#pragma omp parallel num_threads(nt)
  {
    std::vector<float> accv((size_t)CB * 2 * W), xpv((size_t)W + 2);
    float* acc = accv.data();
    float* xp = xpv.data();
#pragma omp for schedule(static)
    for (long task = 0; task < N * nb * Ho; ++task) {
      const long pr = task % Ho, t2 = task / Ho, cb0 = (t2 % nb) * CB, n = t2 / nb;
      const int cb = (int)std::min<long>(CB, CO - cb0);
      for (long i = 0; i < (long)CB * 2 * W; ++i) acc[i] = 0.f;
      for (long ci = 0; ci < CI; ++ci) {
        // input rows 2pr-1 .. 2pr+2 feed conv rows 2pr (kh = ih - 2pr + 1) and 2pr+1
        for (long ih = 2 * pr - 1; ih <= 2 * pr + 2; ++ih) {
          if (ih < 0 || ih >= H) continue;
          const float* xr = x + ((n * CI + ci) * H + ih) * W;
          xp[0] = 0.f;
          xp[W + 1] = 0.f;
          for (long i = 0; i < W; ++i) xp[i + 1] = xr[i];
          for (int r = 0; r < 2; ++r) {
            const long kh = ih - (2 * pr + r) + 1;
            if (kh < 0 || kh > 2) continue;
            for (int j = 0; j < cb; ++j) {
              const float* wp = s.w + (((cb0 + j) * CI + ci) * 3 + kh) * 3;
              const float w0 = wp[0], w1 = wp[1], w2 = wp[2];
              float* a = acc + ((long)j * 2 + r) * W;
#pragma omp simd
              for (long ow = 0; ow < W; ++ow) a[ow] += w0 * xp[ow] + w1 * xp[ow + 1] + w2 * xp[ow + 2];
            }
          }
        }
      }
      for (int j = 0; j < cb; ++j) {
        const long co = cb0 + j;
        const float k = sc[co], b = sh[co];
        const float* a0 = acc + (long)j * 2 * W;
        const float* a1 = a0 + W;
        float* zr = z + ((n * CO + co) * Ho + pr) * Wo;
        for (long q = 0; q < Wo; ++q) {
          const float v00 = fmaxf(a0[2 * q] * k + b, 0.f), v01 = fmaxf(a0[2 * q + 1] * k + b, 0.f);
          const float v10 = fmaxf(a1[2 * q] * k + b, 0.f), v11 = fmaxf(a1[2 * q + 1] * k + b, 0.f);
          zr[q] = fmaxf(fmaxf(v00, v01), fmaxf(v10, v11));
        }
      }
    }
  }
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  Stage st[3];
  long N, H, W, K;
  if (get_args(in, n_in, out, n_out, st, N, H, W, K)) return 1;
  const int nt = ctx->num_threads > 0 ? ctx->num_threads : 1;
  const long s1 = N * st[0].CO * (H / 2) * (W / 2), s2 = N * st[1].CO * (H / 4) * (W / 4);
  const long s3 = N * st[2].CO * (H / 8) * (W / 8);
  const long nc = st[0].CO + st[1].CO + st[2].CO;
  float* a = (float*)ctx->scratch_alloc(ctx, sizeof(float) * (s1 + s2 + s3 + 2 * nc));
  if (!a) return 2;
  float *b = a + s1, *c = b + s2, *sc = c + s3, *sh = sc + nc;
  float* bufs[3] = {a, b, c};
  const float* cur = (const float*)in[0].data;
  long h = H, w = W, off = 0;
  for (int s = 0; s < 3; ++s) {
    fold(st[s], sc + off, sh + off);
    stage(cur, st[s], sc + off, sh + off, bufs[s], N, h, w, nt);
    off += st[s].CO;
    h /= 2;
    w /= 2;
    cur = bufs[s];
  }
  head(c, N, st[2].CO, h * w, (const float*)in[13].data, (const float*)in[14].data, K, (float*)out[0].data);
  ctx->scratch_free(ctx, a);
  return 0;
}
"""

# ----------------------------------------------------------------------------------------
# CUDA
# ----------------------------------------------------------------------------------------
CUDA_COMMON = r"""
#include <initializer_list>

struct Stage {
  const float *w, *b, *g, *beta, *rm, *rv;
  long CI, CO;
};

""" + ARGS + r"""
  if (N > 65535 || H > (1L << 20) || W > (1L << 20)) return 1;
  return 0;
}

static KF_HD float bn_relu(float acc, const Stage& s, long c) {
  const float k = s.g[c] / sqrtf(s.rv[c] + 1e-5f);
  return fmaxf((acc + s.b[c] - s.rm[c]) * k + s.beta[c], 0.f);
}

// Global mean of one (sample, channel) map: one block, fixed-order tree reduction.
__global__ void k_mean(const float* __restrict__ f, float* __restrict__ m, long HW) {
  __shared__ float sm[256];
  const float* p = f + (long)blockIdx.x * HW;
  float s = 0.f;
  for (long i = threadIdx.x; i < HW; i += 256) s += p[i];
  sm[threadIdx.x] = s;
  __syncthreads();
  for (int o = 128; o > 0; o >>= 1) {
    if ((int)threadIdx.x < o) sm[threadIdx.x] += sm[threadIdx.x + o];
    __syncthreads();
  }
  if (threadIdx.x == 0) m[blockIdx.x] = sm[0] / (float)HW;
}

// Linear head: one warp per output, shuffle reduction.
__global__ void k_head(const float* __restrict__ m, const float* __restrict__ hw, const float* __restrict__ hb,
                       float* __restrict__ y, long N, long C, long K) {
  const long o = (blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (o >= N * K) return;
  const long n = o / K, k = o % K;
  float s = 0.f;
  for (long c = lane; c < C; c += 32) s += m[n * C + c] * hw[k * C + c];
  for (int d = 16; d > 0; d >>= 1) s += __shfl_xor_sync(0xffffffffu, s, d);
  if (lane == 0) y[o] = s + hb[k];
}

static int finish(cudaStream_t st, const float* f, float* m, const kf::Tensor* in, float* y, long N, long C, long HW, long K) {
  k_mean<<<(unsigned)(N * C), 256, 0, st>>>(f, m, HW);
  k_head<<<(unsigned)((N * K * 32 + 255) / 256), 256, 0, st>>>(m, (const float*)in[13].data, (const float*)in[14].data, y, N, C, K);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
"""

CUDA_NAIVE = r"""
__global__ void k_conv(const float* __restrict__ x, Stage s, float* __restrict__ y, long N, long H, long W) {
  const long idx = blockIdx.x * (long)blockDim.x + threadIdx.x;
  const long CI = s.CI, CO = s.CO;
  if (idx >= N * CO * H * W) return;
  const long ow = idx % W, oh = (idx / W) % H, co = (idx / (W * H)) % CO, n = idx / (W * H * CO);
  float acc = 0.f;
  for (long ci = 0; ci < CI; ++ci)
    for (int kh = 0; kh < 3; ++kh)
      for (int kw = 0; kw < 3; ++kw) {
        const long ih = oh - 1 + kh, iw = ow - 1 + kw;
        if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
        acc += s.w[((co * CI + ci) * 3 + kh) * 3 + kw] * x[((n * CI + ci) * H + ih) * W + iw];
      }
  y[idx] = bn_relu(acc, s, co);
}

__global__ void k_pool(const float* __restrict__ y, float* __restrict__ z, long NC, long H, long W) {
  const long Ho = H / 2, Wo = W / 2;
  const long idx = blockIdx.x * (long)blockDim.x + threadIdx.x;
  if (idx >= NC * Ho * Wo) return;
  const long j = idx % Wo, i = (idx / Wo) % Ho, p = idx / (Wo * Ho);
  const float* r = y + (p * H + 2 * i) * W + 2 * j;
  z[idx] = fmaxf(fmaxf(r[0], r[1]), fmaxf(r[W], r[W + 1]));
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  Stage st[3];
  long N, H, W, K;
  if (get_args(in, n_in, out, n_out, st, N, H, W, K)) return 1;
  cudaStream_t cs = (cudaStream_t)ctx->stream;
  long big = 0, pooled = 0;
  {
    long h = H, w = W;
    for (int s = 0; s < 3; ++s) {
      if (N * st[s].CO * h * w > big) big = N * st[s].CO * h * w;
      h /= 2;
      w /= 2;
      if (N * st[s].CO * h * w > pooled) pooled = N * st[s].CO * h * w;
    }
  }
  float* a = (float*)ctx->scratch_alloc(ctx, sizeof(float) * (big + pooled + N * st[2].CO + 64));
  if (!a) return 2;
  float *b = a + big, *m = b + pooled;
  const float* cur = (const float*)in[0].data;
  long h = H, w = W;
  for (int s = 0; s < 3; ++s) {
    const long tc = N * st[s].CO * h * w, tp = N * st[s].CO * (h / 2) * (w / 2);
    k_conv<<<(unsigned)((tc + 255) / 256), 256, 0, cs>>>(cur, st[s], a, N, h, w);
    k_pool<<<(unsigned)((tp + 255) / 256), 256, 0, cs>>>(a, b, N * st[s].CO, h, w);
    h /= 2;
    w /= 2;
    cur = b;
  }
  return finish(cs, b, m, in, (float*)out[0].data, N, st[2].CO, h * w, K);
}
"""

CUDA_POOLDIRECT = r"""
#define BS @BS@

// Grid (pooled-pixel tiles, output channel, sample); the block stages its channel's filter
// in shared memory; each thread computes the 2x2 conv outputs under one pooled pixel
// (sharing the 4x4 input window per input channel), then bias+bn+relu and the max.
__global__ void __launch_bounds__(BS) k_stage(const float* __restrict__ x, Stage s, float* __restrict__ z, long H, long W) {
  extern __shared__ float wsh[];
  const long CI = s.CI, CO = s.CO, co = blockIdx.y, n = blockIdx.z, Ho = H / 2, Wo = W / 2;
  for (long k = threadIdx.x; k < CI * 9; k += BS) wsh[k] = s.w[co * CI * 9 + k];
  __syncthreads();
  const long pix = (long)blockIdx.x * BS + threadIdx.x;
  if (pix >= Ho * Wo) return;
  const long pi = pix / Wo, pj = pix % Wo;
  float a00 = 0.f, a01 = 0.f, a10 = 0.f, a11 = 0.f;
  for (long ci = 0; ci < CI; ++ci) {
    const float* xp = x + (n * CI + ci) * H * W;
    float v[4][4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const long ih = 2 * pi - 1 + r;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const long iw = 2 * pj - 1 + q;
        v[r][q] = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? xp[ih * W + iw] : 0.f;
      }
    }
    const float* wk = wsh + ci * 9;
#pragma unroll
    for (int kh = 0; kh < 3; ++kh)
#pragma unroll
      for (int kw = 0; kw < 3; ++kw) {
        const float wv = wk[kh * 3 + kw];
        a00 += wv * v[kh][kw];
        a01 += wv * v[kh][kw + 1];
        a10 += wv * v[kh + 1][kw];
        a11 += wv * v[kh + 1][kw + 1];
      }
  }
  z[((n * CO + co) * Ho + pi) * Wo + pj] =
      fmaxf(fmaxf(bn_relu(a00, s, co), bn_relu(a01, s, co)), fmaxf(bn_relu(a10, s, co), bn_relu(a11, s, co)));
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  Stage st[3];
  long N, H, W, K;
  if (get_args(in, n_in, out, n_out, st, N, H, W, K)) return 1;
  cudaStream_t cs = (cudaStream_t)ctx->stream;
  const long s1 = N * st[0].CO * (H / 2) * (W / 2), s2 = N * st[1].CO * (H / 4) * (W / 4);
  const long s3 = N * st[2].CO * (H / 8) * (W / 8);
  float* a = (float*)ctx->scratch_alloc(ctx, sizeof(float) * (s1 + s2 + s3 + N * st[2].CO + 64));
  if (!a) return 2;
  float* bufs[3] = {a, a + s1, a + s1 + s2};
  float* m = a + s1 + s2 + s3;
  const float* cur = (const float*)in[0].data;
  long h = H, w = W;
  for (int s = 0; s < 3; ++s) {
    const size_t shm = sizeof(float) * st[s].CI * 9;
    if (shm > 48 * 1024 || st[s].CO > 65535) return 1;
    const long np = (h / 2) * (w / 2);
    k_stage<<<dim3((unsigned)((np + BS - 1) / BS), (unsigned)st[s].CO, (unsigned)N), BS, shm, cs>>>(cur, st[s], bufs[s], h, w);
    h /= 2;
    w /= 2;
    cur = bufs[s];
  }
  return finish(cs, bufs[2], m, in, (float*)out[0].data, N, st[2].CO, h * w, K);
}
"""

CUDA_TILED = r"""
#define COB @COB@
#define CK 8
#define TS 16

// Block = 16x16 conv pixels (8x8 pooled) x COB output channels of one sample. Input
// channels go in chunks of CK: haloed 18x18 input tiles and COB x CK x 9 weights are staged
// in shared memory, each thread accumulates COB channels of one conv pixel; the epilogue
// applies bias+bn+relu into shared memory and 64 x COB threads take the 2x2 maxima.
__global__ void __launch_bounds__(256) k_stage(const float* __restrict__ x, Stage s, float* __restrict__ z, int H, int W,
                                               int tilesX) {
  __shared__ float xs[CK][TS + 2][TS + 2];
  __shared__ float ws[COB][CK][9];
  __shared__ float ep[COB][TS][TS + 1];
  const int CI = (int)s.CI, CO = (int)s.CO;
  const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
  const int bx = blockIdx.x % tilesX, by = blockIdx.x / tilesX;
  const int co0 = blockIdx.y * COB;
  const long n = blockIdx.z;
  float acc[COB];
#pragma unroll
  for (int j = 0; j < COB; ++j) acc[j] = 0.f;
  for (int c0 = 0; c0 < CI; c0 += CK) {
    for (int i = threadIdx.x; i < CK * (TS + 2) * (TS + 2); i += 256) {
      const int cc = i / ((TS + 2) * (TS + 2)), r = (i / (TS + 2)) % (TS + 2), q = i % (TS + 2);
      const int ci = c0 + cc, ih = by * TS - 1 + r, iw = bx * TS - 1 + q;
      xs[cc][r][q] = (ci < CI && ih >= 0 && ih < H && iw >= 0 && iw < W) ? x[((n * CI + ci) * H + ih) * (long)W + iw] : 0.f;
    }
    for (int i = threadIdx.x; i < COB * CK * 9; i += 256) {
      const int j = i / (CK * 9), rem = i % (CK * 9), cc = rem / 9, k = rem % 9;
      const int co = co0 + j, ci = c0 + cc;
      ws[j][cc][k] = (co < CO && ci < CI) ? s.w[((long)co * CI + ci) * 9 + k] : 0.f;
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
#pragma unroll
  for (int j = 0; j < COB; ++j) ep[j][ty][tx] = co0 + j < CO ? bn_relu(acc[j], s, co0 + j) : 0.f;
  __syncthreads();
  const int Ho = H / 2, Wo = W / 2;
  for (int i = threadIdx.x; i < COB * 64; i += 256) {
    const int j = i >> 6, pr = (i >> 3) & 7, pc = i & 7;
    const int po = by * 8 + pr, pw = bx * 8 + pc, co = co0 + j;
    if (co >= CO || po >= Ho || pw >= Wo) continue;
    const float m = fmaxf(fmaxf(ep[j][2 * pr][2 * pc], ep[j][2 * pr][2 * pc + 1]),
                          fmaxf(ep[j][2 * pr + 1][2 * pc], ep[j][2 * pr + 1][2 * pc + 1]));
    z[((n * CO + co) * Ho + po) * (long)Wo + pw] = m;
  }
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  Stage st[3];
  long N, H, W, K;
  if (get_args(in, n_in, out, n_out, st, N, H, W, K)) return 1;
  cudaStream_t cs = (cudaStream_t)ctx->stream;
  const long s1 = N * st[0].CO * (H / 2) * (W / 2), s2 = N * st[1].CO * (H / 4) * (W / 4);
  const long s3 = N * st[2].CO * (H / 8) * (W / 8);
  float* a = (float*)ctx->scratch_alloc(ctx, sizeof(float) * (s1 + s2 + s3 + N * st[2].CO + 64));
  if (!a) return 2;
  float* bufs[3] = {a, a + s1, a + s1 + s2};
  float* m = a + s1 + s2 + s3;
  const float* cur = (const float*)in[0].data;
  long h = H, w = W;
  for (int s = 0; s < 3; ++s) {
    // conv pixels past the last even row / column never reach a pooled output
    const int tilesX = (int)((w / 2 + 7) / 8), tilesY = (int)((h / 2 + 7) / 8);
    if ((st[s].CO + COB - 1) / COB > 65535 || (long)tilesX * tilesY > 2147483647L) return 1;
    const dim3 grid((unsigned)(tilesX * tilesY), (unsigned)((st[s].CO + COB - 1) / COB), (unsigned)N);
    k_stage<<<grid, 256, 0, cs>>>(cur, st[s], bufs[s], (int)h, (int)w, tilesX);
    h /= 2;
    w /= 2;
    cur = bufs[s];
  }
  return finish(cs, bufs[2], m, in, (float*)out[0].data, N, st[2].CO, h * w, K);
}
"""


def generate(header, indent):
    F = "composite"
    out = []

    def add(backend, variant, tech, body):
        out.append((backend, variant, F, tech, header(TASK, backend, F, variant, tech) + body))

    add("cpu", "naive",
        "Direct convolutions with per-tap bounds checks, single-threaded, and separate bn/relu, max-pool, mean and linear passes over full-size intermediates.",
        CPU_COMMON.replace("#include <stdlib.h>", "#include <stdlib.h>\n#include <initializer_list>") + CPU_NAIVE)
    for cb in (1, 4, 8):
        add("cpu", f"omp_fused_pool_cb{cb}",
            f"OpenMP tasks of (sample, {cb} output channels, pooled row) accumulate the two conv rows from zero-padded input rows with SIMD, and fold bias, batch norm, relu and the 2x2 max into the row write-out.",
            CPU_COMMON.replace("#include <stdlib.h>", "#include <stdlib.h>\n#include <initializer_list>") + CPU_FUSED.replace("@CB@", str(cb)))
    add("cuda", "naive_b256",
        "One thread per conv output with bias+bn+relu, then a separate 2x2 max-pool kernel per stage, a block-per-map mean and a warp-per-logit head.",
        CUDA_COMMON + CUDA_NAIVE)
    add("cuda", "pool_direct_smemw_b128",
        "One thread per pooled pixel computes its 2x2 conv outputs from a shared 4x4 input window with the channel's filter in shared memory, fusing bias, bn, relu and max-pool so the full-size maps never reach memory.",
        CUDA_COMMON + CUDA_POOLDIRECT.replace("@BS@", "128"))
    for cob in (8, 16):
        add("cuda", f"smem_tiled_co{cob}_pool",
            f"16x16-pixel x {cob}-channel register-blocked tiles with input halos and weights in shared memory, bias+bn+relu+2x2 max-pool fused through a shared epilogue tile.",
            CUDA_COMMON + CUDA_TILED.replace("@COB@", str(cob)))
    return out
