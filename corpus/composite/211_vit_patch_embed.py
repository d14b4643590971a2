"""211_vit_patch_embed: ViT stem = Conv2d(3, D, 16, stride 16) as a patch GEMM, + pos, LayerNorm.

Inputs (task.json order): x [B,C,H,W], pos [1,P,D], patch.weight [D,C,KH,KW], patch.bias [D],
norm.weight [D], norm.bias [D]; output [B,P,D]. The convolution's stride equals its kernel,
so every output row m = (b, patch) is a dot product of one non-overlapping patch (K = C*KH*KW
values) with each filter row: a [M,K] x [K,D] GEMM with an im2col A, then a per-row
epilogue (bias + position, LayerNorm over D, eps 1e-5, biased variance).
"""

TASK = "211_vit_patch_embed"
FAMILY = "composite"

# --------------------------------------------------------------------------------------
# CPU
# --------------------------------------------------------------------------------------
# Argument checks and unpacking, the same in the CPU and the CUDA sources.
ARGS = r"""struct PE {
  const float* x;
  const float* pos;
  const float* w;
  const float* bias;
  const float* g;
  const float* beta;
  float* y;
  long B, C, H, W, KH, KW, PH, PW, P, D, K, M;
};

static int pe_parse(const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out, PE& p) {
  if (n_in != 6 || n_out != 1) return 1;
  for (int i = 0; i < 6; ++i)
    if (in[i].dtype != kf::KF_FLOAT32) return 1;
  if (out[0].dtype != kf::KF_FLOAT32) return 1;
  const kf::Tensor& x = in[0];
  const kf::Tensor& pos = in[1];
  const kf::Tensor& w = in[2];
  if (x.ndim != 4 || pos.ndim != 3 || w.ndim != 4 || in[3].ndim != 1 || in[4].ndim != 1 || in[5].ndim != 1 ||
      out[0].ndim != 3)
    return 1;
  p.B = x.shape[0]; p.C = x.shape[1]; p.H = x.shape[2]; p.W = x.shape[3];
  p.D = w.shape[0]; p.KH = w.shape[2]; p.KW = w.shape[3];
  if (w.shape[1] != p.C || p.KH <= 0 || p.KW <= 0 || p.H < p.KH || p.W < p.KW) return 1;
  p.PH = (p.H - p.KH) / p.KH + 1;  // stride == kernel size
  p.PW = (p.W - p.KW) / p.KW + 1;
  p.P = p.PH * p.PW;
  p.K = p.C * p.KH * p.KW;
  p.M = p.B * p.P;
  if (pos.shape[0] != 1 || pos.shape[1] != p.P || pos.shape[2] != p.D) return 1;
  if (in[3].shape[0] != p.D || in[4].shape[0] != p.D || in[5].shape[0] != p.D) return 1;
  if (out[0].shape[0] != p.B || out[0].shape[1] != p.P || out[0].shape[2] != p.D) return 1;
  p.x = static_cast<const float*>(in[0].data);
  p.pos = static_cast<const float*>(in[1].data);
  p.w = static_cast<const float*>(in[2].data);
  p.bias = static_cast<const float*>(in[3].data);
  p.g = static_cast<const float*>(in[4].data);
  p.beta = static_cast<const float*>(in[5].data);
  p.y = static_cast<float*>(out[0].data);
  return 0;
}
"""

CPU_COMMON = r"""
#include <omp.h>

""" + ARGS + r"""
// Copies the patch of output row m (K values, ordered c, ky, kx like the filter) to a.
static inline void pe_patch(const PE& p, long m, float* a) {
  const long b = m / p.P, pp = m % p.P, py = pp / p.PW, px = pp % p.PW;
  for (long c = 0; c < p.C; ++c)
    for (long ky = 0; ky < p.KH; ++ky) {
      const float* src = p.x + ((b * p.C + c) * p.H + py * p.KH + ky) * p.W + px * p.KW;
      float* dst = a + (c * p.KH + ky) * p.KW;
      for (long kx = 0; kx < p.KW; ++kx) dst[kx] = src[kx];
    }
}

// y holds the raw convolution sums of row m: add bias and position, then LayerNorm in place.
static inline void pe_finish_row(const PE& p, long m, float* y) {
  const float* pr = p.pos + (m % p.P) * p.D;
  float s = 0.f;
  for (long d = 0; d < p.D; ++d) {
    const float v = y[d] + p.bias[d] + pr[d];
    y[d] = v;
    s += v;
  }
  const float mean = s / (float)p.D;
  float q = 0.f;
  for (long d = 0; d < p.D; ++d) {
    const float t = y[d] - mean;
    q += t * t;
  }
  const float rs = 1.f / sqrtf(q / (float)p.D + 1e-5f);
  for (long d = 0; d < p.D; ++d) y[d] = (y[d] - mean) * rs * p.g[d] + p.beta[d];
}
"""

