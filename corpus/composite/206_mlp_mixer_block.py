"""206_mlp_mixer_block: MLP-Mixer block, x [B, T, D].

x1 = x + tok2(gelu(tok1(LN1(x)^T)))^T (token mixing over T), y = x1 + ch2(gelu(ch1(LN2(x1)))).
CPU and the hand-written CUDA GEMMs: LN1 writes its rows transposed ([B, D, T]) so the token
MLP is two ordinary A * W^T GEMMs; the second one's store writes back transposed with the
residual into y. CPU: naive loops / OpenMP rows with SIMD dot products / OpenMP cache-blocked
GEMM with 4-row register reuse; CUDA: one thread per output / shared-memory tiles /
register-blocked tiles / cuBLAS (token mixing as a strided-batched SGEMM with the weight on the
left, no transposes).
"""

TASK = "206_mlp_mixer_block"

# ------------------------------------------------------------------ CPU building blocks
CPU_GEMM_NAIVE = r"""
// C = A[M,K] * W[N,K]^T, each result handed to epi(i, j, acc); one dependent chain per output.
template <class E>
static int gemm_nt(kf::Context* ctx, const float* A, const float* W, long M, long N, long K, const E& epi) {
  (void)ctx;
  for (long i = 0; i < M; ++i)
    for (long j = 0; j < N; ++j) {
      float s = 0.f;
      for (long k = 0; k < K; ++k) s += A[i * K + k] * W[j * K + k];
      epi(i, j, s);
    }
  return 0;
}
"""

CPU_GEMM_DOT = r"""
// C = A[M,K] * W[N,K]^T: rows over cores, each output an `omp simd` dot product of two rows.
template <class E>
static int gemm_nt(kf::Context* ctx, const float* A, const float* W, long M, long N, long K, const E& epi) {
#pragma omp parallel for schedule(static) num_threads(ctx->num_threads)
  for (long i = 0; i < M; ++i) {
    const float* a = A + i * K;
    for (long j = 0; j < N; ++j) {
      const float* w = W + j * K;
      float s = 0.f;
#pragma omp simd reduction(+ : s)
      for (long k = 0; k < K; ++k) s += a[k] * w[k];
      epi(i, j, s);
    }
  }
  return 0;
}
"""

CPU_GEMM_BLOCKED = r"""
// C = A[M,K] * W[N,K]^T: W transposed once to Wt[K,N]; blocks of BI rows over cores, K in
// slices of BK, 4 rows of the accumulator block updated per streamed row of Wt.
#define BI {bi}
#define BK {bk}
template <class E>
static int gemm_nt(kf::Context* ctx, const float* A, const float* W, long M, long N, long K, const E& epi) {{
  const int nth = ctx->num_threads > 0 ? ctx->num_threads : 1;
  float* Wt = static_cast<float*>(ctx->scratch_alloc(ctx, sizeof(float) * (size_t)(K * N + (long)nth * BI * N)));
  if (!Wt) return 2;
  float* accs = Wt + K * N;
#pragma omp parallel for schedule(static) num_threads(nth)
  for (long j0 = 0; j0 < N; j0 += 16)
    for (long k = 0; k < K; ++k)
      for (long j = j0; j < j0 + 16 && j < N; ++j) Wt[k * N + j] = W[j * K + k];
  const long nblk = (M + BI - 1) / BI;
#pragma omp parallel num_threads(nth)
  {{
    float* cb = accs + (long)omp_get_thread_num() * BI * N;
#pragma omp for schedule(dynamic)
    for (long blk = 0; blk < nblk; ++blk) {{
      const long i0 = blk * BI, i1 = i0 + BI < M ? i0 + BI : M, rows = i1 - i0;
      for (long q = 0; q < rows * N; ++q) cb[q] = 0.f;
      for (long k0 = 0; k0 < K; k0 += BK) {{
        const long k1 = k0 + BK < K ? k0 + BK : K;
        long r = 0;
        for (; r + 4 <= rows; r += 4) {{
          float* c0 = cb + r * N; float* c1 = c0 + N; float* c2 = c1 + N; float* c3 = c2 + N;
          const float* a0 = A + (i0 + r) * K; const float* a1 = a0 + K; const float* a2 = a1 + K; const float* a3 = a2 + K;
          for (long k = k0; k < k1; ++k) {{
            const float v0 = a0[k], v1 = a1[k], v2 = a2[k], v3 = a3[k];
            const float* wr = Wt + k * N;
#pragma omp simd
            for (long j = 0; j < N; ++j) {{
              const float w = wr[j];
              c0[j] += v0 * w; c1[j] += v1 * w; c2[j] += v2 * w; c3[j] += v3 * w;
            }}
          }}
        }}
        for (; r < rows; ++r) {{
          float* c = cb + r * N;
          const float* a = A + (i0 + r) * K;
          for (long k = k0; k < k1; ++k) {{
            const float v = a[k];
            const float* wr = Wt + k * N;
#pragma omp simd
            for (long j = 0; j < N; ++j) c[j] += v * wr[j];
          }}
        }}
      }}
      for (long r = 0; r < rows; ++r)
        for (long j = 0; j < N; ++j) epi(i0 + r, j, cb[r * N + j]);
    }}
  }}
  ctx->scratch_free(ctx, Wt);
  return 0;
}}
"""

