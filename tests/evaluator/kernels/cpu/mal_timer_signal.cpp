// malicious (code outside kf_forward): a POSIX timer aimed at the worker's own main
// thread (SIGEV_THREAD_ID), whose signal would run the candidate's code between calls.
// Timers are forbidden; so is installing the handler.
#include <kf/kernel.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
extern "C" int kf_forward(kf::Context*, const kf::Tensor* in, int, kf::Tensor* out, int) {
  sigevent ev{};
  ev.sigev_notify = 4;  // SIGEV_THREAD_ID
  ev.sigev_signo = SIGURG;  // ignored by default: the timer alone does no harm until a handler is set
  ev._sigev_un._tid = (pid_t)syscall(SYS_gettid);
  timer_t t;
  syscall(SYS_timer_create, CLOCK_MONOTONIC, &ev, &t);
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
  for (long i = 0; i < in[0].numel(); ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
  return 0;
}
