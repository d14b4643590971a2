// malicious: writes to an unmapped address.
#include <kf/kernel.h>
#include <cstdint>

static volatile uintptr_t target = 16;

extern "C" int kf_forward(kf::Context*, const kf::Tensor*, int, kf::Tensor*, int) {
  *reinterpret_cast<volatile int*>(target) = 1;
  return 0;
}
