"""209_gated_mlp: y = x + down(silu(gate(h)) * up(h)), h = x * rsqrt(mean(x^2) + 1e-6) * scale.

x [M, D], gate/up [H, D], down [D, H], no biases. CPU: naive loops / OpenMP rows with SIMD dot
products / OpenMP cache-blocked GEMM on the transposed weight with 4-row register reuse;
CUDA: one thread per output / shared-memory tiles / register-blocked tiles / cuBLAS SGEMM.
The up GEMM's store applies silu(gate) * up in place over the gate result, the down GEMM's
store adds the residual.
"""

from _gemm import CPU_GEMM_NAIVE, CPU_GEMM_DOT, CPU_GEMM_BLOCKED, CUDA_GEMM_NAIVE, CUDA_GEMM_TILED, CUDA_GEMM_REGBLOCK, CUDA_GEMM_CUBLAS  # noqa: F401 (shared GEMM building blocks)

TASK = "209_gated_mlp"

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
