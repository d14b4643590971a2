// Sandbox worker: ABI marshalling, poison, containment of malicious kernels, restart.
// Real processes, real seccomp, real compilers; no torch.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "kf/common/error.h"
#include "kf/evaluator/evaluator.h"
#include "process.h"
#include "sandbox.h"
#include "test_util.h"

using namespace kf::evaluator;
using namespace kf;
namespace fs = std::filesystem;

namespace {

CompileService& compiler() {
  static CompileService cs([] {
    CompileOptions o;
    o.cache_dir = test::temp_dir("sbcache");
    return o;
  }());
  return cs;
}

std::string build(const std::string& src) {
  CompileResult r = compiler().compile(src, KF_BACKEND_CPU);
  EXPECT_TRUE(r.ok) << r.diagnostics;
  return r.so_path;
}

SandboxOptions cpu_opts() {
  SandboxOptions o;
  o.threads = 2;
  o.memory_limit_bytes = 1ull << 30;
  o.cpu_seconds = 30;
  return o;
}

constexpr int64_t N = 4096;

std::unique_ptr<Sandbox> start_1d(const SandboxOptions& o = cpu_opts()) {
  return Sandbox::start(o, {{KF_FLOAT32, {N}}}, {{KF_FLOAT32, {N}}});
}

void fill_inputs(Sandbox& sb, int slot, float base) {
  auto* x = static_cast<float*>(sb.input(slot, 0));
  for (int64_t i = 0; i < N; ++i) x[i] = base + float(i) - N / 2;
}

// Runs a malicious kernel on a fresh sandbox; checks containment; returns the outcome.
CallOutcome run_malicious(const std::string& kernel, double timeout_s = 3) {
  const std::string so = build(test::read_kernel(kernel));
  auto sb = start_1d();
  const std::string scratch = sb->scratch_dir();
  const pid_t pid = sb->pid();
  CallOutcome out = sb->load(so);
  if (out.ok()) {
    fill_inputs(*sb, 0, 0);
    out = sb->run(0, 0, false, 1, timeout_s);
  }
  EXPECT_FALSE(sb->alive() && out.ok() && false);
  sb->stop();
  EXPECT_FALSE(test::process_exists(pid)) << kernel << ": worker outlived the check";
  EXPECT_EQ(test::child_processes(), 0) << kernel << ": a process outlived the check";
  EXPECT_FALSE(fs::exists(scratch)) << "scratch folder not removed";
  return out;
}

}  // namespace

TEST(SandboxTest, MarshalsTheAbiAndPoisonsOutputs) {
  // The kernel reports what it sees: counts, ranks, shapes, strides, dtypes, context.
  const std::string src = R"(#include <kf/kernel.h>
extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  long long* r = (long long*)out[1].data;
  int k = 0;
  r[k++] = n_in; r[k++] = n_out; r[k++] = ctx->abi_version; r[k++] = ctx->backend; r[k++] = ctx->num_threads;
  for (int t = 0; t < n_in; ++t) { r[k++] = in[t].ndim; r[k++] = in[t].dtype;
    for (int d = 0; d < in[t].ndim; ++d) { r[k++] = in[t].shape[d]; r[k++] = in[t].stride[d]; } }
  r[k++] = ((const unsigned char*)out[0].data)[0];           // poison seen by the kernel
  void* s = ctx->scratch_alloc(ctx, 1000); r[k++] = s != nullptr; r[k++] = ((unsigned long long)s) % 256;
  r[k++] = ctx->scratch_alloc(ctx, 1ull << 40) == nullptr;   // over the scratch limit
  const float* x = (const float*)in[0].data; float* y = (float*)out[0].data;
  for (long i = 0; i < in[0].numel(); ++i) y[i] = x[i] * 3 + ((const int*)in[1].data)[0];
  return 0;
})";
  const std::string so = build(src);
  auto sb = Sandbox::start(cpu_opts(), {{KF_FLOAT32, {2, 3, 4}}, {KF_INT32, {5}}},
                           {{KF_FLOAT32, {2, 3, 4}}, {KF_INT64, {64}}});
  ASSERT_TRUE(sb->load(so).ok());
  for (int slot = 0; slot < 2; ++slot) {
    auto* x = static_cast<float*>(sb->input(slot, 0));
    for (int i = 0; i < 24; ++i) x[i] = float(i + slot);
    static_cast<int*>(sb->input(slot, 1))[0] = 7;
    CallOutcome o = sb->run(slot, uint32_t(slot), false, 0, 5);
    ASSERT_TRUE(o.ok()) << o.message << sb->log_tail();
    const auto* r = static_cast<const long long*>(sb->output_at_return(slot, 1));
    const std::vector<long long> want = {2,
                                         2,
                                         KF_ABI_VERSION,
                                         KF_BACKEND_CPU,
                                         2,
                                         3,
                                         KF_FLOAT32,
                                         2,
                                         12,
                                         3,
                                         4,
                                         4,
                                         1,
                                         1,
                                         KF_INT32,
                                         5,
                                         1,
                                         slot ? 0x5A : 0xFF,
                                         1,
                                         0,
                                         1};
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(r[i], want[i]) << "field " << i;
    const auto* y = static_cast<const float*>(sb->output_at_return(slot, 0));
    for (int i = 0; i < 24; ++i) EXPECT_FLOAT_EQ(y[i], float(i + slot) * 3 + 7);
    EXPECT_EQ(std::memcmp(sb->output_at_return(slot, 0), sb->output_late(slot, 0), 24 * 4), 0);
    EXPECT_GT(o.elapsed_ms, 0);
    EXPECT_GE(o.external_ms, 0);
  }
}

