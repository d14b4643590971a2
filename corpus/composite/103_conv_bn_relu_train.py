"""103_conv_bn_relu_train: Conv2d(cin, cout, 3, padding=1) -> BatchNorm2d (train) -> ReLU.

Train mode: the BatchNorm uses the batch statistics of the conv output per channel (mean and
biased variance over N, H, W; eps 1e-5); the running-stat buffers are inputs only (never
written: the task's only output is y0). Every kernel is conv -> per-channel statistics
(double accumulation, fixed reduction order so the bytes are the same every run) ->
y = max(v * scale + shift, 0) with scale = gamma / sqrt(var + eps), shift = beta - mean * scale.
"""

TASK = "103_conv_bn_relu_train"

PARSE = r"""
struct CP {
  const float* x;
  const float* w;
  const float* b;
  const float* g;
  const float* be;
  float* y;
  long N, CI, H, W, CO, K, Ho, Wo;
};

static constexpr long PAD = 1;
static constexpr double BN_EPS = 1e-5;

static int parse(const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out, CP& c) {
  if (n_in != 8 || n_out != 1) return 1;
  for (int i = 0; i < 7; ++i)
    if (in[i].dtype != kf::KF_FLOAT32) return 1;
  if (out[0].dtype != kf::KF_FLOAT32) return 1;
  if (in[0].ndim != 4 || in[1].ndim != 4 || out[0].ndim != 4) return 1;
  c.x = static_cast<const float*>(in[0].data);
  c.w = static_cast<const float*>(in[1].data);
  c.b = static_cast<const float*>(in[2].data);
  c.g = static_cast<const float*>(in[3].data);
  c.be = static_cast<const float*>(in[4].data);
  c.y = static_cast<float*>(out[0].data);
  c.N = in[0].shape[0];
  c.CI = in[0].shape[1];
  c.H = in[0].shape[2];
  c.W = in[0].shape[3];
  c.CO = in[1].shape[0];
  c.K = in[1].shape[2];
  if (in[1].shape[1] != c.CI || in[1].shape[3] != c.K) return 1;
  if (in[2].numel() != c.CO || in[3].numel() != c.CO || in[4].numel() != c.CO) return 1;
  c.Ho = c.H + 2 * PAD - c.K + 1;
  c.Wo = c.W + 2 * PAD - c.K + 1;
  if (out[0].shape[0] != c.N || out[0].shape[1] != c.CO || out[0].shape[2] != c.Ho || out[0].shape[3] != c.Wo)
    return 1;
  return 0;
}
"""

# ----------------------------------------------------------------------------------------
# CPU
# ----------------------------------------------------------------------------------------
CPU_NAIVE = r"""
extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  (void)ctx;
  CP c;
  if (parse(in, n_in, out, n_out, c)) return 1;
  const long HWo = c.Ho * c.Wo;
  for (long n = 0; n < c.N; ++n)
    for (long co = 0; co < c.CO; ++co)
      for (long oh = 0; oh < c.Ho; ++oh)
        for (long ow = 0; ow < c.Wo; ++ow) {
          float acc = c.b[co];
          for (long ci = 0; ci < c.CI; ++ci)
            for (long kh = 0; kh < c.K; ++kh)
              for (long kw = 0; kw < c.K; ++kw) {
                const long ih = oh - PAD + kh, iw = ow - PAD + kw;
                if (ih < 0 || ih >= c.H || iw < 0 || iw >= c.W) continue;
                acc += c.x[((n * c.CI + ci) * c.H + ih) * c.W + iw] * c.w[((co * c.CI + ci) * c.K + kh) * c.K + kw];
              }
          c.y[(n * c.CO + co) * HWo + oh * c.Wo + ow] = acc;
        }
  const double cnt = (double)c.N * HWo;
  if (cnt == 0) return 0;
  for (long co = 0; co < c.CO; ++co) {
    double s = 0.0;
    for (long n = 0; n < c.N; ++n)
      for (long i = 0; i < HWo; ++i) s += c.y[(n * c.CO + co) * HWo + i];
    const double mean = s / cnt;
    double v = 0.0;
    for (long n = 0; n < c.N; ++n)
      for (long i = 0; i < HWo; ++i) {
        const double d = c.y[(n * c.CO + co) * HWo + i] - mean;
        v += d * d;
      }
    const double var = v / cnt;
    const float scale = (float)(c.g[co] / sqrt(var + BN_EPS));
    const float shift = (float)(c.be[co] - mean * (double)scale);
    for (long n = 0; n < c.N; ++n)
      for (long i = 0; i < HWo; ++i) {
        float* p = c.y + (n * c.CO + co) * HWo + i;
        *p = fmaxf(*p * scale + shift, 0.f);
      }
  }
  return 0;
}
"""