# ------------------------------------------------------------------ CUDA building blocks
CUDA_GEMM_NAIVE = r"""
// C = A[M,K] * W[N,K]^T: one thread per output, the K loop straight from global memory.
template <class E>
__global__ void k_gemm(const float* __restrict__ A, const float* __restrict__ W, long M, long N, long K, E epi) {{
  const long j = (long)blockIdx.x * {t} + threadIdx.x, i = (long)blockIdx.y * {t} + threadIdx.y;
  if (i >= M || j >= N) return;
  const float* a = A + i * K;
  const float* w = W + j * K;
  float s = 0.f;
  for (long k = 0; k < K; ++k) s += a[k] * w[k];
  epi(i, j, s);
}}
template <class E>
static int gemm_nt(kf::Context* ctx, const float* A, const float* W, long M, long N, long K, const E& epi) {{
  const long gy = (M + {t} - 1) / {t}, gx = (N + {t} - 1) / {t};
  if (gy > 65535 || gx > 2147483647L) return 3;
  k_gemm<E><<<dim3((unsigned)gx, (unsigned)gy), dim3({t}, {t}), 0, (cudaStream_t)ctx->stream>>>(A, W, M, N, K, epi);
  return cudaGetLastError() == cudaSuccess ? 0 : 4;
}}
"""

CUDA_GEMM_TILED = r"""
// C = A[M,K] * W[N,K]^T: TxT output tile per block, TxT slices of A and W staged in shared
// memory (padded against bank conflicts), each thread one output.
#define TILE {t}
template <class E>
__global__ void __launch_bounds__(TILE * TILE) k_gemm(const float* __restrict__ A, const float* __restrict__ W, long M, long N, long K, E epi) {{
  __shared__ float As[TILE][TILE + 1];
  __shared__ float Ws[TILE][TILE + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const long i = (long)blockIdx.y * TILE + ty, j = (long)blockIdx.x * TILE + tx;
  const long wrow = (long)blockIdx.x * TILE + ty;  // the W row this thread stages
  float s = 0.f;
  for (long k0 = 0; k0 < K; k0 += TILE) {{
    const long k = k0 + tx;
    As[ty][tx] = (i < M && k < K) ? A[i * K + k] : 0.f;
    Ws[ty][tx] = (wrow < N && k < K) ? W[wrow * K + k] : 0.f;
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < TILE; ++kk) s += As[ty][kk] * Ws[tx][kk];
    __syncthreads();
  }}
  if (i < M && j < N) epi(i, j, s);
}}
template <class E>
static int gemm_nt(kf::Context* ctx, const float* A, const float* W, long M, long N, long K, const E& epi) {{
  const long gy = (M + TILE - 1) / TILE, gx = (N + TILE - 1) / TILE;
  if (gy > 65535 || gx > 2147483647L) return 3;
  k_gemm<E><<<dim3((unsigned)gx, (unsigned)gy), dim3(TILE, TILE), 0, (cudaStream_t)ctx->stream>>>(A, W, M, N, K, epi);
  return cudaGetLastError() == cudaSuccess ? 0 : 4;
}}
"""