TEST(SandboxTest, OpenMpKernelLeavesNoCpuWorkAfterReturn) {
  const std::string so = build(test::read_kernel("cpu/good_relu.cpp"));
  auto sb = start_1d();
  ASSERT_TRUE(sb->load(so).ok());
  double max_late = 0, max_idle = 0;
  for (int i = 0; i < 20; ++i) {
    fill_inputs(*sb, i % 2, float(i));
    CallOutcome o = sb->run(i % 2, i % 2, false, 2, 5);
    ASSERT_TRUE(o.ok()) << o.message;
    if (i > 0) {
      max_late = std::max(max_late, o.late_cpu_ms);
      max_idle = std::max(max_idle, o.idle_cpu_ms);
      EXPECT_EQ(o.threads_after, o.threads_before);
    }
  }
  std::printf("openmp relu: max late cpu %.3f ms, max idle cpu %.3f ms\n", max_late, max_idle);
  EXPECT_LT(max_late, 1.0);
  EXPECT_LT(max_idle, 2.0);
}

// Process state letter of /proc/<pid>/stat ('T' stopped, 'Z' zombie), or 0 if gone.
char proc_state(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return 0;
  const auto p = line.rfind(')');
  return p == std::string::npos || p + 2 >= line.size() ? 0 : line[p + 2];
}
bool alive(pid_t pid) {
  const char st = proc_state(pid);
  return st != 0 && st != 'Z' && st != 'X';
}
double process_cpu_ms(pid_t pid) {
  clockid_t c;
  timespec ts{};
  if (clock_getcpuclockid(pid, &c) != 0 || clock_gettime(c, &ts) != 0) return -1;
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

// Nothing of the candidate runs between calls: a load-time thread that spins to
// precompute answers (cpu/cheat_background.cpp) is stopped with the rest of the worker, so
// it can neither precompute nor slow the reference the evaluator runs meanwhile.
TEST(SandboxTest, CandidateCodeDoesNotRunBetweenCalls) {
  const std::string so = build(test::read_kernel("cpu/cheat_background.cpp"));
  auto sb = start_1d();
  ASSERT_TRUE(sb->load(so).ok());
  for (int i = 0; i < 4; ++i) {
    fill_inputs(*sb, i % 2, float(i));
    CallOutcome o = sb->run(i % 2, i % 2, false, 0, 5);
    ASSERT_TRUE(o.ok()) << o.message;
    EXPECT_EQ(proc_state(sb->pid()), 'T') << "call " << i << ": the worker must be stopped between calls";
    const double cpu0 = process_cpu_ms(sb->pid());
    std::this_thread::sleep_for(std::chrono::milliseconds(40));  // the thread would spin meanwhile
    const double cpu1 = process_cpu_ms(sb->pid());
    EXPECT_LT(cpu1 - cpu0, 0.5) << "call " << i << ": the worker used CPU while the evaluator had the machine";
  }
}

// What runs outside kf_forward is measured by thread: the spinning thread shows in the
// worker's windows outside the call, more than an OpenMP kernel's pool does (its threads
// only spin down to sleep there). The worker is stopped between calls, so these windows
// are short: tens of microseconds on a fast idle machine, where the two kernels differ by
// less than 2x (H200 host: 0.0154 vs 0.0097 ms per call), and longer on a loaded one. The
// test therefore asks for a measured, larger share, not fixed figures.
TEST(SandboxTest, ThreadsWorkingOutsideTheCallAreMeasured) {
  auto outside_per_call = [](const std::string& kernel) {
    const std::string so = build(test::read_kernel(kernel));
    auto sb = start_1d();
    EXPECT_TRUE(sb->load(so).ok());
    double cpu = 0, wall = 0;
    int n = 0;
    for (int i = 0; i < 12; ++i) {
      fill_inputs(*sb, i % 2, float(i));
      CallOutcome o = sb->run(i % 2, i % 2, false, 0, 5);
      EXPECT_TRUE(o.ok()) << o.message;
      if (i < 2) continue;  // thread start-up
      cpu += o.outside_cpu_ms;
      wall += o.idle_wall_ms;
      ++n;
    }
    std::printf("%s: other threads %.3f ms of CPU in %.3f ms outside kf_forward (%d calls)\n", kernel.c_str(), cpu,
                wall, n);
    return cpu / n;
  };
  // On a loaded 2-core machine the spinning thread may get no core in windows this short
  // (a full suite measured 0.0167 against 0.0182 ms once), so the claim must hold in one of
  // three measurements; a boundary that does not measure that CPU fails all three.
  double spinning = 0, sleeping = 0;
  for (int attempt = 0; attempt < 3; ++attempt) {
    spinning = outside_per_call("cpu/cheat_background.cpp");
    sleeping = outside_per_call("cpu/good_relu.cpp");
    if (spinning > 0.005 && spinning > 1.2 * sleeping) break;
  }
  EXPECT_GT(spinning, 0.005) << "the spinning thread's CPU outside the call was not measured";
  EXPECT_GT(spinning, 1.2 * sleeping);
}

// Evidence at return is ours: a kernel that returns at once and lets a thread compute the
// outputs afterwards is caught with unfinished outputs at return and the thread alive,
// whatever the thread writes later (the at-return copy is not in any memory the worker
// can map).
TEST(SandboxTest, OutputsAtReturnAreCopiedWhileTheWorkerIsStopped) {
  const std::string src = R"(#include <kf/kernel.h>
#include <thread>
extern "C" int kf_forward(kf::Context*, const kf::Tensor* in, int, kf::Tensor* out, int) {
  const float* x = (const float*)in[0].data; float* y = (float*)out[0].data; const long n = in[0].numel();
  std::thread([=] { for (int r = 0; r < 50; ++r) for (long i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f; }).detach();
  return 0;
})";
  const int64_t big = 1 << 22;
  const std::string so = build(src);
  int caught = 0;
  // A fresh worker per call: threads left by an earlier call would do the work inside this
  // call's timed region (which is honest timing, not what this test looks at).
  for (int i = 0; i < 5; ++i) {
    auto sb = Sandbox::start(cpu_opts(), {{KF_FLOAT32, {big}}}, {{KF_FLOAT32, {big}}});
    ASSERT_TRUE(sb->load(so).ok());
    auto* x = static_cast<float*>(sb->input(0, 0));
    for (int64_t k = 0; k < big; ++k) x[k] = float(k % 7) + float(i);
    CallOutcome o = sb->run(0, 0, false, 0, 10);
    ASSERT_TRUE(o.ok()) << o.message;
    // The copy at return misses the answer somewhere: the work was not done by the return.
    const auto* ret = static_cast<const float*>(sb->output_at_return(0, 0));
    int64_t wrong = 0;
    for (int64_t k = 0; k < big; ++k) wrong += ret[k] != float(k % 7) + float(i);
    std::printf("call %d: %lld of %lld elements wrong at return, threads %d -> %d\n", i, (long long)wrong,
                (long long)big, o.threads_before, o.threads_after);
    if (wrong > 0 && o.threads_after > o.threads_before) ++caught;
  }
  EXPECT_EQ(caught, 5);
}

// Signal handlers and timers would run the candidate's code outside kf_forward (between
// calls, while the reference runs): the sandbox forbids them and names the call.
TEST(SandboxTest, SignalHandlersAndTimersAreForbidden) {
  CallOutcome a = run_malicious("cpu/mal_signal_handler.cpp");
  EXPECT_EQ(a.kind, CallOutcome::Forbidden) << a.message;
  EXPECT_NE(a.message.find("rt_sigaction"), std::string::npos) << a.message;
  CallOutcome b = run_malicious("cpu/mal_timer_signal.cpp");
  EXPECT_EQ(b.kind, CallOutcome::Forbidden) << b.message;
  EXPECT_NE(b.message.find("timer_create"), std::string::npos) << b.message;
}

const char* kSleepingKernel = R"(#include <kf/kernel.h>
#include <time.h>
extern "C" int kf_forward(kf::Context*, const kf::Tensor*, int, kf::Tensor* out, int) {
  timespec d{30, 0};
  nanosleep(&d, nullptr);
  return 0;
})";

