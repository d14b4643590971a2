// The verification protocol (see evaluator.h and docs/evaluator.md): correctness passes,
// anti-cheat checks and interleaved timing of one candidate against one task.
//
// Structure: Session holds one evaluation's state (task, reference, sandbox, seeds).
// Every candidate call goes through Session::cand() and every reference call through
// Session::ref(); a failure anywhere becomes a Verdict via Stop (an exception local to
// this file, never seen by callers).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/DeviceAccelerator.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <dirent.h>
#include <malloc.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <algorithm>
#include <cerrno>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <fstream>
#include <deque>
#include <mutex>
#include <optional>
#include <random>

#include "kf/common/error.h"
#include "kf/common/gpu_lock.h"
#include "kf/common/gpu_memory.h"
#include "kf/common/log.h"
#include "kf/evaluator/evaluator.h"
#include "kf/tasks/tasks.h"
#include "attempt.h"
#include "check_plan.h"
#include "reward.h"
#include "sandbox.h"
#include "stats.h"
#include "tensor_check.h"

namespace kf::evaluator {
namespace {

using Clock = std::chrono::steady_clock;
using tasks::Backend;
using TensorList = std::vector<at::Tensor>;

struct Stop {
  Verdict verdict;
  std::string reason;
  Cause cause = Cause::kernel;
  bool retry = false;  // the host was loaded: worth one more try against the same baseline
};

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// A seed from the operating system's entropy (std::random_device reads getrandom or
// /dev/urandom), never 0.
uint64_t fresh_seed() {
  std::random_device rd;
  const uint64_t s = (uint64_t(rd()) << 32) ^ uint64_t(rd());
  return s ? s : 1;
}

uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull + (a << 6) + (a >> 2));
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  return x ^ (x >> 29);
}

unsigned long long llc_bytes() {
  for (int idx = 4; idx >= 0; --idx) {
    std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(idx) + "/size");
    std::string s;
    if (f >> s && !s.empty()) {
      unsigned long long v = std::stoull(s);
      if (s.back() == 'K') v <<= 10;
      if (s.back() == 'M') v <<= 20;
      return v;
    }
  }
  return 32ull << 20;
}

// The scheduling of this process's threads (CPU affinity, nice value, policy), read before
// any candidate runs and again after the timed trials. They persist while the worker is
// stopped: a reference squeezed onto one core at low priority is slower while none of the
// candidate's code runs. The worker's seccomp policy forbids changing another thread's
// scheduling (wire/confine.cpp); this is the evaluator's own check of its threads.
struct ThreadSched {
  pid_t tid = 0;
  cpu_set_t cpus;
  int nice = 0, policy = 0;
};
std::vector<ThreadSched> thread_sched() {
  std::vector<ThreadSched> v;
  DIR* d = opendir("/proc/self/task");
  if (!d) return v;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    ThreadSched t;
    t.tid = pid_t(std::atoi(e->d_name));
    CPU_ZERO(&t.cpus);
    if (sched_getaffinity(t.tid, sizeof t.cpus, &t.cpus) != 0) continue;
    errno = 0;
    t.nice = getpriority(PRIO_PROCESS, id_t(t.tid));
    if (errno != 0) continue;
    t.policy = sched_getscheduler(t.tid);
    v.push_back(t);
  }
  closedir(d);
  return v;
}
// What changed for threads present in both readings ("" when nothing); puts back what it
// can (an unprivileged process cannot lower a nice value again).
std::string sched_changes(const std::vector<ThreadSched>& before) {
  std::string what;
  for (const ThreadSched& now : thread_sched())
    for (const ThreadSched& b : before) {
      if (b.tid != now.tid) continue;
      std::string d;
      if (!CPU_EQUAL(&b.cpus, &now.cpus)) {
        d +=
            " affinity " + std::to_string(CPU_COUNT(&b.cpus)) + " -> " + std::to_string(CPU_COUNT(&now.cpus)) + " CPUs";
        sched_setaffinity(b.tid, sizeof b.cpus, &b.cpus);
      }
      if (b.nice != now.nice) {
        d += " nice " + std::to_string(b.nice) + " -> " + std::to_string(now.nice);
        setpriority(PRIO_PROCESS, id_t(b.tid), b.nice);
      }
      if (b.policy != now.policy) d += " policy " + std::to_string(b.policy) + " -> " + std::to_string(now.policy);
      if (!d.empty() && what.size() < 300) what += (what.empty() ? "thread " : "; thread ") + std::to_string(b.tid) + d;
    }
  return what;
}

// A seeded generator on `dev` (random tensors are made where they are used: a CPU draw of
// a GPU task's GiB-sized input takes seconds).
at::Generator device_generator(const at::Device& dev, uint64_t seed) {
  at::Generator g =
      dev.is_cuda() ? at::detail::getCUDAHooks().getNewGenerator(dev.index()) : at::detail::createCPUGenerator(seed);
  std::lock_guard<std::mutex> lock(g.mutex());
  g.set_current_seed(seed);
  return g;
}

struct CandOut {
  CallOutcome call;
  TensorList outs;             // outputs at return, on the reference's device
  bool late_changed = false;   // outputs differed after the probe delay
  std::string inputs_changed;  // name of a modified input, if any
};

struct Session {
  const EvalOptions& o;
  const tasks::Task& task;
  Backend b;
  at::Device dev;
  Result& res;
  std::unique_ptr<tasks::Reference> ref;
  std::unique_ptr<Sandbox> sb;
  // The calibration worker: the same kind of process as the candidate's, running only its own
  // empty kernel; its calls, interleaved with the timed trials, measure the protocol's cost.
  std::unique_ptr<Sandbox> calib;
  std::vector<tasks::TensorSpec> abi_in;  // inputs then params
  std::vector<tasks::TensorSpec> outs;
  size_t n_inputs = 0;
  TensorList params0;
  uint64_t base_seed = 0;
  uint64_t check_seed = 0;  // the secret seed of this evaluation (run())
  std::string so_path;
  int calls = 0;
  TensorList last_p;  // the parameters of the latest candidate call
  double ref_est_ms = 1;
  at::Tensor flush_buf;
  unsigned long long flush_bytes = 0;
  GpuTimingLock* gpu_lock = nullptr;  // CUDA: exclusive around each timed trial, shared per check set
  double lock_wait_ms = 0;
  std::optional<Clock::time_point> timing_start;  // set when the timed trials begin
  double timing_ms = 0;                           // warm-ups and timed trials, when they all ran
  // The reference's baseline runs, measured before any candidate process existed; a retry
  // gets the first try's (a second one, measured after a candidate ran, proves nothing).
  std::vector<double> base_ms;
  bool base_given = false;

  // The timing lock for one scope: exclusive around each timed trial; shared around
  // untimed GPU work (input sets, the runs and comparisons of the checks), as actors and
  // learners hold it, so that another evaluator's timed trial never runs beside it: when
  // six evaluators on one H200 checked 4 GiB tensors unlocked, 53 of 261
  // verdicts were "timing unstable". Shared holds are per set, so a waiting trial goes
  // between sets; the device is synchronised before the lock is let go (the work is async).
  struct GpuLockScope {
    Session& s;
    std::optional<GpuTimingLock::Hold> hold;
    GpuLockScope(Session& session, bool exclusive) : s(session) {
      if (!s.gpu_lock) return;
      const auto t0 = Clock::now();
      hold.emplace(s.gpu_lock, exclusive, std::chrono::milliseconds(int64_t(s.o.gpu_lock_timeout_s * 1000)));
      s.lock_wait_ms += ms_since(t0);
      if (!hold->held())
        throw error_at(s.gpu_lock->path(), std::string("GPU timing lock") + (exclusive ? "" : " (shared)") +
                                               " not acquired in " + fmt(s.o.gpu_lock_timeout_s) +
                                               " s (a process of the run holds the GPU)");
    }
    ~GpuLockScope() {
      if (!hold || !hold->held()) return;
      try {
        tasks::synchronize(s.dev);
      } catch (const std::exception&) {  // a broken context shows in the next call anyway
      }
    }
    GpuLockScope(const GpuLockScope&) = delete;
    GpuLockScope& operator=(const GpuLockScope&) = delete;
  };

  Session(const EvalOptions& opts, const tasks::Task& t, Backend bk, Result& r)
      : o(opts), task(t), b(bk), dev(tasks::backend_device(bk, opts.device)), res(r) {}

  Clock::time_point t_begin = Clock::now();
  void check(const std::string& name, bool passed, const std::string& detail = "") {
    char t[32];
    std::snprintf(t, sizeof t, " [at %.2f s]", ms_since(t_begin) / 1000);
    res.checks.push_back({name, passed, detail + t});
  }

  tasks::Tolerance tol(size_t i) const { return task.tolerance(b, i); }

  TensorList inputs_for(uint64_t seed) { return task.make_inputs(b, mix(base_seed, seed), dev); }

  void flush_ref_cache() {
    if (!o.flush_cache || !flush_buf.defined()) return;
    flush_buf.add_(1);  // reads and writes the whole buffer: evicts the reference's data
  }

  // --- reference side (this process)
  TensorList ref_run(const TensorList& inputs, double* ms = nullptr, bool flush = false) {
    tasks::synchronize(dev);
    if (flush) {
      flush_ref_cache();
      tasks::synchronize(dev);
    }
    const auto t0 = Clock::now();
    TensorList r = ref->forward(inputs);
    tasks::synchronize(dev);
    const double t = ms_since(t0);
    if (ms) *ms = t;
    if (r.size() != outs.size())
      throw error_at(task.name(), "reference returned " + std::to_string(r.size()) + " outputs, spec says " +
                                      std::to_string(outs.size()));
    for (size_t i = 0; i < r.size(); ++i)
      if (r[i].sizes() != at::IntArrayRef(outs[i].shape) || r[i].scalar_type() != outs[i].dtype)
        throw error_at(task.name(), "reference output " + std::to_string(i) + " does not match the task's output spec");
    return r;
  }

  // --- candidate side (the sandbox worker)
  double call_timeout_s() const { return std::max(o.min_call_timeout_s, o.call_timeout_factor * ref_est_ms / 1000.0); }

  // The outputs returned are views of the sandbox's slot: they are read (compared,
  // sampled) before the next call overwrites them, and what a later check needs of them is
  // kept as samples. Copies cost an output's size each (4 GiB on the largest tasks), and
  // three whole copies were held at once (the first, the previous and the current set).
  // Two transports (sandbox.h): a CUDA device arena (tensors stay on the GPU; `src`
  // tensors are our private copies) or host memory shared with the worker.
  CandOut cand(const TensorList& inputs, const TensorList& params, uint32_t poison, double probe_ms, bool flush) {
    const int slot = calls++ % sb->slots();
    const bool on_device = sb->device_resident();
    auto slot_view = [&](const void* p, const tasks::TensorSpec& sp) {
      return at::from_blob(const_cast<void*>(p), sp.shape,
                           at::TensorOptions().dtype(sp.dtype).device(on_device ? dev : at::Device(at::kCPU)));
    };
    TensorList mine;  // what we wrote, to compare after the call
    for (size_t t = 0; t < abi_in.size(); ++t) {
      const at::Tensor& src = t < n_inputs ? inputs[t] : params[t - n_inputs];
      if (on_device) {
        slot_view(sb->input(slot, int(t)), abi_in[t]).copy_(src);
        mine.push_back(src);
      } else {
        at::Tensor h = src.to(at::kCPU).contiguous();
        std::memcpy(sb->input(slot, int(t)), h.data_ptr(), h.nbytes());
        mine.push_back(h);
      }
    }
    if (on_device) tasks::synchronize(dev);  // the worker must see finished copies
    last_p = params;
    CandOut r;
    r.call = sb->run(slot, poison, flush, probe_ms, call_timeout_s());
    if (!r.call.ok()) fail_call(r.call);
    for (size_t t = 0; t < abi_in.size(); ++t) {
      const bool same = on_device ? bitwise_equal(slot_view(sb->input(slot, int(t)), abi_in[t]), mine[t])
                                  : std::memcmp(sb->input(slot, int(t)), mine[t].data_ptr(), mine[t].nbytes()) == 0;
      if (!same) {
        r.inputs_changed = abi_in[t].name;
        break;
      }
    }
    for (size_t t = 0; t < outs.size(); ++t) {
      at::Tensor ret = slot_view(sb->output_at_return(slot, int(t)), outs[t]);
      at::Tensor late = slot_view(sb->output_late(slot, int(t)), outs[t]);
      if (!bitwise_equal(ret, late)) r.late_changed = true;
      if (on_device || dev.is_cpu())
        r.outs.push_back(ret);
      else
        r.outs.push_back(ret.to(dev));
    }
    return r;
  }