# Statistics from per-plane partial sums, combined per channel in sample order (deterministic
# whatever the thread count), then one parallel normalisation pass.
CPU_STATS_NORM = r"""
static void stats_and_normalise(const CP& c, const double* ps, const double* pq, int nt) {
  const long HWo = c.Ho * c.Wo;
  const double cnt = (double)c.N * HWo;
  std::vector<float> scale(c.CO), shift(c.CO);
  for (long co = 0; co < c.CO; ++co) {
    double s = 0.0, q = 0.0;
    for (long n = 0; n < c.N; ++n) {
      s += ps[n * c.CO + co];
      q += pq[n * c.CO + co];
    }
    const double mean = s / cnt;
    double var = q / cnt - mean * mean;
    if (var < 0.0) var = 0.0;
    scale[co] = (float)(c.g[co] / sqrt(var + BN_EPS));
    shift[co] = (float)(c.be[co] - mean * (double)scale[co]);
  }
  const float* sc = scale.data();
  const float* sh = shift.data();
#pragma omp parallel for schedule(static) num_threads(nt)
  for (long pl = 0; pl < c.N * c.CO; ++pl) {
    const float a = sc[pl % c.CO], bb = sh[pl % c.CO];
    float* yp = c.y + pl * HWo;
#pragma omp simd
    for (long i = 0; i < HWo; ++i) yp[i] = fmaxf(yp[i] * a + bb, 0.f);
  }
}
"""

CPU_OMP_GATHER = r"""
extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  CP c;
  if (parse(in, n_in, out, n_out, c)) return 1;
  const long HWo = c.Ho * c.Wo, planes = c.N * c.CO;
  if (planes * HWo == 0) return 0;
  std::vector<double> ps(planes), pq(planes);
  const int nt = ctx->num_threads;
#pragma omp parallel for schedule(static) num_threads(nt)
  for (long pl = 0; pl < planes; ++pl) {
    const long n = pl / c.CO, co = pl % c.CO;
    float* yp = c.y + pl * HWo;
    for (long oh = 0; oh < c.Ho; ++oh)
      for (long ow = 0; ow < c.Wo; ++ow) {
        float acc = c.b[co];
        for (long ci = 0; ci < c.CI; ++ci) {
          const float* xp = c.x + (n * c.CI + ci) * c.H * c.W;
          const float* wp = c.w + (co * c.CI + ci) * c.K * c.K;
          for (long kh = 0; kh < c.K; ++kh) {
            const long ih = oh - PAD + kh;
            if (ih < 0 || ih >= c.H) continue;
            for (long kw = 0; kw < c.K; ++kw) {
              const long iw = ow - PAD + kw;
              if (iw < 0 || iw >= c.W) continue;
              acc += xp[ih * c.W + iw] * wp[kh * c.K + kw];
            }
          }
        }
        yp[oh * c.Wo + ow] = acc;
      }
  }
  // separate statistics pass over the finished output
#pragma omp parallel for schedule(static) num_threads(nt)
  for (long pl = 0; pl < planes; ++pl) {
    const float* yp = c.y + pl * HWo;
    double s = 0.0, q = 0.0;
    for (long i = 0; i < HWo; ++i) {
      s += yp[i];
      q += (double)yp[i] * yp[i];
    }
    ps[pl] = s;
    pq[pl] = q;
  }
  stats_and_normalise(c, ps.data(), pq.data(), nt);
  return 0;
}
"""

