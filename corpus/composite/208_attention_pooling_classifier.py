"""208_attention_pooling_classifier: learned-query attention pooling, linear head, mean cross entropy.

Inputs (task.json order): x [B,S,D], target [B] int64, query [1,1,D], key.weight [D,D],
key.bias [D], head.weight [C,D], head.bias [C]; output: the scalar mean loss.
score[b,s] = q . (Wk x[b,s] + bk) / sqrt(D); w = softmax_s(score); pooled = sum_s w x[b,s];
logits = Wh pooled + bh; loss = mean_b (logsumexp(logits) - logits[target]).
The fast variants fold the query into the key projection: q . (Wk x + bk) = (Wk^T q) . x + q . bk,
which turns the [B*S, D] x [D, D] GEMM into one GEMV per row.
"""

TASK = "208_attention_pooling_classifier"
FAMILY = "composite"

# Argument checks and unpacking, the same in the CPU and the CUDA sources.
ARGS = r"""struct AP {
  const float* x;
  const int64_t* tgt;
  const float* q;
  const float* wk;
  const float* bk;
  const float* wh;
  const float* bh;
  float* out;
  long B, S, D, C;
};

static int ap_parse(const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out, AP& p) {
  if (n_in != 7 || n_out != 1) return 1;
  if (in[1].dtype != kf::KF_INT64 || out[0].dtype != kf::KF_FLOAT32 || out[0].numel() != 1) return 1;
  for (int i = 0; i < 7; ++i)
    if (i != 1 && in[i].dtype != kf::KF_FLOAT32) return 1;
  if (in[0].ndim != 3 || in[1].ndim != 1 || in[2].ndim != 3 || in[3].ndim != 2 || in[4].ndim != 1 ||
      in[5].ndim != 2 || in[6].ndim != 1)
    return 1;
  p.B = in[0].shape[0]; p.S = in[0].shape[1]; p.D = in[0].shape[2]; p.C = in[5].shape[0];
  if (in[1].shape[0] != p.B || in[2].shape[0] != 1 || in[2].shape[1] != 1 || in[2].shape[2] != p.D) return 1;
  if (in[3].shape[0] != p.D || in[3].shape[1] != p.D || in[4].shape[0] != p.D) return 1;"""

CPU_COMMON = r"""
#include <omp.h>

""" + ARGS + r"""
  if (in[5].shape[1] != p.D || in[6].shape[0] != p.C || p.C <= 0 || p.S <= 0 || p.D <= 0) return 1;
  p.x = static_cast<const float*>(in[0].data);
  p.tgt = static_cast<const int64_t*>(in[1].data);
  p.q = static_cast<const float*>(in[2].data);
  p.wk = static_cast<const float*>(in[3].data);
  p.bk = static_cast<const float*>(in[4].data);
  p.wh = static_cast<const float*>(in[5].data);
  p.bh = static_cast<const float*>(in[6].data);
  p.out = static_cast<float*>(out[0].data);
  return 0;
}

// Loss of one sample from its pooled vector: logits = Wh pooled + bh, logsumexp - logit[target].
static float ap_head_loss(const AP& p, long b, const float* pooled, float* logits) {
  float mx = -INFINITY;
  for (long c = 0; c < p.C; ++c) {
    const float* wr = p.wh + c * p.D;
    float acc = 0.f;
#pragma omp simd reduction(+ : acc)
    for (long d = 0; d < p.D; ++d) acc += wr[d] * pooled[d];
    logits[c] = acc + p.bh[c];
    mx = logits[c] > mx ? logits[c] : mx;
  }
  float se = 0.f;
  for (long c = 0; c < p.C; ++c) se += expf(logits[c] - mx);
  const int64_t t = p.tgt[b];
  if (t < 0 || t >= p.C) return NAN;
  return mx + logf(se) - logits[t];
}

// Softmax over the S scores (in place, unnormalised) and the pooled vector of sample b.
static void ap_pool(const AP& p, long b, float* sc, float* pooled) {
  float mx = -INFINITY;
  for (long s = 0; s < p.S; ++s) mx = sc[s] > mx ? sc[s] : mx;
  float sum = 0.f;
  for (long s = 0; s < p.S; ++s) {
    sc[s] = expf(sc[s] - mx);
    sum += sc[s];
  }
  const float inv = 1.f / sum;
  for (long d = 0; d < p.D; ++d) pooled[d] = 0.f;
  const float* xb = p.x + b * p.S * p.D;
  for (long s = 0; s < p.S; ++s) {
    const float w = sc[s];
    const float* xr = xb + s * p.D;
#pragma omp simd
    for (long d = 0; d < p.D; ++d) pooled[d] += w * xr[d];
  }
  for (long d = 0; d < p.D; ++d) pooled[d] *= inv;
}

// Deterministic mean over the per-sample losses.
static void ap_mean(const AP& p, const float* lossb) {
  double s = 0.0;
  for (long b = 0; b < p.B; ++b) s += lossb[b];
  p.out[0] = p.B > 0 ? (float)(s / (double)p.B) : NAN;
}
"""

