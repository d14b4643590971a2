"""212_gru_free_recurrent_scan: u = tanh(x W^T + b); y = cumsum_t(u * w^-t) * w^t per channel.

Inputs (task.json order): x [B,T,D], decay [D], inp.weight [D,D], inp.bias [D]; output [B,T,D].
The decay factors follow the reference exactly: L = logf(decay), lw = L * t (float),
inv = expf(-lw), fwd = expf(lw), y[t] = (sum_{s<=t} u[s] * inv[s]) * fwd[t]. The cost is the
[B*T, D] x [D, D] GEMM; the scan is a cheap sequential pass over t per (b, channel).
"""

TASK = "212_gru_free_recurrent_scan"
FAMILY = "composite"

# Argument checks and unpacking, the same in the CPU and the CUDA sources.
ARGS = r"""struct RS {
  const float* x;
  const float* decay;
  const float* w;
  const float* bias;
  float* y;
  long B, T, D, M;
};

static int rs_parse(const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out, RS& p) {
  if (n_in != 4 || n_out != 1) return 1;
  for (int i = 0; i < 4; ++i)
    if (in[i].dtype != kf::KF_FLOAT32) return 1;
  if (out[0].dtype != kf::KF_FLOAT32) return 1;
  if (in[0].ndim != 3 || in[1].ndim != 1 || in[2].ndim != 2 || in[3].ndim != 1 || out[0].ndim != 3) return 1;
  p.B = in[0].shape[0]; p.T = in[0].shape[1]; p.D = in[0].shape[2];
  p.M = p.B * p.T;
  if (in[1].shape[0] != p.D || in[2].shape[0] != p.D || in[2].shape[1] != p.D || in[3].shape[0] != p.D) return 1;
  for (int i = 0; i < 3; ++i)
    if (out[0].shape[i] != in[0].shape[i]) return 1;
  p.x = static_cast<const float*>(in[0].data);
  p.decay = static_cast<const float*>(in[1].data);
  p.w = static_cast<const float*>(in[2].data);
  p.bias = static_cast<const float*>(in[3].data);
  p.y = static_cast<float*>(out[0].data);
  return 0;
}
"""

CPU_COMMON = r"""
#include <omp.h>

""" + ARGS + r"""
// fwd[t*D+d] = exp(L*t), inv[t*D+d] = exp(-L*t) with L = log(decay[d]), as the reference rounds them.
static void rs_tables(const RS& p, float* fwd, float* inv, int nt) {
#pragma omp parallel for schedule(static) num_threads(nt)
  for (long t = 0; t < p.T; ++t)
    for (long d = 0; d < p.D; ++d) {
      const float lw = logf(p.decay[d]) * (float)t;
      fwd[t * p.D + d] = expf(lw);
      inv[t * p.D + d] = expf(-lw);
    }
}

// In place over y[b] ([T, D] holding tanh(u)): running sum of u * inv, scaled by fwd.
static inline void rs_scan_batch(const RS& p, long b, const float* fwd, const float* inv) {
  float* yb = p.y + b * p.T * p.D;
  for (long t = 1; t < p.T; ++t) {  // prefix sums row by row: the inner loop over d vectorises
    float* prev = yb + (t - 1) * p.D;
    float* cur = yb + t * p.D;
    const float* iv = inv + t * p.D;
#pragma omp simd
    for (long d = 0; d < p.D; ++d) cur[d] = prev[d] + cur[d] * iv[d];
  }
  // t = 0 has inv = 1 so row 0 is already its own prefix; now scale every row by fwd.
  for (long t = 0; t < p.T; ++t) {
    float* cur = yb + t * p.D;
    const float* fv = fwd + t * p.D;
#pragma omp simd
    for (long d = 0; d < p.D; ++d) cur[d] *= fv[d];
  }
}
"""

CPU_NAIVE = r"""
extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  RS p;
  if (int rc = rs_parse(in, n_in, out, n_out, p)) return rc;
  if (p.M == 0 || p.D == 0) return 0;
  // u = tanh(x W^T + b), one dot product per output element.
  for (long m = 0; m < p.M; ++m)
    for (long j = 0; j < p.D; ++j) {
      float acc = 0.f;
      for (long k = 0; k < p.D; ++k) acc += p.x[m * p.D + k] * p.w[j * p.D + k];
      p.y[m * p.D + j] = tanhf(acc + p.bias[j]);
    }
  // Scan channel by channel, factors computed on the fly exactly as the reference does.
  for (long b = 0; b < p.B; ++b)
    for (long d = 0; d < p.D; ++d) {
      const float L = logf(p.decay[d]);
      float s = 0.f;
      for (long t = 0; t < p.T; ++t) {
        float* yp = p.y + (b * p.T + t) * p.D + d;
        const float lw = L * (float)t;
        s += *yp * expf(-lw);
        *yp = s * expf(lw);
      }
    }
  (void)ctx;
  return 0;
}
"""

