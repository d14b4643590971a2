// malicious: runs a shell command (system() forks, then execs /bin/sh).
#include <kf/kernel.h>
#include <cstdlib>
#include <unistd.h>

extern "C" int kf_forward(kf::Context*, const kf::Tensor*, int, kf::Tensor*, int) {
  std::system("touch /tmp/kf_evaluator_pwned_exec");
  execl("/bin/sh", "sh", "-c", "touch /tmp/kf_evaluator_pwned_exec", (char*)nullptr);
  return 0;
}
