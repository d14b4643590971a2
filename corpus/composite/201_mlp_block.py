"""201_mlp_block: y = x + down(gelu(up(layernorm(x)))), x [M, D], up [H, D], down [D, H].

CPU: naive loops / OpenMP rows with SIMD dot products / OpenMP cache-blocked GEMM on the
transposed weight with 4-row register reuse; CUDA: one thread per output / shared-memory
tiles / register-blocked tiles / cuBLAS SGEMM; every GEMM has its bias, GELU or residual
fused into the store (a functor called per output element).
"""

from _gemm import CPU_GEMM_NAIVE, CPU_GEMM_DOT, CPU_GEMM_BLOCKED, CUDA_GEMM_NAIVE, CUDA_GEMM_TILED, CUDA_GEMM_REGBLOCK, CUDA_GEMM_CUBLAS  # noqa: F401 (shared GEMM building blocks)

TASK = "201_mlp_block"

# ------------------------------------------------------------------ task code
EPI = r"""
static KF_HD float gelu_f(float z) { return 0.5f * z * (1.f + erff(z * 0.70710678118654752f)); }
// up-projection store: U[i, j] = gelu(acc + b1[j])
struct EpiUp {
  const float* bias;
  float* out;
  long ld;
  KF_HD void operator()(long i, long j, float acc) const { out[i * ld + j] = gelu_f(acc + bias[j]); }
};
// down-projection store: y[i, j] = x[i, j] + (acc + b2[j])
struct EpiDown {
  const float* bias;
  const float* res;
  float* out;
  long ld;
  KF_HD void operator()(long i, long j, float acc) const { out[i * ld + j] = res[i * ld + j] + (acc + bias[j]); }
};
"""

CPU_LN = r"""
// LayerNorm of one row (eps 1e-5, biased variance), two passes with double sums.
static void ln_row(const float* x, const float* g, const float* b, float* y, long D) {
  double s = 0.0;
  for (long c = 0; c < D; ++c) s += x[c];
  const float mean = (float)(s / (double)D);
  double v = 0.0;
  for (long c = 0; c < D; ++c) { const double d = (double)x[c] - mean; v += d * d; }
  const float rstd = (float)(1.0 / sqrt(v / (double)D + 1e-5));
  for (long c = 0; c < D; ++c) y[c] = (x[c] - mean) * rstd * g[c] + b[c];
}
"""

CUDA_LN_THREAD = r"""
// LayerNorm, one thread per row (eps 1e-5, biased variance).
__global__ void k_ln(const float* __restrict__ x, const float* __restrict__ g, const float* __restrict__ b, float* __restrict__ y, long rows, long D) {
  const long r = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* xr = x + r * D;
  float* yr = y + r * D;
  float s = 0.f;
  for (long c = 0; c < D; ++c) s += xr[c];
  const float mean = s / (float)D;
  float v = 0.f;
  for (long c = 0; c < D; ++c) { const float d = xr[c] - mean; v += d * d; }
  const float rstd = 1.f / sqrtf(v / (float)D + 1e-5f);
  for (long c = 0; c < D; ++c) yr[c] = (xr[c] - mean) * rstd * g[c] + b[c];
}
static int layernorm(kf::Context* ctx, const float* x, const float* g, const float* b, float* y, long rows, long D) {
  k_ln<<<(unsigned)((rows + 127) / 128), 128, 0, (cudaStream_t)ctx->stream>>>(x, g, b, y, rows, D);
  return cudaGetLastError() == cudaSuccess ? 0 : 4;
}
"""

