"""202_transformer_block: pre-norm block, causal multi-head self-attention then a GELU MLP.

Inputs (task.json order): x [B,T,D], norm1.weight, norm1.bias [D], qkv.weight [3D,D],
qkv.bias [3D], proj.weight [D,D], proj.bias [D], norm2.weight, norm2.bias [D],
fc1.weight [F,D], fc1.bias [F], fc2.weight [D,F], fc2.bias [D] (F = 4D); output [B,T,D].
  h = LN1(x); q,k,v = split(h Wqkv^T + bqkv); a = causal softmax(q k^T / sqrt(hd)) v per head;
  x1 = x + a Wp^T + bp; y = x1 + gelu(LN2(x1) W1^T + b1) W2^T + b2 (exact erf GELU, eps 1e-5).
The head count is a constructor argument that no tensor carries: the suite uses a head
dimension of 64 at every size (256/4 on CPU, 1024/16 on CUDA), so heads = D / 64.
"""

TASK = "202_transformer_block"
FAMILY = "composite"

PARSE = r"""
struct TB {
  const float* x;
  const float* g1;
  const float* be1;
  const float* wqkv;
  const float* bqkv;
  const float* wp;
  const float* bp;
  const float* g2;
  const float* be2;
  const float* w1;
  const float* b1;
  const float* w2;
  const float* b2;
  float* y;
  long B, T, D, H, HD, M, F;
};

static const long kHeadDim = 64;  // heads = D / 64 (see the task: 256/4 and 1024/16)

static int tb_parse(const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out, TB& p) {
  if (n_in != 13 || n_out != 1) return 1;
  for (int i = 0; i < 13; ++i)
    if (in[i].dtype != kf::KF_FLOAT32) return 1;
  if (out[0].dtype != kf::KF_FLOAT32 || in[0].ndim != 3 || out[0].ndim != 3) return 1;
  p.B = in[0].shape[0]; p.T = in[0].shape[1]; p.D = in[0].shape[2];
  p.F = in[9].shape[0];
  p.HD = kHeadDim;
  if (p.D % p.HD != 0) return 1;
  p.H = p.D / p.HD;
  p.M = p.B * p.T;
  const long D = p.D, F = p.F;
  const long want[13][2] = {{0, 0}, {D, 0}, {D, 0}, {3 * D, D}, {3 * D, 0}, {D, D}, {D, 0},
                            {D, 0}, {D, 0}, {F, D}, {F, 0}, {D, F}, {D, 0}};
  for (int i = 1; i < 13; ++i) {
    const int nd = want[i][1] ? 2 : 1;
    if (in[i].ndim != nd || in[i].shape[0] != want[i][0] || (nd == 2 && in[i].shape[1] != want[i][1])) return 1;
  }
  for (int i = 0; i < 3; ++i)
    if (out[0].shape[i] != in[0].shape[i]) return 1;
  p.x = static_cast<const float*>(in[0].data);
  p.g1 = static_cast<const float*>(in[1].data);
  p.be1 = static_cast<const float*>(in[2].data);
  p.wqkv = static_cast<const float*>(in[3].data);
  p.bqkv = static_cast<const float*>(in[4].data);
  p.wp = static_cast<const float*>(in[5].data);
  p.bp = static_cast<const float*>(in[6].data);
  p.g2 = static_cast<const float*>(in[7].data);
  p.be2 = static_cast<const float*>(in[8].data);
  p.w1 = static_cast<const float*>(in[9].data);
  p.b1 = static_cast<const float*>(in[10].data);
  p.w2 = static_cast<const float*>(in[11].data);
  p.b2 = static_cast<const float*>(in[12].data);
  p.y = static_cast<float*>(out[0].data);
  return 0;
}

// Epilogue modes of every GEMM C = A W^T + bias: plain, + residual, GELU.
enum { EPI_BIAS = 0, EPI_RES = 1, EPI_GELU = 2 };
static KF_HD float gelu_f(float z) { return 0.5f * z * (1.f + erff(z * 0.70710678118654752f)); }
static KF_HD float epi_f(int mode, float v, const float* res, long idx) {
  return mode == EPI_GELU ? gelu_f(v) : (mode == EPI_RES ? v + res[idx] : v);
}
"""

