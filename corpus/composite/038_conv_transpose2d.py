"""038_conv_transpose2d: ConvTranspose2d(cin, cout, 4, stride=2, padding=1), eval mode.

y[n, co, oh, ow] = b[co] + sum_{ci, kh, kw} x[n, ci, ih, iw] * w[ci, co, kh, kw]
where oh = ih * S - P + kh and ow = iw * S - P + kw (S = 2, P = 1; K read from the weight).
Written as a gather: for an output row oh only the taps kh with (oh + P - kh) % S == 0 land,
which is what every fast variant below resolves once per row / column phase.
"""

TASK = "038_conv_transpose2d"

# Shared argument parsing (CPU and CUDA): sizes from the tensors, stride/padding from the module.
PARSE = r"""
struct TP {
  const float* x;
  const float* w;
  const float* b;
  float* y;
  long N, CI, H, W, CO, K, Ho, Wo;
};

static constexpr long S = 2;  // stride
static constexpr long P = 1;  // padding

static int parse(const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out, TP& p) {
  if (n_in != 3 || n_out != 1) return 1;
  if (in[0].ndim != 4 || in[1].ndim != 4 || in[2].ndim != 1 || out[0].ndim != 4) return 1;
  if (in[0].dtype != kf::KF_FLOAT32 || in[1].dtype != kf::KF_FLOAT32 || in[2].dtype != kf::KF_FLOAT32 ||
      out[0].dtype != kf::KF_FLOAT32) return 1;
  p.x = static_cast<const float*>(in[0].data);
  p.w = static_cast<const float*>(in[1].data);
  p.b = static_cast<const float*>(in[2].data);
  p.y = static_cast<float*>(out[0].data);
  p.N = in[0].shape[0];
  p.CI = in[0].shape[1];
  p.H = in[0].shape[2];
  p.W = in[0].shape[3];
  if (in[1].shape[0] != p.CI) return 1;
  p.CO = in[1].shape[1];
  p.K = in[1].shape[2];
  if (in[1].shape[3] != p.K || in[2].shape[0] != p.CO) return 1;
  p.Ho = (p.H - 1) * S - 2 * P + p.K;
  p.Wo = (p.W - 1) * S - 2 * P + p.K;
  if (out[0].shape[0] != p.N || out[0].shape[1] != p.CO || out[0].shape[2] != p.Ho || out[0].shape[3] != p.Wo)
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
  TP p;
  if (parse(in, n_in, out, n_out, p)) return 1;
  for (long n = 0; n < p.N; ++n)
    for (long co = 0; co < p.CO; ++co)
      for (long oh = 0; oh < p.Ho; ++oh)
        for (long ow = 0; ow < p.Wo; ++ow) {
          float acc = p.b[co];
          for (long ci = 0; ci < p.CI; ++ci)
            for (long kh = 0; kh < p.K; ++kh) {
              const long th = oh + P - kh;
              if (th < 0 || th % S) continue;
              const long ih = th / S;
              if (ih >= p.H) continue;
              for (long kw = 0; kw < p.K; ++kw) {
                const long tw = ow + P - kw;
                if (tw < 0 || tw % S) continue;
                const long iw = tw / S;
                if (iw >= p.W) continue;
                acc += x_at(p, n, ci, ih, iw) * p.w[((ci * p.CO + co) * p.K + kh) * p.K + kw];
              }
            }
          p.y[((n * p.CO + co) * p.Ho + oh) * p.Wo + ow] = acc;
        }
  return 0;
}
"""

CPU_XAT = r"""
static inline float x_at(const TP& p, long n, long ci, long ih, long iw) {
  return p.x[((n * p.CI + ci) * p.H + ih) * p.W + iw];
}
"""