CPU_ROWDOT = r"""
extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  RS p;
  if (int rc = rs_parse(in, n_in, out, n_out, p)) return rc;
  if (p.M == 0 || p.D == 0) return 0;
  const int nt = ctx->num_threads > 0 ? ctx->num_threads : 1;
  float* fwd = static_cast<float*>(ctx->scratch_alloc(ctx, sizeof(float) * 2 * (size_t)p.T * (size_t)p.D));
  if (!fwd) return 2;
  float* inv = fwd + p.T * p.D;
  rs_tables(p, fwd, inv, nt);
#pragma omp parallel for schedule(static) num_threads(nt)
  for (long m = 0; m < p.M; ++m) {
    const float* xr = p.x + m * p.D;
    for (long j = 0; j < p.D; ++j) {
      const float* wr = p.w + j * p.D;
      float acc = 0.f;
#pragma omp simd reduction(+ : acc)
      for (long k = 0; k < p.D; ++k) acc += xr[k] * wr[k];
      p.y[m * p.D + j] = tanhf(acc + p.bias[j]);
    }
  }
#pragma omp parallel for schedule(static) num_threads(nt)
  for (long b = 0; b < p.B; ++b) rs_scan_batch(p, b, fwd, inv);
  ctx->scratch_free(ctx, fwd);
  return 0;
}
"""

CPU_FUSED = r"""
extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  RS p;
  if (int rc = rs_parse(in, n_in, out, n_out, p)) return rc;
  if (p.M == 0 || p.D == 0) return 0;
  const int nt = ctx->num_threads > 0 ? ctx->num_threads : 1;
  float* fwd = static_cast<float*>(ctx->scratch_alloc(ctx, sizeof(float) * 2 * (size_t)p.T * (size_t)p.D));
  float* Wt = static_cast<float*>(ctx->scratch_alloc(ctx, sizeof(float) * (size_t)p.D * (size_t)p.D));
  if (!fwd || !Wt) return 2;
  float* inv = fwd + p.T * p.D;
  rs_tables(p, fwd, inv, nt);
#pragma omp parallel for schedule(static) num_threads(nt)
  for (long k = 0; k < p.D; ++k)
    for (long j = 0; j < p.D; ++j) Wt[k * p.D + j] = p.w[j * p.D + k];  // W^T: rows stream over outputs
  const long BK = __BK__, BJ = __BJ__;
  // One task per (sequence, column block): the GEMM of its T rows, tanh, then the scan of
  // those columns while they are still in cache.
  const long njb = (p.D + BJ - 1) / BJ;
#pragma omp parallel for schedule(dynamic) num_threads(nt)
  for (long task = 0; task < p.B * njb; ++task) {
    const long b = task / njb, j0 = (task % njb) * BJ, j1 = j0 + BJ < p.D ? j0 + BJ : p.D, nj = j1 - j0;
    float* yb = p.y + b * p.T * p.D;
    const float* xb = p.x + b * p.T * p.D;
    for (long t = 0; t < p.T; ++t)
      for (long j = j0; j < j1; ++j) yb[t * p.D + j] = p.bias[j];
    for (long k0 = 0; k0 < p.D; k0 += BK) {
      const long k1 = k0 + BK < p.D ? k0 + BK : p.D;
      long t = 0;
      for (; t + 4 <= p.T; t += 4) {  // four rows share each streamed row of W^T
        float* y0 = yb + t * p.D + j0;
        float* y1 = y0 + p.D;
        float* y2 = y1 + p.D;
        float* y3 = y2 + p.D;
        const float* xr = xb + t * p.D;
        for (long k = k0; k < k1; ++k) {
          const float a0 = xr[k], a1 = xr[p.D + k], a2 = xr[2 * p.D + k], a3 = xr[3 * p.D + k];
          const float* wr = Wt + k * p.D + j0;
#pragma omp simd
          for (long j = 0; j < nj; ++j) {
            const float wv = wr[j];
            y0[j] += a0 * wv;
            y1[j] += a1 * wv;
            y2[j] += a2 * wv;
            y3[j] += a3 * wv;
          }
        }
      }
      for (; t < p.T; ++t) {
        float* yr = yb + t * p.D + j0;
        const float* xr = xb + t * p.D;
        for (long k = k0; k < k1; ++k) {
          const float av = xr[k];
          const float* wr = Wt + k * p.D + j0;
#pragma omp simd
          for (long j = 0; j < nj; ++j) yr[j] += av * wr[j];
        }
      }
    }
    // tanh and the running sum of u * inv over t for these columns, then the rescale by fwd.
    for (long t = 0; t < p.T; ++t) {
      float* cur = yb + t * p.D;
      const float* iv = inv + t * p.D;
      for (long j = j0; j < j1; ++j) {
        const float prev = t > 0 ? cur[j - p.D] : 0.f;
        cur[j] = prev + tanhf(cur[j]) * iv[j];
      }
    }
    for (long t = 0; t < p.T; ++t) {
      float* cur = yb + t * p.D;
      const float* fv = fwd + t * p.D;
#pragma omp simd
      for (long j = j0; j < j1; ++j) cur[j] *= fv[j];
    }
  }
  ctx->scratch_free(ctx, Wt);
  ctx->scratch_free(ctx, fwd);
  return 0;
}
"""