# --------------------------------------------------------------------------------------
# CPU
# --------------------------------------------------------------------------------------
CPU_COMMON = r"""
#include <omp.h>
""" + PARSE + r"""
static void ln_row(const float* x, float* y, const float* g, const float* b, long D) {
  float s = 0.f;
  for (long d = 0; d < D; ++d) s += x[d];
  const float mean = s / (float)D;
  float q = 0.f;
  for (long d = 0; d < D; ++d) {
    const float t = x[d] - mean;
    q += t * t;
  }
  const float rs = 1.f / sqrtf(q / (float)D + 1e-5f);
  for (long d = 0; d < D; ++d) y[d] = (x[d] - mean) * rs * g[d] + b[d];
}

// Causal attention of query row i of head h in sequence b; qkv rows are [q | k | v], out row
// slice a[.., h*HD .. +HD]. sc: T floats of workspace.
static void attn_row(const TB& p, const float* qkv, float* a, long b, long h, long i, float* sc) {
  const long ld = 3 * p.D;
  const float* q = qkv + (b * p.T + i) * ld + h * p.HD;
  const float* kb = qkv + b * p.T * ld + p.D + h * p.HD;
  const float* vb = qkv + b * p.T * ld + 2 * p.D + h * p.HD;
  const float scale = 1.f / sqrtf((float)p.HD);
  float mx = -INFINITY;
  for (long j = 0; j <= i; ++j) {
    const float* k = kb + j * ld;
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (long d = 0; d < p.HD; ++d) s += q[d] * k[d];
    sc[j] = s * scale;
    mx = sc[j] > mx ? sc[j] : mx;
  }
  float sum = 0.f;
  for (long j = 0; j <= i; ++j) {
    sc[j] = expf(sc[j] - mx);
    sum += sc[j];
  }
  const float inv = 1.f / sum;
  float* o = a + (b * p.T + i) * p.D + h * p.HD;
  for (long d = 0; d < p.HD; ++d) o[d] = 0.f;
  for (long j = 0; j <= i; ++j) {
    const float w = sc[j] * inv;
    const float* v = vb + j * ld;
#pragma omp simd
    for (long d = 0; d < p.HD; ++d) o[d] += w * v[d];
  }
}

static int run_gemm(kf::Context* ctx, const float* A, long M, long K, const float* W, long N, const float* bias,
                    int mode, const float* res, float* C);

// The whole block on top of run_gemm; scratch: LN output, qkv, attention output, x1, MLP hidden.
static int tb_forward(kf::Context* ctx, const TB& p, bool parallel) {
  const int nt = ctx->num_threads > 0 ? ctx->num_threads : 1;
  const size_t nf = (size_t)p.M * (size_t)(p.D + 3 * p.D + p.D + p.D + p.F) + (size_t)nt * (size_t)p.T;
  float* buf = static_cast<float*>(ctx->scratch_alloc(ctx, sizeof(float) * nf));
  if (!buf) return 2;
  float* hb = buf;
  float* qkv = hb + p.M * p.D;
  float* att = qkv + p.M * 3 * p.D;
  float* x1 = att + p.M * p.D;
  float* f = x1 + p.M * p.D;
  float* sc = f + p.M * p.F;
  const int nth = parallel ? nt : 1;
  int rc = 0;
#pragma omp parallel for schedule(static) num_threads(nth)
  for (long m = 0; m < p.M; ++m) ln_row(p.x + m * p.D, hb + m * p.D, p.g1, p.be1, p.D);
  if ((rc = run_gemm(ctx, hb, p.M, p.D, p.wqkv, 3 * p.D, p.bqkv, EPI_BIAS, nullptr, qkv))) return rc;
  const long nrows = p.B * p.H * p.T;
#pragma omp parallel for schedule(dynamic, 16) num_threads(nth)
  for (long r = 0; r < nrows; ++r) {
    const long i = r % p.T, bh = r / p.T;
    attn_row(p, qkv, att, bh / p.H, bh % p.H, i, sc + (long)omp_get_thread_num() * p.T);
  }
  if ((rc = run_gemm(ctx, att, p.M, p.D, p.wp, p.D, p.bp, EPI_RES, p.x, x1))) return rc;
#pragma omp parallel for schedule(static) num_threads(nth)
  for (long m = 0; m < p.M; ++m) ln_row(x1 + m * p.D, hb + m * p.D, p.g2, p.be2, p.D);
  if ((rc = run_gemm(ctx, hb, p.M, p.D, p.w1, p.F, p.b1, EPI_GELU, nullptr, f))) return rc;
  if ((rc = run_gemm(ctx, f, p.M, p.F, p.w2, p.D, p.b2, EPI_RES, x1, p.y))) return rc;
  ctx->scratch_free(ctx, buf);
  return 0;
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  TB p;
  if (int rc = tb_parse(in, n_in, out, n_out, p)) return rc;
  if (p.M == 0) return 0;
  return tb_forward(ctx, p, TB_PARALLEL);
}
"""