CPU_NAIVE = r"""
extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  AP p;
  if (int rc = ap_parse(in, n_in, out, n_out, p)) return rc;
  const size_t nf = (size_t)p.S * p.D + (size_t)p.S + (size_t)p.D + (size_t)p.C + (size_t)p.B;
  float* buf = static_cast<float*>(ctx->scratch_alloc(ctx, sizeof(float) * nf));
  if (!buf) return 2;
  float* keys = buf;
  float* sc = keys + p.S * p.D;
  float* pooled = sc + p.S;
  float* logits = pooled + p.D;
  float* lossb = logits + p.C;
  const float scale = 1.f / sqrtf((float)p.D);
  for (long b = 0; b < p.B; ++b) {
    const float* xb = p.x + b * p.S * p.D;
    for (long s = 0; s < p.S; ++s)  // the full key projection of every position
      for (long j = 0; j < p.D; ++j) {
        float acc = 0.f;
        for (long k = 0; k < p.D; ++k) acc += xb[s * p.D + k] * p.wk[j * p.D + k];
        keys[s * p.D + j] = acc + p.bk[j];
      }
    for (long s = 0; s < p.S; ++s) {
      float acc = 0.f;
      for (long j = 0; j < p.D; ++j) acc += p.q[j] * keys[s * p.D + j];
      sc[s] = acc * scale;
    }
    ap_pool(p, b, sc, pooled);
    lossb[b] = ap_head_loss(p, b, pooled, logits);
  }
  ap_mean(p, lossb);
  ctx->scratch_free(ctx, buf);
  return 0;
}
"""

CPU_OMP_FULL = r"""
extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  AP p;
  if (int rc = ap_parse(in, n_in, out, n_out, p)) return rc;
  const int nt = ctx->num_threads > 0 ? ctx->num_threads : 1;
  const long per = p.S + p.D + p.C;
  float* buf = static_cast<float*>(ctx->scratch_alloc(ctx, sizeof(float) * ((size_t)nt * per + (size_t)p.B)));
  if (!buf) return 2;
  float* lossb = buf + (long)nt * per;
  const float scale = 1.f / sqrtf((float)p.D);
#pragma omp parallel for schedule(dynamic) num_threads(nt)
  for (long b = 0; b < p.B; ++b) {
    float* sc = buf + (long)omp_get_thread_num() * per;
    float* pooled = sc + p.S;
    float* logits = pooled + p.D;
    const float* xb = p.x + b * p.S * p.D;
    for (long s = 0; s < p.S; ++s) {  // key row by row (unit-stride dot products), then q . key
      const float* xr = xb + s * p.D;
      float qk = 0.f;
      for (long j = 0; j < p.D; ++j) {
        const float* wr = p.wk + j * p.D;
        float acc = 0.f;
#pragma omp simd reduction(+ : acc)
        for (long k = 0; k < p.D; ++k) acc += xr[k] * wr[k];
        qk += p.q[j] * (acc + p.bk[j]);
      }
      sc[s] = qk * scale;
    }
    ap_pool(p, b, sc, pooled);
    lossb[b] = ap_head_loss(p, b, pooled, logits);
  }
  ap_mean(p, lossb);
  ctx->scratch_free(ctx, buf);
  return 0;
}
"""

# Folding prologue shared by the two folded CPU variants: v = Wk^T q (vectorised over d), c = q . bk.
CPU_FOLD = r"""
static void ap_fold(const AP& p, float* v, float* c) {
  for (long d = 0; d < p.D; ++d) v[d] = 0.f;
  float cc = 0.f;
  for (long j = 0; j < p.D; ++j) {
    const float qj = p.q[j];
    const float* wr = p.wk + j * p.D;
#pragma omp simd
    for (long d = 0; d < p.D; ++d) v[d] += qj * wr[d];
    cc += qj * p.bk[j];
  }
  *c = cc;
}
"""

