"""207_autoencoder: loss = mean((dec(enc(x)) - x)^2), x [M, D].

enc: Linear(D, D/2) + ReLU, Linear(D/2, C) + Tanh; dec: Linear(C, D/2) + ReLU, Linear(D/2, D).
Every GEMM has its bias and activation fused into the store; the last one stores the squared
error, which is then summed per row in double and over rows in a fixed order (deterministic).
CPU: naive loops / OpenMP rows with SIMD dot products / OpenMP cache-blocked GEMM with 4-row
register reuse; CUDA: one thread per output / shared-memory tiles / register-blocked tiles /
cuBLAS SGEMM.
"""

TASK = "207_autoencoder"

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
// out[i, j] = relu(acc + bias[j])
struct EpiRelu {
  const float* bias;
  float* out;
  long ld;
  KF_HD void operator()(long i, long j, float acc) const {
    const float z = acc + bias[j];
    out[i * ld + j] = z > 0.f ? z : 0.f;
  }
};
// out[i, j] = tanh(acc + bias[j])
struct EpiTanh {
  const float* bias;
  float* out;
  long ld;
  KF_HD void operator()(long i, long j, float acc) const { out[i * ld + j] = tanhf(acc + bias[j]); }
};
// squared reconstruction error: e[i, j] = ((acc + bias[j]) - x[i, j])^2
struct EpiSqErr {
  const float* bias;
  const float* x;
  float* out;
  long ld;
  KF_HD void operator()(long i, long j, float acc) const {
    const float d = (acc + bias[j]) - x[i * ld + j];
    out[i * ld + j] = d * d;
  }
};
"""


def cpu_reduce(par):
    omp = "#pragma omp parallel for schedule(static) num_threads(ctx->num_threads)\n  " if par else ""
    return r"""