CPU_GEMM_NAIVE = r"""
static int run_gemm(kf::Context* ctx, const float* A, long M, long K, const float* W, long N, const float* bias,
                    int mode, const float* res, float* C) {
  (void)ctx;
  for (long m = 0; m < M; ++m)
    for (long n = 0; n < N; ++n) {
      float acc = 0.f;
      for (long k = 0; k < K; ++k) acc += A[m * K + k] * W[n * K + k];
      C[m * N + n] = epi_f(mode, acc + bias[n], res, m * N + n);
    }
  return 0;
}
"""

CPU_GEMM_ROWDOT = r"""
static int run_gemm(kf::Context* ctx, const float* A, long M, long K, const float* W, long N, const float* bias,
                    int mode, const float* res, float* C) {
  const int nt = ctx->num_threads > 0 ? ctx->num_threads : 1;
#pragma omp parallel for collapse(2) schedule(static) num_threads(nt)
  for (long m = 0; m < M; ++m)
    for (long n = 0; n < N; ++n) {
      const float* ar = A + m * K;
      const float* wr = W + n * K;
      float acc = 0.f;
#pragma omp simd reduction(+ : acc)
      for (long k = 0; k < K; ++k) acc += ar[k] * wr[k];
      C[m * N + n] = epi_f(mode, acc + bias[n], res, m * N + n);
    }
  return 0;
}
"""

CPU_GEMM_BLOCKED = r"""
// W^T once per call into scratch, then row blocks of BI over threads with K blocks of BK and
// 4 rows of C per streamed row of W^T (vectorised over N); epilogue on the finished rows.
static int run_gemm(kf::Context* ctx, const float* A, long M, long K, const float* W, long N, const float* bias,
                    int mode, const float* res, float* C) {
  const int nt = ctx->num_threads > 0 ? ctx->num_threads : 1;
  float* Wt = static_cast<float*>(ctx->scratch_alloc(ctx, sizeof(float) * (size_t)K * (size_t)N));
  if (!Wt) return 2;
#pragma omp parallel for schedule(static) num_threads(nt)
  for (long k = 0; k < K; ++k)
    for (long n = 0; n < N; ++n) Wt[k * N + n] = W[n * K + k];
  const long BI = __BI__, BK = __BK__;
  const long nblk = (M + BI - 1) / BI;
#pragma omp parallel for schedule(dynamic) num_threads(nt)
  for (long blk = 0; blk < nblk; ++blk) {
    const long i0 = blk * BI, i1 = i0 + BI < M ? i0 + BI : M;
    for (long i = i0; i < i1; ++i)
      for (long n = 0; n < N; ++n) C[i * N + n] = bias[n];
    for (long k0 = 0; k0 < K; k0 += BK) {
      const long k1 = k0 + BK < K ? k0 + BK : K;
      long i = i0;
      for (; i + 4 <= i1; i += 4) {
        float* c0 = C + i * N;
        float* c1 = c0 + N;
        float* c2 = c1 + N;
        float* c3 = c2 + N;
        const float* a = A + i * K;
        for (long k = k0; k < k1; ++k) {
          const float a0 = a[k], a1 = a[K + k], a2 = a[2 * K + k], a3 = a[3 * K + k];
          const float* wr = Wt + k * N;
#pragma omp simd
          for (long n = 0; n < N; ++n) {
            const float wv = wr[n];
            c0[n] += a0 * wv;
            c1[n] += a1 * wv;
            c2[n] += a2 * wv;
            c3[n] += a3 * wv;
          }
        }
      }
      for (; i < i1; ++i) {
        float* cr = C + i * N;
        const float* a = A + i * K;
        for (long k = k0; k < k1; ++k) {
          const float av = a[k];
          const float* wr = Wt + k * N;
#pragma omp simd
          for (long n = 0; n < N; ++n) cr[n] += av * wr[n];
        }
      }
    }
    if (mode != EPI_BIAS)
      for (long i = i0; i < i1; ++i)
        for (long n = 0; n < N; ++n) C[i * N + n] = epi_f(mode, C[i * N + n], res, i * N + n);
  }
  ctx->scratch_free(ctx, Wt);
  return 0;
}
"""