CUDA_GEMM_REGBLOCK = r"""
// C = A[M,K] * W[N,K]^T: BMxBN output tile per block, BK-deep slices of A and W in shared
// memory stored k-major, each thread a TMxTN register tile (TM+TN shared loads per TM*TN FMAs).
#define BM {bm}
#define BN {bn}
#define BK {bk}
#define TM {tm}
#define TN {tn}
#define NTH ((BM / TM) * (BN / TN))
template <class E>
__global__ void __launch_bounds__(NTH) k_gemm(const float* __restrict__ A, const float* __restrict__ W, long M, long N, long K, E epi) {{
  __shared__ float As[BK][BM + 4];
  __shared__ float Ws[BK][BN + 4];
  const int tid = threadIdx.x, tx = tid % (BN / TN), ty = tid / (BN / TN);
  const long row0 = (long)blockIdx.y * BM, col0 = (long)blockIdx.x * BN;
  float acc[TM][TN];
#pragma unroll
  for (int r = 0; r < TM; ++r)
#pragma unroll
    for (int c = 0; c < TN; ++c) acc[r][c] = 0.f;
  for (long k0 = 0; k0 < K; k0 += BK) {{
#pragma unroll
    for (int e = tid; e < BM * BK; e += NTH) {{
      const int r = e / BK, kk = e % BK;
      const long i = row0 + r, k = k0 + kk;
      As[kk][r] = (i < M && k < K) ? A[i * K + k] : 0.f;
    }}
#pragma unroll
    for (int e = tid; e < BN * BK; e += NTH) {{
      const int r = e / BK, kk = e % BK;
      const long j = col0 + r, k = k0 + kk;
      Ws[kk][r] = (j < N && k < K) ? W[j * K + k] : 0.f;
    }}
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {{
      float av[TM], bv[TN];
#pragma unroll
      for (int r = 0; r < TM; ++r) av[r] = As[kk][ty + r * (BM / TM)];
#pragma unroll
      for (int c = 0; c < TN; ++c) bv[c] = Ws[kk][tx + c * (BN / TN)];
#pragma unroll
      for (int r = 0; r < TM; ++r)
#pragma unroll
        for (int c = 0; c < TN; ++c) acc[r][c] = fmaf(av[r], bv[c], acc[r][c]);
    }}
    __syncthreads();
  }}
#pragma unroll
  for (int r = 0; r < TM; ++r)
#pragma unroll
    for (int c = 0; c < TN; ++c) {{
      const long i = row0 + ty + r * (BM / TM), j = col0 + tx + c * (BN / TN);
      if (i < M && j < N) epi(i, j, acc[r][c]);
    }}
}}
template <class E>
static int gemm_nt(kf::Context* ctx, const float* A, const float* W, long M, long N, long K, const E& epi) {{
  const long gy = (M + BM - 1) / BM, gx = (N + BN - 1) / BN;
  if (gy > 65535 || gx > 2147483647L) return 3;
  k_gemm<E><<<dim3((unsigned)gx, (unsigned)gy), NTH, 0, (cudaStream_t)ctx->stream>>>(A, W, M, N, K, epi);
  return cudaGetLastError() == cudaSuccess ? 0 : 4;
}}
"""

