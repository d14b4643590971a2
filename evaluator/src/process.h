// Child processes for the evaluator: the compiler and the sandbox worker.
// fork+exec with only async-signal-safe calls in the child (the evaluator has threads:
// torch's and TBB's), its own process group (so a kill reaches every descendant),
// rlimits, exact fd placement and a clean environment.
// Threading: any thread may call these; each call owns the child it spawns.
#pragma once
#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

namespace kf::evaluator {

struct SpawnSpec {
  std::vector<std::string> argv;              // argv[0] is the executable path
  std::vector<std::string> env;               // "K=V"; the child gets exactly these
  std::vector<std::pair<int, int>> fds;       // (fd in parent, fd number in child); others close
  std::vector<std::pair<int, unsigned long long>> rlimits;  // (RLIMIT_*, soft=hard value)
  std::string cwd;                            // empty: inherit
};

// Starts the child in a new process group (pgid == pid). Throws kf::Error if fork fails.
pid_t spawn_process(const SpawnSpec& spec);

// SIGKILL to the child's whole process group, then reaps the child. Returns its wait status.
int kill_and_reap(pid_t pid);

struct BoundedRun {
  int status = -1;          // wait status (WIFEXITED/WIFSIGNALED)
  bool timed_out = false;
  std::string output;       // stdout+stderr, the first `max_output` bytes
  bool truncated = false;
  double seconds = 0;
};
// Runs to completion or until `time_limit_s` passes (then kills the process group).
BoundedRun run_bounded(SpawnSpec spec, double time_limit_s, std::size_t max_output);

// Environment entries of this process whose names are in `keep` ("PATH", ...).
std::vector<std::string> pick_env(const std::vector<std::string>& keep);

std::string describe_wait_status(int status);  // "exit 1", "killed by SIGSEGV", ...

}  // namespace kf::evaluator