# --------------------------------------------------------------------------------------
# CUDA
# --------------------------------------------------------------------------------------
CUDA_COMMON = PARSE + r"""
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

// LayerNorm, one block per row (two-pass mean / biased variance, fixed reduction tree).
template <int NT>
__global__ void __launch_bounds__(NT) k_ln(const float* x, float* y, const float* g, const float* b, long D) {
  __shared__ float red[NT];
  const float* xr = x + (long)blockIdx.x * D;
  float* yr = y + (long)blockIdx.x * D;
  float s = 0.f;
  for (long d = threadIdx.x; d < D; d += NT) s += xr[d];
  const float mean = block_sum<NT>(s, red) / (float)D;
  float q = 0.f;
  for (long d = threadIdx.x; d < D; d += NT) {
    const float t = xr[d] - mean;
    q += t * t;
  }
  const float rs = rsqrtf(block_sum<NT>(q, red) / (float)D + 1e-5f);
  for (long d = threadIdx.x; d < D; d += NT) yr[d] = (xr[d] - mean) * rs * g[d] + b[d];
}

static int run_gemm(kf::Context* ctx, const float* A, long M, long K, const float* W, long N, const float* bias,
                    int mode, const float* res, float* C);
static int run_attn(kf::Context* ctx, const TB& p, const float* qkv, float* att);

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  TB p;
  if (int rc = tb_parse(in, n_in, out, n_out, p)) return rc;
  if (p.M == 0) return 0;
  cudaStream_t st = static_cast<cudaStream_t>(ctx->stream);
  const size_t nf = (size_t)p.M * (size_t)(p.D + 3 * p.D + p.D + p.D + p.F);
  // Scratch is released by the harness after the call, once the stream has drained.
  float* buf = static_cast<float*>(ctx->scratch_alloc(ctx, sizeof(float) * nf));
  if (!buf) return 2;
  float* hb = buf;
  float* qkv = hb + p.M * p.D;
  float* att = qkv + p.M * 3 * p.D;
  float* x1 = att + p.M * p.D;
  float* f = x1 + p.M * p.D;
  int rc = 0;
  k_ln<256><<<(unsigned)p.M, 256, 0, st>>>(p.x, hb, p.g1, p.be1, p.D);
  if (cudaGetLastError() != cudaSuccess) return 1;
  if ((rc = run_gemm(ctx, hb, p.M, p.D, p.wqkv, 3 * p.D, p.bqkv, EPI_BIAS, nullptr, qkv))) return rc;
  if ((rc = run_attn(ctx, p, qkv, att))) return rc;
  if ((rc = run_gemm(ctx, att, p.M, p.D, p.wp, p.D, p.bp, EPI_RES, p.x, x1))) return rc;
  k_ln<256><<<(unsigned)p.M, 256, 0, st>>>(x1, hb, p.g2, p.be2, p.D);
  if (cudaGetLastError() != cudaSuccess) return 1;
  if ((rc = run_gemm(ctx, hb, p.M, p.D, p.w1, p.F, p.b1, EPI_GELU, nullptr, f))) return rc;
  if ((rc = run_gemm(ctx, f, p.M, p.F, p.w2, p.D, p.b2, EPI_RES, x1, p.y))) return rc;
  return 0;
}
"""