# Tasks (sample, block of CB output channels): the output planes are the accumulators; each
# (input channel, tap) adds weight x shifted input row to CB output rows at once (unit stride,
# the input row stays in L1 across the CB channels, bounds resolved per row), and the plane
# sums are taken while the planes are still in cache.
CPU_OMP_ROWAXPY = r"""
#define CB @CB@

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  CP c;
  if (parse(in, n_in, out, n_out, c)) return 1;
  const long HWo = c.Ho * c.Wo, planes = c.N * c.CO;
  if (planes * HWo == 0) return 0;
  std::vector<double> ps(planes), pq(planes);
  double* psp = ps.data();
  double* pqp = pq.data();
  const int nt = ctx->num_threads;
  const long nblk = (c.CO + CB - 1) / CB;
#pragma omp parallel for schedule(static) num_threads(nt)
  for (long t = 0; t < c.N * nblk; ++t) {
    const long n = t / nblk, co0 = (t % nblk) * CB;
    const long cbn = std::min((long)CB, c.CO - co0);
    float* y0 = c.y + (n * c.CO + co0) * HWo;
    for (long cb = 0; cb < cbn; ++cb) {
      const float bv = c.b[co0 + cb];
      for (long i = 0; i < HWo; ++i) y0[cb * HWo + i] = bv;
    }
    for (long ci = 0; ci < c.CI; ++ci) {
      const float* xp = c.x + (n * c.CI + ci) * c.H * c.W;
      for (long kh = 0; kh < c.K; ++kh)
        for (long kw = 0; kw < c.K; ++kw) {
          const long o0 = std::max(0L, PAD - kw), o1 = std::min(c.Wo, c.W + PAD - kw);
          float wv[CB];
          for (long cb = 0; cb < CB; ++cb)
            wv[cb] = cb < cbn ? c.w[(((co0 + cb) * c.CI + ci) * c.K + kh) * c.K + kw] : 0.f;
          for (long oh = 0; oh < c.Ho; ++oh) {
            const long ih = oh - PAD + kh;
            if (ih < 0 || ih >= c.H) continue;
            const float* xr = xp + ih * c.W - PAD + kw;
            for (long cb = 0; cb < cbn; ++cb) {
              float* yr = y0 + cb * HWo + oh * c.Wo;
              const float a = wv[cb];
#pragma omp simd
              for (long ow = o0; ow < o1; ++ow) yr[ow] += a * xr[ow];
            }
          }
        }
    }
    for (long cb = 0; cb < cbn; ++cb) {
      const float* yp = y0 + cb * HWo;
      double s = 0.0, q = 0.0;
      for (long i = 0; i < HWo; ++i) {
        s += yp[i];
        q += (double)yp[i] * yp[i];
      }
      psp[n * c.CO + co0 + cb] = s;
      pqp[n * c.CO + co0 + cb] = q;
    }
  }
  stats_and_normalise(c, psp, pqp, nt);
  return 0;
}
"""

CPU_INC = "#include <omp.h>\n#include <vector>\n#include <algorithm>\n"