// A worker killed from outside (an operator, the OOM killer) is the environment's
// failure, not the candidate's; a worker that kills itself is not.
TEST(SandboxTest, OutsideKillIsAnEnvironmentFailureAndSelfKillIsForbidden) {
  const std::string so = build(kSleepingKernel);
  auto sb = start_1d();
  ASSERT_TRUE(sb->load(so).ok());
  const pid_t pid = sb->pid();
  std::thread killer([pid] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    kill(pid, SIGKILL);
  });
  fill_inputs(*sb, 0, 0);
  CallOutcome o = sb->run(0, 0, false, 0, 10);
  killer.join();
  EXPECT_EQ(o.kind, CallOutcome::Environment) << outcome_name(o.kind) << ": " << o.message;
  EXPECT_FALSE(sb->alive());

  const std::string self = build(R"(#include <kf/kernel.h>
#include <signal.h>
extern "C" int kf_forward(kf::Context*, const kf::Tensor*, int, kf::Tensor*, int) { raise(SIGKILL); return 0; })");
  auto sb2 = start_1d();
  ASSERT_TRUE(sb2->load(self).ok());
  fill_inputs(*sb2, 0, 0);
  CallOutcome s = sb2->run(0, 0, false, 0, 10);
  EXPECT_EQ(s.kind, CallOutcome::Forbidden) << outcome_name(s.kind) << ": " << s.message;
  EXPECT_NE(s.message.find("tgkill"), std::string::npos) << s.message;
}