CUDA_LN_BLOCK = r"""
// LayerNorm, one 256-thread block per row: warp shuffles + shared memory for the two sums.
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
__global__ void __launch_bounds__(256) k_ln(const float* __restrict__ x, const float* __restrict__ g, const float* __restrict__ b, float* __restrict__ y, long D) {
  __shared__ float sh[32];
  const long r = blockIdx.x;
  const float* xr = x + r * D;
  float* yr = y + r * D;
  float s = 0.f;
  for (long c = threadIdx.x; c < D; c += blockDim.x) s += xr[c];
  const float mean = block_sum(s, sh) / (float)D;
  float v = 0.f;
  for (long c = threadIdx.x; c < D; c += blockDim.x) { const float d = xr[c] - mean; v += d * d; }
  const float rstd = 1.f / sqrtf(block_sum(v, sh) / (float)D + 1e-5f);
  for (long c = threadIdx.x; c < D; c += blockDim.x) yr[c] = (xr[c] - mean) * rstd * g[c] + b[c];
}
static int layernorm(kf::Context* ctx, const float* x, const float* g, const float* b, float* y, long rows, long D) {
  if (rows > 2147483647L) return 3;
  k_ln<<<(unsigned)rows, 256, 0, (cudaStream_t)ctx->stream>>>(x, g, b, y, D);
  return cudaGetLastError() == cudaSuccess ? 0 : 4;
}
"""

def cpu_forward(par):
    omp = "#pragma omp parallel for schedule(static) num_threads(ctx->num_threads)\n  " if par else ""
    return r"""
extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  if (n_in != 7 || n_out != 1) return 1;
  for (int q = 0; q < 7; ++q)
    if (in[q].dtype != kf::KF_FLOAT32) return 1;
  if (out[0].dtype != kf::KF_FLOAT32 || in[0].ndim < 1 || in[3].ndim != 2 || in[5].ndim != 2) return 1;
  const long D = in[0].shape[in[0].ndim - 1];
  if (D <= 0) return 1;
  const long M = in[0].numel() / D, H = in[3].shape[0];
  if (in[1].numel() != D || in[2].numel() != D || in[3].shape[1] != D || in[4].numel() != H || in[5].shape[0] != D ||
      in[5].shape[1] != H || in[6].numel() != D || out[0].numel() != M * D)
    return 1;
  if (M == 0) return 0;
  const float* x = static_cast<const float*>(in[0].data);
  const float* lw = static_cast<const float*>(in[1].data);
  const float* lb = static_cast<const float*>(in[2].data);
  const float* w1 = static_cast<const float*>(in[3].data);
  const float* b1 = static_cast<const float*>(in[4].data);
  const float* w2 = static_cast<const float*>(in[5].data);
  const float* b2 = static_cast<const float*>(in[6].data);
  float* y = static_cast<float*>(out[0].data);
  float* hn = static_cast<float*>(ctx->scratch_alloc(ctx, sizeof(float) * (size_t)(M * D + M * H)));
  if (!hn) return 2;
  float* u = hn + M * D;
  """ + omp + r"""for (long i = 0; i < M; ++i) ln_row(x + i * D, lw, lb, hn + i * D, D);
  int rc = gemm_nt(ctx, hn, w1, M, H, D, EpiUp{b1, u, H});
  if (!rc) rc = gemm_nt(ctx, u, w2, M, D, H, EpiDown{b2, x, y, D});
  ctx->scratch_free(ctx, hn);
  return rc;
}
"""


CUDA_FORWARD = r"""
extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  if (n_in != 7 || n_out != 1) return 1;
  for (int q = 0; q < 7; ++q)
    if (in[q].dtype != kf::KF_FLOAT32) return 1;
  if (out[0].dtype != kf::KF_FLOAT32 || in[0].ndim < 1 || in[3].ndim != 2 || in[5].ndim != 2) return 1;
  const long D = in[0].shape[in[0].ndim - 1];
  if (D <= 0) return 1;
  const long M = in[0].numel() / D, H = in[3].shape[0];
  if (in[1].numel() != D || in[2].numel() != D || in[3].shape[1] != D || in[4].numel() != H || in[5].shape[0] != D ||
      in[5].shape[1] != H || in[6].numel() != D || out[0].numel() != M * D)
    return 1;
  if (M == 0) return 0;
  if (M > 2147483647L || H > 2147483647L || D > 2147483647L) return 3;
  const float* x = static_cast<const float*>(in[0].data);
  const float* lw = static_cast<const float*>(in[1].data);
  const float* lb = static_cast<const float*>(in[2].data);
  const float* w1 = static_cast<const float*>(in[3].data);
  const float* b1 = static_cast<const float*>(in[4].data);
  const float* w2 = static_cast<const float*>(in[5].data);
  const float* b2 = static_cast<const float*>(in[6].data);
  float* y = static_cast<float*>(out[0].data);
  float* hn = static_cast<float*>(ctx->scratch_alloc(ctx, sizeof(float) * (size_t)(M * D + M * H)));
  if (!hn) return 2;
  float* u = hn + M * D;
  int rc = layernorm(ctx, x, lw, lb, hn, M, D);
  if (!rc) rc = gemm_nt(ctx, hn, w1, M, H, D, EpiUp{b1, u, H});
  if (!rc) rc = gemm_nt(ctx, u, w2, M, D, H, EpiDown{b2, x, y, D});
  ctx->scratch_free(ctx, hn);
  return rc;
}
"""