# ----------------------------------------------------------------------------------------
# CUDA
# ----------------------------------------------------------------------------------------
# Shared CUDA pieces: deterministic block reduction in double, the per-channel finaliser over
# a fixed-order list of partials, and the normalise + ReLU pass.
CUDA_COMMON = r"""
// Sums (s, q) over the block in a fixed tree; result valid in thread 0.
static __device__ void block_sum2(double& s, double& q, double* sh) {
  const int t = threadIdx.x;
  sh[t] = s;
  sh[blockDim.x + t] = q;
  __syncthreads();
  for (int o = blockDim.x / 2; o > 0; o >>= 1) {
    if (t < o) {
      sh[t] += sh[t + o];
      sh[blockDim.x + t] += sh[blockDim.x + t + o];
    }
    __syncthreads();
  }
  s = sh[0];
  q = sh[blockDim.x];
  __syncthreads();
}

// One block per channel: sums its np partials (s, q) in a fixed order, writes (scale, shift).
__global__ void k_finalize(const double* __restrict__ part, long np, CP c, float2* ss) {
  extern __shared__ double shd[];
  const long co = blockIdx.x;
  const double* ps = part + co * np * 2;
  double s = 0.0, q = 0.0;
  for (long i = threadIdx.x; i < np; i += blockDim.x) {
    s += ps[2 * i];
    q += ps[2 * i + 1];
  }
  block_sum2(s, q, shd);
  if (threadIdx.x == 0) {
    const double cnt = (double)c.N * c.Ho * c.Wo;
    const double mean = s / cnt;
    double var = q / cnt - mean * mean;
    if (var < 0.0) var = 0.0;
    const float scale = (float)(c.g[co] / sqrt(var + BN_EPS));
    ss[co] = make_float2(scale, (float)(c.be[co] - mean * (double)scale));
  }
}

__global__ void k_norm(CP c, const float2* __restrict__ ss, long total) {
  const long HWo = c.Ho * c.Wo;
  for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long)gridDim.x * blockDim.x) {
    const float2 a = ss[(i / HWo) % c.CO];
    c.y[i] = fmaxf(c.y[i] * a.x + a.y, 0.f);
  }
}

static unsigned grid_for(long total, int bs) {
  long b = (total + bs - 1) / bs;
  if (b > (1L << 20)) b = 1L << 20;
  return (unsigned)(b < 1 ? 1 : b);
}

// partials: [CO][np][2] doubles; then (scale, shift) per channel; then y normalised in place.
static int finish(kf::Context* ctx, const CP& c, double* part, long np, float2* ss) {
  cudaStream_t st = static_cast<cudaStream_t>(ctx->stream);
  k_finalize<<<(unsigned)c.CO, 256, 2 * 256 * sizeof(double), st>>>(part, np, c, ss);
  if (cudaGetLastError() != cudaSuccess) return 4;
  const long total = c.N * c.CO * c.Ho * c.Wo;
  k_norm<<<grid_for(total, 256), 256, 0, st>>>(c, ss, total);
  return cudaGetLastError() == cudaSuccess ? 0 : 5;
}
"""

# Per-channel partials straight from the raw conv output: block (chunk, channel) sums a fixed
# slice of the channel's N planes.
CUDA_PLANE_STATS = r"""
#define SCHUNKS 64
__global__ void k_plane_stats(CP c, double* part) {
  extern __shared__ double shd[];
  const long co = blockIdx.y, HWo = c.Ho * c.Wo;
  const long per = c.N * HWo;  // elements of this channel
  const long beg = per * blockIdx.x / SCHUNKS, end = per * (blockIdx.x + 1) / SCHUNKS;
  double s = 0.0, q = 0.0;
  for (long i = beg + threadIdx.x; i < end; i += blockDim.x) {
    const long n = i / HWo, r = i % HWo;
    const double v = c.y[(n * c.CO + co) * HWo + r];
    s += v;
    q += v * v;
  }
  block_sum2(s, q, shd);
  if (threadIdx.x == 0) {
    part[(co * SCHUNKS + blockIdx.x) * 2] = s;
    part[(co * SCHUNKS + blockIdx.x) * 2 + 1] = q;
  }
}
"""