CPU_NAIVE = r"""
extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  (void)ctx;
  PE p;
  if (int rc = pe_parse(in, n_in, out, n_out, p)) return rc;
  for (long m = 0; m < p.M; ++m) {
    const long b = m / p.P, pp = m % p.P, py = pp / p.PW, px = pp % p.PW;
    float* y = p.y + m * p.D;
    for (long d = 0; d < p.D; ++d) {
      float acc = 0.f;
      for (long c = 0; c < p.C; ++c)
        for (long ky = 0; ky < p.KH; ++ky)
          for (long kx = 0; kx < p.KW; ++kx)
            acc += p.w[((d * p.C + c) * p.KH + ky) * p.KW + kx] *
                   p.x[((b * p.C + c) * p.H + py * p.KH + ky) * p.W + px * p.KW + kx];
      y[d] = acc;
    }
    pe_finish_row(p, m, y);
  }
  return 0;
}
"""

CPU_ROWDOT = r"""
extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  PE p;
  if (int rc = pe_parse(in, n_in, out, n_out, p)) return rc;
  if (p.M == 0 || p.D == 0) return 0;
  const int nt = ctx->num_threads > 0 ? ctx->num_threads : 1;
  float* buf = static_cast<float*>(ctx->scratch_alloc(ctx, sizeof(float) * (size_t)nt * (size_t)p.K));
  if (!buf) return 2;
#pragma omp parallel for schedule(static) num_threads(nt)
  for (long m = 0; m < p.M; ++m) {
    float* a = buf + (long)omp_get_thread_num() * p.K;
    pe_patch(p, m, a);  // contiguous patch: both dot-product operands are unit-stride
    float* y = p.y + m * p.D;
    for (long d = 0; d < p.D; ++d) {
      const float* wr = p.w + d * p.K;
      float acc = 0.f;
#pragma omp simd reduction(+ : acc)
      for (long k = 0; k < p.K; ++k) acc += wr[k] * a[k];
      y[d] = acc;
    }
    pe_finish_row(p, m, y);
  }
  ctx->scratch_free(ctx, buf);
  return 0;
}
"""

CPU_GEMM = r"""
extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  PE p;
  if (int rc = pe_parse(in, n_in, out, n_out, p)) return rc;
  if (p.M == 0 || p.D == 0) return 0;
  const int nt = ctx->num_threads > 0 ? ctx->num_threads : 1;
  float* A = static_cast<float*>(ctx->scratch_alloc(ctx, sizeof(float) * (size_t)p.M * (size_t)p.K));
  float* Wt = static_cast<float*>(ctx->scratch_alloc(ctx, sizeof(float) * (size_t)p.K * (size_t)p.D));
  if (!A || !Wt) return 2;
#pragma omp parallel num_threads(nt)
  {
#pragma omp for schedule(static) nowait
    for (long m = 0; m < p.M; ++m) pe_patch(p, m, A + m * p.K);  // im2col
#pragma omp for schedule(static)
    for (long k = 0; k < p.K; ++k)
      for (long d = 0; d < p.D; ++d) Wt[k * p.D + d] = p.w[d * p.K + k];  // filters as [K, D]
  }
  const long BI = __BI__, BK = __BK__;
  const long nblk = (p.M + BI - 1) / BI;
#pragma omp parallel for schedule(dynamic) num_threads(nt)
  for (long blk = 0; blk < nblk; ++blk) {
    const long i0 = blk * BI, i1 = i0 + BI < p.M ? i0 + BI : p.M;
    for (long i = i0; i < i1; ++i)
      for (long d = 0; d < p.D; ++d) p.y[i * p.D + d] = 0.f;
    for (long k0 = 0; k0 < p.K; k0 += BK) {
      const long k1 = k0 + BK < p.K ? k0 + BK : p.K;
      long i = i0;
      for (; i + 4 <= i1; i += 4) {  // four output rows per streamed row of Wt
        float* y0 = p.y + i * p.D;
        float* y1 = y0 + p.D;
        float* y2 = y1 + p.D;
        float* y3 = y2 + p.D;
        const float* a = A + i * p.K;
        for (long k = k0; k < k1; ++k) {
          const float a0 = a[k], a1 = a[p.K + k], a2 = a[2 * p.K + k], a3 = a[3 * p.K + k];
          const float* wr = Wt + k * p.D;
#pragma omp simd
          for (long d = 0; d < p.D; ++d) {
            const float wv = wr[d];
            y0[d] += a0 * wv;
            y1[d] += a1 * wv;
            y2[d] += a2 * wv;
            y3[d] += a3 * wv;
          }
        }
      }
      for (; i < i1; ++i) {
        float* yr = p.y + i * p.D;
        const float* a = A + i * p.K;
        for (long k = k0; k < k1; ++k) {
          const float av = a[k];
          const float* wr = Wt + k * p.D;
#pragma omp simd
          for (long d = 0; d < p.D; ++d) yr[d] += av * wr[d];
        }
      }
    }
    for (long i = i0; i < i1; ++i) pe_finish_row(p, i, p.y + i * p.D);  // fused while the rows are hot
  }
  ctx->scratch_free(ctx, Wt);
  ctx->scratch_free(ctx, A);
  return 0;
}
"""

