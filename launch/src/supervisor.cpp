// Supervisor: spawning, reaping, signalling and restarting a node's worker processes (see
// supervisor.h).
#include "supervisor.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <thread>

#include "kf/common/error.h"
#include "kf/common/log.h"

namespace kf::launch {

namespace {
// Async-signal-safe write of a C string (the child between fork and exec).
void child_say(int fd, const char* s) {
  const ssize_t n = static_cast<ssize_t>(strlen(s));
  if (write(fd, s, static_cast<size_t>(n)) < 0) {
  }
}
}  // namespace

Supervisor::~Supervisor() {
  for (auto& w : workers_)
    if (w.pid > 0) ::kill(w.pid, SIGKILL);
  for (auto& w : workers_)
    if (w.pid > 0) {
      int st = 0;
      ::waitpid(w.pid, &st, 0);
      w.pid = -1;
    }
}

std::size_t Supervisor::add(WorkerSpec spec) {
  Worker w;
  w.spec = std::move(spec);
  workers_.push_back(std::move(w));
  return workers_.size() - 1;
}

void Supervisor::start(std::size_t i) {
  Worker& w = workers_.at(i);
  if (w.pid > 0) return;
  // Everything the child needs is prepared before fork: after it only async-signal-safe calls.
  std::vector<char*> argv;
  for (auto& a : w.spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const int log_fd = ::open(w.spec.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) throw Error("launch: cannot open log file " + w.spec.log_path + ": " + std::strerror(errno));
  std::vector<std::string> env_names, env_values;
  for (const auto& kv : w.spec.env) {
    const auto eq = kv.find('=');
    env_names.push_back(kv.substr(0, eq));
    env_values.push_back(eq == std::string::npos ? "" : kv.substr(eq + 1));
  }
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  for (int c : w.spec.cpus) CPU_SET(c, &cpus);
  const std::string banner =
      "\n=== " + w.name() + " start " + std::to_string(w.starts + 1) + ": " + w.spec.argv.front() + " ===\n";
  const pid_t parent = ::getpid();

  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(log_fd);
    throw Error("launch: fork failed for " + w.name() + ": " + std::strerror(errno));
  }
  if (pid == 0) {
    ::setpgid(0, 0);                      // Ctrl-C reaches the launcher only
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);   // the launcher died: stop too
    if (::getppid() != parent) _exit(1);  // it died before prctl took effect
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::signal(SIGPIPE, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    ::dup2(log_fd, 1);
    ::dup2(log_fd, 2);
    const int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    child_say(2, banner.c_str());
    for (std::size_t k = 0; k < env_names.size(); ++k) ::setenv(env_names[k].c_str(), env_values[k].c_str(), 1);
    if (!w.spec.cpus.empty()) ::sched_setaffinity(0, sizeof cpus, &cpus);
    ::execv(argv[0], argv.data());
    child_say(2, "launch: exec failed: ");
    child_say(2, argv[0]);
    child_say(2, ": ");
    child_say(2, strerror(errno));
    child_say(2, "\n");
    _exit(127);
  }
  ::close(log_fd);
  w.pid = pid;
  ++w.starts;
  w.started = Clock::now();
  w.registered = false;
  w.restart_pending = false;
  w.finished = false;
}

std::vector<Exit> Supervisor::reap() {
  std::vector<Exit> out;
  for (;;) {
    int st = 0;
    const pid_t pid = ::waitpid(-1, &st, WNOHANG);
    if (pid <= 0) break;
    const std::size_t i = find_pid(pid);
    if (i == workers_.size()) continue;  // not a worker (e.g. a helper the launcher ran)
    Exit e;
    e.index = i;
    if (WIFEXITED(st)) e.code = WEXITSTATUS(st);
    if (WIFSIGNALED(st)) e.signal = WTERMSIG(st);
    Worker& w = workers_[i];
    w.pid = -1;
    w.last_exit = describe_exit(e);
    if (e.ok()) w.finished = true;
    out.push_back(e);
  }
  return out;
}

void Supervisor::signal(std::size_t i, int sig) {
  if (workers_.at(i).pid > 0) ::kill(workers_[i].pid, sig);
}

void Supervisor::signal_role(const std::string& role, int sig) {
  for (std::size_t i = 0; i < workers_.size(); ++i)
    if (role.empty() || workers_[i].spec.role == role) signal(i, sig);
}

int Supervisor::running(const std::string& role) const {
  int n = 0;
  for (const auto& w : workers_)
    if (w.pid > 0 && (role.empty() || w.spec.role == role)) ++n;
  return n;
}

bool Supervisor::settled() const {
  if (running() > 0) return false;
  for (const auto& w : workers_)
    if (w.restart_pending) return false;
  return true;
}

std::string Supervisor::states() const {
  std::string st;
  for (const auto& w : workers_)
    st += (st.empty() ? "" : ", ") + w.name() +
          (w.running()  ? " up"
           : w.finished ? " done"
                        : " down") +
          (w.deaths ? " (" + std::to_string(w.deaths) + " restarts)" : "");
  return st;
}

bool Supervisor::wait_role(const std::string& role, std::chrono::milliseconds timeout, std::vector<Exit>* exits) {
  const auto until = Clock::now() + timeout;
  for (;;) {
    auto got = reap();
    if (exits) exits->insert(exits->end(), got.begin(), got.end());
    if (running(role) == 0) return true;
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

bool Supervisor::schedule_restart(std::size_t i, int max_restarts, double base_backoff_s) {
  Worker& w = workers_.at(i);
  ++w.deaths;
  if (w.deaths > max_restarts) {
    w.given_up = true;
    w.restart_pending = false;
    return false;
  }
  const double delay = std::min(30.0, base_backoff_s * std::pow(2.0, w.deaths - 1));
  w.restart_at = Clock::now() + std::chrono::milliseconds(static_cast<long long>(delay * 1000));
  w.restart_pending = true;
  return true;
}

std::vector<std::size_t> Supervisor::start_due() {
  std::vector<std::size_t> started;
  const auto now = Clock::now();
  for (std::size_t i = 0; i < workers_.size(); ++i)
    if (workers_[i].restart_pending && workers_[i].pid <= 0 && now >= workers_[i].restart_at) {
      start(i);
      started.push_back(i);
    }
  return started;
}

std::size_t Supervisor::find_pid(pid_t pid) const {
  for (std::size_t i = 0; i < workers_.size(); ++i)
    if (workers_[i].pid == pid) return i;
  return workers_.size();
}

std::string describe_exit(const Exit& e) {
  if (e.signal) {
    const char* n = sigabbrev_np(e.signal);
    return std::string("killed by SIG") + (n ? n : std::to_string(e.signal).c_str());
  }
  return "exit code " + std::to_string(e.code);
}

}  // namespace kf::launch