CUDA_NAIVE = r"""
__global__ void k_conv_naive(CP c, long total) {
  for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long)gridDim.x * blockDim.x) {
    const long ow = i % c.Wo;
    const long oh = (i / c.Wo) % c.Ho;
    const long co = (i / (c.Wo * c.Ho)) % c.CO;
    const long n = i / (c.Wo * c.Ho * c.CO);
    float acc = c.b[co];
    for (long ci = 0; ci < c.CI; ++ci)
      for (long kh = 0; kh < c.K; ++kh)
        for (long kw = 0; kw < c.K; ++kw) {
          const long ih = oh - PAD + kh, iw = ow - PAD + kw;
          if (ih < 0 || ih >= c.H || iw < 0 || iw >= c.W) continue;
          acc += c.x[((n * c.CI + ci) * c.H + ih) * c.W + iw] * c.w[((co * c.CI + ci) * c.K + kh) * c.K + kw];
        }
    c.y[i] = acc;
  }
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  CP c;
  if (parse(in, n_in, out, n_out, c)) return 1;
  const long total = c.N * c.CO * c.Ho * c.Wo;
  if (total == 0) return 0;
  if (c.CO > 65535) return 1;
  cudaStream_t st = static_cast<cudaStream_t>(ctx->stream);
  char* scr = static_cast<char*>(ctx->scratch_alloc(ctx, sizeof(double) * 2 * c.CO * SCHUNKS + sizeof(float2) * c.CO));
  if (!scr) return 2;
  double* part = reinterpret_cast<double*>(scr);
  float2* ss = reinterpret_cast<float2*>(scr + sizeof(double) * 2 * c.CO * SCHUNKS);
  k_conv_naive<<<grid_for(total, @BS@), @BS@, 0, st>>>(c, total);
  if (cudaGetLastError() != cudaSuccess) return 3;
  k_plane_stats<<<dim3(SCHUNKS, (unsigned)c.CO), 256, 2 * 256 * sizeof(double), st>>>(c, part);
  if (cudaGetLastError() != cudaSuccess) return 3;
  return finish(ctx, c, part, SCHUNKS, ss);
}
"""

# Grid (pixel tile, channel, sample), filter in shared memory; each block reduces the sum and
# sum of squares of its outputs into one partial, so the stats need no extra pass over y.
CUDA_SMEM_FUSED = r"""
#define BS @BS@
__global__ void __launch_bounds__(BS) k_conv_smem(CP c, double* part, long tiles) {
  extern __shared__ double shd[];  // 2*BS doubles for the reduction, then the filter
  float* wsh = reinterpret_cast<float*>(shd + 2 * BS);
  const long co = blockIdx.y, n = blockIdx.z;
  const long kk = c.K * c.K;
  for (long t = threadIdx.x; t < c.CI * kk; t += BS) wsh[t] = c.w[co * c.CI * kk + t];
  __syncthreads();
  const long pix = (long)blockIdx.x * BS + threadIdx.x;
  double s = 0.0, q = 0.0;
  if (pix < c.Ho * c.Wo) {
    const long oh = pix / c.Wo, ow = pix % c.Wo;
    float acc = c.b[co];
    for (long ci = 0; ci < c.CI; ++ci) {
      const float* xp = c.x + (n * c.CI + ci) * c.H * c.W;
      const float* wp = wsh + ci * kk;
      for (long kh = 0; kh < c.K; ++kh) {
        const long ih = oh - PAD + kh;
        if (ih < 0 || ih >= c.H) continue;
        for (long kw = 0; kw < c.K; ++kw) {
          const long iw = ow - PAD + kw;
          if (iw < 0 || iw >= c.W) continue;
          acc += __ldg(xp + ih * c.W + iw) * wp[kh * c.K + kw];
        }
      }
    }
    c.y[(n * c.CO + co) * c.Ho * c.Wo + pix] = acc;
    s = acc;
    q = (double)acc * acc;
  }
  block_sum2(s, q, shd);
  if (threadIdx.x == 0) {
    const long slot = (co * c.N + n) * tiles + blockIdx.x;
    part[2 * slot] = s;
    part[2 * slot + 1] = q;
  }
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  CP c;
  if (parse(in, n_in, out, n_out, c)) return 1;
  const long HWo = c.Ho * c.Wo;
  if (c.N * c.CO * HWo == 0) return 0;
  if (c.N > 65535 || c.CO > 65535) return 1;
  const size_t shm = 2 * BS * sizeof(double) + sizeof(float) * c.CI * c.K * c.K;
  if (shm > 48 * 1024) return 1;
  const long tiles = (HWo + BS - 1) / BS;
  const long np = c.N * tiles;
  char* scr = static_cast<char*>(ctx->scratch_alloc(ctx, sizeof(double) * 2 * c.CO * np + sizeof(float2) * c.CO));
  if (!scr) return 2;
  double* part = reinterpret_cast<double*>(scr);
  float2* ss = reinterpret_cast<float2*>(scr + sizeof(double) * 2 * c.CO * np);
  cudaStream_t st = static_cast<cudaStream_t>(ctx->stream);
  k_conv_smem<<<dim3((unsigned)tiles, (unsigned)c.CO, (unsigned)c.N), BS, shm, st>>>(c, part, tiles);
  if (cudaGetLastError() != cudaSuccess) return 3;
  return finish(ctx, c, part, np, ss);
}
"""