# --------------------------------------------------------------------------------------
# CUDA
# --------------------------------------------------------------------------------------
CUDA_COMMON = r"""
""" + ARGS + r"""
// Offset in x of element k (= c, ky, kx) of a patch whose top-left element is at `base`.
static KF_HD long pe_koff(const PE& p, long k) {
  const long khw = p.KH * p.KW;
  const long c = k / khw, r = k - c * khw, ky = r / p.KW, kx = r - ky * p.KW;
  return (c * p.H + ky) * p.W + kx;
}
static KF_HD long pe_base(const PE& p, long m) {
  const long b = m / p.P, pp = m - b * p.P, py = pp / p.PW, px = pp - py * p.PW;
  return (b * p.C * p.H + py * p.KH) * p.W + px * p.KW;
}

// Deterministic block sum (fixed tree); every thread gets the total.
template <int NT>
static KF_HD float block_sum(float v, float* red) {
  red[threadIdx.x] = v;
  __syncthreads();
#pragma unroll
  for (int s = NT / 2; s > 0; s >>= 1) {
    if ((int)threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
    __syncthreads();
  }
  const float r = red[0];
  __syncthreads();
  return r;
}

// One block per output row: y = LayerNorm(conv + bias + pos), in place.
template <int NT>
__global__ void __launch_bounds__(NT) k_finish(PE p) {
  __shared__ float red[NT];
  const long m = blockIdx.x;
  float* y = p.y + m * p.D;
  const float* pr = p.pos + (m % p.P) * p.D;
  float s = 0.f;
  for (long d = threadIdx.x; d < p.D; d += NT) {
    const float v = y[d] + p.bias[d] + pr[d];
    y[d] = v;
    s += v;
  }
  const float mean = block_sum<NT>(s, red) / (float)p.D;
  float q = 0.f;
  for (long d = threadIdx.x; d < p.D; d += NT) {
    const float t = y[d] - mean;
    q += t * t;
  }
  const float rs = rsqrtf(block_sum<NT>(q, red) / (float)p.D + 1e-5f);
  for (long d = threadIdx.x; d < p.D; d += NT) y[d] = (y[d] - mean) * rs * p.g[d] + p.beta[d];
}
"""

CUDA_NAIVE = r"""
// One thread per output element: the whole K-long dot product straight from x and the filters.
__global__ void k_conv(PE p) {
  const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= p.M * p.D) return;
  const long m = idx / p.D, d = idx - m * p.D;
  const long base = pe_base(p, m);
  const float* wr = p.w + d * p.K;
  float acc = 0.f;
  for (long k = 0; k < p.K; ++k) acc += wr[k] * p.x[base + pe_koff(p, k)];
  p.y[idx] = acc;
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  PE p;
  if (int rc = pe_parse(in, n_in, out, n_out, p)) return rc;
  if (p.M == 0 || p.D == 0) return 0;
  cudaStream_t st = static_cast<cudaStream_t>(ctx->stream);
  const long n = p.M * p.D;
  k_conv<<<(unsigned)((n + __NB__ - 1) / __NB__), __NB__, 0, st>>>(p);
  k_finish<256><<<(unsigned)p.M, 256, 0, st>>>(p);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
"""