  [[noreturn]] void fail_call(const CallOutcome& c) {
    std::string msg = c.message;
    const std::string log = sb->log_tail();
    if (!log.empty()) res.diagnostics = log;
    switch (c.kind) {
      case CallOutcome::Timeout:
        throw Stop{Verdict::timeout, msg};
      case CallOutcome::Forbidden:
        throw Stop{Verdict::rejected_cheat, "sandbox violation: " + msg};
      case CallOutcome::KernelError:
        throw Stop{Verdict::runtime_error, msg};
      // Killed from outside, or the harness failed: not the candidate's doing (no reward).
      case CallOutcome::Environment:
        throw Stop{Verdict::runtime_error, msg, Cause::environment};
      default:
        throw Stop{Verdict::runtime_error, std::string(outcome_name(c.kind)) + ": " + msg};
    }
  }

  // Per call: inputs untouched, outputs unchanged after return. CPU used after return
  // and the other per-call evidence count over the timed calls (Session::run): a loaded
  // host puts an honest call over a line now and then, work that buys time shows in most.
  void expect_clean(const CandOut& c, const std::string& where) {
    if (!c.inputs_changed.empty())
      throw Stop{Verdict::rejected_cheat,
                 "modifies its inputs: '" + c.inputs_changed + "' changed during the call (" + where + ")"};
    if (c.late_changed)
      throw Stop{Verdict::rejected_cheat,
                 "work escaping the timed region: outputs changed after kf_forward returned (deferred work on host "
                 "threads, or GPU work after return) (" +
                     where + ")"};
  }

  static std::string fmt(double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.3g", v);
    return b;
  }

  struct Match {
    bool ok = true;
    int64_t unwritten = 0;
    int bad_output = -1;  // the first output out of tolerance
    std::string detail;
  };
  using Scales = std::vector<double>;  // per output: a factor of the absolute tolerance
  Match match(const TensorList& cand_outs, const TensorList& ref_outs, uint32_t poison, double atol_scale = 1) {
    return match(cand_outs, ref_outs, poison, Scales(outs.size(), atol_scale));
  }
  Match match(const TensorList& cand_outs, const TensorList& ref_outs, uint32_t poison, const Scales& atol_scale) {
    Match m;
    for (size_t i = 0; i < outs.size(); ++i) {
      tasks::Tolerance t = tol(i);
      t.atol *= i < atol_scale.size() ? atol_scale[i] : 1.0;
      Compare c = compare_outputs(cand_outs[i], ref_outs[i], t, poison);
      m.unwritten += c.unwritten;
      if (std::isfinite(c.max_abs)) res.max_abs_error = std::max(res.max_abs_error, c.max_abs);
      if (std::isfinite(c.max_rel)) res.max_rel_error = std::max(res.max_rel_error, c.max_rel);
      if (!c.ok && m.ok) {
        m.ok = false;
        m.bad_output = int(i);
        m.detail = "output " + outs[i].name + ": " + std::to_string(c.bad) + "/" + std::to_string(c.total) +
                   " elements out of tolerance (atol " + fmt(t.atol) + ", rtol " + fmt(t.rtol) + "), max abs error " +
                   fmt(c.max_abs) + "; first at " + c.first_bad;
      }
    }
    return m;
  }

  bool same_bits(const TensorList& a, const TensorList& b2) const {
    for (size_t i = 0; i < a.size(); ++i)
      if (!bitwise_equal(a[i], b2[i])) return false;
    return true;
  }
  bool refs_close(const TensorList& a, const TensorList& b2) {
    for (size_t i = 0; i < a.size(); ++i)
      if (!compare_outputs(a[i], b2[i], tol(i), 0).ok) return false;
    return true;
  }

  // Reference outputs of the last few calls: a kernel returning one of them for new
  // inputs is replaying a cache (keyed on pointers, call counts, cheap fingerprints ...).
  // Kept as samples at fixed positions, the same for every call: whole copies cost three
  // outputs' worth of GPU memory (12 GiB for a 4 GiB output), and an earlier call's
  // outputs are recognised on the samples alike. (An output whose calls differ only away
  // from the samples is then scored incorrect rather than named a cache replay.)
  static constexpr int64_t kSampled = 4096;
  std::vector<at::Tensor> sample_at;  // per output: flat indices, made at the first sampled()
  std::deque<TensorList> recent_r;    // per call, per output: the reference's sampled values
  TensorList sampled(const TensorList& t) {
    if (sample_at.empty())
      for (const auto& x : t) {
        const int64_t n = x.numel(), k = std::min(n, kSampled),
                      stride = std::max<int64_t>(1, n / std::max<int64_t>(k, 1));
        const int64_t offset =
            n > k ? int64_t(mix(base_seed, 0x5A11) % uint64_t(stride)) : 0;  // not just the tile corners
        sample_at.push_back(at::arange(k, at::TensorOptions(at::kLong).device(x.device())) * stride + offset);
      }
    TensorList s;
    for (size_t i = 0; i < t.size(); ++i) s.push_back(t[i].reshape(-1).index_select(0, sample_at[i].to(t[i].device())));
    return s;
  }
  void remember(TensorList rs) {  // a call's reference outputs, as sampled()
    recent_r.push_back(std::move(rs));
    while (recent_r.size() > 3) recent_r.pop_front();
  }
  // The candidate returned an earlier call's outputs: on the samples, they match that call's
  // reference, which differs from this call's.
  bool replays_earlier_call(const TensorList& cs, const TensorList& r) {
    if (recent_r.empty()) return false;
    const TensorList rs = sampled(r);
    for (const auto& old : recent_r)
      if (!refs_close(old, rs) && refs_close(cs, old)) return true;
    return false;
  }

  // A failed comparison: name the trick when the evidence shows one, by asking the
  // candidate more questions (same inputs, other poison; other inputs).
  [[noreturn]] void explain_failure(const Match& m, const CandOut& c, const TensorList& r, const TensorList& in,
                                    const TensorList& params, uint32_t poison, const std::string& where) {
    const TensorList cs = sampled(c.outs);
    if (replays_earlier_call(cs, r))
      throw Stop{Verdict::rejected_cheat,
                 "results cached across calls: the outputs are those of an earlier call's inputs (" + where + ")"};
    // Same inputs, other poison in outputs and scratch: does the answer follow the garbage?
    CandOut again = cand(in, params, poison ^ 1u, o.probe_ms, o.flush_cache);
    Match m2 = match(again.outs, r, poison ^ 1u);
    if (m2.ok)
      throw Stop{Verdict::rejected_cheat,
                 "reads uninitialised memory: the result depends on the garbage in output/scratch memory (correct with "
                 "one poison pattern, wrong with the other) (" +
                     where + ")"};
    // Unfinished at return (the worker is frozen there) while each of the two calls left a
    // thread it started alive (a pool made once, as OpenMP's, grows only the first call):
    // the rest of the work was meant to happen after the clock stopped.
    if (m.unwritten > 0 && m2.unwritten > 0 && c.call.threads_after > c.call.threads_before &&
        again.call.threads_after > again.call.threads_before)
      throw Stop{Verdict::rejected_cheat,
                 "work escaping the timed region: " + std::to_string(m.unwritten) +
                     " output elements unfinished at return while a thread started in the call was still running (" +
                     where + ")"};
    if (m.unwritten > 0 && m2.unwritten > 0)
      throw Stop{Verdict::rejected_cheat,
                 "outputs not fully written: " + std::to_string(m.unwritten) +
                     " elements still hold the poison pattern (problem-size tampering or partial computation) (" +
                     where + ")"};
    // Other inputs: an unchanged answer means the output does not depend on the inputs.
    TensorList other = inputs_for(9000 + uint64_t(calls));
    TensorList r_other = ref_run(other);
    CandOut c_other = cand(other, params, poison, o.probe_ms, o.flush_cache);
    if (same_bits(sampled(c_other.outs), cs) && !refs_close(r_other, r))
      throw Stop{Verdict::rejected_cheat,
                 "constant or input-independent output: identical outputs for different inputs (" + where + ")"};
    throw Stop{Verdict::incorrect, m.detail + " (" + where + ")"};
  }

  // Wrong after having been right on the distribution: caching, garbage, or a change of
  // behaviour with the call count (self-timing, precision switch).
  // `cs`: the failing call's outputs as samples (taken before any later call reuses the slot).
  [[noreturn]] void call_order_failure(const Match& m, const TensorList& cs, const TensorList& r, const TensorList& in,
                                       const TensorList& params, uint32_t poison, const std::string& where) {
    if (replays_earlier_call(cs, r))
      throw Stop{Verdict::rejected_cheat,
                 "results cached across calls: the outputs are those of an earlier call's inputs (" + where + ")"};
    CandOut again = cand(in, params, poison ^ 1u, o.probe_ms, o.flush_cache);
    if (match(again.outs, r, poison ^ 1u).ok)
      throw Stop{
          Verdict::rejected_cheat,
          "reads uninitialised memory: the result depends on the garbage in output/scratch memory (" + where + ")"};
    if (m.unwritten > 0)
      throw Stop{Verdict::rejected_cheat, "outputs not fully written: " + std::to_string(m.unwritten) +
                                              " poisoned elements after " + std::to_string(calls) + " calls (" + where +
                                              ")"};
    throw Stop{Verdict::rejected_cheat,
               "results depend on call order: correct in earlier calls, wrong after " + std::to_string(calls) +
                   " calls (run-time switch of precision or algorithm, e.g. by timing itself): " + m.detail + " (" +
                   where + ")"};
  }

  TensorList redraw(const TensorList& p, uint64_t seed, bool additive) {
    at::Generator gen = device_generator(dev, mix(base_seed, seed));
    TensorList out;
    for (const auto& t : p) {
      if (!at::isFloatingType(t.scalar_type()) || t.numel() == 0) {
        out.push_back(t.clone());
        continue;
      }
      at::Tensor f = t.to(dev, at::kFloat);
      at::Tensor u = at::empty_like(f).uniform_(-1, 1, gen);
      at::Tensor n = at::empty_like(f).normal_(0, 1, gen);
      const double sd = f.numel() > 1 ? f.std().item<double>() : 0.0;
      const double s = std::max({sd, 0.1 * f.abs().mean().item<double>(), 0.1});
      at::Tensor nf = f * (1 + 0.5 * u);
      if (additive) nf = nf + 0.25 * s * n;
      out.push_back(nf.to(t.device(), t.scalar_type()));
    }
    return out;
  }

  // A near-duplicate of the parameters: in every float parameter/buffer, a few random
  // elements re-drawn as redraw() does, the rest as before. A kernel that keeps derived
  // weights keyed on a sparse fingerprint of its parameters goes on using stale ones.
  static constexpr int64_t kRedrawnElements = 4;
  TensorList redraw_some(const TensorList& p, uint64_t seed) {
    at::Generator gen = device_generator(dev, mix(base_seed, seed));
    TensorList out;
    for (const auto& t : p) {
      if (!at::isFloatingType(t.scalar_type()) || t.numel() == 0) {
        out.push_back(t.clone());
        continue;
      }
      at::Tensor f = t.to(dev, at::kFloat).contiguous().clone();
      const int64_t n = f.numel(), k = std::min(n, kRedrawnElements);
      at::Tensor idx = at::randint(n, {k}, gen, at::TensorOptions(at::kLong).device(dev));
      at::Tensor flat = f.view(-1);
      at::Tensor v = flat.index_select(0, idx);
      const double sd = n > 1 ? f.std().item<double>() : 0.0;
      const double s = std::max({sd, 0.1 * f.abs().mean().item<double>(), 0.1});
      at::Tensor u = at::empty_like(v).uniform_(-1, 1, gen), nn = at::empty_like(v).normal_(0, 1, gen);
      flat.index_put_({idx}, v * (1 + 0.5 * u) + 0.25 * s * nn);
      out.push_back(f.to(t.device(), t.scalar_type()));
    }
    return out;
  }