// The worker dies with its evaluator, also after dropping root to nobody (which clears
// the parent-death signal): the evaluator here is a forked child, SIGKILLed mid-call.
TEST(SandboxTest, WorkerDiesWithItsEvaluatorWhateverItsUid) {
  const std::string so = build(kSleepingKernel);
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  const pid_t evaluator = fork();
  ASSERT_GE(evaluator, 0);
  if (evaluator == 0) {
    close(p[0]);
    auto sb = start_1d();
    pid_t w = sb->pid();
    if (!sb->load(so).ok()) w = -1;
    (void)!write(p[1], &w, sizeof w);
    fill_inputs(*sb, 0, 0);
    sb->run(0, 0, false, 0, 60);  // sleeps in the kernel until the SIGKILL
    _exit(0);
  }
  close(p[1]);
  pid_t worker = -1;
  ASSERT_EQ(read(p[0], &worker, sizeof worker), ssize_t(sizeof worker));
  close(p[0]);
  ASSERT_GT(worker, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // inside the call
  ASSERT_TRUE(alive(worker));
  kill(evaluator, SIGKILL);
  int st = 0;
  waitpid(evaluator, &st, 0);
  const auto t0 = std::chrono::steady_clock::now();
  while (alive(worker) && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(alive(worker)) << "kf-sandbox-worker " << worker << " outlived its evaluator by 5 s";
}

TEST(SandboxTest, DetachedThreadIsSeenWorkingAfterReturn) {
  const std::string so = build(test::read_kernel("cpu/cheat_host_thread.cpp"));
  auto sb = start_1d();
  ASSERT_TRUE(sb->load(so).ok());
  // A loaded machine can let the thread finish between return and the snapshot in a
  // single call; the verifier sees many calls, so the test allows a few too.
  bool seen = false;
  for (int i = 0; i < 20 && !seen; ++i) {
    fill_inputs(*sb, 0, float(i));
    CallOutcome o = sb->run(0, 0, false, 5, 5);
    ASSERT_TRUE(o.ok());
    seen = o.threads_after > o.threads_before ||
           std::memcmp(sb->output_at_return(0, 0), sb->output_late(0, 0), N * 4) != 0 || o.late_cpu_ms > 0.5;
  }
  EXPECT_TRUE(seen);
}

TEST(SandboxTest, SegfaultIsReportedAndContained) {
  CallOutcome o = run_malicious("cpu/mal_segfault.cpp");
  EXPECT_EQ(o.kind, CallOutcome::Crashed);
  EXPECT_NE(o.message.find("SIGSEGV"), std::string::npos) << o.message;
}

TEST(SandboxTest, AbortIsReportedAndContained) {
  CallOutcome o = run_malicious("cpu/mal_abort.cpp");
  EXPECT_EQ(o.kind, CallOutcome::Crashed);
  EXPECT_NE(o.message.find("SIGABRT"), std::string::npos) << o.message;
}

TEST(SandboxTest, InfiniteLoopIsKilledAtTheWallClockLimit) {
  const auto t0 = std::chrono::steady_clock::now();
  CallOutcome o = run_malicious("cpu/mal_infinite_loop.cpp", 1.0);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(o.kind, CallOutcome::Timeout) << o.message;
  EXPECT_LT(s, 8.0);
}

TEST(SandboxTest, ForkBombIsStoppedAtTheFirstFork) {
  CallOutcome o = run_malicious("cpu/mal_fork_bomb.cpp");
  EXPECT_EQ(o.kind, CallOutcome::Forbidden) << o.message;
  EXPECT_TRUE(o.message.find("clone") != std::string::npos || o.message.find("fork") != std::string::npos) << o.message;
}

TEST(SandboxTest, ShellExecIsForbiddenAndLeavesNoTrace) {
  fs::remove("/tmp/kf_evaluator_pwned_exec");
  CallOutcome o = run_malicious("cpu/mal_exec_shell.cpp");
  EXPECT_EQ(o.kind, CallOutcome::Forbidden) << o.message;
  EXPECT_FALSE(fs::exists("/tmp/kf_evaluator_pwned_exec"));
}

TEST(SandboxTest, RawSyscallsAndIoUringAreForbidden) {
  fs::remove("/tmp/kf_evaluator_pwned_raw");
  CallOutcome o = run_malicious("cpu/mal_raw_syscall.cpp");
  EXPECT_EQ(o.kind, CallOutcome::Forbidden) << o.message;
  EXPECT_FALSE(fs::exists("/tmp/kf_evaluator_pwned_raw"));
}

TEST(SandboxTest, SocketIsForbidden) {
  CallOutcome o = run_malicious("cpu/mal_socket.cpp");
  EXPECT_EQ(o.kind, CallOutcome::Forbidden) << o.message;
  EXPECT_NE(o.message.find("socket"), std::string::npos) << o.message;
}

TEST(SandboxTest, FileWritesAreForbiddenInsideAndOutsideScratch) {
  fs::remove("/tmp/kf_evaluator_pwned_write");
  CallOutcome o = run_malicious("cpu/mal_write_file.cpp");
  EXPECT_EQ(o.kind, CallOutcome::Forbidden) << o.message;
  EXPECT_NE(o.message.find("open"), std::string::npos) << o.message;
  EXPECT_FALSE(fs::exists("/tmp/kf_evaluator_pwned_write"));
}

TEST(SandboxTest, KillingTheEvaluatorIsForbidden) {
  CallOutcome o = run_malicious("cpu/mal_kill_parent.cpp");
  EXPECT_EQ(o.kind, CallOutcome::Forbidden) << o.message;  // and we are still here
}

TEST(SandboxTest, MaliciousStaticConstructorIsCaughtAtLoad) {
  CallOutcome o = run_malicious("cpu/mal_load_time.cpp");
  EXPECT_EQ(o.kind, CallOutcome::Forbidden) << o.message;
}

TEST(SandboxTest, HugeAllocationHitsTheMemoryLimit) {
  CallOutcome o = run_malicious("cpu/mal_huge_alloc.cpp", 20);
  EXPECT_TRUE(o.kind == CallOutcome::MemoryLimit || o.kind == CallOutcome::Crashed)
      << outcome_name(o.kind) << " " << o.message;
}

TEST(SandboxTest, EvaluatorSurvivesAndStartsAFreshWorkerAfterACrash) {
  const std::string bad = build(test::read_kernel("cpu/mal_segfault.cpp"));
  const std::string good = build(test::read_kernel("cpu/good_relu.cpp"));
  for (int round = 0; round < 3; ++round) {
    auto sb = start_1d();
    ASSERT_TRUE(sb->load(bad).ok());
    fill_inputs(*sb, 0, 0);
    EXPECT_EQ(sb->run(0, 0, false, 0, 3).kind, CallOutcome::Crashed);
    EXPECT_FALSE(sb->alive());
    auto fresh = start_1d();
    ASSERT_TRUE(fresh->load(good).ok());
    fill_inputs(*fresh, 0, 0);
    CallOutcome o = fresh->run(0, 0, false, 0, 3);
    ASSERT_TRUE(o.ok()) << o.message;
    EXPECT_FLOAT_EQ(static_cast<const float*>(fresh->output_at_return(0, 0))[N - 1], float(N / 2 - 1));
  }
}

TEST(SandboxTest, KernelErrorCodeIsReported) {
  const std::string so = build(
      "#include <kf/kernel.h>\nextern \"C\" int kf_forward(kf::Context*, const kf::Tensor*, int, kf::Tensor*, int) { "
      "return 42; }\n");
  auto sb = start_1d();
  ASSERT_TRUE(sb->load(so).ok());
  CallOutcome o = sb->run(0, 0, false, 0, 3);
  EXPECT_EQ(o.kind, CallOutcome::KernelError);
  EXPECT_EQ(o.rc, 42);
}

TEST(SandboxTest, MissingEntryPointIsALoadFailure) {
  const std::string so = build("extern \"C\" int not_the_entry() { return 0; }\n");
  auto sb = start_1d();
  CallOutcome o = sb->load(so);
  EXPECT_EQ(o.kind, CallOutcome::LoadFailed);
  EXPECT_NE(o.message.find("kf_forward"), std::string::npos);
}

TEST(SandboxTest, ObjectInAFolderTheSandboxUserCannotSearchIsAClearError) {
  if (geteuid() != 0) GTEST_SKIP() << "the worker keeps this uid when not started as root: nothing to check";
  const std::string so = build(test::read_kernel("cpu/good_relu.cpp"));
  const std::string hidden = test::temp_dir("private");
  ASSERT_EQ(::chmod(hidden.c_str(), 0700), 0);
  const std::string copy = hidden + "/k.so";
  fs::copy_file(so, copy);
  auto sb = start_1d();
  try {
    sb->load(copy);
    FAIL() << "expected kf::Error";
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find(hidden), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not searchable"), std::string::npos) << e.what();
  }
  sb->stop();
}

#ifdef KF_TEST_CUDA
#include <cuda_runtime.h>

namespace {
bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}
std::string build_cuda(const std::string& rel) {
  CompileResult r = compiler().compile(test::read_kernel(rel), KF_BACKEND_CUDA);
  EXPECT_TRUE(r.ok) << r.diagnostics;
  return r.so_path;
}
SandboxOptions cuda_opts() {
  SandboxOptions o = cpu_opts();
  o.backend = KF_BACKEND_CUDA;
  o.slots = 1;
  o.memory_limit_bytes = 4ull << 30;
  return o;
}
constexpr int64_t kCudaN = 1 << 24;
struct CudaCall {
  CallOutcome o;
  int64_t wrong_at_return = 0;  // elements of the copy at return that are not relu(x)
  bool changed_after = false;   // live outputs differ from the copy at return
};
CudaCall cuda_call(Sandbox& sb, int i) {
  std::vector<float> x(kCudaN), y(kCudaN), late(kCudaN);
  for (int64_t k = 0; k < kCudaN; ++k) x[size_t(k)] = float((k * 7 + i) % 13) - 6;
  cudaMemcpy(sb.input(0, 0), x.data(), kCudaN * 4, cudaMemcpyHostToDevice);
  CudaCall c;
  c.o = sb.run(0, uint32_t(i % 2), true, 0, 20);
  if (!c.o.ok()) return c;
  cudaMemcpy(y.data(), sb.output_at_return(0, 0), kCudaN * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(late.data(), sb.output_late(0, 0), kCudaN * 4, cudaMemcpyDeviceToHost);
  for (int64_t k = 0; k < kCudaN; ++k) c.wrong_at_return += y[size_t(k)] != std::max(x[size_t(k)], 0.f);
  c.changed_after = std::memcmp(y.data(), late.data(), kCudaN * 4) != 0;
  return c;
}
}  // namespace

// CUDA: an honest kernel through the stopped-worker protocol is exact at return, leaves
// nothing after it and the device idle; a host thread that launches the real kernel just
// after the return, racing the worker's device sync, and one that leaves a GPU kernel
// spinning to slow the reference, are seen in every call.
TEST(SandboxCudaTest, LateGpuWorkIsSeenAndHonestWorkIsNot) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  auto sb = Sandbox::start(cuda_opts(), {{KF_FLOAT32, {kCudaN}}}, {{KF_FLOAT32, {kCudaN}}});
  ASSERT_TRUE(sb->device_resident());
  ASSERT_TRUE(sb->load(build_cuda("cuda/good_relu.cu")).ok()) << sb->log_tail();
  for (int i = 0; i < 6; ++i) {
    CudaCall c = cuda_call(*sb, i);
    ASSERT_TRUE(c.o.ok()) << c.o.message << sb->log_tail();
    std::printf(
        "good_relu call %d: %.3f ms, settle %.3f ms, late cpu %.3f ms, before-clock cpu %.3f ms, resume %.3f ms, "
        "outside %.3f of %.3f ms\n",
        i, c.o.elapsed_ms, c.o.gpu_settle_ms, c.o.late_cpu_ms, c.o.idle_cpu_ms, c.o.resume_ms, c.o.outside_cpu_ms,
        c.o.idle_wall_ms);
    EXPECT_EQ(c.wrong_at_return, 0);
    EXPECT_FALSE(c.changed_after);
    if (i > 0) EXPECT_LT(c.o.gpu_settle_ms, 0.5);
  }
  sb->stop();

  auto late = Sandbox::start(cuda_opts(), {{KF_FLOAT32, {kCudaN}}}, {{KF_FLOAT32, {kCudaN}}});
  ASSERT_TRUE(late->load(build_cuda("cuda/cheat_late_launch.cu")).ok()) << late->log_tail();
  int seen = 0;
  for (int i = 0; i < 8; ++i) {
    CudaCall c = cuda_call(*late, i);
    ASSERT_TRUE(c.o.ok()) << c.o.message;
    std::printf("late_launch call %d: %.3f ms, %lld wrong at return, changed after %d, settle %.3f ms\n", i,
                c.o.elapsed_ms, (long long)c.wrong_at_return, int(c.changed_after), c.o.gpu_settle_ms);
    seen += c.wrong_at_return > 0 || c.changed_after || c.o.gpu_settle_ms > 0.5;
  }
  EXPECT_EQ(seen, 8);
  late->stop();

  auto burn = Sandbox::start(cuda_opts(), {{KF_FLOAT32, {kCudaN}}}, {{KF_FLOAT32, {kCudaN}}});
  ASSERT_TRUE(burn->load(build_cuda("cuda/cheat_gpu_burn_after.cu")).ok()) << burn->log_tail();
  int busy = 0;
  for (int i = 0; i < 6; ++i) {
    CudaCall c = cuda_call(*burn, i);
    ASSERT_TRUE(c.o.ok()) << c.o.message;
    std::printf("gpu_burn_after call %d: %.3f ms, settle %.3f ms\n", i, c.o.elapsed_ms, c.o.gpu_settle_ms);
    busy += i > 0 && c.o.gpu_settle_ms > 0.5;
  }
  EXPECT_EQ(busy, 5);
}
#endif

// --- the trust boundary: what the candidate can do inside the worker does not reach the
// evaluator's evidence or other processes

namespace {
double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}
// The evaluator's clock around a worker running `so` (empty: the worker's own empty
// kernel) on a ReLU of `n` floats, per call after two warm-ups: outside_ms and the
// worker's own elapsed_ms (medians); outputs checked against the ReLU when `check`.
struct Clocks {
  double outside = 0, worker = 0, call_cpu = 0;
};
Clocks clocks_of(const std::string& so, int64_t n, bool check) {
  auto sb = Sandbox::start(cpu_opts(), {{KF_FLOAT32, {n}}}, {{KF_FLOAT32, {n}}});
  EXPECT_TRUE((so.empty() ? sb->load_empty() : sb->load(so)).ok());
  std::vector<double> outside, worker, cpu;
  for (int i = 0; i < 10; ++i) {
    auto* x = static_cast<float*>(sb->input(i % 2, 0));
    for (int64_t k = 0; k < n; ++k) x[k] = float(k % 13) - 6 + float(i);
    CallOutcome o = sb->run(i % 2, uint32_t(i % 2), false, 0, 10);
    EXPECT_TRUE(o.ok()) << o.message << sb->log_tail();
    if (check) {
      const auto* y = static_cast<const float*>(sb->output_at_return(i % 2, 0));
      int64_t wrong = 0;
      for (int64_t k = 0; k < n; ++k) wrong += y[k] != std::max(0.f, float(k % 13) - 6 + float(i));
      EXPECT_EQ(wrong, 0) << "call " << i;
    }
    if (i < 2) continue;
    outside.push_back(o.outside_ms);
    worker.push_back(o.elapsed_ms);
    cpu.push_back(o.call_cpu_ms);
  }
  return {median_of(outside), median_of(worker), median_of(cpu)};
}
}  // namespace