CUDA_TILED = r"""
// T x T output tile per block; A (the im2col patch rows, gathered on the fly from x) and the
// filter rows are staged through shared memory T values of K at a time.
template <int T>
__global__ void __launch_bounds__(T * T) k_conv(PE p) {
  __shared__ float As[T][T + 1];  // As[row][k]
  __shared__ float Ws[T][T + 1];  // Ws[filter][k]
  const int tx = threadIdx.x, ty = threadIdx.y;
  const long m0 = (long)blockIdx.x * T, n0 = (long)blockIdx.y * T;
  const long ma = m0 + ty, nw = n0 + ty;  // row of A and filter this thread loads
  const long abase = ma < p.M ? pe_base(p, ma) : 0;
  float acc = 0.f;
  for (long k0 = 0; k0 < p.K; k0 += T) {
    const long k = k0 + tx;
    float av = 0.f, wv = 0.f;
    if (k < p.K) {
      if (ma < p.M) av = p.x[abase + pe_koff(p, k)];
      if (nw < p.D) wv = p.w[nw * p.K + k];
    }
    As[ty][tx] = av;
    Ws[ty][tx] = wv;
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < T; ++kk) acc += As[ty][kk] * Ws[tx][kk];
    __syncthreads();
  }
  const long m = m0 + ty, n = n0 + tx;
  if (m < p.M && n < p.D) p.y[m * p.D + n] = acc;
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  PE p;
  if (int rc = pe_parse(in, n_in, out, n_out, p)) return rc;
  if (p.M == 0 || p.D == 0) return 0;
  cudaStream_t st = static_cast<cudaStream_t>(ctx->stream);
  const int T = __T__;
  dim3 grid((unsigned)((p.M + T - 1) / T), (unsigned)((p.D + T - 1) / T));
  k_conv<T><<<grid, dim3(T, T), 0, st>>>(p);
  k_finish<256><<<(unsigned)p.M, 256, 0, st>>>(p);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
"""

CUDA_REGBLOCK = r"""
// 64 x 64 output tile per 256-thread block, K in slices of 16 through shared memory; each
// thread keeps a 4 x 4 register tile, so every shared-memory value feeds 4 FMAs.
__global__ void __launch_bounds__(256) k_conv(PE p) {
  __shared__ float As[16][64 + 4];  // As[k][row]
  __shared__ float Ws[16][64 + 4];  // Ws[k][filter]
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const long m0 = (long)blockIdx.x * 64, n0 = (long)blockIdx.y * 64;
  // Loader role: this thread fills k column `kl` of rows lr + 16 q, q = 0..3.
  const int kl = tid % 16, lr = tid / 16;
  long abase[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const long m = m0 + lr + 16 * q;
    abase[q] = m < p.M ? pe_base(p, m) : -1;
  }
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;
  for (long k0 = 0; k0 < p.K; k0 += 16) {
    const long k = k0 + kl;
    const bool kin = k < p.K;
    const long koff = kin ? pe_koff(p, k) : 0;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int r = lr + 16 * q;
      As[kl][r] = (kin && abase[q] >= 0) ? p.x[abase[q] + koff] : 0.f;
      const long n = n0 + r;
      Ws[kl][r] = (kin && n < p.D) ? p.w[n * p.K + k] : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < 16; ++kk) {
      float av[4], wv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) av[i] = As[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) wv[j] = Ws[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * wv[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const long m = m0 + ty + 16 * i, n = n0 + tx + 16 * j;
      if (m < p.M && n < p.D) p.y[m * p.D + n] = acc[i][j];
    }
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  PE p;
  if (int rc = pe_parse(in, n_in, out, n_out, p)) return rc;
  if (p.M == 0 || p.D == 0) return 0;
  cudaStream_t st = static_cast<cudaStream_t>(ctx->stream);
  dim3 grid((unsigned)((p.M + 63) / 64), (unsigned)((p.D + 63) / 64));
  k_conv<<<grid, 256, 0, st>>>(p);
  k_finish<256><<<(unsigned)p.M, 256, 0, st>>>(p);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
"""

