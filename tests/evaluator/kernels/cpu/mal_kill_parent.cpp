// malicious: tries to kill the evaluator (its parent process).
#include <kf/kernel.h>
#include <csignal>
#include <unistd.h>

extern "C" int kf_forward(kf::Context*, const kf::Tensor*, int, kf::Tensor*, int) {
  kill(getppid(), SIGKILL);
  return 0;
}