// A candidate that rewrites the worker's dynamic-linking table (its GOT entry for read(),
// made writable with mprotect) computes each call's outputs inside the worker's read of
// the command, before the worker's clock starts: the worker's clock says almost nothing,
// while the evaluator's measure around the worker, less that of an empty call, holds the
// whole ReLU. Before the start mark that measure is the CPU the worker used (a resumed
// worker waits for a CPU there on a loaded host), so the ReLU is compared with the CPU
// time an honest single-threaded ReLU takes in its call.
TEST(SandboxTest, WorkBeforeTheWorkersClockIsOnTheEvaluatorsClock) {
  const int64_t n = 1 << 24;  // 64 MiB: milliseconds of single-threaded ReLU
  const std::string cheat_so = build(test::read_kernel("cpu/cheat_work_before_clock.cpp"));
  const std::string honest_so = build(R"(#include <kf/kernel.h>
extern "C" int kf_forward(kf::Context*, const kf::Tensor* in, int, kf::Tensor* out, int) {
  const float* x = (const float*)in[0].data; float* y = (float*)out[0].data; const long n = in[0].numel();
  for (long i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;  // the cheat's loop
  return 0;
})");
  // On a loaded host a resumed worker can wait for a CPU on most calls of one measurement
  // (the suite measured an empty call at 1.8 ms beside two training runs): the claim must
  // show in one of three measurements. A boundary that misses the cheat's work fails all three.
  for (int attempt = 1; attempt <= 3; ++attempt) {
    const Clocks empty = clocks_of("", n, false);
    const Clocks cheat = clocks_of(cheat_so, n, true);
    const Clocks honest = clocks_of(honest_so, n, true);
    std::printf("outside/worker clock (call CPU), ms: empty %.3f/%.3f, honest %.3f/%.3f (%.3f), cheat %.3f/%.3f\n",
                empty.outside, empty.worker, honest.outside, honest.worker, honest.call_cpu, cheat.outside,
                cheat.worker);
    const bool held = empty.outside < 0.5 * honest.call_cpu && cheat.worker < 0.1 * honest.call_cpu &&
                      cheat.outside - empty.outside > 0.6 * honest.call_cpu &&
                      honest.outside - empty.outside > 0.9 * honest.worker;
    if (!held && attempt < 3) continue;
    EXPECT_LT(empty.outside, 0.5 * honest.call_cpu) << "the protocol's own cost is small next to the work";
    EXPECT_LT(cheat.worker, 0.1 * honest.call_cpu) << "the cheat hides its work from the worker's clock";
    EXPECT_GT(cheat.outside - empty.outside, 0.6 * honest.call_cpu) << "the evaluator's measure must hold the work";
    EXPECT_GT(honest.outside - empty.outside, 0.9 * honest.worker);
    break;
  }
}

// Scheduling of other threads: a candidate running with the evaluator's own uid (no drop
// to nobody, as for a non-root evaluator) cannot pin the evaluator's threads to one CPU
// (EPERM) nor lower their priority (forbidden: the call is named).
TEST(SandboxTest, OtherThreadsSchedulingCannotBeChanged) {
  SandboxOptions o = cpu_opts();
  o.drop_root = false;
  auto my_affinity = [] {
    cpu_set_t s;
    CPU_ZERO(&s);
    sched_getaffinity(0, sizeof s, &s);
    return CPU_COUNT(&s);
  };
  const int cpus = my_affinity();
  const std::string affinity = R"(#include <kf/kernel.h>
#include <dirent.h>
#include <sched.h>
#include <unistd.h>
#include <cstdio>
#include <cstdlib>
extern "C" int kf_forward(kf::Context*, const kf::Tensor*, int, kf::Tensor* out, int) {
  char path[64]; std::snprintf(path, sizeof path, "/proc/%d/task", int(getppid()));
  cpu_set_t one; CPU_ZERO(&one); CPU_SET(0, &one);
  float changed = 0, seen = 0;
  if (DIR* d = opendir(path)) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      seen += 1;
      changed += sched_setaffinity(std::atoi(e->d_name), sizeof one, &one) == 0;
    }
    closedir(d);
  }
  changed += sched_setaffinity(0, sizeof one, &one) == 0 ? 1000 : 0;  // its own: allowed
  ((float*)out[0].data)[0] = changed; ((float*)out[0].data)[1] = seen;
  return 0;
})";
  auto sb = Sandbox::start(o, {{KF_FLOAT32, {N}}}, {{KF_FLOAT32, {N}}});
  ASSERT_TRUE(sb->load(build(affinity)).ok());
  CallOutcome c = sb->run(0, 0, false, 0, 5);
  ASSERT_TRUE(c.ok()) << c.message << sb->log_tail();
  const auto* y = static_cast<const float*>(sb->output_at_return(0, 0));
  EXPECT_GT(y[1], 0) << "the parent's threads are listed";
  EXPECT_EQ(y[0], 1000) << "only the worker's own affinity may change";
  EXPECT_EQ(my_affinity(), cpus) << "the evaluator's affinity changed";
  sb->stop();

  const std::string priority = R"(#include <kf/kernel.h>
