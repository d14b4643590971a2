"""123_linear_relu_fp16: y = relu(x @ W^T + b), all tensors float16 (tolerance 1e-2).

x: [..., K], W: [N, K], b: [N], y: [..., N]. Every kernel accumulates in float and rounds to
half once at the end (round to nearest even).
"""

TASK = "123_linear_relu_fp16"

PARSE = r"""
struct LP {
  const uint16_t* x;  // half bits
  const uint16_t* w;
  const uint16_t* b;
  uint16_t* y;
  long M, K, N;
};

static int parse(const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out, LP& p) {
  if (n_in != 3 || n_out != 1) return 1;
  if (in[0].dtype != kf::KF_FLOAT16 || in[1].dtype != kf::KF_FLOAT16 || in[2].dtype != kf::KF_FLOAT16 ||
      out[0].dtype != kf::KF_FLOAT16) return 1;
  if (in[0].ndim < 1 || in[1].ndim != 2 || in[2].ndim != 1 || out[0].ndim != in[0].ndim) return 1;
  p.K = in[0].shape[in[0].ndim - 1];
  p.N = in[1].shape[0];
  if (in[1].shape[1] != p.K || in[2].shape[0] != p.N) return 1;
  p.M = 1;
  for (int d = 0; d + 1 < in[0].ndim; ++d) {
    if (out[0].shape[d] != in[0].shape[d]) return 1;
    p.M *= in[0].shape[d];
  }
  if (out[0].shape[out[0].ndim - 1] != p.N) return 1;
  p.x = static_cast<const uint16_t*>(in[0].data);
  p.w = static_cast<const uint16_t*>(in[1].data);
  p.b = static_cast<const uint16_t*>(in[2].data);
  p.y = static_cast<uint16_t*>(out[0].data);
  return 0;
}
"""

# Portable IEEE half <-> float on the bit patterns (CPU).
CPU_HALF = r"""
static inline float h2f(uint16_t h) {
  uint32_t s = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu, f;
  if (e == 0) {
    if (m == 0) {
      f = s;
    } else {  // subnormal: normalise the mantissa
      e = 113;
      while (!(m & 0x400u)) {
        m <<= 1;
        --e;
      }
      f = s | (e << 23) | ((m & 0x3ffu) << 13);
    }
  } else if (e == 31) {
    f = s | 0x7f800000u | (m << 13);
  } else {
    f = s | ((e + 112) << 23) | (m << 13);
  }
  float r;
  memcpy(&r, &f, 4);
  return r;
}

static inline uint16_t f2h(float v) {  // round to nearest even
  uint32_t x;
  memcpy(&x, &v, 4);
  const uint32_t s = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return (uint16_t)(s | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
  if (ax >= 0x477ff000u) return (uint16_t)(s | 0x7c00u);  // >= 65520 rounds to inf
  if (ax < 0x38800000u) {                                  // below 2^-14: subnormal half
    const uint32_t e = ax >> 23;
    if (e < 102) return (uint16_t)s;
    const uint32_t m = (ax & 0x7fffffu) | 0x800000u, sh = 126 - e;
    uint32_t h = m >> sh;
    const uint32_t rem = m & ((1u << sh) - 1), half = 1u << (sh - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return (uint16_t)(s | h);
  }
  const uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u);
  return (uint16_t)(s | ((r - 0x38000000u) >> 13));
}
"""

CPU_NAIVE = r"""
extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  (void)ctx;
  LP p;
  if (parse(in, n_in, out, n_out, p)) return 1;
  for (long i = 0; i < p.M; ++i)
    for (long j = 0; j < p.N; ++j) {
      float acc = 0.f;
      for (long k = 0; k < p.K; ++k) acc += h2f(p.x[i * p.K + k]) * h2f(p.w[j * p.K + k]);
      acc += h2f(p.b[j]);
      p.y[i * p.N + j] = f2h(acc > 0.f ? acc : 0.f);
    }
  return 0;
}
"""

