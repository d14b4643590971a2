// Sandbox: the evaluator's handle on one sandbox worker process (kf-sandbox-worker),
// which loads one untrusted candidate and runs it on tensors in shared memory.
//
// The worker confines itself before loading the candidate (seccomp, rlimits, privilege
// drop, private scratch folder: see wire/confine.h); this side adds what a confined
// process cannot be trusted to do for itself: a wall-clock limit per command, a memory
// watchdog (RSS), a kill of the whole process group, and an exit classification that
// names the cause (signal, forbidden system call, CUDA fault, limit, outside kill).
//
// The worker is stopped (SIGSTOP, every thread) whenever it is not inside a call
// (wire/protocol.h): none of the candidate's code runs while this side stages inputs, runs
// the reference or reads the evidence. Outputs at return are copied into this side's own
// memory while the worker is stopped; CPU time and thread counts come from the kernel's
// accounting of the worker, read here.
// Any failure leaves the Sandbox dead (alive() false); start a new one to go on.
//
// Threading: one thread uses a Sandbox at a time. Different Sandboxes are independent.
#pragma once
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kf/evaluator/evaluator.h"  // defines: SandboxOptions, gpu_lock_key
#include "kf/kernel.h"

namespace kf::evaluator {

struct TensorLayout {
  int dtype = KF_FLOAT32;  // kf::DType
  std::vector<int64_t> shape;
  uint64_t nbytes() const;
};

struct CallOutcome {
  // Environment: the worker was killed from outside, or its harness failed for a reason
  // that is not the candidate's (scored as an environment failure, no reward).
  enum Kind { Ok, KernelError, Crashed, Timeout, Forbidden, MemoryLimit, CudaError, LoadFailed, Protocol, Environment };
  Kind kind = Ok;
  std::string message;  // the cause in words (signal, call, CUDA error, ...)
  int rc = 0;
  double elapsed_ms = 0;   // the worker's clock: sync, call, sync (the candidate can forge it)
  double external_ms = 0;  // this process's clock between the worker's start and end marks
  // This process's clock over every window in which the worker ran up to the outputs at
  // return: from the resume before its start mark until it was seen stopped at freeze 0,
  // and from the resume that starts the call until it was seen stopped at freeze 1 (CUDA:
  // plus the settle probe that waits for the device), less the time the worker's main
  // thread waited on a run queue in them (kernel accounting: a loaded host's delay, not the
  // candidate's work). Work the candidate does anywhere in the worker before the outputs are
  // taken (inside the worker's read of the command, before its clock, after its end mark)
  // is inside it; the fixed cost of the protocol is calibrated against an empty call
  // (load_empty) and subtracted by the verifier.
  double outside_ms = 0;
  // CPU time of all the worker's threads from the resume to the start mark (the worker's
  // own part is a read and a write): work done before the worker's clock shows here.
  double before_cpu_ms = 0;
  // How long this process's calling thread waited on a run queue in those windows: a late
  // look at the worker's end on a loaded host, which lengthens outside_ms.
  double evaluator_wait_ms = 0;
  double presync_ms = 0;
  // CPU time of ALL the worker's threads (its main thread included), from the kernel's
  // accounting read by this process: before the start mark (from the resume), after the
  // end mark (until the worker stopped), and between the marks.
  double idle_cpu_ms = 0, late_cpu_ms = 0, call_cpu_ms = 0;
  // This process's clock from resuming the stopped worker to its start mark: candidate code
  // that ran before the clock (signal handlers, threads racing the main one).
  double resume_ms = 0;
  // CUDA: how long the device took to go idle after the worker had stopped at return (GPU
  // work the call left behind); 0 on the CPU.
  double gpu_settle_ms = 0;
  int threads_before = 0, threads_after = 0, threads_late = 0;
  // Threads other than the worker's main one (the candidate's, the runtime's) in the two
  // windows the worker runs outside kf_forward (resume to freeze 0, and after freeze 1),
  // and the wall time of those windows: honest kernels' threads sleep there.
  double outside_cpu_ms = 0, idle_wall_ms = 0;
  std::string idle_top;  // unused; kept for callers that print it
  bool ok() const { return kind == Ok; }
};
const char* outcome_name(CallOutcome::Kind k);

class Sandbox {
 public:
  // Spawns the worker for tensors of these layouts (inputs in ABI order, then outputs).
  // Throws kf::Error if the trusted side cannot be set up (missing worker binary, ...).
  static std::unique_ptr<Sandbox> start(const SandboxOptions& opts, const std::vector<TensorLayout>& inputs,
                                        const std::vector<TensorLayout>& outputs);
  ~Sandbox();
  Sandbox(const Sandbox&) = delete;
  Sandbox& operator=(const Sandbox&) = delete;

  // Loads the candidate. Throws kf::Error (an installation problem, not the candidate's)
  // when the worker's user could not read so_path (a 0700 folder on the way).
  CallOutcome load(const std::string& so_path);
  // Loads the worker's own empty kernel (returns 0, touches nothing): a worker that runs no
  // untrusted code, whose calls measure the protocol's fixed cost (outside_ms).
  CallOutcome load_empty();
  // One call of kf_forward on slot `slot`: outputs poisoned with `poison` (0 or 1) and
  // caches flushed if asked (here, with the worker stopped); after return the worker is
  // frozen, the outputs copied, then it is let finish its own clean-up and frozen again.
  // `probe_ms` is unused: nothing of the worker runs after its clean-up.
  CallOutcome run(int slot, uint32_t poison, bool flush_cache, double probe_ms, double timeout_s);

  // Buffers of slot s, tensor t: device pointers when device_resident(), else host
  // memory. output_at_return is this side's private copy taken at freeze 1; output_late is
  // the live (shared) buffer after the worker's clean-up: a difference is work that went
  // on after kf_forward returned.
  void* input(int s, int t);
  const void* output_at_return(int s, int t) const;
  const void* output_late(int s, int t) const;
  bool device_resident() const;
  uint64_t device_arena_bytes() const;  // 0 without a device arena; else with the at-return copies
  int slots() const;

  bool alive() const;
  pid_t pid() const;
  std::string log_tail() const;  // the worker's stderr/stdout (bounded)
  const std::string& scratch_dir() const;
  void stop();  // kills the process group, removes the scratch folder

 private:
  Sandbox();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kf::evaluator