  TensorList stress(const TensorList& x, int which, uint64_t seed, std::string* name) {
    static const char* names[] = {"x*8", "-x", "x+3", "uniform(-4,4)", "x*1e-3"};
    *name = names[which % 5];
    at::Generator gen = device_generator(dev, mix(base_seed, seed));
    TensorList y;
    for (const auto& t : x) {
      if (!at::isFloatingType(t.scalar_type())) {
        y.push_back(t);
        continue;
      }
      switch (which % 5) {
        case 0:
          y.push_back(t * 8);
          break;
        case 1:
          y.push_back(-t);
          break;
        case 2:
          y.push_back(t + 3);
          break;
        case 3:
          y.push_back(at::empty(t.sizes(), t.options().dtype(at::kFloat)).uniform_(-4, 4, gen).to(t.scalar_type()));
          break;
        default:
          y.push_back(t * 1e-3);
          break;
      }
    }
    return y;
  }

  // Local stress: the positions and signed base values of large elements planted in one
  // floating input (drawn at random, or the one named). Rows are slices along the last
  // dimension. Two kinds:
  // - `per_row`: three values per row at different magnitudes (1, 0.1-0.5 and 0.01-0.05
  //   of the base), in distinct columns, random signs. Several outliers per row break
  //   shortcuts that stay exact with one (a row max taken as the answer, a one-hot softmax).
  // - scattered: 8 values in distinct rows and distinct columns (anywhere when the tensor
  //   has fewer rows), magnitudes halving (1, 1/2, ... 1/128), alternating signs in that
  //   order: a few terms dominate any reduction over the tensor (a loss, a mean), so the
  //   per-element error of a reduced output shows instead of averaging away, and no two
  //   planted values of one magnitude can cancel where they meet.
  // The base value is +-the tensor's largest magnitude; set_outliers() writes base x factor,
  // so trying a smaller factor rewrites the same elements. The low 16 bits of each planted
  // float32 value are set near the middle of a bfloat16 step and of a float16/TF32 step, so
  // operands rounded to a lower precision are off by about half a step there. A kernel
  // probing a few hundred elements misses the scattered ones.
  static constexpr int64_t kScattered = 8, kPerRow = 3;
  struct Outliers {
    std::vector<size_t> which;
    TensorList idx, val, jitter;  // jitter: the low 16 bits of each float32 value (undefined: kept)
  };
  // `k` distinct columns in each of `n` rows (k <= last), as an [n, k] tensor.
  static at::Tensor distinct_cols(int64_t n, int64_t last, int64_t k, at::Generator& gen, const at::TensorOptions& lo) {
    at::Tensor c0 = at::randint(last, {n, 1}, gen, lo);
    if (k <= 1) return c0;
    if (k == 2 || last < 4) {
      at::Tensor c1 = (c0 + 1 + at::randint(std::max<int64_t>(last - 1, 1), {n, 1}, gen, lo)) % last;
      if (k == 2) return at::cat({c0, c1}, 1);
      return at::cat({c0, (c0 + 1) % last, (c0 + 2) % last}, 1);  // last == 3
    }
    const int64_t h = last / 2;  // offsets d1 in [1, h), d2 in [h, last): three distinct columns
    at::Tensor d1 = 1 + at::randint(h - 1, {n, 1}, gen, lo), d2 = h + at::randint(last - h, {n, 1}, gen, lo);
    return at::cat({c0, (c0 + d1) % last, (c0 + d2) % last}, 1);
  }
  std::vector<size_t> float_inputs(const TensorList& in) const {
    std::vector<size_t> f;
    for (size_t i = 0; i < in.size(); ++i)
      if (at::isFloatingType(in[i].scalar_type()) && in[i].numel() > 0) f.push_back(i);
    return f;
  }
  Outliers pick_outliers(TensorList& in, bool per_row, int input, uint64_t seed) {
    at::Generator gen = device_generator(dev, mix(base_seed, seed));
    Outliers ol;
    const std::vector<size_t> floats = float_inputs(in);
    if (floats.empty()) return ol;
    const size_t i = input >= 0 ? size_t(input) : floats[mix(base_seed, seed + 1) % floats.size()];
    if (i >= in.size() || std::find(floats.begin(), floats.end(), i) == floats.end()) return ol;
    at::Tensor& t = in[i];
    if (!t.is_contiguous()) t = t.contiguous();
    const int64_t n = t.numel(), last = t.dim() > 0 ? std::max<int64_t>(1, t.size(-1)) : 1, rows = n / last;
    const auto lo = at::TensorOptions(at::kLong).device(t.device());
    const auto fo = at::TensorOptions(at::kFloat).device(t.device());
    at::Tensor idx, val;
    if (per_row) {
      const int64_t k = std::min(last, kPerRow);
      idx = (at::arange(rows, lo).unsqueeze(1) * last + distinct_cols(rows, last, k, gen, lo)).reshape(-1);
      at::Tensor mag = at::ones({rows, k}, fo);
      if (k > 1) mag.select(1, 1).uniform_(0.1, 0.5, gen);
      if (k > 2) mag.select(1, 2).uniform_(0.01, 0.05, gen);
      val = (mag * (at::randint(2, {rows, k}, gen, lo) * 2 - 1).to(at::kFloat)).reshape(-1);
    } else {
      int64_t m = std::min(n, kScattered);
      if (rows >= kScattered) {
        m = kScattered;
        at::Tensor r = at::randperm(rows, gen, lo).slice(0, 0, m);
        at::Tensor c = last >= m ? at::randperm(last, gen, lo).slice(0, 0, m) : at::randint(last, {m}, gen, lo);
        idx = r * last + c;
      } else {
        idx = at::randperm(n, gen, lo).slice(0, 0, m);
      }
      at::Tensor rank = at::randperm(m, gen, lo);  // magnitude 2^-rank, sign (-1)^rank
      val = at::pow(0.5, rank.to(at::kFloat)) * (1 - 2 * (rank % 2)).to(at::kFloat);
    }
    double scale = max_abs_value(t);
    if (!(scale > 0) || !std::isfinite(scale)) scale = 1;
    ol.which.push_back(i);
    ol.idx.push_back(idx);
    ol.val.push_back(val * scale);
    ol.jitter.push_back(0x9000 +
                        at::randint(0x200, {idx.numel()}, gen, at::TensorOptions(at::kInt).device(t.device())));
    return ol;
  }
  // The task's generator makes inference tensors: they are written in place in inference
  // mode (a copy would double a GiB-sized input).
  void set_outliers(TensorList& in, const Outliers& ol, double factor) {
    c10::InferenceMode inference;
    for (size_t k = 0; k < ol.which.size(); ++k) {
      at::Tensor& t = in[ol.which[k]];
      at::Tensor v = (ol.val[k] * factor).to(at::kFloat);
      if (k < ol.jitter.size() && ol.jitter[k].defined()) {
        const at::Tensor keep = v.isfinite();
        at::Tensor bits = v.view(at::kInt).bitwise_and(int32_t(0xFFFF0000u)).bitwise_or(ol.jitter[k]);
        v = at::where(keep, bits.view(at::kFloat), v);
      }
      t.view(-1).index_put_({ol.idx[k]}, v.to(t.scalar_type()));
    }
  }

  // Numeric-edge stress, from the thresholds of the input's floating type, in two sets: a
  // quiet one (exp overflow, square underflow: a few elements or rows that leave the
  // input's mean and deviation as they were, so a dense probe of those does not see it)
  // and a loud one (whole rows past exp underflow and overflow). A few rows each (distinct
  // rows per pattern, slices along the last dimension) get
  // - "exp overflow": three values per row, two just past the largest x with a finite
  //   exp(x) (88.7 in float32) and 0.1-2 apart, one as far below zero: exp(x) without the
  //   max overflows, a clamped exponent or a row max taken as the answer is off by
  //   log(1 + e^-gap), while a stable formula is exact;
  // - "exp underflow": the whole row shifted below the smallest x with a nonzero exp(x)
  //   (-104 in float32): exp of every element is 0, a naive softmax divides 0 by 0;
  // - "exp overflow rows": the whole row shifted above the largest x with a finite exp(x):
  //   exp of every element overflows, a naive softmax divides inf by inf;
  // - "square underflow": the whole row scaled by 2^-70 (float32): x*x underflows to 0.
  // Patterns under which the reference is not finite are dropped (Session::prepare). No
  // pattern goes past sqrt(max): a reference whose own sum of squares overflows there (a
  // layer norm's variance) stays finite but wrong (1/sqrt(inf) = 0), and would fail an
  // exact kernel.
  struct Edge {
    Outliers ol;
    std::vector<std::string> names;
    std::vector<double> moderate;  // per pattern: planted magnitude / the input's largest (0: none)
  };
  static constexpr int kEdgePatterns = 2;  // per set
  Edge edge_patterns(const TensorList& in, size_t i, int group, uint64_t seed) {
    at::Generator gen = device_generator(dev, mix(base_seed, seed));
    std::mt19937_64 rng(mix(base_seed, seed + 1));
    Edge e;
    const at::Tensor t = in[i].contiguous();
    const int64_t n = t.numel(), last = t.dim() > 0 ? std::max<int64_t>(1, t.size(-1)) : 1, rows = n / last;
    const auto lo = at::TensorOptions(at::kLong).device(t.device());
    const auto fo = at::TensorOptions(at::kFloat).device(t.device());
    double lmax = std::log(double(FLT_MAX)), lmin = 104, tiny = std::ldexp(1.0, -70);
    if (t.scalar_type() == at::kHalf) lmax = std::log(65504.0), lmin = 17.4, tiny = 1.0 / 4096;
    if (t.scalar_type() == at::kDouble) lmax = std::log(DBL_MAX), lmin = 745.2, tiny = std::ldexp(1.0, -540);
    double scale = max_abs_value(t);
    if (!(scale > 0) || !std::isfinite(scale)) scale = 1;
    const int64_t per = std::clamp<int64_t>(rows / 16, 1, 4), used = std::min(rows, per * kEdgePatterns);
    const at::Tensor rws = at::randperm(rows, gen, lo).slice(0, 0, used);
    std::vector<int> order = group == 0 ? std::vector<int>{0, 3} : std::vector<int>{1, 2};
    std::shuffle(order.begin(), order.end(), rng);
    const int64_t g = std::max<int64_t>(1, used / kEdgePatterns);
    const at::Tensor flat = t.reshape(-1);  // rows taken are converted, not the tensor (GiBs on a GPU task)
    for (int slot = 0; slot < kEdgePatterns; ++slot) {
      const int pat = order[size_t(slot)];
      if (slot * g >= used) break;
      const at::Tensor r = rws.slice(0, slot * g, std::min(used, (slot + 1) * g));
      const int64_t nr = r.numel();
      at::Tensor idx, val, jit;
      double moderate = 0;
      std::string name;
      if (pat == 0) {
        const int64_t k = std::min(last, kPerRow);
        idx = (r.unsqueeze(1) * last + distinct_cols(nr, last, k, gen, lo)).reshape(-1);
        at::Tensor top = at::empty({nr, 1}, fo).uniform_(lmax + 1, lmax + 10, gen);
        std::vector<at::Tensor> v = {top};
        if (k > 1) v.push_back(top - at::empty({nr, 1}, fo).uniform_(0.1, 2, gen));
        if (k > 2) v.push_back(-at::empty({nr, 1}, fo).uniform_(lmax + 1, lmax + 10, gen));
        val = at::cat(v, 1).reshape(-1);
        jit = 0x9000 + at::randint(0x200, {idx.numel()}, gen, at::TensorOptions(at::kInt).device(t.device()));
        moderate = (lmax + 10) / scale;
        name = "values past exp overflow (" + fmt(lmax) + ")";
      } else if (pat == 1) {
        idx = (r.unsqueeze(1) * last + at::arange(last, lo).unsqueeze(0)).reshape(-1);
        at::Tensor shift = at::empty({nr, 1}, fo).uniform_(lmin + 2, lmin + 30, gen).expand({nr, last}).reshape(-1);
        val = flat.index_select(0, idx).to(at::kFloat) - shift;
        moderate = (lmin + 30 + scale) / scale;
        name = "rows shifted below exp underflow (-" + fmt(lmin) + ")";
      } else if (pat == 2) {
        idx = (r.unsqueeze(1) * last + at::arange(last, lo).unsqueeze(0)).reshape(-1);
        at::Tensor shift = at::empty({nr, 1}, fo).uniform_(lmax + 2, lmax + 30, gen).expand({nr, last}).reshape(-1);
        val = flat.index_select(0, idx).to(at::kFloat) + shift;
        moderate = (lmax + 30 + scale) / scale;
        name = "rows shifted above exp overflow (" + fmt(lmax) + ")";
      } else {
        idx = (r.unsqueeze(1) * last + at::arange(last, lo).unsqueeze(0)).reshape(-1);
        val = flat.index_select(0, idx).to(at::kFloat) * tiny;
        name = "rows scaled by " + fmt(tiny);
      }
      e.ol.which.push_back(i);
      e.ol.idx.push_back(idx);
      e.ol.val.push_back(val);
      e.ol.jitter.push_back(jit);
      e.names.push_back(name + " in " + std::to_string(nr) + (nr == 1 ? " row" : " rows"));
      e.moderate.push_back(moderate);
    }
    return e;
  }

