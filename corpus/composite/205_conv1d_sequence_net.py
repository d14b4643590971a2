"""205_conv1d_sequence_net: stack of dilated 1-D convs (kernel 3, dilation 2^i, padding 2^i,
bias) with residual GELU: x = x + gelu(conv_i(x)) for each layer (GELU in the exact erf form)."""

TASK = "205_conv1d_sequence_net"

# ----------------------------------------------------------------------------------------
# CPU
# ----------------------------------------------------------------------------------------
# Argument checks and unpacking, the same in the CPU and the CUDA sources.
ARGS = r"""static int get_args(const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out, long& N, long& C, long& L, int& layers) {
  if (n_in < 3 || (n_in - 1) % 2 || n_out != 1) return 1;
  const kf::Tensor& x = in[0];
  if (x.ndim != 3 || x.dtype != kf::KF_FLOAT32 || out[0].dtype != kf::KF_FLOAT32) return 1;
  N = x.shape[0]; C = x.shape[1]; L = x.shape[2];
  layers = (n_in - 1) / 2;
  if (layers > 30) return 1;
  for (int l = 0; l < layers; ++l) {
    const kf::Tensor& w = in[1 + 2 * l];
    if (w.ndim != 3 || w.shape[0] != C || w.shape[1] != C || w.shape[2] != 3 || w.dtype != kf::KF_FLOAT32) return 1;
    if (in[2 + 2 * l].numel() != C || in[2 + 2 * l].dtype != kf::KF_FLOAT32) return 1;
  }
  if (out[0].numel() != x.numel()) return 1;
  return 0;
}
"""

CPU_COMMON = r"""
#include <stdlib.h>
#include <algorithm>

// in: x (N, C, L), then (weight (C, C, 3), bias (C)) per layer.
""" + ARGS + r"""
static inline float gelu(float v) { return 0.5f * v * (1.f + erff(v * 0.70710678118654752f)); }

// Ping-pong so that the last layer writes the output: layer l reads src[l], writes dst[l].
static void plan(int layers, const float* x, float* s, float* y, const float** src, float** dst) {
  float* first = (layers % 2 == 0) ? s : y;
  float* second = (layers % 2 == 0) ? y : s;
  const float* cur = x;
  for (int l = 0; l < layers; ++l) {
    src[l] = cur;
    dst[l] = (l % 2 == 0) ? first : second;
    cur = dst[l];
  }
}
"""

CPU_NAIVE = r"""
static void layer(const float* x, const float* w, const float* b, float* y, long N, long C, long L, long d) {
  for (long n = 0; n < N; ++n)
    for (long co = 0; co < C; ++co)
      for (long t = 0; t < L; ++t) {
        float acc = b[co];
        for (long ci = 0; ci < C; ++ci)
          for (int k = 0; k < 3; ++k) {
            const long tt = t + (k - 1) * d;
            if (tt < 0 || tt >= L) continue;
            acc += w[(co * C + ci) * 3 + k] * x[(n * C + ci) * L + tt];
          }
        const long i = (n * C + co) * L + t;
        y[i] = x[i] + gelu(acc);
      }
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  long N, C, L;
  int layers;
  if (get_args(in, n_in, out, n_out, N, C, L, layers)) return 1;
  const long tot = N * C * L;
  if (tot == 0) return 0;
  float* s = (float*)ctx->scratch_alloc(ctx, sizeof(float) * tot);
  if (!s) return 2;
  const float* src[32];
  float* dst[32];
  plan(layers, (const float*)in[0].data, s, (float*)out[0].data, src, dst);
  for (int l = 0; l < layers; ++l)
    layer(src[l], (const float*)in[1 + 2 * l].data, (const float*)in[2 + 2 * l].data, dst[l], N, C, L, 1L << l);
  ctx->scratch_free(ctx, s);
  return 0;
}
"""

