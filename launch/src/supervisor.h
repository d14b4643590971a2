// Supervisor: the worker processes of one run (evaluators, actors, learner ranks) as
// child processes of tools/launch: spawn with their own environment, CPU affinity and
// log file, reap, restart with back-off, kill.
//
// Children run in their own process group, so a terminal's Ctrl-C reaches only the
// launcher, which then stops them in order (drain, checkpoint); each child also gets
// SIGTERM if the launcher dies (PR_SET_PDEATHSIG), so no worker outlives its run.
//
// Threading: one thread (the launcher's main loop) owns a Supervisor.
#pragma once
#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace kf::launch {

using Clock = std::chrono::steady_clock;

struct WorkerSpec {
  std::string role;  // "evaluator", "actor", "learner"
  int id = 0;
  std::vector<std::string> argv;  // argv[0]: the binary
  std::vector<std::string> env;   // NAME=value, added to the launcher's environment
  std::vector<int> cpus;          // CPU affinity (empty: inherit)
  std::string log_path;           // stdout + stderr, appended
};

struct Worker {
  WorkerSpec spec;
  pid_t pid = -1;
  int starts = 0;         // spawns so far (1 + restarts)
  int deaths = 0;         // abnormal exits so far
  bool finished = false;  // exited 0: not restarted
  bool given_up = false;  // died more than max_restarts times
  Clock::time_point started{}, restart_at{};
  bool restart_pending = false;
  // Seen in the control block since this start. A worker that registered and then left it
  // is exiting (it unregisters first), not stuck before registering.
  bool registered = false;
  std::string last_exit;  // "exit code 3", "killed by SIGSEGV", ...
  std::string name() const { return spec.role + " " + std::to_string(spec.id); }
  bool running() const { return pid > 0; }
};

// One child that exited, as reaped by Supervisor::reap().
struct Exit {
  std::size_t index = 0;
  int code = -1;  // exit code, or -1 when killed by a signal
  int signal = 0;
  bool ok() const { return code == 0; }
};

class Supervisor {
 public:
  Supervisor() = default;
  ~Supervisor();  // SIGKILLs and reaps whatever still runs
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  std::size_t add(WorkerSpec spec);  // returns its index; not started
  // Forks and execs worker i. Throws kf::Error if fork fails; an exec failure shows as
  // the child exiting 127 with a line in its log.
  void start(std::size_t i);
  // Non-blocking: every child that exited since the last call.
  std::vector<Exit> reap();
  void signal(std::size_t i, int sig);  // no-op unless running
  void signal_role(const std::string& role, int sig);
  // Waits up to `timeout` for every child of `role` (all roles if empty) to exit,
  // reaping them into `exits`. Returns true if none of them runs any more.
  bool wait_role(const std::string& role, std::chrono::milliseconds timeout, std::vector<Exit>* exits);
  // Schedules a restart of worker i after the back-off for its death count; returns
  // false (and marks it given_up) once deaths exceed max_restarts.
  bool schedule_restart(std::size_t i, int max_restarts, double base_backoff_s);
  // Starts every worker whose restart time has come; returns their indices.
  std::vector<std::size_t> start_due();

  std::vector<Worker>& workers() { return workers_; }
  const std::vector<Worker>& workers() const { return workers_; }
  int running(const std::string& role = "") const;
  // Nothing runs and no restart is pending: a node launcher's loop is over.
  bool settled() const;
  // "evaluator-0 up, evaluator-1 down (2 restarts), ..." for a node's status line.
  std::string states() const;
  std::size_t find_pid(pid_t pid) const;  // workers().size() if not ours

 private:
  std::vector<Worker> workers_;
};

// "exit code N" / "killed by SIGxxx" for a reaped exit.
std::string describe_exit(const Exit& e);

}  // namespace kf::launch