# Block = TSxTS output tile x COB channels of one sample; input channels are staged CIC at a
# time as (TS+K-1)^2 halo tiles in shared memory with the matching weights ([ci][tap][cob]),
# each thread keeps COB accumulators for its pixel, and per-channel block partials of the
# sum / sum of squares are written for the finaliser.
CUDA_TILED = r"""
#define TS 16
#define COB @COB@
#define CIC 8
#define KMAX 3
#define HT (TS + KMAX - 1)

__global__ void __launch_bounds__(TS * TS) k_conv_tiled(CP c, double* part, long tiles_x, long tiles) {
  __shared__ float xs[CIC][HT][HT];
  __shared__ float ws[CIC][KMAX * KMAX][COB];
  __shared__ double red[2 * TS * TS];
  const int tx = threadIdx.x % TS, ty = threadIdx.x / TS;
  const long tile = blockIdx.x;
  const long oh0 = (tile / tiles_x) * TS, ow0 = (tile % tiles_x) * TS;
  const long co0 = (long)blockIdx.y * COB, n = blockIdx.z;
  const long oh = oh0 + ty, ow = ow0 + tx;
  const long K = c.K, kk = K * K;
  float acc[COB];
#pragma unroll
  for (int cb = 0; cb < COB; ++cb) acc[cb] = 0.f;
  for (long ci0 = 0; ci0 < c.CI; ci0 += CIC) {
    __syncthreads();  // previous chunk fully consumed
    for (int t = threadIdx.x; t < CIC * HT * HT; t += TS * TS) {
      const int cc = t / (HT * HT), r = t % (HT * HT);
      const long ih = oh0 - PAD + r / HT, iw = ow0 - PAD + r % HT;
      const long ci = ci0 + cc;
      float v = 0.f;
      if (ci < c.CI && ih >= 0 && ih < c.H && iw >= 0 && iw < c.W) v = __ldg(c.x + ((n * c.CI + ci) * c.H + ih) * c.W + iw);
      xs[cc][r / HT][r % HT] = v;
    }
    for (int t = threadIdx.x; t < CIC * KMAX * KMAX * COB; t += TS * TS) {
      const int cb = t % COB, tap = (t / COB) % (KMAX * KMAX), cc = t / (COB * KMAX * KMAX);
      const long ci = ci0 + cc, co = co0 + cb;
      float v = 0.f;
      if (ci < c.CI && co < c.CO && tap < kk) v = __ldg(c.w + (co * c.CI + ci) * kk + tap);
      ws[cc][tap][cb] = v;
    }
    __syncthreads();
    for (int cc = 0; cc < CIC; ++cc)
#pragma unroll
      for (int kh = 0; kh < KMAX; ++kh)
#pragma unroll
        for (int kw = 0; kw < KMAX; ++kw) {
          const float xv = xs[cc][ty + kh][tx + kw];
#pragma unroll
          for (int cb = 0; cb < COB; ++cb) acc[cb] += xv * ws[cc][kh * KMAX + kw][cb];
        }
  }
  const bool inside = oh < c.Ho && ow < c.Wo;
  const long HWo = c.Ho * c.Wo;
  for (int cb = 0; cb < COB; ++cb) {
    const long co = co0 + cb;
    if (co >= c.CO) break;  // uniform across the block
    const float v = acc[cb] + c.b[co];
    double s = 0.0, q = 0.0;
    if (inside) {
      c.y[(n * c.CO + co) * HWo + oh * c.Wo + ow] = v;
      s = v;
      q = (double)v * v;
    }
    block_sum2(s, q, red);
    if (threadIdx.x == 0) {
      const long slot = (co * c.N + n) * tiles + tile;
      part[2 * slot] = s;
      part[2 * slot + 1] = q;
    }
  }
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  CP c;
  if (parse(in, n_in, out, n_out, c)) return 1;
  const long HWo = c.Ho * c.Wo;
  if (c.N * c.CO * HWo == 0) return 0;
  if (c.K != KMAX) return 1;  // the tile holds a KMAX x KMAX filter
  const long tiles_x = (c.Wo + TS - 1) / TS, tiles_y = (c.Ho + TS - 1) / TS;
  const long tiles = tiles_x * tiles_y, cblk = (c.CO + COB - 1) / COB;
  if (c.N > 65535 || cblk > 65535 || tiles > 2147483647L) return 1;
  const long np = c.N * tiles;
  char* scr = static_cast<char*>(ctx->scratch_alloc(ctx, sizeof(double) * 2 * c.CO * np + sizeof(float2) * c.CO));
  if (!scr) return 2;
  double* part = reinterpret_cast<double*>(scr);
  float2* ss = reinterpret_cast<float2*>(scr + sizeof(double) * 2 * c.CO * np);
  cudaStream_t st = static_cast<cudaStream_t>(ctx->stream);
  k_conv_tiled<<<dim3((unsigned)tiles, (unsigned)cblk, (unsigned)c.N), TS * TS, 0, st>>>(c, part, tiles_x, tiles);
  if (cudaGetLastError() != cudaSuccess) return 3;
  return finish(ctx, c, part, np, ss);
}
"""