# Convert x and W once into float scratch, then OpenMP over rows with a vectorised dot product
# per output (both operands unit stride along k).
CPU_OMP_DOT = r"""
extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  LP p;
  if (parse(in, n_in, out, n_out, p)) return 1;
  if (p.M * p.N == 0) return 0;
  const int nt = ctx->num_threads;
  float* xf = static_cast<float*>(ctx->scratch_alloc(ctx, sizeof(float) * (p.M * p.K + p.N * p.K + p.N) + 64));
  if (!xf) return 2;
  float* wf = xf + p.M * p.K;
  float* bf = wf + p.N * p.K;
#pragma omp parallel num_threads(nt)
  {
#pragma omp for schedule(static) nowait
    for (long i = 0; i < p.M * p.K; ++i) xf[i] = h2f(p.x[i]);
#pragma omp for schedule(static) nowait
    for (long i = 0; i < p.N * p.K; ++i) wf[i] = h2f(p.w[i]);
#pragma omp for schedule(static)
    for (long j = 0; j < p.N; ++j) bf[j] = h2f(p.b[j]);
#pragma omp for schedule(static)
    for (long i = 0; i < p.M; ++i) {
      const float* xr = xf + i * p.K;
      for (long j = 0; j < p.N; ++j) {
        const float* wr = wf + j * p.K;
        float acc = 0.f;
#pragma omp simd reduction(+ : acc)
        for (long k = 0; k < p.K; ++k) acc += xr[k] * wr[k];
        acc += bf[j];
        p.y[i * p.N + j] = f2h(acc > 0.f ? acc : 0.f);
      }
    }
  }
  ctx->scratch_free(ctx, xf);
  return 0;
}
"""

# Convert x to float and W to a float transpose Wt[K][N] once; OpenMP over (row block, column
# block) tiles of MI x NJ accumulators; for each k the tile gets x[i][k] * Wt[k][j..j+NJ)
# (unit stride in j, vectorised), k blocked by KB so the Wt panel stays in cache, then the
# bias + ReLU + half rounding epilogue.
CPU_OMP_TILED = r"""
#include <omp.h>
#include <algorithm>

#define MI @MI@
#define NJ @NJ@
#define KB 256

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  LP p;
  if (parse(in, n_in, out, n_out, p)) return 1;
  if (p.M * p.N == 0) return 0;
  const int nt = ctx->num_threads;
  float* xf = static_cast<float*>(ctx->scratch_alloc(ctx, sizeof(float) * (p.M * p.K + p.K * p.N + p.N) + 64));
  if (!xf) return 2;
  float* wt = xf + p.M * p.K;
  float* bf = wt + p.K * p.N;
  const long mb = (p.M + MI - 1) / MI, nb = (p.N + NJ - 1) / NJ;
#pragma omp parallel num_threads(nt)
  {
#pragma omp for schedule(static) nowait
    for (long i = 0; i < p.M * p.K; ++i) xf[i] = h2f(p.x[i]);
#pragma omp for schedule(static) nowait
    for (long j = 0; j < p.N; ++j) bf[j] = h2f(p.b[j]);
    // transpose W [N][K] -> Wt [K][N] in 32 x 32 blocks
#pragma omp for schedule(static)
    for (long blk = 0; blk < ((p.N + 31) / 32) * ((p.K + 31) / 32); ++blk) {
      const long j0 = (blk / ((p.K + 31) / 32)) * 32, k0 = (blk % ((p.K + 31) / 32)) * 32;
      for (long j = j0; j < std::min(j0 + 32, p.N); ++j)
        for (long k = k0; k < std::min(k0 + 32, p.K); ++k) wt[k * p.N + j] = h2f(p.w[j * p.K + k]);
    }
#pragma omp for schedule(static)
    for (long t = 0; t < mb * nb; ++t) {
      const long i0 = (t % mb) * MI, j0 = (t / mb) * NJ;
      const long mi = std::min((long)MI, p.M - i0), nj = std::min((long)NJ, p.N - j0);
      float acc[MI][NJ];
      for (int a = 0; a < MI; ++a)
        for (int c = 0; c < NJ; ++c) acc[a][c] = 0.f;
      if (nj == NJ && mi == MI) {
        for (long k = 0; k < p.K; ++k) {
          const float* wr = wt + k * p.N + j0;
#pragma GCC unroll 8
          for (int a = 0; a < MI; ++a) {
            const float xv = xf[(i0 + a) * p.K + k];
#pragma omp simd
            for (int c = 0; c < NJ; ++c) acc[a][c] += xv * wr[c];
          }
        }
      } else {
        for (long k = 0; k < p.K; ++k) {
          const float* wr = wt + k * p.N + j0;
          for (long a = 0; a < mi; ++a) {
            const float xv = xf[(i0 + a) * p.K + k];
            for (long c = 0; c < nj; ++c) acc[a][c] += xv * wr[c];
          }
        }
      }
      for (long a = 0; a < mi; ++a)
        for (long c = 0; c < nj; ++c) {
          const float v = acc[a][c] + bf[j0 + c];
          p.y[(i0 + a) * p.N + j0 + c] = f2h(v > 0.f ? v : 0.f);
        }
    }
  }
  ctx->scratch_free(ctx, xf);
  return 0;
}
"""