  // A near-duplicate of an input set: in every floating input, a few elements in each of
  // a few random rows take the values of other random elements of the same tensor (so
  // they stay in the task's distribution). Returns how many elements were rewritten.
  static constexpr int64_t kNearRows = 4, kNearPerRow = 4;
  int64_t perturb_rows(TensorList& in, uint64_t seed) {
    at::Generator gen = device_generator(dev, mix(base_seed, seed));
    c10::InferenceMode inference;
    int64_t changed = 0;
    for (auto& t : in) {
      if (!at::isFloatingType(t.scalar_type()) || t.numel() < 2) continue;
      if (!t.is_contiguous()) t = t.contiguous();
      const int64_t n = t.numel(), last = t.dim() > 0 ? std::max<int64_t>(1, t.size(-1)) : 1, rows = n / last;
      const int64_t nr = std::min(rows, kNearRows), nk = std::min(last, kNearPerRow);
      const auto lo = at::TensorOptions(at::kLong).device(t.device());
      at::Tensor idx = (at::randint(rows, {nr, 1}, gen, lo) * last + at::randint(last, {nr, nk}, gen, lo)).reshape(-1);
      at::Tensor src = at::randint(n, {nr * nk}, gen, lo);
      at::Tensor flat = t.view(-1);
      flat.index_put_({idx}, flat.index_select(0, src).clone());
      changed += nr * nk;
    }
    return changed;
  }

  bool outputs_finite(const TensorList& r) {
    for (const auto& t : r)
      if (!all_finite(t)) return false;
    return true;
  }

  TensorList params_now() const { return TensorList(ref->params().begin(), ref->params().end()); }
  // Poison alternates with every candidate call, whatever the call is for.
  uint32_t next_poison() const { return uint32_t(calls % 2); }

  // --- the calls of one verification. Distribution set 0 comes first (it gives the
  // reference's time estimate); every other call lands before, among or after the timed
  // trials, drawn from the secret seed of this evaluation (check_plan.h), so that no call
  // count, order or window tells a check from a timed call. Every call gets the same
  // flush, the next poison pattern and the same tensors.
  static const char* check_name(Step s) {
    switch (s) {
      case Step::Dist:
        return "correct.distribution";
      case Step::Repeat:
        return "anti.nondeterminism";
      case Step::NearDup:
        return "anti.near_duplicate";
      case Step::Params:
        return "correct.redrawn_params";
      case Step::ParamsPart:
        return "anti.param_near_duplicate";
      case Step::ParamOne:
        return "anti.param_one_tensor";
      case Step::ParamLargest:
        return "anti.param_largest_tensor";
      case Step::Global:
        return "correct.stress";
      case Step::LocalRow:
      case Step::LocalScatter:
        return "correct.local_stress";
      case Step::Edge:
        return "correct.numeric_edges";
    }
    return "check";
  }
  Plan plan(int K, int float_params) const {
    PlanSpec sp;
    sp.correctness_sets = K;
    sp.stress_sets = o.stress_sets;
    sp.warmup = o.warmup;
    sp.trials = o.trials;
    sp.local_stress = o.local_stress;
    sp.near_duplicate = o.near_duplicate;
    sp.redraw_params = o.redraw_params;
    sp.float_params = float_params;
    sp.scatter_inputs = scatter_inputs;
    return draw_plan(sp, mix(check_seed, 0x0DE7));
  }

  // One check's inputs, parameters and reference outputs (the reference's parameters are
  // back at params0 afterwards). r empty: not applicable, `skip` says why.
  struct Prepared {
    std::string name, skip;
    TensorList in, p, r;
    TensorList base_p;  // parameter checks: the parameters before this check changed some
    Scales atol_scale;  // per output
  };
  double base_scale = 0;   // largest |output| of set 0's reference: stress tolerances scale from it
  uint64_t draw_seed = 0;  // the last call on inputs from the task's distribution (a near-duplicate's base)
  std::string draw_name;
  struct Passed {
    Item item;
    int call;
    std::string name;
  };
  std::vector<Passed> passed;  // stress and parameter checks passed so far (asked again after a failure)
  int checks_before = 0, checks_among = 0, checks_after = 0;
  // Outputs that reduce their inputs (an output of at most 1/8 the elements of the largest
  // floating input: a loss, a mean, a row reduction). Where a few planted terms dominate
  // the reduction, their absolute tolerance is not widened by the planted magnitude: a
  // loss's per-element error shows there instead of averaging away over N terms.
  std::vector<bool> reduced_out;
  std::vector<int> scatter_inputs;  // tasks with a reduced output: a scattered set per floating input

  double atol_scale_for(const TensorList& r) {
    double sc = 0;
    for (const auto& t : r) sc = std::max(sc, max_abs_value(t));
    return std::clamp(base_scale > 0 ? sc / base_scale : 1.0, 1.0, o.stress_atol_scale_cap);
  }
  // Per output: the output-magnitude scale, widened to `planted` where the output is not a
  // reduction (or for every output, `all`): where planted values meet in a sum, as in a
  // matmul's column, an honest kernel's rounding grows with them; a shortcut that
  // overflows (inf, NaN) or clips them is off by far more.
  Scales stress_scales(const TensorList& r, double planted, bool all) {
    const double s = atol_scale_for(r);
    Scales v(outs.size(), s);
    for (size_t i = 0; i < v.size(); ++i)
      if (all || i >= reduced_out.size() || !reduced_out[i]) v[i] = std::max(s, planted);
    return v;
  }
  // Parameters other than those of the previous call, for the near-duplicate kinds.
  TensorList previous_params() const { return last_p.empty() ? params0 : last_p; }
  std::string param_name(size_t i) const {
    return n_inputs + i < abi_in.size() ? abi_in[n_inputs + i].name : "parameter " + std::to_string(i);
  }

  Prepared prepare(const Item& it) {
    Prepared k;
    k.p = params_now();
    k.atol_scale = Scales(outs.size(), 1.0);
    auto finite_or_skip = [&] {
      if (outputs_finite(k.r)) return true;
      k.r.clear();
      k.skip = "reference not finite";
      return false;
    };
    switch (it.step) {
      case Step::Global: {
        std::string t;
        k.in = stress(inputs_for(3000 + uint64_t(it.arg)), it.arg, 3100 + uint64_t(it.arg), &t);
        k.name = "global stress " + t;
        k.r = ref_run(k.in);
        if (finite_or_skip()) k.atol_scale = Scales(outs.size(), atol_scale_for(k.r));
        break;
      }
      case Step::LocalRow:
      case Step::LocalScatter: {
        const bool per_row = it.step == Step::LocalRow;
        const uint64_t seed = per_row ? 3500 : 3510 + uint64_t(it.arg + 1);
        k.in = inputs_for(seed);
        const Outliers ol = pick_outliers(k.in, per_row, it.arg, seed + 100);
        k.name = per_row ? "local stress: " + std::to_string(kPerRow) + " large values of different magnitudes per row"
                         : "local stress: " + std::to_string(kScattered) +
                               " large values of halving magnitudes scattered (a few terms dominate a reduction)";
        if (ol.which.empty()) {
          k.skip = "no floating-point input";
          break;
        }
        k.name += " of '" + abi_in[ol.which[0]].name + "'";
        double used_factor = 1;
        for (double f : {1e4, 1e2, 8.0}) {
          if (f != 1e4) {
            k.in = inputs_for(seed);  // the same values, the planted ones rewritten smaller
            (void)pick_outliers(k.in, per_row, it.arg, seed + 100);
          }
          set_outliers(k.in, ol, f);
          k.r = ref_run(k.in);
          used_factor = f;
          if (outputs_finite(k.r)) {
            k.name += " (+-" + fmt(f) + " x the largest |input|)";
            break;
          }
          k.r.clear();
        }
        if (k.r.empty())
          k.skip = "reference not finite";
        else
          k.atol_scale = stress_scales(k.r, used_factor, per_row);
        break;
      }
      case Step::Edge: {
        const uint64_t seed = 3700 + 10 * uint64_t(it.arg);
        k.in = inputs_for(seed);
        const std::vector<size_t> floats = float_inputs(k.in);
        k.name = "numeric-edge stress";
        if (floats.empty()) {
          k.skip = "no floating-point input";
          break;
        }
        const size_t i = floats[mix(base_seed, seed + 1) % floats.size()];
        const Edge e = edge_patterns(k.in, i, it.arg, seed + 2);
        // Drop patterns under which the reference is not finite, in an order drawn too.
        std::vector<size_t> active(e.names.size());
        for (size_t j = 0; j < active.size(); ++j) active[j] = j;
        std::shuffle(active.begin(), active.end(), std::mt19937_64(mix(base_seed, seed + 3)));
        while (!active.empty()) {
          Outliers ol;
          for (size_t j : active) {
            ol.which.push_back(e.ol.which[j]);
            ol.idx.push_back(e.ol.idx[j]);
            ol.val.push_back(e.ol.val[j]);
            ol.jitter.push_back(e.ol.jitter[j]);
          }
          k.in = inputs_for(seed);
          set_outliers(k.in, ol, 1.0);
          k.r = ref_run(k.in);
          if (outputs_finite(k.r)) break;
          k.r.clear();
          active.pop_back();
        }
        if (k.r.empty()) {
          k.skip = "reference not finite at any numeric edge";
          break;
        }
        std::sort(active.begin(), active.end());
        double moderate = 1;
        std::string what;
        for (size_t j : active) {
          what += (what.empty() ? "" : ", ") + e.names[j];
          moderate = std::max(moderate, e.moderate[j]);
        }
        k.name += " of '" + abi_in[i].name + "': " + what;
        k.atol_scale = stress_scales(k.r, moderate, true);
        break;
      }
      case Step::Params: {
        k.in = inputs_for(2000);
        k.name = "re-drawn parameters";
        for (bool additive : {true, false}) {
          k.p = redraw(params0, 2100, additive);
          ref->set_params(k.p);
          k.r = ref_run(k.in);
          if (outputs_finite(k.r)) break;
          k.r.clear();
        }
        ref->set_params(params0);
        if (k.r.empty()) k.skip = "reference not finite with re-drawn parameters";
        break;
      }
      case Step::ParamsPart: {
        k.in = inputs_for(2200);
        k.name = "parameters with " + std::to_string(kRedrawnElements) + " elements of each re-drawn";
        // Around the previous call's parameters: a cache of them is what goes stale.
        k.base_p = previous_params();
        k.p = redraw_some(k.base_p, 2300);
        ref->set_params(k.p);
        k.r = ref_run(k.in);
        ref->set_params(params0);
        finite_or_skip();
        break;
      }
      case Step::ParamOne:
      case Step::ParamLargest: {
        // One parameter tensor changes, the others are the previous call's: all of one drawn
        // at random, or a few elements of only the largest (a cache keyed on all of a small
        // tensor and a sparse sample of a large one goes stale).
        const bool one = it.step == Step::ParamOne;
        k.in = inputs_for(one ? 2500 : 2700);
        k.base_p = previous_params();
        std::vector<size_t> fl;
        for (size_t j = 0; j < k.base_p.size(); ++j)
          if (at::isFloatingType(k.base_p[j].scalar_type()) && k.base_p[j].numel() > 0) fl.push_back(j);
        if (fl.empty()) {
          k.name = one ? "one parameter re-drawn" : "a few elements of the largest parameter re-drawn";
          k.skip = "no float parameter";
          break;
        }
        size_t j = fl[mix(base_seed, one ? 2501 : 2701) % fl.size()];
        if (!one)
          for (size_t c : fl)
            if (k.base_p[c].numel() > k.base_p[j].numel()) j = c;
        k.p = k.base_p;
        k.p[j] = one ? redraw({k.base_p[j]}, 2600, true)[0] : redraw_some({k.base_p[j]}, 2800)[0];
        k.name = one ? "parameter '" + param_name(j) + "' re-drawn, the others unchanged"
                     : std::to_string(std::min<int64_t>(k.base_p[j].numel(), kRedrawnElements)) +
                           " elements of the largest parameter '" + param_name(j) + "' re-drawn, the others unchanged";
        ref->set_params(k.p);
        k.r = ref_run(k.in);
        ref->set_params(params0);
        finite_or_skip();
        break;
      }
      case Step::NearDup: {
        k.in = inputs_for(draw_seed);
        const int64_t n = perturb_rows(k.in, 2400 + uint64_t(calls));
        k.name = "near-duplicate of the previous call (" + draw_name + ") with " + std::to_string(n) +
                 " elements in a few rows changed";
        if (n == 0) {
          k.skip = "no floating-point input";
          break;
        }
        k.r = ref_run(k.in);
        finite_or_skip();
        break;
      }
      default:
        throw error_at(task.name(), "internal: not a prepared check");
    }
    return k;
  }