CUDA_CUBLAS = r"""
#include <cublas_v2.h>

// im2col: A[m][k] = patch element k of output row m (one thread per element, coalesced writes).
__global__ void k_im2col(PE p, float* A) {
  const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= p.M * p.K) return;
  const long m = idx / p.K, k = idx - m * p.K;
  A[idx] = p.x[pe_base(p, m) + pe_koff(p, k)];
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  PE p;
  if (int rc = pe_parse(in, n_in, out, n_out, p)) return rc;
  if (p.M == 0 || p.D == 0) return 0;
  if (p.M > 2147483647L || p.K > 2147483647L || p.D > 2147483647L) return 1;
  cudaStream_t st = static_cast<cudaStream_t>(ctx->stream);
  cublasHandle_t h = static_cast<cublasHandle_t>(ctx->cublas);
  // Scratch is released by the harness after the call (after the stream has drained).
  float* A = static_cast<float*>(ctx->scratch_alloc(ctx, sizeof(float) * (size_t)p.M * (size_t)p.K));
  if (!A) return 2;
  const long n = p.M * p.K;
  k_im2col<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(p, A);
  if (cudaGetLastError() != cudaSuccess) return 1;
  // Row-major Y[M,D] = A[M,K] * Wf[D,K]^T, i.e. column-major Y^T[D,M] = Wf^T' * A^T.
  const float one = 1.f, zero = 0.f;
  if (cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)p.D, (int)p.M, (int)p.K, &one, p.w, (int)p.K, A, (int)p.K, &zero,
                  p.y, (int)p.D) != CUBLAS_STATUS_SUCCESS)
    return 1;
  k_finish<__NT__><<<(unsigned)p.M, __NT__, 0, st>>>(p);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
"""


def generate(header, indent):
    ks = []

    def add(backend, variant, tech, common, body):
        ks.append((backend, variant, FAMILY, tech, header(TASK, backend, FAMILY, variant, tech) + common + body))

    add("cpu", "naive",
        "Single-threaded direct convolution: every output element is a K-long dot product read straight from the image and the filter, then bias, position and LayerNorm per row.",
        CPU_COMMON, CPU_NAIVE)
    add("cpu", "omp_rowdot",
        "Rows (image, patch) split over OpenMP threads; each thread copies its patch into a contiguous buffer so every filter dot product is a unit-stride `omp simd` reduction, and the bias, position and LayerNorm are fused into the same pass.",
        CPU_COMMON, CPU_ROWDOT)
    for bi, bk in ((32, 128), (64, 256)):
        add("cpu", f"omp_im2col_gemm_r4_{bi}x{bk}",
            f"im2col into scratch plus a transposed [K, D] filter, then an OpenMP GEMM over {bi}-row blocks with {bk}-deep K blocks that updates 4 output rows per streamed filter row (vectorised over D), with bias, position and LayerNorm fused on the still-cached rows.",
            CPU_COMMON, CPU_GEMM.replace("__BI__", str(bi)).replace("__BK__", str(bk)))

    add("cuda", "naive_b256",
        "One thread per output element computes the K-long patch dot product straight from global memory, then one 256-thread block per row adds bias and position and applies LayerNorm in place.",
        CUDA_COMMON, CUDA_NAIVE.replace("__NB__", "256"))
    for t in (16, 32):
        add("cuda", f"smem_tiled_t{t}",
            f"Implicit-GEMM patch convolution: {t}x{t} output tiles with the image patches (gathered on the fly, no im2col buffer) and filter rows staged in shared memory {t} K-values at a time, followed by a block-per-row bias + position + LayerNorm kernel.",
            CUDA_COMMON, CUDA_TILED.replace("__T__", str(t)))
    add("cuda", "regblock_64x64_4x4",
        "Implicit-GEMM patch convolution with 64x64 block tiles, 16-deep shared-memory K slices and a 4x4 register tile per thread (patch offsets precomputed per loader row), then a block-per-row bias + position + LayerNorm kernel.",
        CUDA_COMMON, CUDA_REGBLOCK)
    for nt in (128, 256):
        add("cuda", f"cublas_im2col_ln{nt}",
            f"im2col kernel into scratch and one cuBLAS SGEMM against the filter matrix for the convolution, then a fused {nt}-thread block-per-row kernel that adds bias and position and applies LayerNorm in place.",
            CUDA_COMMON, CUDA_CUBLAS.replace("__NT__", str(nt)))
    return ks