# ----------------------------------------------------------------------------------------
# CUDA
# ----------------------------------------------------------------------------------------
CUDA_INC = "#include <cuda_fp16.h>\n"

CUDA_HELP = r"""
static __device__ __forceinline__ float ldh(const uint16_t* p) {
  return __half2float(__ushort_as_half(__ldg(reinterpret_cast<const unsigned short*>(p))));
}
static __device__ __forceinline__ uint16_t relu_h(float v) {
  return __half_as_ushort(__float2half_rn(v > 0.f ? v : 0.f));
}
"""

CUDA_NAIVE = r"""
__global__ void k_naive(LP p) {
  const long j = (long)blockIdx.x * 16 + threadIdx.x;
  const long i = (long)blockIdx.y * 16 + threadIdx.y;
  if (i >= p.M || j >= p.N) return;
  const uint16_t* xr = p.x + i * p.K;
  const uint16_t* wr = p.w + j * p.K;
  float acc = 0.f;
  for (long k = 0; k < p.K; ++k) acc += ldh(xr + k) * ldh(wr + k);
  p.y[i * p.N + j] = relu_h(acc + ldh(p.b + j));
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  LP p;
  if (parse(in, n_in, out, n_out, p)) return 1;
  if (p.M * p.N == 0) return 0;
  const long gx = (p.N + 15) / 16, gy = (p.M + 15) / 16;
  if (gx > 2147483647L || gy > 65535) return 1;
  k_naive<<<dim3((unsigned)gx, (unsigned)gy), dim3(16, 16), 0, static_cast<cudaStream_t>(ctx->stream)>>>(p);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
"""

# Shared-memory tiles of x rows and W rows (converted to float on load, padded against bank
# conflicts), one output per thread, bias + ReLU + rounding fused in the epilogue.
CUDA_TILED = r"""
#define T @T@
__global__ void __launch_bounds__(T * T) k_tiled(LP p) {
  __shared__ float xs[T][T + 1];
  __shared__ float ws[T][T + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const long i = (long)blockIdx.y * T + ty;          // output row
  const long j = (long)blockIdx.x * T + tx;          // output column
  const long jw = (long)blockIdx.x * T + ty;         // W row this thread loads
  float acc = 0.f;
  for (long k0 = 0; k0 < p.K; k0 += T) {
    const long k = k0 + tx;
    xs[ty][tx] = (i < p.M && k < p.K) ? ldh(p.x + i * p.K + k) : 0.f;
    ws[ty][tx] = (jw < p.N && k < p.K) ? ldh(p.w + jw * p.K + k) : 0.f;
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < T; ++kk) acc += xs[ty][kk] * ws[tx][kk];
    __syncthreads();
  }
  if (i < p.M && j < p.N) p.y[i * p.N + j] = relu_h(acc + ldh(p.b + j));
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  LP p;
  if (parse(in, n_in, out, n_out, p)) return 1;
  if (p.M * p.N == 0) return 0;
  const long gx = (p.N + T - 1) / T, gy = (p.M + T - 1) / T;
  if (gx > 2147483647L || gy > 65535) return 1;
  k_tiled<<<dim3((unsigned)gx, (unsigned)gy), dim3(T, T), 0, static_cast<cudaStream_t>(ctx->stream)>>>(p);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
"""