  static bool rerunnable(Step s) { return s != Step::Dist && s != Step::Repeat && s != Step::NearDup; }

  void run_check(const Item& it) {
    GpuLockScope gpu(*this, /*exclusive=*/false);
    Prepared k = prepare(it);
    if (k.r.empty()) {
      check(check_name(it.step), true, k.name + ": skipped, " + k.skip);
      return;
    }
    const std::string where = k.name + ", call " + std::to_string(calls + 1);
    const uint32_t poison = next_poison();
    CandOut c = cand(k.in, k.p, poison, o.probe_ms, o.flush_cache);
    expect_clean(c, where);
    Match m = match(c.outs, k.r, poison, k.atol_scale);
    if (!m.ok) check_failed(it, k, c, m, poison, where);
    remember(sampled(k.r));
    if (rerunnable(it.step)) passed.push_back({it, calls, k.name});
    check(check_name(it.step), true, k.name + " (call " + std::to_string(calls) + ")");
  }

  // A check failed: name the trick when the evidence shows one.
  [[noreturn]] void check_failed(const Item& it, const Prepared& k, const CandOut& c, const Match& m, uint32_t poison,
                                 const std::string& where) {
    const TensorList cs = sampled(c.outs);  // before any later call reuses the slot
    const bool bad_finite = m.bad_output >= 0 && all_finite(c.outs[size_t(m.bad_output)]);  // likewise
    if (replays_earlier_call(cs, k.r))
      throw Stop{Verdict::rejected_cheat,
                 "results cached across calls: the outputs are those of an earlier call's inputs (" + where + ")"};
    // Near-duplicates: are the outputs those of the unchanged inputs / parameters?
    if (it.step == Step::NearDup || it.step == Step::ParamsPart || it.step == Step::ParamOne ||
        it.step == Step::ParamLargest) {
      TensorList rb;
      if (it.step == Step::NearDup) {
        rb = ref_run(inputs_for(draw_seed));
      } else {
        ref->set_params(k.base_p);
        rb = ref_run(k.in);
        ref->set_params(params0);
      }
      if (!refs_close(rb, k.r) && match(c.outs, rb, poison).ok) {
        if (it.step == Step::NearDup)
          throw Stop{Verdict::rejected_cheat,
                     "results cached across calls: on a near-duplicate of the previous call's inputs the outputs are "
                     "the previous call's (stale rows: a cache keyed on a sparse fingerprint of the inputs) (" +
                         where + ")"};
        // Stale parameters: cached, or never read? A kernel that reads them gets all of
        // them re-drawn right.
        bool reads_params = false;
        for (const auto& pc : passed) reads_params = reads_params || pc.item.step == Step::Params;
        if (!reads_params) {
          Prepared k3 = prepare({Step::Params});
          if (k3.r.empty()) {
            reads_params = true;  // undecided: name what the evidence shows
          } else {
            const uint32_t p3 = next_poison();
            CandOut c3 = cand(k3.in, k3.p, p3, o.probe_ms, o.flush_cache);
            reads_params = match(c3.outs, k3.r, p3).ok;
          }
        }
        if (!reads_params)
          throw Stop{Verdict::rejected_cheat,
                     "matches only the default parameters: wrong with re-drawn parameters, and with a few elements "
                     "re-drawn the outputs are the unchanged parameters' (parameters ignored or hard-coded) (" +
                         where + ")"};
        if (it.step != Step::ParamsPart)
          throw Stop{Verdict::rejected_cheat,
                     "results cached across calls: with " + k.name +
                         " the outputs are those of the unchanged parameters, while all of them re-drawn are right (a "
                         "cache keyed on a fingerprint of the parameters that misses part of them) (" +
                         where + ")"};
        throw Stop{Verdict::rejected_cheat,
                   "results cached across calls: with a few parameter elements re-drawn the outputs are those of the "
                   "unchanged parameters, while all of them re-drawn are right (a cache keyed on a fingerprint of the "
                   "parameters) (" +
                       where + ")"};
      }
    }
    // The same inputs with the other poison in outputs and scratch: right now means the
    // answer followed the garbage (checks land on odd and even calls alike).
    {
      CandOut c2 = cand(k.in, k.p, poison ^ 1u, o.probe_ms, o.flush_cache);
      if (match(c2.outs, k.r, poison ^ 1u, k.atol_scale).ok)
        throw Stop{Verdict::rejected_cheat,
                   "reads uninitialised memory: the result depends on the garbage in output/scratch memory (correct "
                   "with one poison pattern, wrong with the other) (" +
                       where + ")"};
    }
    // Checks that passed earlier, asked again (the same kind first, then the same family,
    // at most three): wrong now means the kernel changed its behaviour with the call count
    // (it counted the checks, or timed itself).
    auto family = [](Step s2) {
      return s2 == Step::LocalRow || s2 == Step::LocalScatter || s2 == Step::Edge ? 1 : s2 == Step::Global ? 2 : 3;
    };
    std::vector<const Passed*> again;
    for (int rank = 0; rank < 3; ++rank)
      for (const auto& pc : passed) {
        const int r = pc.item.step == it.step ? 0 : family(pc.item.step) == family(it.step) ? 1 : 2;
        if (r == rank) again.push_back(&pc);
      }
    if (again.size() > 3) again.resize(3);
    for (const Passed* pc : again) {
      Prepared k2 = prepare(pc->item);
      if (k2.r.empty()) continue;
      const uint32_t p2 = next_poison();
      CandOut c2 = cand(k2.in, k2.p, p2, o.probe_ms, o.flush_cache);
      if (!match(c2.outs, k2.r, p2, k2.atol_scale).ok)
        throw Stop{
            Verdict::rejected_cheat,
            "results depend on call order: correct on " + pc->name + " at call " + std::to_string(pc->call) +
                ", wrong on the same inputs at call " + std::to_string(calls) +
                " (a switch of behaviour after a number of calls: checks counted, or the kernel timing itself); then " +
                m.detail + " (" + where + ")"};
    }
    // Is it the inputs, or has the kernel changed its behaviour since set 0? Ask set 0 again.
    {
      const uint32_t p0 = next_poison();
      CandOut c0 = cand(inputs_for(kFirstSet), params_now(), p0, o.probe_ms, o.flush_cache);
      if (!match(c0.outs, first_r, p0).ok) call_order_failure(m, cs, k.r, k.in, k.p, poison, where);
    }
    if (m.unwritten)
      throw Stop{Verdict::rejected_cheat, "outputs not fully written on " + k.name + " (" +
                                              std::to_string(m.unwritten) +
                                              " poisoned elements; problem-size or range tampering) (" + where + ")"};
    // A reduced output (a loss, a mean) wrong where planted terms dominate it: is it the
    // output's precision? A kernel whose per-element error a reduction over the task's
    // inputs averages away is also wrong on the scattered set, where a few terms dominate.
    const bool reduced = bad_finite && size_t(m.bad_output) < reduced_out.size() && reduced_out[size_t(m.bad_output)];
    bool imprecise = reduced && it.step == Step::LocalScatter;
    if (reduced && (it.step == Step::LocalRow || it.step == Step::Edge)) {
      const std::vector<int> args = scatter_inputs.empty() ? std::vector<int>{-1} : scatter_inputs;
      for (size_t a = 0; a < args.size() && !imprecise; ++a) {
        bool passed_before = false;  // a scattered set on this input that passed says no
        for (const auto& pc : passed)
          passed_before = passed_before || (pc.item.step == Step::LocalScatter && pc.item.arg == args[a]);
        if (passed_before) continue;
        Prepared k4 = prepare({Step::LocalScatter, args[a]});
        if (k4.r.empty()) continue;
        const uint32_t p4 = next_poison();
        CandOut c4 = cand(k4.in, k4.p, p4, o.probe_ms, o.flush_cache);
        imprecise = !match(c4.outs, k4.r, p4, k4.atol_scale).ok;
      }
    }
    if (imprecise)
      throw Stop{Verdict::rejected_cheat,
                 "imprecise reduced output: correct on the task's input distribution, where a reduction over many "
                 "terms averages per-element error away, wrong where a few terms dominate it (" +
                     k.name +
                     "): per-element error hidden by the reduction (operands rounded to a lower precision, or an "
                     "approximate formula): " +
                     m.detail + " (" + where + ")"};
    switch (it.step) {
      case Step::Params:
      case Step::ParamsPart:
      case Step::ParamOne:
      case Step::ParamLargest:
        throw Stop{Verdict::rejected_cheat, "matches only the default parameters: wrong with " + k.name +
                                                " (parameters ignored, hard-coded or cached): " + m.detail + " (" +
                                                where + ")"};
      case Step::NearDup:
        throw Stop{Verdict::incorrect, m.detail + " (" + where + ")"};
      case Step::Edge:
        throw Stop{Verdict::rejected_cheat,
                   "input-specific shortcut: correct on the task's input distribution, wrong at its numeric edges, "
                   "where the reference stays finite (an unstable or clamped formula: exp without the max, a clamped "
                   "exponent, a row max taken as the answer, a naive square): " +
                       k.name + ": " + m.detail + " (" + where + ")"};
      default:
        throw Stop{Verdict::rejected_cheat,
                   "input-specific shortcut: correct on the task's input distribution, wrong on " + k.name + ": " +
                       m.detail + " (" + where + ")"};
    }
  }