CUDA_GEMM_CUBLAS = r"""
// C = A[M,K] * W[N,K]^T by cuBLAS SGEMM (row-major C^T = W * A^T in its column-major terms)
// into scratch, then one grid-stride pass hands every element to epi(i, j, acc).
template <class E>
__global__ void k_epi(const float* C, long M, long N, E epi) {{
  const long total = M * N;
  for (long q = (long)blockIdx.x * blockDim.x + threadIdx.x; q < total; q += (long)gridDim.x * blockDim.x)
    epi(q / N, q % N, C[q]);
}}
template <class E>
static int gemm_nt(kf::Context* ctx, const float* A, const float* W, long M, long N, long K, const E& epi) {{
  float* C = static_cast<float*>(ctx->scratch_alloc(ctx, sizeof(float) * (size_t)(M * N)));
  if (!C) return 2;
  const float one = 1.f, zero = 0.f;
  cublasHandle_t h = (cublasHandle_t)ctx->cublas;
  if (cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)M, (int)K, &one, W, (int)K, A, (int)K, &zero, C, (int)N) !=
      CUBLAS_STATUS_SUCCESS) {{
    ctx->scratch_free(ctx, C);
    return 5;
  }}
  long blocks = (M * N + {b} - 1) / {b};
  if (blocks > 132 * 32) blocks = 132 * 32;
  k_epi<E><<<(unsigned)blocks, {b}, 0, (cudaStream_t)ctx->stream>>>(C, M, N, epi);
  const int rc = cudaGetLastError() == cudaSuccess ? 0 : 4;
  ctx->scratch_free(ctx, C);
  return rc;
}}
"""

# ------------------------------------------------------------------ task code
# ------------------------------------------------------------------ task code
EPI = r"""
static KF_HD float gelu_f(float z) { return 0.5f * z * (1.f + erff(z * 0.70710678118654752f)); }
// out[i, j] = gelu(acc + bias[j])
struct EpiBiasGelu {
  const float* bias;
  float* out;
  long ld;
  KF_HD void operator()(long i, long j, float acc) const { out[i * ld + j] = gelu_f(acc + bias[j]); }
};
// token MLP second layer on rows i = b * D + d, columns j = t: y[b, t, d] = x[b, t, d] + (acc + bias[t])
struct EpiTok {
  const float* bias;
  const float* res;
  float* out;
  long T, D;
  KF_HD void operator()(long i, long j, float acc) const {
    const long q = ((i / D) * T + j) * D + i % D;
    out[q] = res[q] + (acc + bias[j]);
  }
};
// channel MLP second layer, in place over x1: y[i, j] = y[i, j] + (acc + bias[j])
struct EpiCh {
  const float* bias;
  float* out;
  long ld;
  KF_HD void operator()(long i, long j, float acc) const { out[i * ld + j] = out[i * ld + j] + (acc + bias[j]); }
};
"""

CPU_LN = r"""
// LayerNorm of one row (eps 1e-5, biased variance, double sums), output element c at y[c * ys].
static void ln_row(const float* x, const float* g, const float* b, float* y, long D, long ys) {
  double s = 0.0;
  for (long c = 0; c < D; ++c) s += x[c];
  const float mean = (float)(s / (double)D);
  double v = 0.0;
  for (long c = 0; c < D; ++c) { const double d = (double)x[c] - mean; v += d * d; }
  const float rstd = (float)(1.0 / sqrt(v / (double)D + 1e-5));
  for (long c = 0; c < D; ++c) y[c * ys] = (x[c] - mean) * rstd * g[c] + b[c];
}
"""

CUDA_LN_THREAD = r"""
// LayerNorm, one thread per row (eps 1e-5, biased variance); trans: row (b, t) goes to y[b, :, t].
__global__ void k_ln(const float* __restrict__ x, const float* __restrict__ g, const float* __restrict__ b, float* __restrict__ y,
                     long rows, long T, long D, int trans) {
  const long r = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* xr = x + r * D;
  float* yr = trans ? y + (r / T) * D * T + r % T : y + r * D;
  const long ys = trans ? T : 1;
  float s = 0.f;
  for (long c = 0; c < D; ++c) s += xr[c];
  const float mean = s / (float)D;
  float v = 0.f;
  for (long c = 0; c < D; ++c) { const float d = xr[c] - mean; v += d * d; }
  const float rstd = 1.f / sqrtf(v / (float)D + 1e-5f);
  for (long c = 0; c < D; ++c) yr[c * ys] = (xr[c] - mean) * rstd * g[c] + b[c];
}
static int layernorm(kf::Context* ctx, const float* x, const float* g, const float* b, float* y, long rows, long T, long D, int trans) {
  k_ln<<<(unsigned)((rows + 127) / 128), 128, 0, (cudaStream_t)ctx->stream>>>(x, g, b, y, rows, T, D, trans);
  return cudaGetLastError() == cudaSuccess ? 0 : 4;
}
"""

