// malicious: allocates and touches memory until something stops it.
#include <kf/kernel.h>
#include <cstdlib>
#include <cstring>

extern "C" int kf_forward(kf::Context*, const kf::Tensor*, int, kf::Tensor*, int) {
  const size_t chunk = size_t(256) << 20;
  while (true) {
    void* p = std::malloc(chunk);
    if (!p) { *(volatile int*)nullptr = 1; }
    std::memset(p, 1, chunk);
  }
  return 0;
}
