"""209_gated_mlp: y = x + down(silu(gate(h)) * up(h)), h = x * rsqrt(mean(x^2) + 1e-6) * scale.

x [M, D], gate/up [H, D], down [D, H], no biases. CPU: naive loops / OpenMP rows with SIMD dot
products / OpenMP cache-blocked GEMM on the transposed weight with 4-row register reuse;
CUDA: one thread per output / shared-memory tiles / register-blocked tiles / cuBLAS SGEMM.
The up GEMM's store applies silu(gate) * up in place over the gate result, the down GEMM's
store adds the residual.
"""

TASK = "209_gated_mlp"

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
// gate GEMM store: G[i, j] = acc
struct EpiStore {
  float* out;
  long ld;
  KF_HD void operator()(long i, long j, float acc) const { out[i * ld + j] = acc; }
};
// up GEMM store, in place over G: G[i, j] = silu(G[i, j]) * acc
struct EpiGlu {
  float* g;
  long ld;
  KF_HD void operator()(long i, long j, float acc) const {
    const float z = g[i * ld + j];
    g[i * ld + j] = z / (1.f + expf(-z)) * acc;
  }
};
// down GEMM store: y[i, j] = x[i, j] + acc
struct EpiDown {
  const float* res;
  float* out;
  long ld;
  KF_HD void operator()(long i, long j, float acc) const { out[i * ld + j] = res[i * ld + j] + acc; }
};
"""

CPU_NORM = r"""
// RMSNorm of one row: x * rsqrt(mean(x^2) + 1e-6) * scale, the sum of squares in double.
static void rms_row(const float* x, const float* s, float* y, long D) {
  double q = 0.0;
  for (long c = 0; c < D; ++c) q += (double)x[c] * x[c];
  const float r = (float)(1.0 / sqrt(q / (double)D + 1e-6));
  for (long c = 0; c < D; ++c) y[c] = x[c] * r * s[c];
}
"""

CUDA_NORM_THREAD = r"""
// RMSNorm, one thread per row.
__global__ void k_rms(const float* __restrict__ x, const float* __restrict__ s, float* __restrict__ y, long rows, long D) {
  const long r = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* xr = x + r * D;
  float* yr = y + r * D;
  float q = 0.f;
  for (long c = 0; c < D; ++c) q += xr[c] * xr[c];
  const float rs = 1.f / sqrtf(q / (float)D + 1e-6f);
  for (long c = 0; c < D; ++c) yr[c] = xr[c] * rs * s[c];
}
static int rmsnorm(kf::Context* ctx, const float* x, const float* s, float* y, long rows, long D) {
  k_rms<<<(unsigned)((rows + 127) / 128), 128, 0, (cudaStream_t)ctx->stream>>>(x, s, y, rows, D);
  return cudaGetLastError() == cudaSuccess ? 0 : 4;
}
"""

CUDA_NORM_BLOCK = r"""
// RMSNorm, one 256-thread block per row: warp shuffles + shared memory for the sum of squares.
__global__ void __launch_bounds__(256) k_rms(const float* __restrict__ x, const float* __restrict__ s, float* __restrict__ y, long D) {
  __shared__ float sh[32];
  const long r = blockIdx.x;
  const float* xr = x + r * D;
  float* yr = y + r * D;
  float q = 0.f;
  for (long c = threadIdx.x; c < D; c += blockDim.x) q += xr[c] * xr[c];
  for (int o = 16; o > 0; o >>= 1) q += __shfl_xor_sync(0xffffffffu, q, o);
  if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = q;
  __syncthreads();
  float t = 0.f;
  for (int w = 0; w < (int)(blockDim.x / 32); ++w) t += sh[w];
  const float rs = 1.f / sqrtf(t / (float)D + 1e-6f);
  for (long c = threadIdx.x; c < D; c += blockDim.x) yr[c] = xr[c] * rs * s[c];
}
static int rmsnorm(kf::Context* ctx, const float* x, const float* s, float* y, long rows, long D) {
  if (rows > 2147483647L) return 3;
  k_rms<<<(unsigned)rows, 256, 0, (cudaStream_t)ctx->stream>>>(x, s, y, D);
  return cudaGetLastError() == cudaSuccess ? 0 : 4;
}
"""

CHECKS = r"""
extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  if (n_in != 5 || n_out != 1) return 1;
  for (int q = 0; q < 5; ++q)
    if (in[q].dtype != kf::KF_FLOAT32) return 1;
  if (out[0].dtype != kf::KF_FLOAT32 || in[0].ndim < 1 || in[2].ndim != 2 || in[3].ndim != 2 || in[4].ndim != 2) return 1;
  const long D = in[0].shape[in[0].ndim - 1];
  if (D <= 0) return 1;
  const long M = in[0].numel() / D, H = in[2].shape[0];
  if (in[1].numel() != D || in[2].shape[1] != D || in[3].shape[0] != H || in[3].shape[1] != D || in[4].shape[0] != D ||
      in[4].shape[1] != H || out[0].numel() != M * D)
    return 1;
  if (M == 0) return 0;
  if (M > 2147483647L || H > 2147483647L || D > 2147483647L) return 3;
  const float* x = static_cast<const float*>(in[0].data);
  const float* sc = static_cast<const float*>(in[1].data);
  const float* wg = static_cast<const float*>(in[2].data);
  const float* wu = static_cast<const float*>(in[3].data);
  const float* wd = static_cast<const float*>(in[4].data);
  float* y = static_cast<float*>(out[0].data);
  float* hn = static_cast<float*>(ctx->scratch_alloc(ctx, sizeof(float) * (size_t)(M * D + M * H)));
  if (!hn) return 2;
  float* g = hn + M * D;
