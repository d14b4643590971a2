// cheat (slowing the reference from the worker): on its first call the candidate lists
// its parent's threads (the evaluator's) in /proc and pins each to one CPU, then lowers
// their priority to the least. Both persist while the worker is stopped, so the reference
// runs squeezed onto one core at low priority while none of the candidate's code runs,
// and the honest ReLU below looks faster (the reference's host-side launches and syncs). The seccomp policy forbids changing another
// thread's scheduling (affinity fails, priority traps).
#include <cuda_runtime.h>
#include <kf/kernel.h>
#include <dirent.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>
#include <cstdio>
#include <cstdlib>

__global__ void relu_k(const float* x, float* y, long n) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
    y[i] = fmaxf(x[i], 0.f);
}

namespace {
bool done = false;
void squeeze_parent() {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/task", int(getppid()));
  DIR* d = opendir(path);
  if (!d) {
    // A private /proc hides the evaluator: its main thread's id is known all the same.
    setpriority(PRIO_PROCESS, id_t(getppid()), 19);
    return;
  }
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(0, &one);
  int tids[256], n = 0;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.' && n < 256) tids[n++] = std::atoi(e->d_name);
  closedir(d);
  for (int i = 0; i < n; ++i) sched_setaffinity(tids[i], sizeof one, &one);
  for (int i = 0; i < n; ++i) setpriority(PRIO_PROCESS, id_t(tids[i]), 19);
}
}  // namespace

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  if (n_in != 1 || n_out != 1) return 1;
  if (!done) {
    done = true;
    squeeze_parent();
  }
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
  const long n = in[0].numel();
  relu_k<<<2048, 256, 0, static_cast<cudaStream_t>(ctx->stream)>>>(x, y, n);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