# --------------------------------------------------------------------------------------
# CUDA
# --------------------------------------------------------------------------------------
CUDA_COMMON = r"""
""" + ARGS + r"""
// One thread per (sequence, channel), sequential over t (coalesced across channels).
// y holds the pre-activation (ADD_BIAS_TANH) or u itself; the factors follow the reference:
// lw = logf(decay) * t, s += u * expf(-lw), y = s * expf(lw).
template <bool ADD_BIAS_TANH>
__global__ void k_scan(RS p) {
  const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= p.B * p.D) return;
  const long b = idx / p.D, d = idx - b * p.D;
  const float L = logf(p.decay[d]);
  const float bj = ADD_BIAS_TANH ? p.bias[d] : 0.f;
  float* yp = p.y + b * p.T * p.D + d;
  float s = 0.f;
  for (long t = 0; t < p.T; ++t) {
    float u = yp[t * p.D];
    if (ADD_BIAS_TANH) u = tanhf(u + bj);
    const float lw = L * (float)t;
    s += u * expf(-lw);
    yp[t * p.D] = s * expf(lw);
  }
}
"""

CUDA_NAIVE = r"""
// One thread per element of u: a D-long dot product from global memory, then tanh.
__global__ void k_linear(RS p) {
  const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= p.M * p.D) return;
  const long m = idx / p.D, j = idx - m * p.D;
  const float* xr = p.x + m * p.D;
  const float* wr = p.w + j * p.D;
  float acc = 0.f;
  for (long k = 0; k < p.D; ++k) acc += xr[k] * wr[k];
  p.y[idx] = tanhf(acc + p.bias[j]);
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  RS p;
  if (int rc = rs_parse(in, n_in, out, n_out, p)) return rc;
  if (p.M == 0 || p.D == 0) return 0;
  cudaStream_t st = static_cast<cudaStream_t>(ctx->stream);
  const long n = p.M * p.D;
  k_linear<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(p);
  const long nc = p.B * p.D;
  k_scan<false><<<(unsigned)((nc + 255) / 256), 256, 0, st>>>(p);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
"""