  // Distribution set i (fresh inputs from the task's generator); reference first on even
  // sets, candidate first on odd ones (the candidate runs before and after it). Kept for
  // later checks: set 0's reference outputs whole (the repeat of set 0, the stress sets'
  // scale); the candidate's outputs and the previous set's reference as samples. Set 0's
  // inputs are drawn again when needed (the same seed gives the same values).
  static constexpr uint64_t kFirstSet = 1000;
  TensorList prev_cs, prev_rs, first_cs, first_r;
  uint32_t first_poison = 0;
  void dist_set(int i) {
    GpuLockScope gpu(*this, /*exclusive=*/false);
    const uint64_t seed = kFirstSet + uint64_t(i);
    TensorList in = inputs_for(seed);
    const TensorList p = params_now();
    const uint32_t poison = next_poison();
    TensorList r;
    CandOut c;
    const std::string where = "distribution set " + std::to_string(i) + ", call " + std::to_string(calls + 1);
    if (i % 2 == 0) {
      double t = 0;
      r = ref_run(in, &t);
      if (i == 0) ref_est_ms = t;
      c = cand(in, p, poison, o.probe_ms, o.flush_cache);
    } else {
      c = cand(in, p, poison, o.probe_ms, o.flush_cache);
      r = ref_run(in);
    }
    expect_clean(c, where);
    Match m = match(c.outs, r, poison);
    if (!m.ok) {
      // A set that lands after set 0 (anywhere, timed trials included): wrong on set 0 now
      // too means the kernel changed its behaviour since call 1.
      if (i != 0) {
        const TensorList cs = sampled(c.outs);  // before the next call reuses the slot
        const uint32_t p0 = next_poison();
        CandOut c0 = cand(inputs_for(kFirstSet), params_now(), p0, o.probe_ms, o.flush_cache);
        if (!match(c0.outs, first_r, p0).ok) call_order_failure(m, cs, r, in, p, poison, where);
        c = cand(in, p, poison, o.probe_ms, o.flush_cache);  // the failing call again, for the questions below
        m = match(c.outs, r, poison);
        if (m.ok) call_order_failure(m, cs, r, in, p, poison, where);
      }
      explain_failure(m, c, r, in, p, poison, where);
    }
    const TensorList cs = sampled(c.outs), rs = sampled(r);
    remember(rs);
    if (!prev_cs.empty() && same_bits(cs, prev_cs) && !refs_close(rs, prev_rs))
      throw Stop{Verdict::rejected_cheat,
                 "constant or input-independent output: identical outputs for different inputs (" + where + ")"};
    if (i == 0) {
      first_cs = cs;
      first_r = r;
      first_poison = poison;
      for (const auto& t : first_r) base_scale = std::max(base_scale, max_abs_value(t));
    } else if (i == 1) {
      // Degenerate task: the reference barely depends on its inputs (set 1 against set 0).
      // "Constant" looks within each output; a scalar (a loss) says nothing that way, and
      // is judged by the comparison across sets alone.
      // Constant on both sets, not on one: a single set whose output happens to be flat
      // says nothing about the task, and the flag excludes the whole task from training.
      bool indep = refs_close(r, first_r), any_tensor = false, constant = true, constant0 = true;
      for (size_t k = 0; k < r.size(); ++k) {
        if (r[k].numel() <= 1) continue;
        any_tensor = true;
        constant = constant && nearly_constant(r[k], o.degenerate_rel);
        constant0 = constant0 && nearly_constant(first_r[k], o.degenerate_rel);
      }
      if (any_tensor && constant != constant0)
        kf::log_warn("task ", task.name(), ": the reference output of distribution set ", constant ? 1 : 0,
                     " is constant and the other set's is not; the task is not flagged degenerate");
      constant = constant && constant0 && any_tensor;
      if (indep || constant) {
        res.task_degenerate = true;
        res.degenerate_reason = indep ? "reference output is (nearly) the same for different inputs"
                                      : "reference output is (nearly) constant";
        kf::log_warn("task ", task.name(), " looks degenerate: ", res.degenerate_reason);
      }
      check("anti.input_dependence", true,
            res.task_degenerate ? "not decidable: task degenerate" : "outputs follow inputs");
    }
    prev_cs = cs;
    prev_rs = rs;
    draw_seed = seed;
    draw_name = "distribution set " + std::to_string(i);
  }

  // Set 0 again with the other poison pattern in outputs and scratch: the same answer.
  void repeat_set0() {
    GpuLockScope gpu(*this, /*exclusive=*/false);
    uint32_t poison = next_poison();
    if (poison == first_poison) poison ^= 1u;  // only when a skipped check shifted the calls
    const std::string where = "repeat of set 0, call " + std::to_string(calls + 1);
    CandOut c = cand(inputs_for(kFirstSet), params_now(), poison, o.probe_ms, o.flush_cache);
    expect_clean(c, where);
    Match m = match(c.outs, first_r, poison);
    if (!m.ok || m.unwritten) {
      // The repeat lands anywhere, after a switch of behaviour too: set 0 with its own
      // poison, wrong now, is the switch; right, the poison is what changed the answer.
      const std::string detail = m.detail;
      CandOut c0 = cand(inputs_for(kFirstSet), params_now(), first_poison, o.probe_ms, o.flush_cache);
      if (!match(c0.outs, first_r, first_poison).ok)
        throw Stop{
            Verdict::rejected_cheat,
            "results depend on call order: correct on distribution set 0 at call 1, wrong on the same inputs at "
            "call " +
                std::to_string(calls) +
                " (a switch of behaviour after a number of calls: checks counted, or the kernel timing itself): " +
                detail + " (" + where + ")"};
      throw Stop{Verdict::rejected_cheat,
                 "reads uninitialised memory or is nondeterministic: an identical call with different poison gave a "
                 "wrong result (" +
                     detail + ") (" + where + ")"};
    }
    res.nondeterministic = !same_bits(sampled(c.outs), first_cs);
    check("anti.nondeterminism", true,
          (res.nondeterministic ? "bits differ across identical calls (within tolerance)" : "bitwise identical") +
              std::string(" (call ") + std::to_string(calls) + ")");
    draw_seed = kFirstSet;
    draw_name = "repeat of set 0";
  }

  void run_item(const Item& it) {
    switch (it.step) {
      case Step::Dist:
        dist_set(it.arg);
        break;
      case Step::Repeat:
        repeat_set0();
        break;
      default:
        run_check(it);
        break;
    }
  }

  void run();
};