CPU_OMP_GATHER = r"""
extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  TP p;
  if (parse(in, n_in, out, n_out, p)) return 1;
  const long planes = p.N * p.CO;
#pragma omp parallel for schedule(static) num_threads(ctx->num_threads)
  for (long pl = 0; pl < planes; ++pl) {
    const long n = pl / p.CO, co = pl % p.CO;
    float* yp = p.y + pl * p.Ho * p.Wo;
    for (long oh = 0; oh < p.Ho; ++oh) {
      // first tap row with (oh + P - kh) % S == 0; later ones step by S (ih steps by -1)
      const long kh0 = (oh + P) % S;
      for (long ow = 0; ow < p.Wo; ++ow) {
        const long kw0 = (ow + P) % S;
        float acc = p.b[co];
        for (long kh = kh0; kh < p.K; kh += S) {
          const long ih = (oh + P - kh) / S;
          if (ih < 0 || ih >= p.H) continue;
          for (long kw = kw0; kw < p.K; kw += S) {
            const long iw = (ow + P - kw) / S;
            if (iw < 0 || iw >= p.W) continue;
            const float* xp = p.x + (n * p.CI * p.H + ih) * p.W + iw;
            const float* wp = p.w + (co * p.K + kh) * p.K + kw;
            for (long ci = 0; ci < p.CI; ++ci) acc += xp[ci * p.H * p.W] * wp[ci * p.CO * p.K * p.K];
          }
        }
        yp[oh * p.Wo + ow] = acc;
      }
    }
  }
  return 0;
}
"""

# Row tasks (n, output-channel block, oh); the output row is split into its S column phases
# q (ow = S*j + q): within a phase every valid tap kw reads the input row at a fixed offset d,
# so the update acc[cb][q][j] += w * x[j + d] is unit-stride and vectorises.
CPU_OMP_PHASE_INC = "#include <omp.h>\n#include <vector>\n#include <algorithm>\n"
CPU_OMP_PHASE = r"""
#define CB @CB@

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  TP p;
  if (parse(in, n_in, out, n_out, p)) return 1;
  if (p.N * p.CO * p.Ho * p.Wo == 0) return 0;
  const long nblk = (p.CO + CB - 1) / CB;
  const long WQ = (p.Wo + S - 1) / S;  // longest phase
  const long tasks = p.N * nblk * p.Ho;
#pragma omp parallel num_threads(ctx->num_threads)
  {
    std::vector<float> accv((size_t)CB * S * WQ);
    float* acc = accv.data();
#pragma omp for schedule(static)
    for (long t = 0; t < tasks; ++t) {
      const long oh = t % p.Ho;
      const long blk = (t / p.Ho) % nblk;
      const long n = t / (p.Ho * nblk);
      const long co0 = blk * CB;
      const long cb_n = std::min((long)CB, p.CO - co0);
      for (long cb = 0; cb < cb_n; ++cb) {
        const float bv = p.b[co0 + cb];
        for (long i = 0; i < S * WQ; ++i) acc[cb * S * WQ + i] = bv;
      }
      const long kh0 = (oh + P) % S;
      for (long ci = 0; ci < p.CI; ++ci) {
        for (long kh = kh0; kh < p.K; kh += S) {
          const long ih = (oh + P - kh) / S;
          if (ih < 0 || ih >= p.H) continue;
          const float* xr = p.x + ((n * p.CI + ci) * p.H + ih) * p.W;
          for (long cb = 0; cb < cb_n; ++cb) {
            const float* wr = p.w + ((ci * p.CO + co0 + cb) * p.K + kh) * p.K;
            for (long q = 0; q < S; ++q) {
              const long wq = (p.Wo - q + S - 1) / S;
              float* aq = acc + (cb * S + q) * WQ;
              for (long kw = (q + P) % S; kw < p.K; kw += S) {
                const long d = (q + P - kw) / S;  // exact division
                const float wv = wr[kw];
                const long j0 = std::max(0L, -d), j1 = std::min(wq, p.W - d);
#pragma omp simd
                for (long j = j0; j < j1; ++j) aq[j] += wv * xr[j + d];
              }
            }
          }
        }
      }
      for (long cb = 0; cb < cb_n; ++cb) {
        float* yr = p.y + ((n * p.CO + co0 + cb) * p.Ho + oh) * p.Wo;
        for (long q = 0; q < S; ++q) {
          const float* aq = acc + (cb * S + q) * WQ;
          for (long j = 0; S * j + q < p.Wo; ++j) yr[S * j + q] = aq[j];
        }
      }
    }
  }
  return 0;
}
"""