CPU_ROWAXPY = r"""
// One (sample, output channel) row per OpenMP task: each (input channel, tap) adds
// weight x a shifted input row (unit stride, SIMD), then the residual GELU epilogue.
static void layer(const float* x, const float* w, const float* b, float* y, long N, long C, long L, long d, int nt) {
#pragma omp parallel for schedule(static) num_threads(nt)
  for (long r = 0; r < N * C; ++r) {
    const long n = r / C, co = r % C;
    float* yr = y + r * L;
    for (long t = 0; t < L; ++t) yr[t] = b[co];
    for (long ci = 0; ci < C; ++ci) {
      const float* xr = x + (n * C + ci) * L;
      for (int k = 0; k < 3; ++k) {
        const float wv = w[(co * C + ci) * 3 + k];
        const long sft = (k - 1) * d;
        const long t0 = std::max(0L, -sft), t1 = std::min(L, L - sft);
#pragma omp simd
        for (long t = t0; t < t1; ++t) yr[t] += wv * xr[t + sft];
      }
    }
    const float* xo = x + r * L;
    for (long t = 0; t < L; ++t) yr[t] = xo[t] + gelu(yr[t]);
  }
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  long N, C, L;
  int layers;
  if (get_args(in, n_in, out, n_out, N, C, L, layers)) return 1;
  const long tot = N * C * L;
  if (tot == 0) return 0;
  const int nt = ctx->num_threads > 0 ? ctx->num_threads : 1;
  float* s = (float*)ctx->scratch_alloc(ctx, sizeof(float) * tot);
  if (!s) return 2;
  const float* src[32];
  float* dst[32];
  plan(layers, (const float*)in[0].data, s, (float*)out[0].data, src, dst);
  for (int l = 0; l < layers; ++l)
    layer(src[l], (const float*)in[1 + 2 * l].data, (const float*)in[2 + 2 * l].data, dst[l], N, C, L, 1L << l, nt);
  ctx->scratch_free(ctx, s);
  return 0;
}
"""

CPU_COBLOCK = r"""
#include <vector>
#define CB @CB@
#define TC @TC@

// OpenMP task = (sample, CB output channels, TC-long time chunk): each input channel's
// zero-padded segment is loaded once and feeds CB accumulator rows that stay in L1;
// the epilogue adds the bias, applies GELU and the residual.
static void layer(const float* x, const float* w, const float* b, float* y, long N, long C, long L, long d, int nt) {
  const long nb = (C + CB - 1) / CB, nc = (L + TC - 1) / TC;
#pragma omp parallel num_threads(nt)
  {
    std::vector<float> accv((size_t)CB * TC), xpv((size_t)TC + 2 * d);
    float* acc = accv.data();
    float* xp = xpv.data();
#pragma omp for schedule(static)
    for (long task = 0; task < N * nb * nc; ++task) {
      const long ch = task % nc, t2 = task / nc, cb0 = (t2 % nb) * CB, n = t2 / nb;
      const int cb = (int)std::min<long>(CB, C - cb0);
      const long t0 = ch * TC, tc = std::min<long>(TC, L - t0);
      for (long i = 0; i < (long)CB * TC; ++i) acc[i] = 0.f;
      for (long ci = 0; ci < C; ++ci) {
        const float* xr = x + (n * C + ci) * L;
        for (long q = 0; q < tc + 2 * d; ++q) {
          const long tt = t0 - d + q;
          xp[q] = (tt >= 0 && tt < L) ? xr[tt] : 0.f;
        }
        for (int j = 0; j < cb; ++j) {
          const float* wp = w + ((cb0 + j) * C + ci) * 3;
          const float w0 = wp[0], w1 = wp[1], w2 = wp[2];
          float* a = acc + (long)j * TC;
#pragma omp simd
          for (long t = 0; t < tc; ++t) a[t] += w0 * xp[t] + w1 * xp[t + d] + w2 * xp[t + 2 * d];
        }
      }
      for (int j = 0; j < cb; ++j) {
        const long co = cb0 + j, base = (n * C + co) * L + t0;
        const float bv = b[co];
        const float* a = acc + (long)j * TC;
        for (long t = 0; t < tc; ++t) y[base + t] = x[base + t] + gelu(a[t] + bv);
      }
    }
  }
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  long N, C, L;
  int layers;
  if (get_args(in, n_in, out, n_out, N, C, L, layers)) return 1;
  const long tot = N * C * L;
  if (tot == 0) return 0;
  const int nt = ctx->num_threads > 0 ? ctx->num_threads : 1;
  float* s = (float*)ctx->scratch_alloc(ctx, sizeof(float) * tot);
  if (!s) return 2;
  const float* src[32];
  float* dst[32];
  plan(layers, (const float*)in[0].data, s, (float*)out[0].data, src, dst);
  for (int l = 0; l < layers; ++l)
    layer(src[l], (const float*)in[1 + 2 * l].data, (const float*)in[2 + 2 * l].data, dst[l], N, C, L, 1L << l, nt);
  ctx->scratch_free(ctx, s);
  return 0;
}
"""

