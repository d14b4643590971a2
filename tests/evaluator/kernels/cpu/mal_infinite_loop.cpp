// malicious: never returns.
#include <kf/kernel.h>

extern "C" int kf_forward(kf::Context*, const kf::Tensor*, int, kf::Tensor*, int) {
  volatile unsigned long spin = 0;
  while (true) ++spin;
  return 0;
}