# ----------------------------------------------------------------------------------------
# CUDA
# ----------------------------------------------------------------------------------------
CUDA_NAIVE = r"""
__global__ void k_naive(TP p, long total) {
  for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long)gridDim.x * blockDim.x) {
    const long ow = i % p.Wo;
    const long oh = (i / p.Wo) % p.Ho;
    const long co = (i / (p.Wo * p.Ho)) % p.CO;
    const long n = i / (p.Wo * p.Ho * p.CO);
    float acc = p.b[co];
    for (long ci = 0; ci < p.CI; ++ci)
      for (long kh = 0; kh < p.K; ++kh) {
        const long th = oh + P - kh;
        if (th < 0 || th % S) continue;
        const long ih = th / S;
        if (ih >= p.H) continue;
        for (long kw = 0; kw < p.K; ++kw) {
          const long tw = ow + P - kw;
          if (tw < 0 || tw % S) continue;
          const long iw = tw / S;
          if (iw >= p.W) continue;
          acc += p.x[((n * p.CI + ci) * p.H + ih) * p.W + iw] * p.w[((ci * p.CO + co) * p.K + kh) * p.K + kw];
        }
      }
    p.y[i] = acc;
  }
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  TP p;
  if (parse(in, n_in, out, n_out, p)) return 1;
  const long total = p.N * p.CO * p.Ho * p.Wo;
  if (total == 0) return 0;
  long blocks = (total + @BS@ - 1) / @BS@;
  if (blocks > (1L << 20)) blocks = 1L << 20;
  k_naive<<<(unsigned)blocks, @BS@, 0, static_cast<cudaStream_t>(ctx->stream)>>>(p, total);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
"""

# Grid (pixel tiles, co, n); the block's output-channel filter w[:, co] sits in shared memory.
CUDA_SMEM = r"""
__global__ void k_smem(TP p) {
  extern __shared__ float wsh[];  // [CI][K][K] of output channel co
  const long co = blockIdx.y, n = blockIdx.z;
  const long kk = p.K * p.K;
  for (long t = threadIdx.x; t < p.CI * kk; t += blockDim.x) {
    const long ci = t / kk, r = t % kk;
    wsh[t] = p.w[(ci * p.CO + co) * kk + r];
  }
  __syncthreads();
  const long pix = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (pix >= p.Ho * p.Wo) return;
  const long oh = pix / p.Wo, ow = pix % p.Wo;
  const long HW = p.H * p.W;
  const float* xn = p.x + n * p.CI * HW;
  float acc = p.b[co];
  for (long kh = (oh + P) % S; kh < p.K; kh += S) {
    const long ih = (oh + P - kh) / S;
    if (ih < 0 || ih >= p.H) continue;
    for (long kw = (ow + P) % S; kw < p.K; kw += S) {
      const long iw = (ow + P - kw) / S;
      if (iw < 0 || iw >= p.W) continue;
      const float* xp = xn + ih * p.W + iw;
      const float* wp = wsh + kh * p.K + kw;
      for (long ci = 0; ci < p.CI; ++ci) acc += __ldg(xp + ci * HW) * wp[ci * kk];
    }
  }
  p.y[(n * p.CO + co) * p.Ho * p.Wo + pix] = acc;
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  TP p;
  if (parse(in, n_in, out, n_out, p)) return 1;
  if (p.N * p.CO * p.Ho * p.Wo == 0) return 0;
  if (p.N > 65535 || p.CO > 65535) return 1;
  const size_t shm = sizeof(float) * p.CI * p.K * p.K;
  if (shm > 48 * 1024) return 1;
  const long tiles = (p.Ho * p.Wo + @BS@ - 1) / @BS@;
  k_smem<<<dim3((unsigned)tiles, (unsigned)p.CO, (unsigned)p.N), @BS@, shm, static_cast<cudaStream_t>(ctx->stream)>>>(p);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
"""