# ----------------------------------------------------------------------------------------
# CUDA
# ----------------------------------------------------------------------------------------
CUDA_COMMON = r"""
""" + ARGS + r"""
static KF_HD float gelu(float v) { return 0.5f * v * (1.f + erff(v * 0.70710678118654752f)); }

"""

CUDA_PLAN = r"""
static void plan(int layers, const float* x, float* s, float* y, const float** src, float** dst) {
  float* first = (layers % 2 == 0) ? s : y;
  float* second = (layers % 2 == 0) ? y : s;
  const float* cur = x;
  for (int l = 0; l < layers; ++l) {
    src[l] = cur;
    dst[l] = (l % 2 == 0) ? first : second;
    cur = dst[l];
  }
}
"""

CUDA_NAIVE = r"""
__global__ void k_layer(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
                        float* __restrict__ y, long N, long C, long L, long d) {
  const long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
  if (i >= N * C * L) return;
  const long t = i % L, co = (i / L) % C, n = i / (L * C);
  float acc = b[co];
  for (long ci = 0; ci < C; ++ci)
    for (int k = 0; k < 3; ++k) {
      const long tt = t + (k - 1) * d;
      if (tt < 0 || tt >= L) continue;
      acc += w[(co * C + ci) * 3 + k] * x[(n * C + ci) * L + tt];
    }
  y[i] = x[i] + gelu(acc);
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  long N, C, L;
  int layers;
  if (get_args(in, n_in, out, n_out, N, C, L, layers)) return 1;
  const long tot = N * C * L;
  if (tot == 0) return 0;
  cudaStream_t st = (cudaStream_t)ctx->stream;
  float* s = (float*)ctx->scratch_alloc(ctx, sizeof(float) * tot);
  if (!s) return 2;
  const float* src[32];
  float* dst[32];
  plan(layers, (const float*)in[0].data, s, (float*)out[0].data, src, dst);
  for (int l = 0; l < layers; ++l)
    k_layer<<<(unsigned)((tot + 255) / 256), 256, 0, st>>>(src[l], (const float*)in[1 + 2 * l].data,
                                                          (const float*)in[2 + 2 * l].data, dst[l], N, C, L, 1L << l);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
"""

