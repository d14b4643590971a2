// Confinement of the sandbox worker, applied once, after the trusted set-up (CUDA
// context, buffers) and before the candidate's shared object is loaded.
//
// Layers, each of which alone stops a class of attack:
//   rlimits     CPU seconds, file size 0, no core dumps, open files, address space (CPU
//               backend only: CUDA reserves terabytes of virtual memory)
//   identity    when started as root: drop to nobody (no capabilities, cannot signal or
//               ptrace the evaluator, cannot write root-owned files)
//   seccomp     deny exec, new processes (clone without CLONE_THREAD), every socket,
//               every file write/creation/removal (open with write flags included),
//               ptrace and cross-process memory, io_uring (it bypasses seccomp), signals
//               to other processes, kernel/namespace/admin calls, SysV IPC; and, so that
//               none of the candidate's code runs outside kf_forward, signal handlers,
//               timers, SIGCONT/SIGKILL to itself and lowered rlimits; no change to the
//               scheduling (affinity, priority, policy, I/O priority) of any thread but
//               the caller's own, so the evaluator's threads stay as they were.
//   life        the parent-death signal is armed again after the identity change (which
//               clears it): the worker dies with its evaluator, whatever its uid.
// A denied call raises SIGSYS; the handler records the call number in shared memory and
// exits with kExitForbidden, so the evaluator names the call in its report.
#pragma once
#include <string>

namespace kf::evaluator::worker {

constexpr int kExitForbidden = 86;

struct ConfineOptions {
  bool cpu_backend = true;
  long cpu_seconds = 120;
  unsigned long long address_space_bytes = 0;  // 0: no RLIMIT_AS
  bool drop_root = true;
  // Root gives way to a user of this process's own (kOwnUidBase + pid) rather than nobody:
  // under a private /proc (hidepid=invisible) it then sees no other process, other
  // workers included.
  bool own_uid = false;
};
constexpr unsigned kOwnUidBase = 0x40000000u;

// volatile int32 where the SIGSYS handler writes the denied syscall number.
void install_sigsys_handler(volatile int* forbidden_syscall_slot);

// Returns an empty string on success, else what failed (the worker then refuses to run).
std::string confine(const ConfineOptions& opts);

}  // namespace kf::evaluator::worker
