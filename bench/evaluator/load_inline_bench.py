"""Compile latency of torch.utils.cpp_extension.load_inline for the same kernel the C++
bench compiles (bench_evaluator runs this; or run it alone).
  python3 load_inline_bench.py --backend cpu|cuda --reps N
Prints one line per compile: LOADINLINE|<seconds>. Each rep uses a fresh build folder
and a unique name, so nothing is cached (cold, like the C++ side)."""
import argparse, os, sys, tempfile, time, uuid

CPU_SRC = r"""
#include <torch/extension.h>
torch::Tensor relu_fwd(torch::Tensor x) {
  auto y = torch::empty_like(x);
  const float* xp = x.data_ptr<float>(); float* yp = y.data_ptr<float>();
  const long n = x.numel();
  #pragma omp parallel for
  for (long i = 0; i < n; ++i) yp[i] = xp[i] > 0.f ? xp[i] : 0.f;
  return y;
}
"""
CUDA_SRC = r"""
#include <torch/extension.h>
__global__ void relu_k(const float* x, float* y, long n) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) y[i] = fmaxf(x[i], 0.f);
}
torch::Tensor relu_fwd(torch::Tensor x) {
  auto y = torch::empty_like(x);
  relu_k<<<2048, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
  return y;
}
"""
DECL = "torch::Tensor relu_fwd(torch::Tensor x);"

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    from torch.utils.cpp_extension import load_inline
    for _ in range(a.reps):
        d = tempfile.mkdtemp(prefix="kf-loadinline-")
        name = "kf_bench_" + uuid.uuid4().hex[:10]
        t0 = time.time()
        if a.backend == "cuda":
            load_inline(name, cpp_sources=DECL, cuda_sources=CUDA_SRC, functions=["relu_fwd"], build_directory=d,
                        extra_cuda_cflags=["-O3", "-arch=sm_90"], verbose=False)
        else:
            load_inline(name, cpp_sources=CPU_SRC, functions=["relu_fwd"], build_directory=d,
                        extra_cflags=["-O3", "-fopenmp"], extra_ldflags=["-fopenmp"], verbose=False)
        print(f"LOADINLINE|{time.time() - t0:.3f}", flush=True)

if __name__ == "__main__":
    sys.exit(main())