CUDA_TILED = r"""
#define COB @COB@
#define CK 16
#define TT 256

// Block = 256 time steps x COB output channels of one sample. Input channels go in chunks
// of CK: their haloed segments (TT + 2d) and the COB x CK x 3 weights are staged in shared
// memory, each thread accumulates COB channels at one time step, then bias + GELU + residual.
__global__ void __launch_bounds__(TT) k_layer(const float* __restrict__ x, const float* __restrict__ w,
                                              const float* __restrict__ b, float* __restrict__ y, int C, long L, int d) {
  extern __shared__ float sm[];
  const int seg = TT + 2 * d;
  float* xs = sm;
  float* ws = sm + CK * seg;
  const long t0 = (long)blockIdx.x * TT, n = blockIdx.z;
  const int co0 = blockIdx.y * COB, tx = threadIdx.x;
  float acc[COB];
#pragma unroll
  for (int j = 0; j < COB; ++j) acc[j] = 0.f;
  for (int c0 = 0; c0 < C; c0 += CK) {
    for (int i = tx; i < CK * seg; i += TT) {
      const int cc = i / seg, q = i % seg, ci = c0 + cc;
      const long tt = t0 - d + q;
      xs[i] = (ci < C && tt >= 0 && tt < L) ? x[(n * C + ci) * L + tt] : 0.f;
    }
    for (int i = tx; i < COB * CK * 3; i += TT) {
      const int j = i / (CK * 3), cc = (i / 3) % CK, k = i % 3, co = co0 + j, ci = c0 + cc;
      ws[i] = (co < C && ci < C) ? w[((long)co * C + ci) * 3 + k] : 0.f;
    }
    __syncthreads();
#pragma unroll 4
    for (int cc = 0; cc < CK; ++cc) {
      const float v0 = xs[cc * seg + tx], v1 = xs[cc * seg + tx + d], v2 = xs[cc * seg + tx + 2 * d];
#pragma unroll
      for (int j = 0; j < COB; ++j) {
        const float* wj = ws + (j * CK + cc) * 3;
        acc[j] += wj[0] * v0 + wj[1] * v1 + wj[2] * v2;
      }
    }
    __syncthreads();
  }
  const long t = t0 + tx;
  if (t >= L) return;
#pragma unroll
  for (int j = 0; j < COB; ++j) {
    const int co = co0 + j;
    if (co >= C) break;
    const long i = (n * C + co) * L + t;
    y[i] = x[i] + gelu(acc[j] + b[co]);
  }
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  long N, C, L;
  int layers;
  if (get_args(in, n_in, out, n_out, N, C, L, layers)) return 1;
  const long tot = N * C * L;
  if (tot == 0) return 0;
  if (N > 65535 || (C + COB - 1) / COB > 65535 || C > 2147483647L) return 1;
  cudaStream_t st = (cudaStream_t)ctx->stream;
  float* s = (float*)ctx->scratch_alloc(ctx, sizeof(float) * tot);
  if (!s) return 2;
  const float* src[32];
  float* dst[32];
  plan(layers, (const float*)in[0].data, s, (float*)out[0].data, src, dst);
  const dim3 grid((unsigned)((L + TT - 1) / TT), (unsigned)((C + COB - 1) / COB), (unsigned)N);
  for (int l = 0; l < layers; ++l) {
    const long d = 1L << l;
    const size_t shm = sizeof(float) * (CK * (TT + 2 * d) + COB * CK * 3);
    if (shm > 48 * 1024) return 1;
    k_layer<<<grid, TT, shm, st>>>(src[l], (const float*)in[1 + 2 * l].data, (const float*)in[2 + 2 * l].data, dst[l],
                                   (int)C, L, (int)d);
  }
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
"""

CUDA_CUBLAS = r"""
#include <cublas_v2.h>

// Activations live in zero-margined rows (N, C, L + 2D), D = the largest dilation, so each
// tap k of a layer is the same buffer shifted by (k - 1) d: three strided-batched SGEMMs
// (one per tap, beta = 1 after the first) give conv(x) per sample without im2col.
__global__ void k_pad(const float* __restrict__ x, float* __restrict__ xp, long rows, long L, long D) {
  const long Lp = L + 2 * D;
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < rows * Lp; i += (long)gridDim.x * blockDim.x) {
    const long r = i / Lp, q = i % Lp - D;
    xp[i] = (q >= 0 && q < L) ? x[r * L + q] : 0.f;
  }
}

// wr[k][co][ci] = w[co][ci][k]
__global__ void k_repack(const float* __restrict__ w, float* __restrict__ wr, long C) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < 3 * C * C; i += (long)gridDim.x * blockDim.x) {
    const long k = i / (C * C), co = (i / C) % C, ci = i % C;
    wr[i] = w[(co * C + ci) * 3 + k];
  }
}

// y_out = x + gelu(acc + b); x is padded, y_out padded (ld Lp, offset D) or plain (ld L).
__global__ void k_epi(const float* __restrict__ acc, const float* __restrict__ xp, const float* __restrict__ b,
                      float* __restrict__ y, long rows, long C, long L, long D, int y_padded) {
  const long Lp = L + 2 * D;
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < rows * L; i += (long)gridDim.x * blockDim.x) {
    const long r = i / L, t = i % L;
    const float v = xp[r * Lp + D + t] + gelu(acc[i] + b[r % C]);
    if (y_padded) y[r * Lp + D + t] = v;
    else y[i] = v;
  }
}

static unsigned ew_grid(long tot) {
  long g = (tot + 255) / 256;
  return (unsigned)(g < 65536L * 16 ? g : 65536L * 16);
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  long N, C, L;
  int layers;
  if (get_args(in, n_in, out, n_out, N, C, L, layers)) return 1;
  const long tot = N * C * L;
  if (tot == 0) return 0;
  const long D = 1L << (layers - 1), Lp = L + 2 * D;
  if (Lp > 2147483647L || C > 46340 || N > 2147483647L) return 1;
  cudaStream_t st = (cudaStream_t)ctx->stream;
  cublasHandle_t h = (cublasHandle_t)ctx->cublas;
  const size_t pb = ((size_t)N * C * Lp * sizeof(float) + 255) & ~(size_t)255;
  const size_t ab = ((size_t)tot * sizeof(float) + 255) & ~(size_t)255;
  char* mem = (char*)ctx->scratch_alloc(ctx, 2 * pb + ab + sizeof(float) * 3 * C * C);
  if (!mem) return 2;
  float* pa = (float*)mem;
  float* pbuf = (float*)(mem + pb);
  float* acc = (float*)(mem + 2 * pb);
  float* wr = (float*)(mem + 2 * pb + ab);
  // both padded buffers need zero margins: pad x into pa, and zero pbuf once
  k_pad<<<ew_grid(N * C * Lp), 256, 0, st>>>((const float*)in[0].data, pa, N * C, L, D);
  if (cudaMemsetAsync(pbuf, 0, (size_t)N * C * Lp * sizeof(float), st) != cudaSuccess) return 3;
  const float one = 1.f, zero = 0.f;
  float* cur = pa;
  float* nxt = pbuf;
  for (int l = 0; l < layers; ++l) {
    const long d = 1L << l;
    k_repack<<<ew_grid(3 * C * C), 256, 0, st>>>((const float*)in[1 + 2 * l].data, wr, C);
    for (int k = 0; k < 3; ++k) {
      // column-major: acc_n^T (L x C, ld L) += shifted x_n^T (L x C, ld Lp) * wr[k]^T (C x C, ld C)
      if (cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, (int)L, (int)C, (int)C, &one,
                                    cur + D + (k - 1) * d, (int)Lp, (long long)C * Lp, wr + (long)k * C * C, (int)C, 0LL,
                                    k == 0 ? &zero : &one, acc, (int)L, (long long)C * L, (int)N) != CUBLAS_STATUS_SUCCESS)
        return 4;
    }
    const bool last = l == layers - 1;
    k_epi<<<ew_grid(tot), 256, 0, st>>>(acc, cur, (const float*)in[2 + 2 * l].data, last ? (float*)out[0].data : nxt,
                                        N * C, C, L, D, last ? 0 : 1);
    float* tmp = cur;
    cur = nxt;
    nxt = tmp;
  }
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
"""