CUDA_GEMM_NAIVE = r"""
// One thread per element of C.
__global__ void k_gemm(const float* A, const float* W, const float* bias, const float* res, float* C, long M, long N,
                       long K, int mode) {
  const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= M * N) return;
  const long m = idx / N, n = idx - m * N;
  const float* ar = A + m * K;
  const float* wr = W + n * K;
  float acc = 0.f;
  for (long k = 0; k < K; ++k) acc += ar[k] * wr[k];
  C[idx] = epi_f(mode, acc + bias[n], res, idx);
}

static int run_gemm(kf::Context* ctx, const float* A, long M, long K, const float* W, long N, const float* bias,
                    int mode, const float* res, float* C) {
  const long n = M * N;
  k_gemm<<<(unsigned)((n + 255) / 256), 256, 0, static_cast<cudaStream_t>(ctx->stream)>>>(A, W, bias, res, C, M, N, K,
                                                                                           mode);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
"""

CUDA_GEMM_TILED = r"""
// T x T tile of C per block, A rows and W rows staged in shared memory T values of K at a time,
// bias / residual / GELU fused in the epilogue.
template <int T>
__global__ void __launch_bounds__(T * T) k_gemm(const float* A, const float* W, const float* bias, const float* res,
                                                float* C, long M, long N, long K, int mode) {
  __shared__ float As[T][T + 1];
  __shared__ float Ws[T][T + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const long m0 = (long)blockIdx.x * T, n0 = (long)blockIdx.y * T;
  const long ma = m0 + ty, nw = n0 + ty;
  float acc = 0.f;
  for (long k0 = 0; k0 < K; k0 += T) {
    const long k = k0 + tx;
    As[ty][tx] = (ma < M && k < K) ? A[ma * K + k] : 0.f;
    Ws[ty][tx] = (nw < N && k < K) ? W[nw * K + k] : 0.f;
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < T; ++kk) acc += As[ty][kk] * Ws[tx][kk];
    __syncthreads();
  }
  const long m = m0 + ty, n = n0 + tx;
  if (m < M && n < N) C[m * N + n] = epi_f(mode, acc + bias[n], res, m * N + n);
}

static int run_gemm(kf::Context* ctx, const float* A, long M, long K, const float* W, long N, const float* bias,
                    int mode, const float* res, float* C) {
  const int T = __T__;
  dim3 grid((unsigned)((M + T - 1) / T), (unsigned)((N + T - 1) / T));
  if (grid.y > 65535u) return 1;
  k_gemm<T><<<grid, dim3(T, T), 0, static_cast<cudaStream_t>(ctx->stream)>>>(A, W, bias, res, C, M, N, K, mode);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
"""

CUDA_GEMM_CUBLAS = r"""
#include <cublas_v2.h>

// In place over the GEMM result: + bias, then + residual or GELU.
__global__ void k_epi(float* C, const float* bias, const float* res, long M, long N, int mode) {
  const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= M * N) return;
  C[idx] = epi_f(mode, C[idx] + bias[idx % N], res, idx);
}

static int run_gemm(kf::Context* ctx, const float* A, long M, long K, const float* W, long N, const float* bias,
                    int mode, const float* res, float* C) {
  if (M > 2147483647L || N > 2147483647L || K > 2147483647L) return 1;
  cublasHandle_t h = static_cast<cublasHandle_t>(ctx->cublas);
  // Row-major C[M,N] = A[M,K] W[N,K]^T  ==  column-major C^T = op_T(W^T) * A^T.
  const float one = 1.f, zero = 0.f;
  if (cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)M, (int)K, &one, W, (int)K, A, (int)K, &zero, C, (int)N) !=
      CUBLAS_STATUS_SUCCESS)
    return 1;
  const long n = M * N;
  k_epi<<<(unsigned)((n + 255) / 256), 256, 0, static_cast<cudaStream_t>(ctx->stream)>>>(C, bias, res, M, N, mode);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
"""