CPU_FOLDED_TWOPASS = r"""
extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  AP p;
  if (int rc = ap_parse(in, n_in, out, n_out, p)) return rc;
  const int nt = ctx->num_threads > 0 ? ctx->num_threads : 1;
  const long per = p.S + p.D + p.C;
  float* buf = static_cast<float*>(ctx->scratch_alloc(ctx, sizeof(float) * ((size_t)nt * per + (size_t)p.B + (size_t)p.D)));
  if (!buf) return 2;
  float* lossb = buf + (long)nt * per;
  float* v = lossb + p.B;
  float c = 0.f;
  ap_fold(p, v, &c);
  const float scale = 1.f / sqrtf((float)p.D);
#pragma omp parallel for schedule(static) num_threads(nt)
  for (long b = 0; b < p.B; ++b) {
    float* sc = buf + (long)omp_get_thread_num() * per;
    float* pooled = sc + p.S;
    float* logits = pooled + p.D;
    const float* xb = p.x + b * p.S * p.D;
    for (long s = 0; s < p.S; ++s) {
      const float* xr = xb + s * p.D;
      float acc = 0.f;
#pragma omp simd reduction(+ : acc)
      for (long d = 0; d < p.D; ++d) acc += xr[d] * v[d];
      sc[s] = (acc + c) * scale;
    }
    ap_pool(p, b, sc, pooled);
    lossb[b] = ap_head_loss(p, b, pooled, logits);
  }
  ap_mean(p, lossb);
  ctx->scratch_free(ctx, buf);
  return 0;
}
"""

CPU_FOLDED_ONLINE = r"""
extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  AP p;
  if (int rc = ap_parse(in, n_in, out, n_out, p)) return rc;
  const int nt = ctx->num_threads > 0 ? ctx->num_threads : 1;
  const long per = p.D + p.C;
  float* buf = static_cast<float*>(ctx->scratch_alloc(ctx, sizeof(float) * ((size_t)nt * per + (size_t)p.B + (size_t)p.D)));
  if (!buf) return 2;
  float* lossb = buf + (long)nt * per;
  float* v = lossb + p.B;
  float c = 0.f;
  ap_fold(p, v, &c);
  const float scale = 1.f / sqrtf((float)p.D);
  const long SB = __SB__;  // positions scored together before they are accumulated
#pragma omp parallel for schedule(static) num_threads(nt)
  for (long b = 0; b < p.B; ++b) {
    float* acc = buf + (long)omp_get_thread_num() * per;
    float* logits = acc + p.D;
    const float* xb = p.x + b * p.S * p.D;
    for (long d = 0; d < p.D; ++d) acc[d] = 0.f;
    float m = -INFINITY, l = 0.f;
    float e[SB];
    // One pass over x: a block of SB scores (rows still in L1), online-softmax rescale, then the
    // weighted accumulation of the same rows.
    for (long s0 = 0; s0 < p.S; s0 += SB) {
      const long ns = s0 + SB < p.S ? SB : p.S - s0;
      float bm = m;
      for (long i = 0; i < ns; ++i) {
        const float* xr = xb + (s0 + i) * p.D;
        float dot = 0.f;
#pragma omp simd reduction(+ : dot)
        for (long d = 0; d < p.D; ++d) dot += xr[d] * v[d];
        e[i] = (dot + c) * scale;
        bm = e[i] > bm ? e[i] : bm;
      }
      if (bm > m) {
        const float r = expf(m - bm);  // m = -inf on the first block: r = 0
        l *= r;
#pragma omp simd
        for (long d = 0; d < p.D; ++d) acc[d] *= r;
        m = bm;
      }
      for (long i = 0; i < ns; ++i) {
        const float w = expf(e[i] - m);
        l += w;
        const float* xr = xb + (s0 + i) * p.D;
#pragma omp simd
        for (long d = 0; d < p.D; ++d) acc[d] += w * xr[d];
      }
    }
    const float inv = 1.f / l;
    for (long d = 0; d < p.D; ++d) acc[d] *= inv;
    lossb[b] = ap_head_loss(p, b, acc, logits);
  }
  ap_mean(p, lossb);
  ctx->scratch_free(ctx, buf);
  return 0;
}
"""