CUDA_LN_BLOCK = r"""
// LayerNorm, one 256-thread block per row: warp shuffles + shared memory for the two sums;
// trans: row (b, t) goes to y[b, :, t].
static __device__ float block_sum(float v, float* sh) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  __syncthreads();  // sh may still be read from a previous call
  if (l == 0) sh[w] = v;
  __syncthreads();
  float t = 0.f;
  for (int q = 0; q < (int)(blockDim.x / 32); ++q) t += sh[q];
  return t;
}
__global__ void __launch_bounds__(256) k_ln(const float* __restrict__ x, const float* __restrict__ g, const float* __restrict__ b,
                                            float* __restrict__ y, long T, long D, int trans) {
  __shared__ float sh[32];
  const long r = blockIdx.x;
  const float* xr = x + r * D;
  float* yr = trans ? y + (r / T) * D * T + r % T : y + r * D;
  const long ys = trans ? T : 1;
  float s = 0.f;
  for (long c = threadIdx.x; c < D; c += blockDim.x) s += xr[c];
  const float mean = block_sum(s, sh) / (float)D;
  float v = 0.f;
  for (long c = threadIdx.x; c < D; c += blockDim.x) { const float d = xr[c] - mean; v += d * d; }
  const float rstd = 1.f / sqrtf(block_sum(v, sh) / (float)D + 1e-5f);
  for (long c = threadIdx.x; c < D; c += blockDim.x) yr[c * ys] = (xr[c] - mean) * rstd * g[c] + b[c];
}
static int layernorm(kf::Context* ctx, const float* x, const float* g, const float* b, float* y, long rows, long T, long D, int trans) {
  if (rows > 2147483647L) return 3;
  k_ln<<<(unsigned)rows, 256, 0, (cudaStream_t)ctx->stream>>>(x, g, b, y, T, D, trans);
  return cudaGetLastError() == cudaSuccess ? 0 : 4;
}
"""

CUBLAS_TOK = r"""
// Token mixing without transposes: C[b] (M2 x N) = W (M2 x K) * Y[b] (K x N) for every b, one
// cuBLAS strided-batched SGEMM (column-major: C[b]^T = Y[b]^T * W^T), then epi(b * M2 + s, n, acc).
struct EpiRowBiasGelu {  // in place: C[i, j] = gelu(C[i, j] + bias[i % M2])
  const float* bias;
  float* out;
  long ld, M2;
  KF_HD void operator()(long i, long j, float acc) const { out[i * ld + j] = gelu_f(acc + bias[i % M2]); }
};
struct EpiRowBiasRes {  // y[i, j] = x[i, j] + (acc + bias[i % M2])
  const float* bias;
  const float* res;
  float* out;
  long ld, M2;
  KF_HD void operator()(long i, long j, float acc) const { out[i * ld + j] = res[i * ld + j] + (acc + bias[i % M2]); }
};
template <class E>
static int gemm_wy(kf::Context* ctx, const float* W, const float* Y, float* C, long Bn, long M2, long K, long N, const E& epi) {
  const float one = 1.f, zero = 0.f;
  if (cublasSgemmStridedBatched((cublasHandle_t)ctx->cublas, CUBLAS_OP_N, CUBLAS_OP_N, (int)N, (int)M2, (int)K, &one, Y, (int)N,
                                (long long)K * N, W, (int)K, 0LL, &zero, C, (int)N, (long long)M2 * N, (int)Bn) != CUBLAS_STATUS_SUCCESS)
    return 5;
  long blocks = (Bn * M2 * N + 255) / 256;
  if (blocks > 132 * 32) blocks = 132 * 32;
  k_epi<E><<<(unsigned)blocks, 256, 0, (cudaStream_t)ctx->stream>>>(C, Bn * M2, N, epi);
  return cudaGetLastError() == cudaSuccess ? 0 : 4;
}
"""