def generate(header, indent):
    ks = []

    def cpu(variant, tech, gemm, par):
        inc = "#include <omp.h>\n" if par else ""
        code = header(TASK, "cpu", "composite", variant, tech) + inc + EPI + CPU_LN + gemm + cpu_forward(par)
        ks.append(("cpu", variant, "composite", tech, code))

    def cuda(variant, tech, gemm, ln, extra_inc=""):
        code = header(TASK, "cuda", "composite", variant, tech) + extra_inc + EPI + ln + gemm + CUDA_FORWARD
        ks.append(("cuda", variant, "composite", tech, code))

    cpu("naive", "Single-threaded loops: LayerNorm per row, then every output of both linear layers one scalar dot product with bias+GELU and bias+residual applied at the store.",
        CPU_GEMM_NAIVE, False)
    cpu("omp_rows_simd", "Rows split over cores with OpenMP and every output an `omp simd` dot product of two contiguous rows; bias+GELU and bias+residual fused into the stores.",
        CPU_GEMM_DOT, True)
    for bi, bk in ((16, 64), (32, 128)):
        cpu(f"omp_blocked_r4_{bi}x{bk}",
            f"Weights transposed once, row blocks of {bi} over cores with K slices of {bk} (weight panel stays in cache), 4 rows updated per streamed weight row with `omp simd`, bias+GELU / bias+residual fused into the block's store.",
            CPU_GEMM_BLOCKED.format(bi=bi, bk=bk), True)

    cuda("naive_t16", "One thread per output of each linear layer reading A and W straight from global memory, one thread per row for the LayerNorm, bias+GELU and bias+residual fused into the stores.",
         CUDA_GEMM_NAIVE.format(t=16), CUDA_LN_THREAD)
    for t in (16, 32):
        cuda(f"smem_tiled_t{t}", f"{t}x{t} output tiles with {t}-deep slices of activations and weights staged in padded shared memory, block-per-row LayerNorm, bias+GELU and bias+residual fused into the GEMM stores.",
             CUDA_GEMM_TILED.format(t=t), CUDA_LN_BLOCK)
    for bm, bn, bk, tm, tn in ((64, 64, 16, 4, 4), (128, 128, 8, 8, 8)):
        cuda(f"regblock_{bm}x{bn}_{tm}x{tn}",
             f"{bm}x{bn} output tile per block with {bk}-deep shared-memory slices and a {tm}x{tn} register tile per thread (outer-product FMAs), block-per-row LayerNorm, bias+GELU / bias+residual fused into the GEMM stores.",
             CUDA_GEMM_REGBLOCK.format(bm=bm, bn=bn, bk=bk, tm=tm, tn=tn), CUDA_LN_BLOCK)
    cuda("cublas_fused_b256", "Block-per-row LayerNorm, both linear layers as cuBLAS SGEMMs into scratch, each followed by one grid-stride 256-thread pass that applies bias+GELU or bias+residual.",
         CUDA_GEMM_CUBLAS.format(b=256), CUDA_LN_BLOCK, "#include <cublas_v2.h>\n")
    return ks
