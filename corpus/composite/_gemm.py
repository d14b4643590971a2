"""GEMM building blocks shared by the MLP-like composite tasks (201, 206, 207, 209):
C = A W^T with a functor epilogue called per output element (bias, activation, residual,
squared error), as CPU naive / row-dot / cache-blocked code and CUDA naive / shared-memory
tiled / register-blocked / cuBLAS code. A file starting with "_" is not a task module:
corpus/generate.py puts this folder on sys.path, so the task modules import from it.
"""

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