CHECKS = r"""
extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  if (n_in != 13 || n_out != 1) return 1;
  for (int q = 0; q < 13; ++q)
    if (in[q].dtype != kf::KF_FLOAT32) return 1;
  if (out[0].dtype != kf::KF_FLOAT32 || in[0].ndim != 3 || in[3].ndim != 2 || in[5].ndim != 2 || in[9].ndim != 2 || in[11].ndim != 2)
    return 1;
  const long B = in[0].shape[0], T = in[0].shape[1], D = in[0].shape[2];
  const long T2 = in[3].shape[0], D4 = in[9].shape[0];
  if (in[1].numel() != D || in[2].numel() != D || in[3].shape[1] != T || in[4].numel() != T2 || in[5].shape[0] != T ||
      in[5].shape[1] != T2 || in[6].numel() != T || in[7].numel() != D || in[8].numel() != D || in[9].shape[1] != D ||
      in[10].numel() != D4 || in[11].shape[0] != D || in[11].shape[1] != D4 || in[12].numel() != D || out[0].numel() != B * T * D)
    return 1;
  if (B * T * D == 0) return 0;
  if (B * D > 2147483647L || B * T > 2147483647L || T2 > 2147483647L || D4 > 2147483647L) return 3;
  const float* x = static_cast<const float*>(in[0].data);
  const float* n1w = static_cast<const float*>(in[1].data);
  const float* n1b = static_cast<const float*>(in[2].data);
  const float* w1 = static_cast<const float*>(in[3].data);
  const float* b1 = static_cast<const float*>(in[4].data);
  const float* w2 = static_cast<const float*>(in[5].data);
  const float* b2 = static_cast<const float*>(in[6].data);
  const float* n2w = static_cast<const float*>(in[7].data);
  const float* n2b = static_cast<const float*>(in[8].data);
  const float* wc1 = static_cast<const float*>(in[9].data);
  const float* bc1 = static_cast<const float*>(in[10].data);
  const float* wc2 = static_cast<const float*>(in[11].data);
  const float* bc2 = static_cast<const float*>(in[12].data);
  float* y = static_cast<float*>(out[0].data);
  const long R = B * T;  // rows of the channel MLP
  float* yt = static_cast<float*>(ctx->scratch_alloc(ctx, sizeof(float) * (size_t)(R * D + B * D * T2 + R * D4)));
  if (!yt) return 2;
  float* z = yt + R * D;       // token hidden [B * D, T2] (cuBLAS: [B, T2, D])
  float* gb = z + B * D * T2;  // channel hidden [R, D4]
  int rc = 0;
"""

TAIL = r"""
  if (!rc) rc = gemm_nt(ctx, yt, wc1, R, D4, D, EpiBiasGelu{bc1, gb, D4});
  if (!rc) rc = gemm_nt(ctx, gb, wc2, R, D, D4, EpiCh{bc2, y, D});
  ctx->scratch_free(ctx, yt);
  return rc;
}
"""


def cpu_forward(par):
    omp = "#pragma omp parallel for schedule(static) num_threads(ctx->num_threads)\n  " if par else ""
    return CHECKS + "  " + omp + r"""for (long r = 0; r < R; ++r) ln_row(x + r * D, n1w, n1b, yt + (r / T) * D * T + r % T, D, T);
  rc = gemm_nt(ctx, yt, w1, B * D, T2, T, EpiBiasGelu{b1, z, T2});
  if (!rc) rc = gemm_nt(ctx, z, w2, B * D, T, T2, EpiTok{b2, x, y, T, D});
  if (rc) { ctx->scratch_free(ctx, yt); return rc; }
  """ + omp + "for (long r = 0; r < R; ++r) ln_row(y + r * D, n2w, n2b, yt + r * D, D, 1);" + TAIL


CUDA_FORWARD = CHECKS + r"""  rc = layernorm(ctx, x, n1w, n1b, yt, R, T, D, 1);
  if (!rc) rc = gemm_nt(ctx, yt, w1, B * D, T2, T, EpiBiasGelu{b1, z, T2});
  if (!rc) rc = gemm_nt(ctx, z, w2, B * D, T, T2, EpiTok{b2, x, y, T, D});
  if (!rc) rc = layernorm(ctx, y, n2w, n2b, yt, R, T, D, 0);""" + TAIL