CUDA_ATTN_NAIVE = r"""
// One thread per (sequence, head, query): three passes over its keys (max, sum, weighted V),
// head dimension 64 held in registers.
__global__ void k_attn(const float* qkv, float* att, long B, long T, long D, long H) {
  const long r = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= B * H * T) return;
  const long i = r % T, bh = r / T, b = bh / H, h = bh % H;
  const long ld = 3 * D;
  const float* q = qkv + (b * T + i) * ld + h * 64;
  const float* kb = qkv + b * T * ld + D + h * 64;
  const float* vb = kb + D;
  float qr[64];
#pragma unroll
  for (int d = 0; d < 64; ++d) qr[d] = q[d] * 0.125f;  // 1/sqrt(64), exact
  float mx = -INFINITY;
  for (long j = 0; j <= i; ++j) {
    float s = 0.f;
#pragma unroll
    for (int d = 0; d < 64; ++d) s += qr[d] * kb[j * ld + d];
    mx = fmaxf(mx, s);
  }
  float acc[64];
#pragma unroll
  for (int d = 0; d < 64; ++d) acc[d] = 0.f;
  float sum = 0.f;
  for (long j = 0; j <= i; ++j) {
    float s = 0.f;
#pragma unroll
    for (int d = 0; d < 64; ++d) s += qr[d] * kb[j * ld + d];
    const float w = expf(s - mx);
    sum += w;
#pragma unroll
    for (int d = 0; d < 64; ++d) acc[d] += w * vb[j * ld + d];
  }
  const float inv = 1.f / sum;
  float* o = att + (b * T + i) * D + h * 64;
#pragma unroll
  for (int d = 0; d < 64; ++d) o[d] = acc[d] * inv;
}

static int run_attn(kf::Context* ctx, const TB& p, const float* qkv, float* att) {
  if (p.HD != 64) return 1;
  const long n = p.B * p.H * p.T;
  k_attn<<<(unsigned)((n + 127) / 128), 128, 0, static_cast<cudaStream_t>(ctx->stream)>>>(qkv, att, p.B, p.T, p.D, p.H);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
"""

CUDA_ATTN_FLASH = r"""
// Flash-style causal attention: a block owns 32 queries of one (sequence, head); 8 warps hold
// 4 queries each. Key/value tiles of 32 rows go through shared memory; lane l scores key l of
// the tile, the warp does an online-softmax update, and lane l accumulates output dims l, l+32.
__global__ void __launch_bounds__(256) k_attn(const float* qkv, float* att, long T, long D, long H) {
  __shared__ float Qs[32][64];
  __shared__ float Ks[32][65];
  __shared__ float Vs[32][64];
  const long bh = blockIdx.y, b = bh / H, h = bh % H;
  const long q0 = (long)blockIdx.x * 32;
  const long ld = 3 * D;
  const float* base = qkv + b * T * ld + h * 64;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  for (int e = tid; e < 32 * 64; e += 256) {
    const int r = e / 64, c = e % 64;
    const long i = q0 + r;
    Qs[r][c] = i < T ? base[i * ld + c] * 0.125f : 0.f;  // 1/sqrt(64), exact
  }
  float m[4], l[4], o0[4], o1[4];
#pragma unroll
  for (int qq = 0; qq < 4; ++qq) {
    m[qq] = -INFINITY;
    l[qq] = 0.f;
    o0[qq] = 0.f;
    o1[qq] = 0.f;
  }
  const long qlast = q0 + 31 < T - 1 ? q0 + 31 : T - 1;
  for (long k0 = 0; k0 <= qlast; k0 += 32) {
    __syncthreads();  // Qs ready / previous tile consumed
    for (int e = tid; e < 32 * 64; e += 256) {
      const int r = e / 64, c = e % 64;
      const long j = k0 + r;
      Ks[r][c] = j < T ? base[j * ld + D + c] : 0.f;
      Vs[r][c] = j < T ? base[j * ld + 2 * D + c] : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int qq = 0; qq < 4; ++qq) {
      const int r = warp * 4 + qq;
      const long i = q0 + r;
      if (i >= T || k0 > i) continue;  // warp-uniform
      const long j = k0 + lane;
      float s = -INFINITY;
      if (j <= i) {
        float t = 0.f;
#pragma unroll
        for (int d = 0; d < 64; ++d) t += Qs[r][d] * Ks[lane][d];
        s = t;
      }
      float tm = s;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, o));
      const float mn = fmaxf(m[qq], tm);  // finite: key k0 <= i is always valid
      const float corr = expf(m[qq] - mn);
      const float pj = j <= i ? expf(s - mn) : 0.f;
      float ps = pj;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, o);
      l[qq] = l[qq] * corr + ps;
      float a0 = o0[qq] * corr, a1 = o1[qq] * corr;
#pragma unroll 8
      for (int jj = 0; jj < 32; ++jj) {
        const float pw = __shfl_sync(0xffffffffu, pj, jj);
        a0 += pw * Vs[jj][lane];
        a1 += pw * Vs[jj][lane + 32];
      }
      o0[qq] = a0;
      o1[qq] = a1;
      m[qq] = mn;
    }
  }
#pragma unroll
  for (int qq = 0; qq < 4; ++qq) {
    const long i = q0 + warp * 4 + qq;
    if (i < T) {
      float* o = att + (b * T + i) * D + h * 64;
      const float inv = 1.f / l[qq];
      o[lane] = o0[qq] * inv;
      o[lane + 32] = o1[qq] * inv;
    }
  }
}

static int run_attn(kf::Context* ctx, const TB& p, const float* qkv, float* att) {
  if (p.HD != 64 || p.B * p.H > 65535) return 1;
  dim3 grid((unsigned)((p.T + 31) / 32), (unsigned)(p.B * p.H));
  k_attn<<<grid, 256, 0, static_cast<cudaStream_t>(ctx->stream)>>>(qkv, att, p.T, p.D, p.H);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
"""

