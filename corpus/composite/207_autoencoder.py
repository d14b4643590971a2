"""207_autoencoder: loss = mean((dec(enc(x)) - x)^2), x [M, D].

enc: Linear(D, D/2) + ReLU, Linear(D/2, C) + Tanh; dec: Linear(C, D/2) + ReLU, Linear(D/2, D).
Every GEMM has its bias and activation fused into the store; the last one stores the squared
error, which is then summed per row in double and over rows in a fixed order (deterministic).
CPU: naive loops / OpenMP rows with SIMD dot products / OpenMP cache-blocked GEMM with 4-row
register reuse; CUDA: one thread per output / shared-memory tiles / register-blocked tiles /
cuBLAS SGEMM.
"""

from _gemm import CPU_GEMM_NAIVE, CPU_GEMM_DOT, CPU_GEMM_BLOCKED, CUDA_GEMM_NAIVE, CUDA_GEMM_TILED, CUDA_GEMM_REGBLOCK, CUDA_GEMM_CUBLAS  # noqa: F401 (shared GEMM building blocks)

TASK = "207_autoencoder"

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
