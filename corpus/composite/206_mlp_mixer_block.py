"""206_mlp_mixer_block: MLP-Mixer block, x [B, T, D].

x1 = x + tok2(gelu(tok1(LN1(x)^T)))^T (token mixing over T), y = x1 + ch2(gelu(ch1(LN2(x1)))).
CPU and the hand-written CUDA GEMMs: LN1 writes its rows transposed ([B, D, T]) so the token
MLP is two ordinary A * W^T GEMMs; the second one's store writes back transposed with the
residual into y. CPU: naive loops / OpenMP rows with SIMD dot products / OpenMP cache-blocked
GEMM with 4-row register reuse; CUDA: one thread per output / shared-memory tiles /
register-blocked tiles / cuBLAS (token mixing as a strided-batched SGEMM with the weight on the
left, no transposes).
"""

from _gemm import CPU_GEMM_NAIVE, CPU_GEMM_DOT, CPU_GEMM_BLOCKED, CUDA_GEMM_NAIVE, CUDA_GEMM_TILED, CUDA_GEMM_REGBLOCK, CUDA_GEMM_CUBLAS  # noqa: F401 (shared GEMM building blocks)

TASK = "206_mlp_mixer_block"

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
