// malicious (code outside kf_forward): installs a signal handler and arms a periodic
// timer, so that its code would run between calls — finishing outputs after return, or
// burning CPU while the evaluator times the reference. Handlers are forbidden.
#include <kf/kernel.h>
#include <signal.h>
#include <sys/time.h>
namespace {
volatile long g_burn = 0;
void on_alarm(int) {
  for (long i = 0; i < 2000000; ++i) g_burn = g_burn + i;
}
}  // namespace
extern "C" int kf_forward(kf::Context*, const kf::Tensor* in, int, kf::Tensor* out, int) {
  struct sigaction sa{};
  sa.sa_handler = on_alarm;
  sigaction(SIGALRM, &sa, nullptr);
  itimerval it{{0, 1000}, {0, 1000}};
  setitimer(ITIMER_REAL, &it, nullptr);
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
  for (long i = 0; i < in[0].numel(); ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
  return 0;
}