CUDA_TILED = r"""
// T x T tile of u per block, x rows and W rows staged through shared memory T values of K at
// a time; the epilogue adds the bias and applies tanh.
template <int T>
__global__ void __launch_bounds__(T * T) k_linear(RS p) {
  __shared__ float Xs[T][T + 1];  // Xs[row][k]
  __shared__ float Ws[T][T + 1];  // Ws[out column][k]
  const int tx = threadIdx.x, ty = threadIdx.y;
  const long m0 = (long)blockIdx.x * T, n0 = (long)blockIdx.y * T;
  const long mr = m0 + ty, nr = n0 + ty;
  float acc = 0.f;
  for (long k0 = 0; k0 < p.D; k0 += T) {
    const long k = k0 + tx;
    Xs[ty][tx] = (mr < p.M && k < p.D) ? p.x[mr * p.D + k] : 0.f;
    Ws[ty][tx] = (nr < p.D && k < p.D) ? p.w[nr * p.D + k] : 0.f;
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < T; ++kk) acc += Xs[ty][kk] * Ws[tx][kk];
    __syncthreads();
  }
  const long m = m0 + ty, n = n0 + tx;
  if (m < p.M && n < p.D) p.y[m * p.D + n] = tanhf(acc + p.bias[n]);
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  RS p;
  if (int rc = rs_parse(in, n_in, out, n_out, p)) return rc;
  if (p.M == 0 || p.D == 0) return 0;
  cudaStream_t st = static_cast<cudaStream_t>(ctx->stream);
  const int T = __T__;
  dim3 grid((unsigned)((p.M + T - 1) / T), (unsigned)((p.D + T - 1) / T));
  k_linear<T><<<grid, dim3(T, T), 0, st>>>(p);
  const long nc = p.B * p.D;
  k_scan<false><<<(unsigned)((nc + 255) / 256), 256, 0, st>>>(p);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
"""

CUDA_CUBLAS = r"""
#include <cublas_v2.h>

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  RS p;
  if (int rc = rs_parse(in, n_in, out, n_out, p)) return rc;
  if (p.M == 0 || p.D == 0) return 0;
  if (p.M > 2147483647L || p.D > 2147483647L) return 1;
  cudaStream_t st = static_cast<cudaStream_t>(ctx->stream);
  cublasHandle_t h = static_cast<cublasHandle_t>(ctx->cublas);
  // Row-major Y[M,D] = X[M,D] * W[D,D]^T  ==  column-major Y^T = op_T(W^T) * X^T.
  const float one = 1.f, zero = 0.f;
  if (cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)p.D, (int)p.M, (int)p.D, &one, p.w, (int)p.D, p.x, (int)p.D, &zero,
                  p.y, (int)p.D) != CUBLAS_STATUS_SUCCESS)
    return 1;
  // Bias, tanh and the decayed scan fused in one pass over the GEMM output.
  const long nc = p.B * p.D;
  k_scan<true><<<(unsigned)((nc + __NB__ - 1) / __NB__), __NB__, 0, st>>>(p);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
"""


def generate(header, indent):
    ks = []

    def add(backend, variant, tech, common, body):
        ks.append((backend, variant, FAMILY, tech, header(TASK, backend, FAMILY, variant, tech) + common + body))

    add("cpu", "naive",
        "Single-threaded: a dot product per element of the input projection with tanh, then a per-channel sequential scan that recomputes both decay factors with logf/expf at every step.",
        CPU_COMMON, CPU_NAIVE)
    add("cpu", "omp_rowdot",
        "OpenMP over rows for the projection (unit-stride `omp simd` dot products of x rows with W rows), decay factors tabulated once, and a row-wise prefix scan over time that vectorises across channels.",
        CPU_COMMON, CPU_ROWDOT)
    for bj, bk in ((128, 128), (256, 256)):
        add("cpu", f"omp_fused_r4_j{bj}_k{bk}",
            f"One OpenMP task per (sequence, {bj}-column block): a register-blocked GEMM (4 time steps per streamed row of the transposed weight, {bk}-deep K blocks, vectorised over columns) whose tile then gets bias+tanh and the decayed prefix scan while still in cache.",
            CPU_COMMON, CPU_FUSED.replace("__BJ__", str(bj)).replace("__BK__", str(bk)))

    add("cuda", "naive_b256",
        "One thread per projection output (D-long dot product from global memory, tanh), then one thread per (sequence, channel) running the decayed scan sequentially over time with coalesced accesses across channels.",
        CUDA_COMMON, CUDA_NAIVE)
    for t in (16, 32):
        add("cuda", f"smem_tiled_t{t}",
            f"{t}x{t} shared-memory tiled GEMM for the projection with a bias+tanh epilogue, then a thread-per-(sequence, channel) sequential scan over time, coalesced across channels.",
            CUDA_COMMON, CUDA_TILED.replace("__T__", str(t)))
    for nb in (128, 256):
        add("cuda", f"cublas_fused_scan_b{nb}",
            f"cuBLAS SGEMM for the projection, then a single {nb}-thread-block pass that fuses bias, tanh and the decayed time scan per (sequence, channel), reading and writing each element once.",
            CUDA_COMMON, CUDA_CUBLAS.replace("__NB__", str(nb)))
    return ks