# Each thread: one output pixel for COB output channels; each input value loaded once feeds
# COB accumulators, and the COB weights of a tap are consecutive in shared memory.
CUDA_REGBLOCK = r"""
#define COB @COB@

__global__ void __launch_bounds__(@BS@) k_regblock(TP p) {
  extern __shared__ float wsh[];  // [CI][K][K][COB]
  const long co0 = (long)blockIdx.y * COB, n = blockIdx.z;
  const long kk = p.K * p.K;
  for (long t = threadIdx.x; t < p.CI * kk * COB; t += blockDim.x) {
    const long cb = t % COB, r = (t / COB) % kk, ci = t / (COB * kk);
    const long co = co0 + cb;
    wsh[t] = co < p.CO ? p.w[(ci * p.CO + co) * kk + r] : 0.f;
  }
  __syncthreads();
  const long pix = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (pix >= p.Ho * p.Wo) return;
  const long oh = pix / p.Wo, ow = pix % p.Wo;
  const long HW = p.H * p.W;
  const float* xn = p.x + n * p.CI * HW;
  float acc[COB];
#pragma unroll
  for (int cb = 0; cb < COB; ++cb) acc[cb] = 0.f;
  for (long kh = (oh + P) % S; kh < p.K; kh += S) {
    const long ih = (oh + P - kh) / S;
    if (ih < 0 || ih >= p.H) continue;
    for (long kw = (ow + P) % S; kw < p.K; kw += S) {
      const long iw = (ow + P - kw) / S;
      if (iw < 0 || iw >= p.W) continue;
      const float* xp = xn + ih * p.W + iw;
      const float* wp = wsh + (kh * p.K + kw) * COB;
      for (long ci = 0; ci < p.CI; ++ci) {
        const float xv = __ldg(xp + ci * HW);
        const float* wc = wp + ci * kk * COB;
#pragma unroll
        for (int cb = 0; cb < COB; ++cb) acc[cb] += xv * wc[cb];
      }
    }
  }
#pragma unroll
  for (int cb = 0; cb < COB; ++cb) {
    const long co = co0 + cb;
    if (co < p.CO) p.y[(n * p.CO + co) * p.Ho * p.Wo + pix] = acc[cb] + p.b[co];
  }
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  TP p;
  if (parse(in, n_in, out, n_out, p)) return 1;
  if (p.N * p.CO * p.Ho * p.Wo == 0) return 0;
  const long cblocks = (p.CO + COB - 1) / COB;
  if (p.N > 65535 || cblocks > 65535) return 1;
  const size_t shm = sizeof(float) * p.CI * p.K * p.K * COB;
  if (shm > 48 * 1024) return 1;
  const long tiles = (p.Ho * p.Wo + @BS@ - 1) / @BS@;
  k_regblock<<<dim3((unsigned)tiles, (unsigned)cblocks, (unsigned)p.N), @BS@, shm, static_cast<cudaStream_t>(ctx->stream)>>>(p);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
"""