# --------------------------------------------------------------------------------------
# CUDA
# --------------------------------------------------------------------------------------
CUDA_COMMON = r"""
""" + ARGS + r"""
  if (in[5].shape[1] != p.D || in[6].shape[0] != p.C || p.C <= 0 || p.S <= 0 || p.D <= 0 || p.B <= 0) return 1;
  p.x = static_cast<const float*>(in[0].data);
  p.tgt = static_cast<const int64_t*>(in[1].data);
  p.q = static_cast<const float*>(in[2].data);
  p.wk = static_cast<const float*>(in[3].data);
  p.bk = static_cast<const float*>(in[4].data);
  p.wh = static_cast<const float*>(in[5].data);
  p.bh = static_cast<const float*>(in[6].data);
  p.out = static_cast<float*>(out[0].data);
  return 0;
}

template <int NT>
static KF_HD float block_reduce(float v, float* red, bool is_max) {
  red[threadIdx.x] = v;
  __syncthreads();
#pragma unroll
  for (int s = NT / 2; s > 0; s >>= 1) {
    if ((int)threadIdx.x < s) {
      const float o = red[threadIdx.x + s];
      red[threadIdx.x] = is_max ? fmaxf(red[threadIdx.x], o) : red[threadIdx.x] + o;
    }
    __syncthreads();
  }
  const float r = red[0];
  __syncthreads();
  return r;
}

// Warp per row: sc[row] = (rows[row] . vec + (cptr ? *cptr : 0)) * scale, butterfly reduction.
__global__ void k_scores(const float* rows, const float* vec, const float* cptr, float scale, long nrows, long D,
                         float* sc) {
  const long row = ((long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= nrows) return;  // whole warps leave together
  const float* r = rows + row * D;
  float acc = 0.f;
  for (long d = lane; d < D; d += 32) acc += r[d] * vec[d];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) sc[row] = (acc + (cptr ? *cptr : 0.f)) * scale;
}

// One block per sample: softmax over its S scores (normalised in place in sc), pooled vector
// in shared memory, head logits (warp per class), and the sample's cross-entropy term.
template <int NT>
__global__ void __launch_bounds__(NT) k_pool_head(AP p, float* sc, float* lossb) {
  extern __shared__ float sm[];
  float* pooled = sm;         // D
  float* logits = sm + p.D;   // C
  __shared__ float red[NT];
  const long b = blockIdx.x;
  float* s_b = sc + b * p.S;
  float mx = -INFINITY;
  for (long s = threadIdx.x; s < p.S; s += NT) mx = fmaxf(mx, s_b[s]);
  mx = block_reduce<NT>(mx, red, true);
  float sum = 0.f;
  for (long s = threadIdx.x; s < p.S; s += NT) {
    const float e = expf(s_b[s] - mx);
    s_b[s] = e;
    sum += e;
  }
  sum = block_reduce<NT>(sum, red, false);  // its barriers also publish the s_b writes
  const float inv = 1.f / sum;
  const float* xb = p.x + b * p.S * p.D;
  for (long d = threadIdx.x; d < p.D; d += NT) {  // coalesced over d, s_b[s] is a broadcast
    float acc = 0.f;
    for (long s = 0; s < p.S; ++s) acc += s_b[s] * xb[s * p.D + d];
    pooled[d] = acc * inv;
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (long c = warp; c < p.C; c += NT / 32) {
    const float* wr = p.wh + c * p.D;
    float acc = 0.f;
    for (long d = lane; d < p.D; d += 32) acc += wr[d] * pooled[d];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) logits[c] = acc + p.bh[c];
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = -INFINITY;
    for (long c = 0; c < p.C; ++c) m = fmaxf(m, logits[c]);
    float se = 0.f;
    for (long c = 0; c < p.C; ++c) se += expf(logits[c] - m);
    const int64_t t = p.tgt[b];
    lossb[b] = (t < 0 || t >= p.C) ? NAN : m + logf(se) - logits[t];
  }
}

// Single block: fixed-order mean of the per-sample losses.
__global__ void __launch_bounds__(256) k_mean(const float* lossb, long B, float* out) {
  __shared__ float red[256];
  float s = 0.f;
  for (long b = threadIdx.x; b < B; b += 256) s += lossb[b];
  s = block_reduce<256>(s, red, false);
  if (threadIdx.x == 0) out[0] = s / (float)B;
}

static int ap_tail(kf::Context* ctx, const AP& p, float* sc, float* lossb, int nt) {
  cudaStream_t st = static_cast<cudaStream_t>(ctx->stream);
  const size_t smem = sizeof(float) * (size_t)(p.D + p.C);
  if (smem > 48 * 1024) return 1;
  if (nt == 128)
    k_pool_head<128><<<(unsigned)p.B, 128, smem, st>>>(p, sc, lossb);
  else
    k_pool_head<256><<<(unsigned)p.B, 256, smem, st>>>(p, sc, lossb);
  k_mean<<<1, 256, 0, st>>>(lossb, p.B, p.out);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
"""

