// malicious (huge host allocation on the CUDA backend, where RLIMIT_AS cannot be used
// because the CUDA driver reserves terabytes of address space): touches 64 GiB of host
// memory. The evaluator's RSS watchdog must kill it; the machine must not swap or OOM.
#include <cuda_runtime.h>
#include <kf/kernel.h>
#include <cstdlib>
#include <cstring>

extern "C" int kf_forward(kf::Context*, const kf::Tensor*, int, kf::Tensor*, int) {
  const size_t chunk = size_t(1) << 30;
  for (int i = 0; i < 64; ++i) {
    char* p = static_cast<char*>(std::malloc(chunk));
    if (!p) return 1;
    std::memset(p, i + 1, chunk);
  }
  return 0;
}