// mean of e [M, D]: each row summed in double, the row sums added in row order.
static int mean_sq(kf::Context* ctx, const float* e, double* rs, long M, long D, float* out) {
  (void)ctx;
  """ + omp + r"""for (long i = 0; i < M; ++i) {
    double s = 0.0;
    for (long j = 0; j < D; ++j) s += e[i * D + j];
    rs[i] = s;
  }
  double t = 0.0;
  for (long i = 0; i < M; ++i) t += rs[i];
  out[0] = (float)(t / ((double)M * (double)D));
  return 0;
}
"""


CUDA_REDUCE_NAIVE = r"""
// mean of e [M, D]: one thread per row sums it in double, then one thread adds the row sums.
__global__ void k_rowsum(const float* __restrict__ e, double* __restrict__ rs, long M, long D) {
  const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= M) return;
  double s = 0.0;
  for (long j = 0; j < D; ++j) s += e[i * D + j];
  rs[i] = s;
}
__global__ void k_final(const double* __restrict__ rs, long M, long D, float* out) {
  double t = 0.0;
  for (long i = 0; i < M; ++i) t += rs[i];
  out[0] = (float)(t / ((double)M * (double)D));
}
static int mean_sq(kf::Context* ctx, const float* e, double* rs, long M, long D, float* out) {
  cudaStream_t st = (cudaStream_t)ctx->stream;
  k_rowsum<<<(unsigned)((M + 127) / 128), 128, 0, st>>>(e, rs, M, D);
  k_final<<<1, 1, 0, st>>>(rs, M, D, out);
  return cudaGetLastError() == cudaSuccess ? 0 : 4;
}
"""

CUDA_REDUCE_BLOCK = r"""
// mean of e [M, D]: one 256-thread block per row (coalesced, double partials, fixed tree), then
// one block adds the row sums in a fixed order: the same bits every run.
static __device__ double block_sum_d(double v, double* sh) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int o = 128; o > 0; o >>= 1) {
    if ((int)threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
    __syncthreads();
  }
  return sh[0];
}
__global__ void __launch_bounds__(256) k_rowsum(const float* __restrict__ e, double* __restrict__ rs, long D) {
  __shared__ double sh[256];
  const float* er = e + (long)blockIdx.x * D;
  double s = 0.0;
  for (long j = threadIdx.x; j < D; j += 256) s += er[j];
  s = block_sum_d(s, sh);
  if (threadIdx.x == 0) rs[blockIdx.x] = s;
}
__global__ void __launch_bounds__(256) k_final(const double* __restrict__ rs, long M, long D, float* out) {
  __shared__ double sh[256];
  double s = 0.0;
  for (long i = threadIdx.x; i < M; i += 256) s += rs[i];
  s = block_sum_d(s, sh);
  if (threadIdx.x == 0) out[0] = (float)(s / ((double)M * (double)D));
}
static int mean_sq(kf::Context* ctx, const float* e, double* rs, long M, long D, float* out) {
  cudaStream_t st = (cudaStream_t)ctx->stream;
  if (M > 2147483647L) return 3;
  k_rowsum<<<(unsigned)M, 256, 0, st>>>(e, rs, D);
  k_final<<<1, 256, 0, st>>>(rs, M, D, out);
  return cudaGetLastError() == cudaSuccess ? 0 : 4;
}
"""

FORWARD = r"""
extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  if (n_in != 9 || n_out != 1) return 1;
  for (int q = 0; q < 9; ++q)
    if (in[q].dtype != kf::KF_FLOAT32) return 1;
  if (out[0].dtype != kf::KF_FLOAT32 || out[0].numel() != 1 || in[0].ndim < 1) return 1;
  for (int q = 1; q < 9; q += 2)
    if (in[q].ndim != 2) return 1;
  const long D = in[0].shape[in[0].ndim - 1];
  if (D <= 0) return 1;
  const long M = in[0].numel() / D, Hd = in[1].shape[0], C = in[3].shape[0];
  if (in[1].shape[1] != D || in[2].numel() != Hd || in[3].shape[1] != Hd || in[4].numel() != C || in[5].shape[0] != Hd ||
      in[5].shape[1] != C || in[6].numel() != Hd || in[7].shape[0] != D || in[7].shape[1] != Hd || in[8].numel() != D)
    return 1;
  if (M == 0) return 1;  // the mean of nothing is NaN; not a case this task has
  if (M > 2147483647L || D > 2147483647L || Hd > 2147483647L || C > 2147483647L) return 3;
  const float* x = static_cast<const float*>(in[0].data);
  const float* w1 = static_cast<const float*>(in[1].data);
  const float* b1 = static_cast<const float*>(in[2].data);
  const float* w2 = static_cast<const float*>(in[3].data);
  const float* b2 = static_cast<const float*>(in[4].data);
  const float* w3 = static_cast<const float*>(in[5].data);
  const float* b3 = static_cast<const float*>(in[6].data);
  const float* w4 = static_cast<const float*>(in[7].data);
  const float* b4 = static_cast<const float*>(in[8].data);
  float* loss = static_cast<float*>(out[0].data);
  // scratch: row sums (double) first for alignment, then h [M, Hd], code [M, C], e [M, D]
  double* rs = static_cast<double*>(ctx->scratch_alloc(ctx, sizeof(double) * (size_t)M + sizeof(float) * (size_t)(M * Hd + M * C + M * D)));
  if (!rs) return 2;
  float* h = reinterpret_cast<float*>(rs + M);
  float* code = h + M * Hd;
  float* e = code + M * C;
  int rc = gemm_nt(ctx, x, w1, M, Hd, D, EpiRelu{b1, h, Hd});
  if (!rc) rc = gemm_nt(ctx, h, w2, M, C, Hd, EpiTanh{b2, code, C});
  if (!rc) rc = gemm_nt(ctx, code, w3, M, Hd, C, EpiRelu{b3, h, Hd});
  if (!rc) rc = gemm_nt(ctx, h, w4, M, D, Hd, EpiSqErr{b4, x, e, D});
  if (!rc) rc = mean_sq(ctx, e, rs, M, D, loss);
  ctx->scratch_free(ctx, rs);
  return rc;
}
"""


def generate(header, indent):
    ks = []

    def cpu(variant, tech, gemm, par):
        inc = "#include <omp.h>\n" if par else ""
        code = header(TASK, "cpu", "composite", variant, tech) + inc + EPI + gemm + cpu_reduce(par) + FORWARD
        ks.append(("cpu", variant, "composite", tech, code))

    def cuda(variant, tech, gemm, red, extra_inc=""):
        code = header(TASK, "cuda", "composite", variant, tech) + extra_inc + EPI + gemm + red + FORWARD
        ks.append(("cuda", variant, "composite", tech, code))

    cpu("naive", "Single-threaded loops: every output of the four linear layers one scalar dot product with bias+ReLU/Tanh or the squared error applied at the store, then a double-precision sum.",
        CPU_GEMM_NAIVE, False)
    cpu("omp_rows_simd", "Rows split over cores with OpenMP and every output an `omp simd` dot product of two contiguous rows; bias+activation and the squared error fused into the stores, row sums in double over cores.",
        CPU_GEMM_DOT, True)
    for bi, bk in ((16, 64), (32, 128)):
        cpu(f"omp_blocked_r4_{bi}x{bk}",
            f"Weights transposed once per layer, row blocks of {bi} over cores with K slices of {bk}, 4 rows updated per streamed weight row with `omp simd`, bias+activation and the squared error fused into the block stores, row sums in double over cores.",
            CPU_GEMM_BLOCKED.format(bi=bi, bk=bk), True)

    cuda("naive_t16", "One thread per output of each linear layer reading A and W straight from global memory with bias+activation / squared error fused into the store, one thread per row for the double row sums and one thread for the total.",
         CUDA_GEMM_NAIVE.format(t=16), CUDA_REDUCE_NAIVE)
    for t in (16, 32):
        cuda(f"smem_tiled_t{t}", f"{t}x{t} output tiles with {t}-deep slices staged in padded shared memory, bias+activation / squared error fused into the GEMM stores, block-per-row double reduction then one block for the total.",
             CUDA_GEMM_TILED.format(t=t), CUDA_REDUCE_BLOCK)
    for bm, bn, bk, tm, tn in ((64, 64, 16, 4, 4), (128, 128, 8, 8, 8)):
        cuda(f"regblock_{bm}x{bn}_{tm}x{tn}",
             f"{bm}x{bn} output tile per block with {bk}-deep shared-memory slices and a {tm}x{tn} register tile per thread, bias+activation / squared error fused into the GEMM stores, block-per-row double reduction then one block for the total.",
             CUDA_GEMM_REGBLOCK.format(bm=bm, bn=bn, bk=bk, tm=tm, tn=tn), CUDA_REDUCE_BLOCK)
    cuda("cublas_fused_b256", "The four linear layers as cuBLAS SGEMMs into scratch, each followed by one 256-thread grid-stride pass for bias+activation or the squared error, then a block-per-row double reduction and one block for the total.",
         CUDA_GEMM_CUBLAS.format(b=256), CUDA_REDUCE_BLOCK, "#include <cublas_v2.h>\n")
    return ks