"""

TAIL = r"""
  if (!rc) rc = gemm_nt(ctx, hn, wg, M, H, D, EpiStore{g, H});
  if (!rc) rc = gemm_nt(ctx, hn, wu, M, H, D, EpiGlu{g, H});
  if (!rc) rc = gemm_nt(ctx, g, wd, M, D, H, EpiDown{x, y, D});
  ctx->scratch_free(ctx, hn);
  return rc;
}
"""


def cpu_forward(par):
    omp = "#pragma omp parallel for schedule(static) num_threads(ctx->num_threads)\n  " if par else ""
    return CHECKS + "  int rc = 0;\n  " + omp + "for (long i = 0; i < M; ++i) rms_row(x + i * D, sc, hn + i * D, D);" + TAIL


CUDA_FORWARD = CHECKS + "  int rc = rmsnorm(ctx, x, sc, hn, M, D);" + TAIL


def generate(header, indent):
    ks = []

    def cpu(variant, tech, gemm, par):
        inc = "#include <omp.h>\n" if par else ""
        code = header(TASK, "cpu", "composite", variant, tech) + inc + EPI + CPU_NORM + gemm + cpu_forward(par)
        ks.append(("cpu", variant, "composite", tech, code))

    def cuda(variant, tech, gemm, norm, extra_inc=""):
        code = header(TASK, "cuda", "composite", variant, tech) + extra_inc + EPI + norm + gemm + CUDA_FORWARD
        ks.append(("cuda", variant, "composite", tech, code))

    cpu("naive", "Single-threaded loops: RMSNorm per row, then every output of the gate, up and down projections one scalar dot product, silu(gate)*up and the residual applied at the stores.",
        CPU_GEMM_NAIVE, False)
    cpu("omp_rows_simd", "Rows split over cores with OpenMP and every output an `omp simd` dot product of two contiguous rows; silu(gate)*up fused into the up projection's store, the residual into the down projection's.",
        CPU_GEMM_DOT, True)
    for bi, bk in ((16, 64), (32, 128)):
        cpu(f"omp_blocked_r4_{bi}x{bk}",
            f"Weights transposed once, row blocks of {bi} over cores with K slices of {bk} (weight panel stays in cache), 4 rows updated per streamed weight row with `omp simd`, silu(gate)*up and the residual fused into the block stores.",
            CPU_GEMM_BLOCKED.format(bi=bi, bk=bk), True)

    cuda("naive_t16", "One thread per output of each projection reading A and W straight from global memory, one thread per row for the RMSNorm, silu(gate)*up and the residual fused into the stores.",
         CUDA_GEMM_NAIVE.format(t=16), CUDA_NORM_THREAD)
    for t in (16, 32):
        cuda(f"smem_tiled_t{t}", f"{t}x{t} output tiles with {t}-deep slices of activations and weights staged in padded shared memory, block-per-row RMSNorm, silu(gate)*up and the residual fused into the GEMM stores.",
             CUDA_GEMM_TILED.format(t=t), CUDA_NORM_BLOCK)
    for bm, bn, bk, tm, tn in ((64, 64, 16, 4, 4), (128, 128, 8, 8, 8)):
        cuda(f"regblock_{bm}x{bn}_{tm}x{tn}",
             f"{bm}x{bn} output tile per block with {bk}-deep shared-memory slices and a {tm}x{tn} register tile per thread (outer-product FMAs), block-per-row RMSNorm, silu(gate)*up and the residual fused into the GEMM stores.",
             CUDA_GEMM_REGBLOCK.format(bm=bm, bn=bn, bk=bk, tm=tm, tn=tn), CUDA_NORM_BLOCK)
    cuda("cublas_fused_b256", "Block-per-row RMSNorm, the three projections as cuBLAS SGEMMs into scratch, each followed by one grid-stride 256-thread pass that stores the gate, applies silu(gate)*up in place, or adds the residual.",
         CUDA_GEMM_CUBLAS.format(b=256), CUDA_NORM_BLOCK, "#include <cublas_v2.h>\n")
    return ks