CUDA_ATTN_BATCHED = r"""
// Causal softmax over the rows of the [H, T, T] score block of one sequence: block per row,
// entries above the diagonal set to 0 so the following P V GEMM can read full rows.
template <int NT>
__global__ void __launch_bounds__(NT) k_causal_softmax(float* S, long T) {
  __shared__ float red[NT];
  const long row = blockIdx.x, i = row % T;
  float* sr = S + row * T;
  float mx = -INFINITY;
  for (long j = threadIdx.x; j <= i; j += NT) mx = fmaxf(mx, sr[j]);
  red[threadIdx.x] = mx;
  __syncthreads();
#pragma unroll
  for (int s = NT / 2; s > 0; s >>= 1) {
    if ((int)threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
    __syncthreads();
  }
  mx = red[0];
  __syncthreads();
  float sum = 0.f;
  for (long j = threadIdx.x; j <= i; j += NT) {
    const float e = expf(sr[j] - mx);
    sr[j] = e;
    sum += e;
  }
  const float inv = 1.f / block_sum<NT>(sum, red);
  for (long j = threadIdx.x; j < T; j += NT) sr[j] = j <= i ? sr[j] * inv : 0.f;
}

// Per sequence: S_h = (Q_h / 8) K_h^T for all heads with one strided-batched SGEMM, causal
// softmax, then O_h = P_h V_h with a second strided-batched SGEMM written straight into att.
static int run_attn(kf::Context* ctx, const TB& p, const float* qkv, float* att) {
  if (p.HD != 64 || p.T > 2147483647L || 3 * p.D > 2147483647L) return 1;
  cudaStream_t st = static_cast<cudaStream_t>(ctx->stream);
  cublasHandle_t h = static_cast<cublasHandle_t>(ctx->cublas);
  float* S = static_cast<float*>(ctx->scratch_alloc(ctx, sizeof(float) * (size_t)p.H * (size_t)p.T * (size_t)p.T));
  if (!S) return 2;
  const int T = (int)p.T, ld = (int)(3 * p.D), hd = (int)p.HD;
  const float scale = 0.125f, one = 1.f, zero = 0.f;
  for (long b = 0; b < p.B; ++b) {
    const float* q = qkv + b * p.T * 3 * p.D;
    const float* k = q + p.D;
    const float* v = q + 2 * p.D;
    // column-major S^T (T x T) = op_T(K^T) * Q^T, i.e. row-major S[i][j] = q_i . k_j.
    if (cublasSgemmStridedBatched(h, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hd, &scale, k, ld, hd, q, ld, hd, &zero, S, T,
                                  (long long)p.T * p.T, (int)p.H) != CUBLAS_STATUS_SUCCESS)
      return 1;
    k_causal_softmax<__NT__><<<(unsigned)(p.H * p.T), __NT__, 0, st>>>(S, p.T);
    if (cudaGetLastError() != cudaSuccess) return 1;
    // column-major O^T (64 x T, ld D) = V^T (64 x T, ld 3D) * P^T (T x T, ld T).
    if (cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, hd, T, T, &one, v, ld, hd, S, T, (long long)p.T * p.T,
                                  &zero, att + b * p.T * p.D, (int)p.D, hd, (int)p.H) != CUBLAS_STATUS_SUCCESS)
      return 1;
  }
  return 0;
}
"""