def generate(header, indent):
    F = "composite"
    out = []

    def add(backend, variant, tech, body):
        out.append((backend, variant, F, tech, header(TASK, backend, F, variant, tech) + body))

    add("cpu", "naive",
        "Direct dilated convolution per output with per-tap bounds checks, single-threaded, residual GELU in the same loop.",
        CPU_COMMON + CPU_NAIVE)
    add("cpu", "omp_rows_axpy",
        "Output rows over OpenMP threads, each (input channel, tap) adds weight x the shifted input row with unit-stride SIMD, then the bias + GELU + residual pass.",
        CPU_COMMON + CPU_ROWAXPY)
    for cb, tc in ((4, 512), (8, 256)):
        add("cpu", f"omp_coblock{cb}_t{tc}",
            f"OpenMP tasks of {cb} output channels x {tc} time steps: each zero-padded input segment is loaded once and feeds {cb} L1-resident accumulator rows with SIMD, bias + GELU + residual fused in the write-out.",
            CPU_COMMON + CPU_COBLOCK.replace("@CB@", str(cb)).replace("@TC@", str(tc)))
    add("cuda", "naive_b256",
        "One thread per output element reading inputs and weights from global memory, bias + GELU + residual fused.",
        CUDA_COMMON + CUDA_PLAN + CUDA_NAIVE)
    for cob in (8, 16):
        add("cuda", f"smem_tiled_co{cob}",
            f"256-step x {cob}-channel register-blocked tiles with haloed input segments and weights staged in shared memory per 16-channel chunk, bias + GELU + residual fused.",
            CUDA_COMMON + CUDA_PLAN + CUDA_TILED.replace("@COB@", str(cob)))
    add("cuda", "cublas_shifted_sgemm",
        "Activations kept in zero-margined rows so each dilated tap is a shifted view: three strided-batched cuBLAS SGEMMs per layer accumulate the conv, then one fused bias + GELU + residual kernel.",
        CUDA_COMMON + CUDA_CUBLAS)
    return out