# cuBLAS: per chunk of samples im2col into scratch, one strided-batched SGEMM writes the conv
# straight into y (the conv bias is left out: it cancels exactly under batch-stat normalisation),
# then chunked per-channel partial sums, the finaliser and the normalise pass.
CUDA_CUBLAS = r"""
__global__ void k_im2col(CP c, float* __restrict__ col, long n0, long nc) {
  const long HWo = c.Ho * c.Wo, kk = c.K * c.K, R = c.CI * kk;
  const long total = nc * R * HWo;
  for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long)gridDim.x * blockDim.x) {
    const long pix = i % HWo;
    const long r = (i / HWo) % R;
    const long nl = i / (HWo * R);
    const long ci = r / kk, kh = (r % kk) / c.K, kw = r % c.K;
    const long ih = pix / c.Wo - PAD + kh, iw = pix % c.Wo - PAD + kw;
    float v = 0.f;
    if (ih >= 0 && ih < c.H && iw >= 0 && iw < c.W) v = __ldg(c.x + (((n0 + nl) * c.CI + ci) * c.H + ih) * c.W + iw);
    col[i] = v;
  }
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  CP c;
  if (parse(in, n_in, out, n_out, c)) return 1;
  const long HWo = c.Ho * c.Wo, R = c.CI * c.K * c.K;
  if (c.N * c.CO * HWo == 0) return 0;
  if (R == 0 || c.CO > 65535 || HWo > 2147483647L || R > 2147483647L) return 1;
  const size_t per_sample = sizeof(float) * (size_t)R * (size_t)HWo;
  long chunk = (long)((size_t)@CHUNK_MB@ * 1024 * 1024 / per_sample);
  if (chunk < 1) chunk = 1;
  if (chunk > c.N) chunk = c.N;
  const size_t pbytes = sizeof(double) * 2 * c.CO * SCHUNKS + sizeof(float2) * c.CO;
  char* scr = static_cast<char*>(ctx->scratch_alloc(ctx, pbytes));
  float* col = static_cast<float*>(ctx->scratch_alloc(ctx, per_sample * chunk));
  if (!scr || !col) return 2;
  double* part = reinterpret_cast<double*>(scr);
  float2* ss = reinterpret_cast<float2*>(scr + sizeof(double) * 2 * c.CO * SCHUNKS);
  cublasHandle_t h = static_cast<cublasHandle_t>(ctx->cublas);
  cudaStream_t st = static_cast<cudaStream_t>(ctx->stream);
  const float one = 1.f, zero = 0.f;
  for (long n0 = 0; n0 < c.N; n0 += chunk) {
    const long nc = c.N - n0 < chunk ? c.N - n0 : chunk;
    k_im2col<<<grid_for(nc * R * HWo, 256), 256, 0, st>>>(c, col, n0, nc);
    if (cudaGetLastError() != cudaSuccess) return 3;
    // column-major: Y (HWo x CO, ld HWo) = Col (HWo x R, ld HWo) * Wm (R x CO, ld R)
    if (cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, (int)HWo, (int)c.CO, (int)R, &one,
                                  col, (int)HWo, (long long)(R * HWo), c.w, (int)R, 0LL, &zero,
                                  c.y + n0 * c.CO * HWo, (int)HWo, (long long)(c.CO * HWo),
                                  (int)nc) != CUBLAS_STATUS_SUCCESS)
      return 3;
  }
  k_plane_stats<<<dim3(SCHUNKS, (unsigned)c.CO), 256, 2 * 256 * sizeof(double), st>>>(c, part);
  if (cudaGetLastError() != cudaSuccess) return 3;
  return finish(ctx, c, part, SCHUNKS, ss);
}
"""