# Tensor cores through WMMA: block tile BM x BN over k steps of 32 (half tiles in shared
# memory, rows padded by 8 halves), each warp owns FM x FN 16x16 float accumulator fragments;
# the epilogue stages one fragment at a time in the warp's shared scratch and applies
# bias + ReLU + half rounding with bounds checks (any M, N, K: out-of-range loads are zero).
CUDA_WMMA = r"""
#include <mma.h>
using namespace nvcuda;

#define BM @BM@
#define BN @BN@
#define WARPS_M @WM@
#define WARPS_N @WN@
#define BK 32
#define LDS (BK + 8)
#define NTH (WARPS_M * WARPS_N * 32)
#define FM (BM / WARPS_M / 16)
#define FN (BN / WARPS_N / 16)

template <bool VEC>
static __device__ __forceinline__ void load_tile(__half* dst, const uint16_t* src, long rows, long r0, long K, long k0,
                                                 int nrows) {
  if (VEC) {  // K % 8 == 0: 8 halves (16 bytes) per load, aligned
    for (int t = threadIdx.x; t < nrows * (BK / 8); t += NTH) {
      const int r = t / (BK / 8), c8 = (t % (BK / 8)) * 8;
      const long gr = r0 + r, gk = k0 + c8;
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (gr < rows && gk < K) v = __ldg(reinterpret_cast<const uint4*>(src + gr * K + gk));
      *reinterpret_cast<uint4*>(dst + r * LDS + c8) = v;
    }
  } else {
    for (int t = threadIdx.x; t < nrows * BK; t += NTH) {
      const int r = t / BK, c = t % BK;
      const long gr = r0 + r, gk = k0 + c;
      unsigned short v = 0;
      if (gr < rows && gk < K) v = __ldg(reinterpret_cast<const unsigned short*>(src + gr * K + gk));
      dst[r * LDS + c] = __ushort_as_half(v);
    }
  }
}

template <bool VEC>
__global__ void __launch_bounds__(NTH) k_wmma(LP p) {
  __shared__ __align__(32) __half as[BM * LDS];
  __shared__ __align__(32) __half bs[BN * LDS];
  __shared__ __align__(32) float stage[WARPS_M * WARPS_N][16 * 16];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp / WARPS_N, wn = warp % WARPS_N;
  const long m0 = (long)blockIdx.y * BM, n0 = (long)blockIdx.x * BN;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FM][FN];
#pragma unroll
  for (int a = 0; a < FM; ++a)
#pragma unroll
    for (int b = 0; b < FN; ++b) wmma::fill_fragment(acc[a][b], 0.f);
  for (long k0 = 0; k0 < p.K; k0 += BK) {
    load_tile<VEC>(as, p.x, p.M, m0, p.K, k0, BM);
    load_tile<VEC>(bs, p.w, p.N, n0, p.K, k0, BN);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa[FM];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb[FN];
#pragma unroll
      for (int a = 0; a < FM; ++a) wmma::load_matrix_sync(fa[a], as + (wm * FM * 16 + a * 16) * LDS + kk, LDS);
#pragma unroll
      for (int b = 0; b < FN; ++b) wmma::load_matrix_sync(fb[b], bs + (wn * FN * 16 + b * 16) * LDS + kk, LDS);
#pragma unroll
      for (int a = 0; a < FM; ++a)
#pragma unroll
        for (int b = 0; b < FN; ++b) wmma::mma_sync(acc[a][b], fa[a], fb[b], acc[a][b]);
    }
    __syncthreads();
  }
  float* st = stage[warp];
#pragma unroll
  for (int a = 0; a < FM; ++a)
#pragma unroll
    for (int b = 0; b < FN; ++b) {
      wmma::store_matrix_sync(st, acc[a][b], 16, wmma::mem_row_major);
      __syncwarp();
      const long r0 = m0 + wm * FM * 16 + a * 16, c0 = n0 + wn * FN * 16 + b * 16;
      for (int e = lane; e < 256; e += 32) {
        const long r = r0 + e / 16, c = c0 + e % 16;
        if (r < p.M && c < p.N) p.y[r * p.N + c] = relu_h(st[e] + ldh(p.b + c));
      }
      __syncwarp();
    }
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  LP p;
  if (parse(in, n_in, out, n_out, p)) return 1;
  if (p.M * p.N == 0) return 0;
  const long gx = (p.N + BN - 1) / BN, gy = (p.M + BM - 1) / BM;
  if (gx > 2147483647L || gy > 65535) return 1;
  cudaStream_t st = static_cast<cudaStream_t>(ctx->stream);
  if (p.K % 8 == 0)
    k_wmma<true><<<dim3((unsigned)gx, (unsigned)gy), NTH, 0, st>>>(p);
  else
    k_wmma<false><<<dim3((unsigned)gx, (unsigned)gy), NTH, 0, st>>>(p);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
"""