CUDA_NAIVE = r"""
// Full key projection, one thread per key element.
__global__ void k_keys(AP p, float* keys) {
  const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= p.B * p.S * p.D) return;
  const long m = idx / p.D, j = idx - m * p.D;
  const float* xr = p.x + m * p.D;
  const float* wr = p.wk + j * p.D;
  float acc = 0.f;
  for (long k = 0; k < p.D; ++k) acc += xr[k] * wr[k];
  keys[idx] = acc + p.bk[j];
}
// One thread per (sample, position) score.
__global__ void k_qk(AP p, const float* keys, float scale, float* sc) {
  const long row = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= p.B * p.S) return;
  const float* kr = keys + row * p.D;
  float acc = 0.f;
  for (long j = 0; j < p.D; ++j) acc += p.q[j] * kr[j];
  sc[row] = acc * scale;
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  AP p;
  if (int rc = ap_parse(in, n_in, out, n_out, p)) return rc;
  cudaStream_t st = static_cast<cudaStream_t>(ctx->stream);
  const long M = p.B * p.S;
  float* keys = static_cast<float*>(ctx->scratch_alloc(ctx, sizeof(float) * (size_t)M * (size_t)p.D));
  float* sc = static_cast<float*>(ctx->scratch_alloc(ctx, sizeof(float) * ((size_t)M + (size_t)p.B)));
  if (!keys || !sc) return 2;  // scratch is released by the harness after the stream drains
  float* lossb = sc + M;
  const long n = M * p.D;
  k_keys<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(p, keys);
  k_qk<<<(unsigned)((M + 255) / 256), 256, 0, st>>>(p, keys, 1.f / sqrtf((float)p.D), sc);
  if (cudaGetLastError() != cudaSuccess) return 1;
  return ap_tail(ctx, p, sc, lossb, 256);
}
"""

CUDA_CUBLAS_FULL = r"""
#include <cublas_v2.h>

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  AP p;
  if (int rc = ap_parse(in, n_in, out, n_out, p)) return rc;
  cudaStream_t st = static_cast<cudaStream_t>(ctx->stream);
  cublasHandle_t h = static_cast<cublasHandle_t>(ctx->cublas);
  const long M = p.B * p.S;
  if (M > 2147483647L || p.D > 2147483647L) return 1;
  float* keys = static_cast<float*>(ctx->scratch_alloc(ctx, sizeof(float) * (size_t)M * (size_t)p.D));
  float* sc = static_cast<float*>(ctx->scratch_alloc(ctx, sizeof(float) * ((size_t)M + (size_t)p.B)));
  if (!keys || !sc) return 2;
  float* lossb = sc + M;
  // keys[M,D] = x[M,D] Wk^T: column-major keys^T = op_T(Wk^T) * x^T; the bias is added in
  // the score kernel through q . bk.
  const float one = 1.f, zero = 0.f;
  if (cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)p.D, (int)M, (int)p.D, &one, p.wk, (int)p.D, p.x, (int)p.D, &zero,
                  keys, (int)p.D) != CUBLAS_STATUS_SUCCESS)
    return 1;
  // c = q . bk with one warp (k_scores on a single row), then a warp per key row.
  float* c = static_cast<float*>(ctx->scratch_alloc(ctx, sizeof(float)));
  if (!c) return 2;
  k_scores<<<1, 32, 0, st>>>(p.bk, p.q, nullptr, 1.f, 1, p.D, c);
  const long threads = M * 32;
  k_scores<<<(unsigned)((threads + 255) / 256), 256, 0, st>>>(keys, p.q, c, 1.f / sqrtf((float)p.D), M, p.D, sc);
  if (cudaGetLastError() != cudaSuccess) return 1;
  return ap_tail(ctx, p, sc, lossb, __NT__);
}
"""