CUBLAS_FORWARD = CHECKS + r"""  rc = layernorm(ctx, x, n1w, n1b, yt, R, T, D, 0);
  if (!rc) rc = gemm_wy(ctx, w1, yt, z, B, T2, T, D, EpiRowBiasGelu{b1, z, D, T2});
  if (!rc) rc = gemm_wy(ctx, w2, z, yt, B, T, T2, D, EpiRowBiasRes{b2, x, y, D, T});
  if (!rc) rc = layernorm(ctx, y, n2w, n2b, yt, R, T, D, 0);""" + TAIL


def generate(header, indent):
    ks = []

    def cpu(variant, tech, gemm, par):
        inc = "#include <omp.h>\n" if par else ""
        code = header(TASK, "cpu", "composite", variant, tech) + inc + EPI + CPU_LN + gemm + cpu_forward(par)
        ks.append(("cpu", variant, "composite", tech, code))

    def cuda(variant, tech, gemm, ln, fwd=CUDA_FORWARD, extra_inc="", extra=""):
        code = header(TASK, "cuda", "composite", variant, tech) + extra_inc + EPI + ln + gemm + extra + fwd
        ks.append(("cuda", variant, "composite", tech, code))

    cpu("naive", "Single-threaded loops: LayerNorm rows written transposed, the four linear layers as scalar dot products per output with bias+GELU, the transposed residual store and the in-place residual applied at the stores.",
        CPU_GEMM_NAIVE, False)
    cpu("omp_rows_simd", "Rows split over cores with OpenMP and every output an `omp simd` dot product of two contiguous rows; LayerNorm writes the token-mixing input transposed, bias+GELU and both residuals fused into the stores.",
        CPU_GEMM_DOT, True)
    for bi, bk in ((16, 64), (32, 128)):
        cpu(f"omp_blocked_r4_{bi}x{bk}",
            f"Weights transposed once per GEMM, row blocks of {bi} over cores with K slices of {bk}, 4 rows updated per streamed weight row with `omp simd`; token mixing on the transposed LayerNorm output, bias+GELU and both residuals fused into the block stores.",
            CPU_GEMM_BLOCKED.format(bi=bi, bk=bk), True)

    cuda("naive_t16", "One thread per output of each linear layer reading A and W straight from global memory, one thread per row for the LayerNorms (the first written transposed), bias+GELU and both residuals fused into the stores.",
         CUDA_GEMM_NAIVE.format(t=16), CUDA_LN_THREAD)
    for t in (16, 32):
        cuda(f"smem_tiled_t{t}", f"{t}x{t} output tiles with {t}-deep slices staged in padded shared memory, block-per-row LayerNorms (the first written transposed for the token MLP), bias+GELU and both residuals fused into the GEMM stores.",
             CUDA_GEMM_TILED.format(t=t), CUDA_LN_BLOCK)
    for bm, bn, bk, tm, tn in ((64, 64, 16, 4, 4), (128, 128, 8, 8, 8)):
        cuda(f"regblock_{bm}x{bn}_{tm}x{tn}",
             f"{bm}x{bn} output tile per block with {bk}-deep shared-memory slices and a {tm}x{tn} register tile per thread, block-per-row LayerNorms (the first written transposed for the token MLP), bias+GELU and both residuals fused into the GEMM stores.",
             CUDA_GEMM_REGBLOCK.format(bm=bm, bn=bn, bk=bk, tm=tm, tn=tn), CUDA_LN_BLOCK)
    cuda("cublas_fused_b256", "Token mixing as cuBLAS strided-batched SGEMMs with the weight on the left (no transposes), channel mixing as plain SGEMMs, each followed by one 256-thread grid-stride pass for bias+GELU or bias+residual; block-per-row LayerNorms.",
         CUDA_GEMM_CUBLAS.format(b=256), CUDA_LN_BLOCK, CUBLAS_FORWARD, "#include <cublas_v2.h>\n", CUBLAS_TOK)
    return ks