# cuBLAS: per chunk of samples, cols[n][(co, kh, kw)][ih*W + iw] = sum_ci w[ci][(co,kh,kw)] x[n][ci][ih*W+iw]
# (one strided-batched SGEMM), then a col2im gather adds the <= (K/S)^2 landing taps and the bias.
CUDA_CUBLAS_INC = "#include <cublas_v2.h>\n"
CUDA_CUBLAS = r"""

__global__ void k_col2im(TP p, const float* __restrict__ cols, long n0, long nc) {
  const long per = p.CO * p.Ho * p.Wo;
  const long total = nc * per;
  const long HW = p.H * p.W, kk = p.K * p.K;
  for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long)gridDim.x * blockDim.x) {
    const long ow = i % p.Wo;
    const long oh = (i / p.Wo) % p.Ho;
    const long co = (i / (p.Wo * p.Ho)) % p.CO;
    const long nl = i / per;
    const float* cn = cols + (nl * p.CO + co) * kk * HW;
    float acc = p.b[co];
    for (long kh = (oh + P) % S; kh < p.K; kh += S) {
      const long ih = (oh + P - kh) / S;
      if (ih < 0 || ih >= p.H) continue;
      for (long kw = (ow + P) % S; kw < p.K; kw += S) {
        const long iw = (ow + P - kw) / S;
        if (iw < 0 || iw >= p.W) continue;
        acc += cn[(kh * p.K + kw) * HW + ih * p.W + iw];
      }
    }
    p.y[n0 * per + i] = acc;
  }
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  TP p;
  if (parse(in, n_in, out, n_out, p)) return 1;
  if (p.N * p.CO * p.Ho * p.Wo == 0) return 0;
  if (p.CI == 0 || p.H * p.W == 0) return 1;
  const long HW = p.H * p.W, M = p.CO * p.K * p.K;
  if (HW > 2147483647L || M > 2147483647L || p.CI > 2147483647L) return 1;
  const size_t per_sample = sizeof(float) * (size_t)M * (size_t)HW;
  long chunk = (long)((size_t)@CHUNK_MB@ * 1024 * 1024 / per_sample);
  if (chunk < 1) chunk = 1;
  if (chunk > p.N) chunk = p.N;
  float* cols = static_cast<float*>(ctx->scratch_alloc(ctx, per_sample * chunk));
  if (!cols) return 2;
  cublasHandle_t h = static_cast<cublasHandle_t>(ctx->cublas);
  cudaStream_t st = static_cast<cudaStream_t>(ctx->stream);
  const float one = 1.f, zero = 0.f;
  for (long n0 = 0; n0 < p.N; n0 += chunk) {
    const long nc = p.N - n0 < chunk ? p.N - n0 : chunk;
    // column-major: C (HW x M, ld HW) = X (HW x CI, ld HW) * Wt, with Wt = op_T(w viewed M x CI, ld M)
    if (cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_T, (int)HW, (int)M, (int)p.CI, &one,
                                  p.x + n0 * p.CI * HW, (int)HW, (long long)(p.CI * HW),
                                  p.w, (int)M, 0LL, &zero, cols, (int)HW, (long long)(M * HW),
                                  (int)nc) != CUBLAS_STATUS_SUCCESS) {
      ctx->scratch_free(ctx, cols);
      return 3;
    }
    const long total = nc * p.CO * p.Ho * p.Wo;
    long blocks = (total + 255) / 256;
    if (blocks > (1L << 20)) blocks = 1L << 20;
    k_col2im<<<(unsigned)blocks, 256, 0, st>>>(p, cols, n0, nc);
    if (cudaGetLastError() != cudaSuccess) {
      ctx->scratch_free(ctx, cols);
      return 4;
    }
  }
  ctx->scratch_free(ctx, cols);
  return 0;
}
"""


def generate(header, indent):
    out = []

    def add(backend, variant, tech, body, inc=""):
        code = header(TASK, backend, "conv", variant, tech) + inc + PARSE + body
        out.append((backend, variant, "conv", tech, code))

    add("cpu", "naive",
        "Single-threaded gather over every (ci, kh, kw) with a divisibility test per tap to find the input pixel that lands on each output.",
        CPU_XAT + CPU_NAIVE)
    add("cpu", "omp_gather_parity",
        "OpenMP over output planes; the stride parity of oh/ow picks the only landing taps directly (K/S per axis), so no tap is tested and skipped.",
        CPU_OMP_GATHER)
    for cb in (4, 16):
        add("cpu", f"omp_phase_rows_cb{cb}",
            f"OpenMP over (sample, {cb}-channel block, output row); the row is split into its stride phases so each landing tap is a unit-stride vectorised axpy of an input row into {cb} channel accumulators, interleaved on store.",
            CPU_OMP_PHASE.replace("@CB@", str(cb)), CPU_OMP_PHASE_INC)

    add("cuda", "naive_b256",
        "One thread per output element (grid-stride, 64-bit index) testing every tap for stride divisibility; weights and inputs read from global memory.",
        CUDA_NAIVE.replace("@BS@", "256"))
    add("cuda", "smem_weights_parity_b256",
        "Grid (pixel tile, output channel, sample): the channel's filter is staged in shared memory and the output's stride parity selects its landing taps directly.",
        CUDA_SMEM.replace("@BS@", "256"))
    for cob in (4, 8):
        add("cuda", f"regblock_cob{cob}_b128",
            f"Each thread computes one output pixel for {cob} output channels, so every input value loaded feeds {cob} accumulators; weights of the channel block live in shared memory, tap-major with channels innermost.",
            CUDA_REGBLOCK.replace("@COB@", str(cob)).replace("@BS@", "128"))
    add("cuda", "cublas_gemm_col2im",
        "Per chunk of samples a strided-batched cuBLAS SGEMM forms every (co, kh, kw) contribution of every input pixel, then a col2im gather kernel sums the landing taps and adds the bias.",
        CUDA_CUBLAS.replace("@CHUNK_MB@", "512"), CUDA_CUBLAS_INC)
    return out