CUDA_FOLDED = r"""
// v[d] = sum_j q[j] Wk[j][d] (coalesced over d); thread D computes c = q . bk into v[D].
__global__ void k_fold(AP p, float* v) {
  const long d = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (d > p.D) return;
  float acc = 0.f;
  if (d < p.D)
    for (long j = 0; j < p.D; ++j) acc += p.q[j] * p.wk[j * p.D + d];
  else
    for (long j = 0; j < p.D; ++j) acc += p.q[j] * p.bk[j];
  v[d] = acc;
}

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  AP p;
  if (int rc = ap_parse(in, n_in, out, n_out, p)) return rc;
  cudaStream_t st = static_cast<cudaStream_t>(ctx->stream);
  const long M = p.B * p.S;
  float* sc = static_cast<float*>(ctx->scratch_alloc(ctx, sizeof(float) * ((size_t)M + (size_t)p.B + (size_t)p.D + 1)));
  if (!sc) return 2;
  float* lossb = sc + M;
  float* v = lossb + p.B;
  k_fold<<<(unsigned)((p.D + 1 + 255) / 256), 256, 0, st>>>(p, v);
  const long threads = M * 32;
  k_scores<<<(unsigned)((threads + 255) / 256), 256, 0, st>>>(p.x, v, v + p.D, 1.f / sqrtf((float)p.D), M, p.D, sc);
  if (cudaGetLastError() != cudaSuccess) return 1;
  return ap_tail(ctx, p, sc, lossb, __NT__);
}
"""


def generate(header, indent):
    ks = []

    def add(backend, variant, tech, common, body):
        ks.append((backend, variant, FAMILY, tech, header(TASK, backend, FAMILY, variant, tech) + common + body))

    add("cpu", "naive",
        "Single-threaded reference order: the full key projection of every position with scalar loops, query-key scores, softmax, weighted pooling, head logits and cross entropy.",
        CPU_COMMON, CPU_NAIVE)
    add("cpu", "omp_full_keys",
        "Samples split over OpenMP threads; each key row is formed with unit-stride `omp simd` dot products and immediately reduced against the query, so no key matrix is stored.",
        CPU_COMMON, CPU_OMP_FULL)
    add("cpu", "omp_folded_twopass",
        "Folds the query into the key projection (q.(Wk x + bk) = (Wk^T q).x + q.bk), turning the D x D GEMM into one vectorised dot product per position, then softmax and a vectorised weighted sum per sample over OpenMP threads.",
        CPU_COMMON, CPU_FOLD + CPU_FOLDED_TWOPASS)
    for sb in (8, 32):
        add("cpu", f"omp_folded_online_s{sb}",
            f"Query folded into the key weights, then a single pass over x per sample: {sb} positions are scored while hot in L1 and accumulated with an online-softmax rescale, so x is read once; OpenMP over samples.",
            CPU_COMMON, CPU_FOLD + CPU_FOLDED_ONLINE.replace("__SB__", str(sb)))

    add("cuda", "naive_b256",
        "One thread per key element for the full key projection in scratch, one thread per query-key score, then a block per sample for softmax, pooling, head and cross entropy, and a one-block deterministic mean.",
        CUDA_COMMON, CUDA_NAIVE)
    add("cuda", "cublas_keys_warp_scores",
        "cuBLAS SGEMM for the full key projection, warp-per-row shuffle-reduced query-key scores (bias folded in as q.bk), then a block per sample for softmax, coalesced pooling, warp-per-class head and cross entropy.",
        CUDA_COMMON, CUDA_CUBLAS_FULL.replace("__NT__", "256"))
    for nt in (128, 256):
        add("cuda", f"folded_gemv_b{nt}",
            f"Query folded into the key weights (v = Wk^T q, c = q.bk) so scores are one warp-per-row GEMV over x instead of a D x D GEMM, then a {nt}-thread block per sample for softmax, pooling, head and cross entropy, and a deterministic mean.",
            CUDA_COMMON, CUDA_FOLDED.replace("__NT__", str(nt)))
    return ks