def generate(header, indent):
    ks = []

    def add(backend, variant, tech, body):
        ks.append((backend, variant, FAMILY, tech, header(TASK, backend, FAMILY, variant, tech) + body))

    add("cpu", "naive",
        "Single-threaded scalar loops for the four linear layers (bias, residual and GELU applied per element), LayerNorm per row and a three-pass causal softmax attention per query.",
        "#define TB_PARALLEL false\n" + CPU_COMMON + CPU_GEMM_NAIVE)
    add("cpu", "omp_rowdot",
        "OpenMP everywhere: every linear layer as unit-stride `omp simd` dot products of activation rows with weight rows (collapsed over rows and outputs) with fused bias/residual/GELU, and attention split over (sequence, head, query) rows.",
        "#define TB_PARALLEL true\n" + CPU_COMMON + CPU_GEMM_ROWDOT)
    for bi, bk in ((32, 128), (64, 256)):
        add("cpu", f"omp_blocked_r4_{bi}x{bk}",
            f"Linear layers as cache-blocked GEMMs on a transposed weight ({bi}-row blocks over threads, {bk}-deep K blocks, 4 rows updated per streamed weight row, vectorised over outputs) with bias/residual/GELU fused on the finished rows; OpenMP attention per query row.",
            "#define TB_PARALLEL true\n" + CPU_COMMON + CPU_GEMM_BLOCKED.replace("__BI__", str(bi)).replace("__BK__", str(bk)))

    add("cuda", "naive_b256",
        "One thread per output element for every linear layer (fused bias/residual/GELU), block-per-row LayerNorm, and one thread per query running a three-pass causal softmax with the 64-wide head in registers.",
        CUDA_COMMON + CUDA_GEMM_NAIVE + CUDA_ATTN_NAIVE)
    for t in (16, 32):
        add("cuda", f"smem_tiled_t{t}_flash",
            f"{t}x{t} shared-memory tiled GEMMs with fused bias/residual/GELU epilogues, block-per-row LayerNorm, and flash-style causal attention (32-key K/V tiles in shared memory, warp per query, online softmax, fully masked tiles skipped).",
            CUDA_COMMON + CUDA_GEMM_TILED.replace("__T__", str(t)) + CUDA_ATTN_FLASH)
    add("cuda", "cublas_flash",
        "cuBLAS SGEMM for the four linear layers with a small in-place bias/residual/GELU epilogue kernel each, block-per-row LayerNorm, and flash-style causal attention with shared-memory K/V tiles and an online softmax (never materialises the T x T scores).",
        CUDA_COMMON + CUDA_GEMM_CUBLAS + CUDA_ATTN_FLASH)
    add("cuda", "cublas_batched_attn_b256",
        "cuBLAS for everything dense: SGEMMs for the linear layers plus epilogue kernels, and per sequence two strided-batched SGEMMs over the heads (Q K^T into a [H, T, T] scratch, then P V) around a block-per-row causal softmax.",
        CUDA_COMMON + CUDA_GEMM_CUBLAS + CUDA_ATTN_BATCHED.replace("__NT__", "256"))
    return ks