def generate(header, indent):
    out = []

    def add(backend, variant, tech, body, inc=""):
        code = header(TASK, backend, "conv", variant, tech) + inc + PARSE + body
        out.append((backend, variant, "conv", tech, code))

    add("cpu", "naive",
        "Single-threaded direct convolution with a bounds test per tap, then per channel a two-pass mean / biased variance in double and the normalise + ReLU sweep.",
        CPU_NAIVE)
    add("cpu", "omp_gather_3pass",
        "OpenMP over output planes for the direct convolution, a second parallel pass for per-plane double sums, a fixed-order per-channel combine, then a parallel vectorised normalise + ReLU.",
        CPU_STATS_NORM + CPU_OMP_GATHER, CPU_INC)
    for cb in (4, 8):
        add("cpu", f"omp_rowaxpy_cb{cb}_fused_stats",
            f"OpenMP over (sample, {cb}-channel block): each tap is a unit-stride vectorised row axpy into {cb} output planes sharing one input row, and the plane sums are taken while the planes are cache-hot before the normalise + ReLU pass.",
            CPU_STATS_NORM + CPU_OMP_ROWAXPY.replace("@CB@", str(cb)), CPU_INC)

    add("cuda", "naive_b256",
        "One thread per conv output from global memory, then a chunked per-channel sum / sum-of-squares pass in double, a per-channel finaliser and a grid-stride normalise + ReLU.",
        CUDA_COMMON + CUDA_PLANE_STATS + CUDA_NAIVE.replace("@BS@", "256"))
    add("cuda", "smem_weights_fused_stats_b256",
        "Grid (pixel tile, channel, sample) with the channel's filter in shared memory; each block reduces its outputs' sum and sum of squares in double, so the batch statistics cost no extra read of the output.",
        CUDA_COMMON + CUDA_SMEM_FUSED.replace("@BS@", "256"))
    for cob in (8, 16):
        add("cuda", f"tiled16_cob{cob}_fused_stats",
            f"16x16 output tiles with halo input tiles and weights staged in shared memory 8 input channels at a time; each thread accumulates {cob} output channels and the block writes per-channel partial statistics for the finaliser.",
            CUDA_COMMON + CUDA_TILED.replace("@COB@", str(cob)))
    add("cuda", "cublas_im2col",
        "im2col of a chunk of samples into scratch and one strided-batched cuBLAS SGEMM straight into the output (the conv bias cancels under batch-stat normalisation), then chunked channel statistics and a fused normalise + ReLU.",
        CUDA_COMMON + CUDA_PLANE_STATS + CUDA_CUBLAS.replace("@CHUNK_MB@", "512"), "#include <cublas_v2.h>\n")
    return out