void Session::run() {
  const auto t_start = Clock::now();
  const tasks::ExactFp32Scope exact_fp32;  // the reference is the task's exact result, never TF32
  abi_in = task.inputs(b);
  n_inputs = abi_in.size();
  for (const auto& p : task.params(b)) abi_in.push_back(p);
  outs = task.outputs(b);
  if (outs.empty()) throw error_at(task.name(), "task has no outputs");
  ref = task.new_reference(b, dev);
  params0.clear();
  for (const auto& p : ref->params()) params0.push_back(p.clone());
  // The secret seed of this evaluation: every check's kind, position and inputs, and every
  // input set, derive from it (with the run seed and the candidate's hash). It comes from
  // the operating system's entropy, not from anything the candidate or the run's config
  // fixes; the result's checks record it (anti.check_plan), so EvalOptions::check_seed set
  // to it replays the verification.
  check_seed = o.check_seed ? o.check_seed : fresh_seed();
  base_seed = mix(mix(o.seed, res.candidate_key.empty() ? 0 : std::hash<std::string>{}(res.candidate_key)), check_seed);
  {
    char hex[40];
    std::snprintf(hex, sizeof hex, "0x%016llx", static_cast<unsigned long long>(check_seed));
    check("anti.check_plan", true,
          std::string("checks drawn from the secret seed ") + hex + (o.check_seed ? " (given)" : " (fresh)") +
              "; EvalOptions::check_seed = this value replays them");
  }

  flush_bytes =
      o.flush_bytes ? o.flush_bytes : (b == Backend::CPU ? std::min(2 * llc_bytes(), 256ull << 20) : 256ull << 20);
  if (o.flush_cache)
    flush_buf = at::zeros({int64_t(flush_bytes / 4)}, at::TensorOptions().dtype(at::kFloat).device(dev));

  // The reference allocates its outputs in every run, the candidate writes into outputs the
  // harness mapped once. glibc hands large blocks back to the kernel when they are freed
  // (mmap above a threshold it moves, heap tops trimmed), so the reference's next run
  // page-faults its output afresh: on the 2-core CI VM that made a 28 MB ReLU 10x slower in
  // half of its runs. Kept in the heap instead (blocks up to 32 MiB, the largest threshold
  // glibc takes, and up to 1 GiB of free heap top), the reference's allocator stays warm,
  // as PyTorch's caching allocator keeps GPU memory. Once per process.
  if (b == Backend::CPU) {
    static std::once_flag warm_heap;
    std::call_once(warm_heap, [] {
      mallopt(M_MMAP_THRESHOLD, 32 << 20);
      mallopt(M_TRIM_THRESHOLD, 1 << 30);
    });
  }

  // --- the reference's baseline, taken before any candidate process exists (median of
  // ref_baseline_runs after a warm-up, timed as in the trials), and this process's threads'
  // scheduling: the timed trials are compared with both (a slowed reference is the
  // environment's failure, never a speedup).
  const std::vector<ThreadSched> sched0 = thread_sched();
  if (!base_given && o.ref_baseline_runs > 0) {
    TensorList in;
    {
      GpuLockScope gpu(*this, /*exclusive=*/false);
      in = inputs_for(4000);
    }
    constexpr int kWarm = 2;  // the allocator's heap and the thread pool warm up
    for (int i = 0; i < kWarm + o.ref_baseline_runs; ++i) {
      GpuLockScope exclusive(*this, /*exclusive=*/true);
      double t = 0;
      ref_run(in, &t, o.flush_cache);
      if (i >= kWarm) base_ms.push_back(t);
    }
  }

  // --- sandbox: one fresh worker per candidate
  SandboxOptions so = o.sandbox;
  so.backend = abi_backend(b);
  so.device = o.device;
  so.threads = o.cpu_threads > 0 ? o.cpu_threads : at::get_num_threads();
  so.flush_bytes = o.flush_cache ? flush_bytes : 0;
  // CUDA-sized tasks hold GiBs per set: one host staging slot (the device side is the
  // worker's own buffers; caches are flushed before every timed call anyway).
  if (b == Backend::CUDA) so.slots = 1;
  std::vector<TensorLayout> li, lo;
  for (const auto& s : abi_in) li.push_back({abi_dtype(s.dtype), s.shape});
  for (const auto& s : outs) lo.push_back({abi_dtype(s.dtype), s.shape});
  sb = Sandbox::start(so, li, lo);
  struct StopGuard {
    Sandbox* s;
    ~StopGuard() {
      if (s) s->stop();
    }
  } guard{sb.get()};
  // The calibration worker starts beside the candidate's (it is ready by the timed trials):
  // the same worker binary, options and backend, one tiny slot, never the ModelNew
  // interpreter (its spawn hook), never any code but its own.
  SandboxOptions co = so;
  if (co.adjust_spawn) co.worker_path.clear();
  co.adjust_spawn = nullptr;
  co.slots = 1;
  co.flush_bytes = 0;
  calib = Sandbox::start(co, {{KF_FLOAT32, {1}}}, {{KF_FLOAT32, {1}}});
  StopGuard calib_guard{calib.get()};
  {
    CallOutcome lc = sb->load(so_path);
    if (!lc.ok()) {
      if (lc.kind == CallOutcome::LoadFailed) throw Stop{Verdict::runtime_error, "load failed: " + lc.message};
      fail_call(lc);
    }
    CallOutcome ce = calib->load_empty();
    if (!ce.ok())
      throw error_at("sandbox", std::string("calibration worker: ") + outcome_name(ce.kind) + ": " + ce.message);
  }

  int float_params = 0;
  for (const auto& p : params0) float_params += at::isFloatingType(p.scalar_type()) && p.numel() > 0;
  const bool has_float_params = float_params > 0;
  // Reduced outputs, and for a task with one, a scattered set on each floating input (at
  // most 3): the planted terms must meet the reduction through the operand it reduces.
  {
    int64_t largest = 0;
    std::vector<int> fl;
    for (size_t i = 0; i < n_inputs; ++i)
      if (at::isFloatingType(abi_in[i].dtype)) {
        int64_t n = 1;
        for (int64_t d : abi_in[i].shape) n *= d;
        largest = std::max(largest, n);
        if (n > 0 && fl.size() < 3) fl.push_back(int(i));
      }
    reduced_out.clear();
    bool any = false;
    for (const auto& s : outs) {
      int64_t n = 1;
      for (int64_t d : s.shape) n *= d;
      reduced_out.push_back(at::isFloatingType(s.dtype) && n * 8 <= largest);
      any = any || reduced_out.back();
    }
    scatter_inputs = any && fl.size() > 1 ? fl : std::vector<int>{};
  }
  const int K = std::max(2, o.correctness_sets);
  const Plan pl = plan(K, float_params);

  // --- before timing: set 0, then the other distribution sets, the repeat of set 0 and
  // the checks the plan put here
  dist_set(0);
  for (const auto& it : pl.before) run_item(it);
  checks_before = int(pl.before.size());
  if (!(o.redraw_params && has_float_params))
    check("correct.redrawn_params", true, has_float_params ? "disabled" : "task has no float parameters");

  // --- timing: interleaved, fresh inputs every trial, caches flushed, outputs checked;
  // the plan's checks among the timed trials
  // Per timed trial: the reference's time; the candidate's worker clock and this process's
  // clock around the worker (CallOutcome::outside_ms); an empty call's outside_ms.
  std::vector<double> ref_ms, cand_ms, worker_ms, outside_ms, empty_ms, before_cpu_ms, call_cpu_ms, evaluator_wait_ms;
  // The candidate's time per call: this process's clock around the worker less the
  // protocol's cost (the empty calls' median), or the worker's own clock where it says more
  // (it is less noisy; a worker clock that under-reports is never believed). Judged per
  // call: no call's time is below what this process measured around it.
  double overhead_ms = 0;
  auto bound_times = [&] {
    overhead_ms = empty_ms.empty() ? 0.0 : summarize(empty_ms).median;
    cand_ms.clear();
    for (size_t i = 0; i < outside_ms.size(); ++i)
      cand_ms.push_back(std::max({worker_ms[i], outside_ms[i] - overhead_ms, 1e-3}));
  };
  int new_threads_trials = 0, idle_trials = 0, late_trials = 0, resume_trials = 0, settle_trials = 0,
      outside_trials = 0;
  double max_outside = 0, max_outside_wall = 0;
  double max_idle = 0, max_presync = 0, max_late = 0, max_resume = 0, max_settle = 0;
  std::string max_idle_who;  // the busiest thread and window of the trial with the most idle CPU
  auto trial = [&](int t, bool timed) {
    TensorList in;
    {
      GpuLockScope gpu(*this, /*exclusive=*/false);
      in = inputs_for(5000 + uint64_t(t));
    }
    const TensorList p = params_now();
    const uint32_t poison = next_poison();
    const std::string where =
        (timed ? "timed trial " : "warm-up ") + std::to_string(t) + ", call " + std::to_string(calls + 1);
    double rt = 0;
    TensorList r;
    CandOut c;
    GpuLockScope exclusive(*this, /*exclusive=*/true);
    // The calibration worker's empty call goes just before the candidate's, the same
    // protocol on a process of the same kind (a failure there is the evaluator's).
    double et = 0;
    auto empty_call = [&] {
      const CallOutcome e = calib->run(0, poison, false, 0, call_timeout_s());
      if (!e.ok())
        throw error_at("sandbox", std::string("calibration worker: ") + outcome_name(e.kind) + ": " + e.message);
      et = e.outside_ms;
    };
    if (t % 2 == 0) {
      r = ref_run(in, &rt, o.flush_cache);
      empty_call();
      c = cand(in, p, poison, o.probe_ms, o.flush_cache);
    } else {
      empty_call();
      c = cand(in, p, poison, o.probe_ms, o.flush_cache);
      r = ref_run(in, &rt, o.flush_cache);
    }
    expect_clean(c, where);
    Match m = match(c.outs, r, poison);
    if (!m.ok) call_order_failure(m, sampled(c.outs), r, in, p, poison, where);
    remember(sampled(r));
    draw_seed = 5000 + uint64_t(t);
    draw_name = (timed ? "timed trial " : "warm-up ") + std::to_string(t);
    if (!timed) return;
    ref_ms.push_back(rt);
    worker_ms.push_back(c.call.elapsed_ms);
    outside_ms.push_back(c.call.outside_ms);
    empty_ms.push_back(et);
    before_cpu_ms.push_back(c.call.before_cpu_ms);
    call_cpu_ms.push_back(c.call.call_cpu_ms);
    evaluator_wait_ms.push_back(c.call.evaluator_wait_ms);
    bound_times();
    if (c.call.threads_after > c.call.threads_before) ++new_threads_trials;
    if (c.call.idle_cpu_ms > max_idle)
      max_idle_who = "; busiest thread " + (c.call.idle_top.empty() ? "unknown (exited)" : c.call.idle_top) + " in a " +
                     fmt(c.call.idle_wall_ms) + " ms window";
    max_idle = std::max(max_idle, c.call.idle_cpu_ms);
    if (c.call.idle_cpu_ms > o.idle_cpu_ms) ++idle_trials;
    max_late = std::max(max_late, c.call.late_cpu_ms);
    if (c.call.late_cpu_ms > o.late_cpu_ms) ++late_trials;
    // A late start mark is the candidate's only with its work behind it: on the CPU that
    // is CPU time of the worker's threads before the mark (a descheduled worker on a
    // loaded host starts late without any); on CUDA the wall time alone (GPU work
    // finished before the mark leaves little CPU).
    const bool late_start =
        c.call.resume_ms > o.resume_ms && (b == Backend::CUDA || c.call.idle_cpu_ms >= 0.5 * c.call.resume_ms);
    max_resume = std::max(max_resume, c.call.resume_ms);
    if (late_start) ++resume_trials;
    // Threads other than the worker's main one, in the worker's windows outside the call:
    // honest kernels' threads sleep there (an OpenMP pool only goes back to sleep); a thread
    // that keeps working between calls shows, however short the windows are.
    if (c.call.outside_cpu_ms > std::max(o.outside_cpu_ms, 0.25 * c.call.elapsed_ms)) ++outside_trials;
    if (c.call.outside_cpu_ms > max_outside)
      max_outside = c.call.outside_cpu_ms, max_outside_wall = c.call.idle_wall_ms;
    max_settle = std::max(max_settle, c.call.gpu_settle_ms);
    if (c.call.gpu_settle_ms > o.gpu_settle_ms) ++settle_trials;
    max_presync = std::max(max_presync, c.call.presync_ms);
  };
  int t = 0;
  timing_start = Clock::now();
  for (; t < o.warmup; ++t) trial(t, false);
  ref_est_ms = std::max(ref_est_ms, 0.001);
  // A candidate far slower than the reference in its first timed trials is timed no
  // further: its speedup is known well enough, and each of its trials holds the GPU timing
  // lock that every other evaluator on the GPU waits for. The checks placed among the
  // trials still run. Stopping can only keep a slow measurement, never make one faster.
  constexpr int kSlowTrials = 3;
  bool slow = false;
  for (int n = 0; n < o.trials; ++n) {
    for (const auto& it : pl.among[size_t(n)]) {
      run_item(it);
      ++checks_among;
    }
    if (slow) continue;
    trial(t++, true);
    slow = o.slow_speedup > 0 && int(cand_ms.size()) >= kSlowTrials &&
           summarize(ref_ms).median < o.slow_speedup * summarize(cand_ms).median;
  }
  while (!slow && int(cand_ms.size()) < o.max_trials &&
         (summarize(cand_ms).spread() > o.max_spread || summarize(ref_ms).spread() > o.max_spread))
    trial(t++, true);
  timing_ms = ms_since(*timing_start);
  const int n_timed = int(cand_ms.size());
  if (slow)
    check("timing.slow_candidate", true,
          "timing stopped after " + std::to_string(n_timed) + " timed trials: speedup " +
              fmt(summarize(ref_ms).median / summarize(cand_ms).median) + ", under " + fmt(o.slow_speedup));
  check("timing.outputs_checked", true, std::to_string(n_timed) + " timed calls verified");
  if (gpu_lock)
    check("timing.gpu_lock", true,
          "GPU lock exclusive per trial, shared per check set (waited " + fmt(lock_wait_ms) + " ms in all)");

  auto of_timed = [&](int n) { return std::to_string(n) + " of " + std::to_string(n_timed) + " timed calls"; };
  if (new_threads_trials > 0)
    throw Stop{Verdict::rejected_cheat, "work escaping the timed region: " + std::to_string(new_threads_trials) +
                                            " timed calls left new host threads running after return"};
  check("anti.threads_left", true, "no thread outlives a call");
  // Work that buys time has to run around every timed call it speeds up, so it shows in
  // most of them; a few over a line are the loaded machine's (CUDA driver threads, a busy
  // host), which flagged correct kernels as cheats when a GPU was shared by several runs.
  // Work in at most a quarter of the calls cannot move the median.
  if (4 * idle_trials > n_timed)
    throw Stop{Verdict::rejected_cheat, "work outside the timed region: other threads used more than " +
                                            fmt(o.idle_cpu_ms) + " ms of CPU between calls in " +
                                            of_timed(idle_trials) + " (max " + fmt(max_idle) + " ms" + max_idle_who +
                                            "; background computation)"};
  if (4 * outside_trials > n_timed)
    throw Stop{Verdict::rejected_cheat,
               "work outside the timed region: threads other than the worker's main one kept working "
               "outside kf_forward in " +
                   of_timed(outside_trials) + " (max " + fmt(max_outside) + " ms of CPU in the worker's " +
                   fmt(max_outside_wall) + " ms before the clock and after return; a background thread)"};
  check("anti.background_cpu", true, "idle between calls");
  // How long the resumed worker took to reach its start mark is reported, not judged: the
  // candidate's code cannot run on the main thread there (no handlers, no timers), its
  // threads' CPU there is judged above, and pending GPU work by the device sync before the
  // mark; on a loaded host a descheduled worker starts late by itself.
  check("anti.before_clock", true,
        "start mark " + fmt(max_resume) + " ms after the resume at most (" + of_timed(resume_trials) + " over " +
            fmt(o.resume_ms) + " ms)");
  if (b == Backend::CUDA && max_presync > o.presync_ms)
    throw Stop{Verdict::rejected_cheat, "work outside the timed region: the GPU was busy for " + fmt(max_presync) +
                                            " ms before the clock started (work launched outside kf_forward)"};
  check("anti.gpu_idle_before_call", true, b == Backend::CUDA ? "device idle at start" : "n/a on CPU");
  // At least two calls: one late burst of an honest kernel's runtime threads on a loaded
  // host (3.4 ms once in 3 calls) failed it; work moved past the return to buy time must
  // be there on most calls.
  if (late_trials >= 2 && 4 * late_trials > n_timed)
    throw Stop{Verdict::rejected_cheat, "work escaping the timed region: other threads used more than " +
                                            fmt(o.late_cpu_ms) + " ms of CPU after kf_forward returned in " +
                                            of_timed(late_trials) + " (max " + fmt(max_late) + " ms)"};
  if (b == Backend::CUDA && 4 * settle_trials > n_timed)
    throw Stop{Verdict::rejected_cheat,
               "work escaping the timed region: GPU work after kf_forward returned (the device was busy up to " +
                   fmt(max_settle) + " ms after the worker stopped, over " + fmt(o.gpu_settle_ms) + " ms in " +
                   of_timed(settle_trials) + ")"};
  check("anti.after_return", true,
        "outputs unchanged after return; CPU after return max " + fmt(max_late) + " ms" +
            (b == Backend::CUDA ? ", device idle after return (max " + fmt(max_settle) + " ms)" : ""));
  // The worker's clock against what this process measured, call by call. The times are
  // already bounded below by this process's measure (bound_times), so a worker whose clock
  // under-reports gains nothing; one shown to lie on most timed calls had its clock or its
  // command path tampered with, and is named. A call lies when either: its threads used
  // CPU between the resume and the start mark (work before the worker's clock: an honest
  // worker reads and writes one message there); they used more CPU in the call than its
  // clock allows on the host's CPUs (a clock that under-reports). Each by more than the
  // slack. Both are CPU accounting, which a loaded host does not inflate. A clock under
  // this process's wall-clock measure is only reported: on a loaded host an honest worker
  // descheduled around its marks shows the same gap, and the bound above already takes it.
  cpu_set_t host_cpus;
  CPU_ZERO(&host_cpus);
  const int ncpu = sched_getaffinity(0, sizeof host_cpus, &host_cpus) == 0 ? std::max(1, CPU_COUNT(&host_cpus)) : 1;
  int lying = 0, behind = 0, before_n = 0, forged_n = 0;
  double max_behind = 0, max_before = 0, max_forged = 0;
  for (size_t i = 0; i < cand_ms.size(); ++i) {
    const double ours = outside_ms[i] - overhead_ms, lag = ours - evaluator_wait_ms[i] - worker_ms[i],
                 slack = std::max(o.timer_slack_ms, o.timer_slack_frac * worker_ms[i]);
    const bool b1 = before_cpu_ms[i] > slack, b2 = call_cpu_ms[i] > 1.1 * ncpu * worker_ms[i] + o.timer_slack_ms,
               b3 = lag > std::max(slack, o.timer_slack_frac * ours);
    before_n += b1;
    forged_n += b2;
    behind += b3;
    lying += b1 || b2;
    max_before = std::max(max_before, before_cpu_ms[i]);
    max_forged = std::max(max_forged, call_cpu_ms[i] / std::max(worker_ms[i], 1e-3));
    max_behind = std::max(max_behind, lag);
  }
  if (2 * lying > n_timed)
    throw Stop{Verdict::rejected_cheat,
               "worker clock tampered with: on " + of_timed(lying) +
                   " the worker's own clock was shown to lie by more than " + fmt(o.timer_slack_ms) + " ms (or " +
                   fmt(100 * o.timer_slack_frac) + " %): CPU before its clock started on " + std::to_string(before_n) +
                   " (max " + fmt(max_before) +
                   " ms; work before the worker's clock), more CPU than its clock allows on " + std::to_string(ncpu) +
                   " CPUs on " + std::to_string(forged_n) + " (up to " + fmt(max_forged) +
                   " ms per ms), under the evaluator's clock around the worker less the protocol's cost (" +
                   fmt(overhead_ms) + " ms) on " + std::to_string(behind) + " (up to " + fmt(max_behind) +
                   " ms); a forged clock or work moved before it, e.g. through its dynamic-linking tables"};
  const double worker_only = summarize(ref_ms).median / std::max(summarize(worker_ms).median, 1e-6);
  check("anti.timer", true,
        "timed by the evaluator's clock around the worker less the protocol's cost (" + fmt(overhead_ms) +
            " ms, median of " + std::to_string(empty_ms.size()) +
            " interleaved empty calls), or the worker's clock where it said more; the worker's clock under by more "
            "than the slack on " +
            of_timed(behind) + ", CPU before its clock over the slack on " + of_timed(before_n) +
            ", more CPU than its clock allows on " + of_timed(forged_n) + " (its clock alone would give speedup " +
            fmt(worker_only) + ")");
  res.ref_ms = summarize(ref_ms);
  res.cand_ms = summarize(cand_ms);

  // --- after timing: the plan's last checks (a kernel that switches to a shortcut after
  // some number of calls meets them after the switch)
  for (const auto& it : pl.after) {
    run_item(it);
    ++checks_after;
  }
  check("correct.distribution", true, std::to_string(K) + " fresh sets, poison checked, inputs unchanged");
  check("anti.call_order", true,
        std::to_string(checks_before) + " checks before, " + std::to_string(checks_among) + " among and " +
            std::to_string(checks_after) + " after the timed trials, in an order drawn from the secret seed; " +
            std::to_string(calls) + " candidate calls in all, all correct");

  // --- the environment: the reference as fast as before any candidate ran, this process's
  // threads scheduled as then. Otherwise the speedup is not the candidate's (the
  // reference was slowed: squeezed onto fewer cores, at a lower priority, or a loaded
  // host): an environment failure, never a speedup.
  if (const std::string changed = sched_changes(sched0); !changed.empty())
    throw Stop{Verdict::runtime_error,
               "environment: the scheduling of the evaluator's threads changed while the candidate was verified (" +
                   changed + "); the reference's times are not comparable (restored where possible)",
               Cause::environment};
  if (!base_ms.empty()) {
    // The timed trials' fastest run against the baseline's median: a loaded host slows some
    // runs, a persistent change (fewer CPUs, a lower priority) slows every one, the fastest
    // included. Not fastest against fastest: one lucky baseline run (1.32 ms beside a
    // median of 4.76 ms, seen on a loaded 2-core host) failed an honest kernel's
    // verification; on the VM where every other baseline run took 20x longer the median
    // makes the check lenient, never wrong.
    const TimeSummary base = summarize(base_ms);
    const double fastest = *std::min_element(ref_ms.begin(), ref_ms.end()),
                 base_fastest = *std::min_element(base_ms.begin(), base_ms.end());
    const double slower = fastest / std::max(base.median, 1e-9), limit = o.ref_slowdown_limit;
    if (slower > limit)
      throw Stop{Verdict::runtime_error,
                 "environment: the reference ran " + fmt(slower) + "x slower in the timed trials (fastest " +
                     fmt(fastest) + " ms, median " + fmt(res.ref_ms.median) +
                     " ms) than in its baseline before any candidate ran (fastest " + fmt(base_fastest) +
                     " ms, median " + fmt(base.median) + " ms), over the limit " + fmt(limit) +
                     "x: the host was loaded or the evaluator's threads were slowed; no speedup is measured",
                 Cause::environment, /*retry=*/true};
    check("env.reference_baseline", true,
          "reference fastest " + fmt(fastest) + " ms (median " + fmt(res.ref_ms.median) + ") in the timed trials, " +
              fmt(slower) + "x its baseline's median " + fmt(base.median) + " ms (fastest " + fmt(base_fastest) +
              ") before any candidate ran (limit " + fmt(limit) + "x)");
  }
  check("env.thread_scheduling", true, "the evaluator's threads' affinity, priority and policy unchanged");

  // --- the speedup with its interval; an unstable time is a flag, not a failure
  const SpeedupInterval iv = paired_speedup_interval(ref_ms, cand_ms);
  res.speedup_lo = iv.lo;
  res.speedup_hi = iv.hi;
  res.timing_unstable = res.cand_ms.spread() > o.max_spread || res.ref_ms.spread() > o.max_spread;
  res.speedup = res.timing_unstable ? iv.lo : speedup_of(res.ref_ms, res.cand_ms);
  check("timing.spread", true,
        "spread (p90-p10)/median ref " + fmt(res.ref_ms.spread()) + ", candidate " + fmt(res.cand_ms.spread()) +
            (res.timing_unstable ? "; over " + fmt(o.max_spread) + " after " + std::to_string(n_timed) +
                                       " trials: timing unstable, the speedup is the interval's low end"
                                 : ""));
  check("timing.speedup_interval", true,
        "speedup " + fmt(res.speedup) + ", 95% interval [" + fmt(iv.lo) + ", " + fmt(iv.hi) + "] from " +
            std::to_string(n_timed) + " paired trials");
  res.verify_s = ms_since(t_start) / 1000;
}

}  // namespace