#include <sys/resource.h>
#include <unistd.h>
extern "C" int kf_forward(kf::Context*, const kf::Tensor*, int, kf::Tensor*, int) {
  setpriority(PRIO_PROCESS, id_t(getppid()), 19);
  return 0;
})";
  errno = 0;
  const int nice0 = getpriority(PRIO_PROCESS, 0);
  auto sb2 = Sandbox::start(o, {{KF_FLOAT32, {N}}}, {{KF_FLOAT32, {N}}});
  ASSERT_TRUE(sb2->load(build(priority)).ok());
  CallOutcome p = sb2->run(0, 0, false, 0, 5);
  EXPECT_EQ(p.kind, CallOutcome::Forbidden) << p.message;
  EXPECT_NE(p.message.find("setpriority"), std::string::npos) << p.message;
  EXPECT_EQ(getpriority(PRIO_PROCESS, 0), nice0) << "the evaluator's priority changed";
}

// The worker sees no other process: not its evaluator (the reference's threads), not a
// second worker beside it (the calibration worker, another candidate), whose activity
// would tell it which calls are timed. A private /proc lists only its own user's
// processes, and each worker is a user of its own.
TEST(SandboxTest, WorkerSeesNoOtherProcess) {
  if (!private_proc_supported()) GTEST_SKIP() << "a private /proc needs root and Linux >= 5.8 (not here)";
  const std::string looker = R"(#include <kf/kernel.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cstdio>
#include <cstdlib>
extern "C" int kf_forward(kf::Context*, const kf::Tensor* in, int, kf::Tensor* out, int) {
  float* y = (float*)out[0].data;
  float listed = 0, other = 0;
  if (DIR* d = opendir("/proc")) {
    while (dirent* e = readdir(d)) {
      const int pid = std::atoi(e->d_name);
      if (pid <= 0) continue;
      listed += 1;
      other += pid != getpid();
    }
    closedir(d);
  }
  char path[64];
  struct stat st;
  std::snprintf(path, sizeof path, "/proc/%d/task", int(getppid()));
  y[0] = listed; y[1] = other; y[2] = stat(path, &st) == 0;
  std::snprintf(path, sizeof path, "/proc/%d", int(((const float*)in[0].data)[0]));
  y[3] = stat(path, &st) == 0;
  y[4] = float(getuid() == 65534);
  return 0;
})";
  const std::string so = build(looker);
  auto a = start_1d();
  auto b = start_1d();
  ASSERT_TRUE(a->load(so).ok());
  ASSERT_TRUE(b->load(so).ok());
  for (const auto& pair : {std::make_pair(a.get(), b.get()), std::make_pair(b.get(), a.get())}) {
    static_cast<float*>(pair.first->input(0, 0))[0] = float(pair.second->pid());  // its neighbour
    CallOutcome c = pair.first->run(0, 0, false, 0, 5);
    ASSERT_TRUE(c.ok()) << c.message << pair.first->log_tail();
    const auto* y = static_cast<const float*>(pair.first->output_at_return(0, 0));
    EXPECT_EQ(y[0], 1) << "processes listed in the worker's /proc";
    EXPECT_EQ(y[1], 0) << "processes other than itself listed";
    EXPECT_EQ(y[2], 0) << "the evaluator's threads are visible";
    EXPECT_EQ(y[3], 0) << "the worker beside it is visible";
    EXPECT_EQ(y[4], 0) << "the worker runs as nobody, a user other workers share";
  }
  // The evaluator's own /proc is the host's, unchanged: it still sees both workers.
  EXPECT_TRUE(fs::exists("/proc/" + std::to_string(a->pid()) + "/task"));
  EXPECT_TRUE(fs::exists("/proc/" + std::to_string(b->pid()) + "/task"));
  EXPECT_TRUE(fs::exists("/proc/" + std::to_string(getpid()) + "/task"));
}