# cuBLAS: y is preloaded with the bias rows, one GemmEx (fp16 in/out, fp32 compute, tensor
# cores) computes y = x W^T + 1 * y with a single rounding, then an in-place half2 ReLU.
CUDA_CUBLAS = r"""
__global__ void k_bias_rows(LP p) {
  const long total = p.M * p.N;
  for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long)gridDim.x * blockDim.x)
    p.y[i] = p.b[i % p.N];
}

__global__ void k_relu(uint16_t* y, long total) {
  const long pairs = total / 2;
  __half2* y2 = reinterpret_cast<__half2*>(y);
  const __half2 z = __float2half2_rn(0.f);
  for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < pairs; i += (long)gridDim.x * blockDim.x)
    y2[i] = __hmax2(y2[i], z);
  if (blockIdx.x == 0 && threadIdx.x == 0 && (total & 1)) {
    const __half h = __ushort_as_half(y[total - 1]);
    y[total - 1] = __half_as_ushort(__hgt(h, __float2half(0.f)) ? h : __float2half(0.f));
  }
}

static unsigned grid_for(long total, int bs) {
  long b = (total + bs - 1) / bs;
  if (b > (1L << 20)) b = 1L << 20;
  return (unsigned)(b < 1 ? 1 : b);
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  LP p;
  if (parse(in, n_in, out, n_out, p)) return 1;
  const long total = p.M * p.N;
  if (total == 0) return 0;
  if (p.M > 2147483647L || p.N > 2147483647L || p.K > 2147483647L) return 1;
  cudaStream_t st = static_cast<cudaStream_t>(ctx->stream);
  cublasHandle_t h = static_cast<cublasHandle_t>(ctx->cublas);
  k_bias_rows<<<grid_for(total, 256), 256, 0, st>>>(p);
  if (cudaGetLastError() != cudaSuccess) return 3;
  if (p.K > 0) {
    const float one = 1.f;
    // column-major: Y^T (N x M, ld N) = op_T(W viewed K x N) * (x viewed K x M) + Y^T
    if (cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)p.N, (int)p.M, (int)p.K, &one, p.w, CUDA_R_16F, (int)p.K,
                     p.x, CUDA_R_16F, (int)p.K, &one, p.y, CUDA_R_16F, (int)p.N, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
      return 4;
  }
  k_relu<<<grid_for(total / 2 + 1, 256), 256, 0, st>>>(p.y, total);
  return cudaGetLastError() == cudaSuccess ? 0 : 5;
}
"""


def generate(header, indent):
    out = []

    def add(backend, variant, tech, body, inc=""):
        code = header(TASK, backend, "matmul", variant, tech) + inc + PARSE + body
        out.append((backend, variant, "matmul", tech, code))

    add("cpu", "naive",
        "Single-threaded triple loop converting both half operands to float inside the dot product, then bias, ReLU and round-to-nearest-even.",
        CPU_HALF + CPU_NAIVE)
    add("cpu", "omp_convert_dot",
        "x and W are converted to float once into scratch, then OpenMP over rows computes every output as a vectorised unit-stride dot product with the epilogue fused.",
        CPU_HALF + CPU_OMP_DOT, "#include <omp.h>\n")
    for mi, nj in ((4, 32), (8, 64)):
        add("cpu", f"omp_transposed_tile_{mi}x{nj}",
            f"W is converted once to a float transpose so each k step broadcasts x[i][k] into a {mi}x{nj} accumulator tile updated with unit-stride vector FMAs; OpenMP over tiles, epilogue fused.",
            CPU_HALF + CPU_OMP_TILED.replace("@MI@", str(mi)).replace("@NJ@", str(nj)))

    add("cuda", "naive_b16x16",
        "One thread per output reading half operands from global memory with float accumulation, bias + ReLU + rounding fused.",
        CUDA_HELP + CUDA_NAIVE, CUDA_INC)
    for t in (16, 32):
        add("cuda", f"smem_tiled_t{t}",
            f"{t}x{t} shared-memory tiles of x rows and W rows converted to float on load (padded rows), one output per thread, fused bias + ReLU epilogue.",
            CUDA_HELP + CUDA_TILED.replace("@T@", str(t)), CUDA_INC)
    for bm, bn, wm, wn in ((64, 64, 2, 2), (128, 128, 2, 4)):
        add("cuda", f"wmma_{bm}x{bn}_w{wm}x{wn}",
            f"Tensor cores via WMMA: {bm}x{bn} block tiles over 32-wide k steps in shared memory (16-byte loads when K allows), {wm}x{wn} warps each holding a grid of 16x16 float accumulators, fragment-wise bias + ReLU + half epilogue.",
            CUDA_HELP + CUDA_WMMA.replace("@BM@", str(bm)).replace("@BN@", str(bn)).replace("@WM@", str(wm)).replace("@WN@", str(wn)),
            CUDA_INC)
    add("cuda", "cublas_gemmex_bias_beta1",
        "The output is preloaded with the bias rows and one cuBLAS GemmEx (fp16 operands, fp32 tensor-core compute, beta = 1) adds x W^T with a single rounding, followed by an in-place half2 ReLU.",
        CUDA_CUBLAS, CUDA_INC + "#include <cublas_v2.h>\n")
    return out