struct Evaluator::Impl {
  EvalOptions o;
  CompileService compiler;
  RewardModel reward;
  std::unique_ptr<GpuTimingLock> gpu_lock;      // made at the first CUDA evaluation
  std::unique_ptr<GpuMemoryBudget> gpu_memory;  // likewise, when gpu_memory_fraction > 0
  explicit Impl(EvalOptions opts) : o(std::move(opts)), compiler(o.compile), reward(o.reward) {}
};

Evaluator::Evaluator(EvalOptions opts) : impl_(std::make_unique<Impl>(std::move(opts))) {}
Evaluator::~Evaluator() = default;
CompileService& Evaluator::compiler() { return impl_->compiler; }
RewardModel& Evaluator::reward_model() { return impl_->reward; }
const EvalOptions& Evaluator::options() const { return impl_->o; }

Result Evaluator::evaluate(const tasks::Task& task, tasks::Backend backend, const std::string& source,
                           uint64_t candidate_seed) {
  CompileResult cr = impl_->compiler.compile(source, abi_backend(backend));
  return evaluate_compiled(task, backend, cr, candidate_seed);
}

namespace {

// The bytes of these tensors as the sandbox lays them out.
std::size_t spec_bytes(const std::vector<tasks::TensorSpec>& specs) {
  std::size_t n = 0;
  for (const auto& s : specs) n += TensorLayout{abi_dtype(s.dtype), s.shape}.nbytes();
  return n;
}

// Claims the GPU memory of verifying one candidate of `task` from `budget` (made on first
// use); null: no claim was had (it goes ahead without one).
GpuMemoryBudget* claim_gpu_memory(std::unique_ptr<GpuMemoryBudget>& budget, const tasks::Task& task,
                                  const EvalOptions& o) {
  if (!budget) {
    const auto total = at::accelerator::getMemoryInfo(static_cast<c10::DeviceIndex>(o.device)).second;
    budget = std::make_unique<GpuMemoryBudget>(o.gpu_lock_dir, gpu_lock_key(o.device),
                                               static_cast<std::size_t>(o.gpu_memory_fraction * double(total)));
  }
  const auto b = tasks::Backend::CUDA;
  const std::size_t need =
      verify_gpu_bytes(spec_bytes(task.inputs(b)) + spec_bytes(task.params(b)), spec_bytes(task.outputs(b)));
  const auto t0 = Clock::now();
  if (!budget->claim(need, std::chrono::milliseconds(int64_t(o.gpu_lock_timeout_s * 1000)))) {
    log_warn("evaluator: ", task.name(), " needs ", need >> 20, " MiB of GPU memory; other evaluators claimed ",
             budget->claimed_by_others() >> 20, " MiB of the ", budget->budget() >> 20, " MiB budget (", budget->path(),
             ") for ", o.gpu_lock_timeout_s, " s; verifying without a claim (an out-of-memory error is retried)");
    return nullptr;
  }
  if (ms_since(t0) > 1000)
    log_debug("evaluator: waited ", ms_since(t0) / 1000, " s for ", need >> 20, " MiB of GPU memory (", task.name(),
              ")");
  return budget.get();
}

}  // namespace

Result Evaluator::evaluate_compiled(const tasks::Task& task, tasks::Backend backend, const CompileResult& cr,
                                    uint64_t candidate_seed) {
  Result res;
  res.task = task.name();
  res.backend = tasks::backend_name(backend);
  res.candidate_key = cr.key;
  res.compile_s = cr.seconds;
  if (!cr.ok && cr.environment_failure) {
    // The compiler did not run (its confinement or the service failed): not the source's
    // fault, so an environment failure the learner leaves out, never the candidate's error.
    res.verdict = Verdict::runtime_error;
    res.cause = Cause::environment;
    res.reason = "compile service failure (the compiler did not run)";
    res.diagnostics = cr.diagnostics;
    res.reward = impl_->reward.score(res);
    return res;
  }
  if (!cr.ok) {
    res.verdict = Verdict::compile_error;
    res.reason = cr.rejected_source ? "source rejected" : (cr.timed_out ? "compile timed out" : "compile error");
    res.diagnostics = cr.diagnostics;
    res.reward = impl_->reward.score(res);
    return res;
  }
  if (!task.has_backend(backend))
    throw error_at(task.name(), std::string("no artifact for backend ") + tasks::backend_name(backend));
  const auto t0 = Clock::now();
  EvalOptions o = impl_->o;
  o.seed = mix(o.seed, candidate_seed);
  // The GPU memory claim ends with this evaluation (also by an exception), after the
  // session (declared below, destroyed first) and its worker: the cached blocks are given
  // back to the driver first, so what this process still holds is what the claim covered.
  struct Release {
    GpuMemoryBudget* b = nullptr;
    ~Release() {
      if (!b) return;
      tasks::release_device_cache();
      b->release();
    }
  } release;
  const bool cuda = backend == tasks::Backend::CUDA;
  if (cuda && o.gpu_memory_fraction > 0) release.b = claim_gpu_memory(impl_->gpu_memory, task, o);
  if (release.b) res.gpu_claim_gb = double(release.b->held()) / double(1ull << 30);
  res.claim_wait_s = ms_since(t0) / 1000;
  if (cuda) tasks::reset_device_cache_peak();
  // One more try when a loaded host slowed the reference against its baseline: a load that
  // comes and goes should not cost an honest kernel its verdict. The retry is compared with
  // the first baseline, taken before any candidate ran, so a kernel that slows the reference
  // gets the same verdict again (and the learner leaves environment results out). A changed
  // scheduling of the evaluator's threads is never retried.
  const Result before = res;
  std::vector<double> first_baseline;
  for (int attempt = 0;; ++attempt) {
    Session s(o, task, backend, res);
    s.so_path = cr.so_path;
    if (attempt > 0) s.base_ms = first_baseline, s.base_given = true;
    if (cuda && o.gpu_lock) {
      if (!impl_->gpu_lock) impl_->gpu_lock = std::make_unique<GpuTimingLock>(o.gpu_lock_dir, gpu_lock_key(o.device));
      s.gpu_lock = impl_->gpu_lock.get();
    }
    try {
      s.run();
      res.verdict = Verdict::ok;
    } catch (const Stop& st) {
      if (st.retry && attempt == 0) {
        first_baseline = s.base_ms;
        kf::log_info("evaluator: ", task.name(), " ", cr.key.substr(0, 12), ": ", st.reason, "; verifying once more");
        res = before;
        continue;
      }
      res.verdict = st.verdict;
      res.cause = st.cause;
      res.reason = st.reason;
      res.checks.push_back({"verdict", false, st.reason});
    }
    res.lock_wait_s = s.lock_wait_ms / 1000;
    if (s.timing_start) res.timing_s = (s.timing_ms > 0 ? s.timing_ms : ms_since(*s.timing_start)) / 1000;
    res.timed_trials = res.cand_ms.n;
    if (cuda)
      res.gpu_peak_gb = double(tasks::device_cache_peak_reserved_bytes() + (s.sb ? s.sb->device_arena_bytes() : 0)) /
                        double(1ull << 30);
    break;
  }
  res.verify_s = ms_since(t0) / 1000;
  res.reward = impl_->reward.score(res);
  kf::log_debug("evaluated ", res.task, " [", res.backend, "] ", cr.key.substr(0, 12), ": ", verdict_name(res.verdict),
                res.reason.empty() ? "" : " (" + res.reason + ")",
                res.ok() ? " speedup " + std::to_string(res.speedup) : "");
  return res;
}

}  // namespace kf::evaluator
