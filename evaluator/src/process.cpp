// Child processes: fork+exec with async-signal-safe set-up (see process.h).
#include "process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "kf/common/error.h"

extern char** environ;

namespace kf::evaluator {

pid_t spawn_process(const SpawnSpec& spec) {
  if (spec.argv.empty()) throw Error("spawn_process: empty argv");
  // Everything the child needs is prepared before fork: no allocation after it.
  std::vector<char*> argv, envp;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  std::vector<std::pair<int, int>> fds = spec.fds;
  std::vector<std::pair<int, unsigned long long>> lims = spec.rlimits;
  const char* cwd = spec.cwd.empty() ? nullptr : spec.cwd.c_str();

  pid_t pid = fork();
  if (pid < 0) throw Error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    setpgid(0, 0);
    // Move sources out of the way first, so a source never collides with a target.
    for (auto& f : fds) f.first = fcntl(f.first, F_DUPFD, 200);
    int devnull = open("/dev/null", O_RDWR);
    bool has[3] = {false, false, false};
    for (const auto& f : fds) {
      dup2(f.first, f.second);
      if (f.second < 3) has[f.second] = true;
    }
    for (int i = 0; i < 3; ++i)
      if (!has[i] && devnull >= 0) dup2(devnull, i);
    int maxfd = 2;
    for (const auto& f : fds) maxfd = f.second > maxfd ? f.second : maxfd;
    syscall(SYS_close_range, maxfd + 1, ~0u, 0);
    for (const auto& l : lims) {
      struct rlimit rl{rlim_t(l.second), rlim_t(l.second)};
      setrlimit(l.first, &rl);
    }
    signal(SIGPIPE, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (cwd && chdir(cwd) != 0) _exit(126);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  setpgid(pid, pid);  // also from the parent: no race with an early kill
  return pid;
}

int kill_and_reap(pid_t pid) {
  if (pid <= 0) return -1;
  kill(-pid, SIGKILL);
  kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  return status;
}

BoundedRun run_bounded(SpawnSpec spec, double time_limit_s, std::size_t max_output) {
  BoundedRun r;
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) throw Error(std::string("pipe: ") + std::strerror(errno));
  spec.fds.push_back({p[1], 1});
  spec.fds.push_back({p[1], 2});
  const auto t0 = std::chrono::steady_clock::now();
  pid_t pid;
  try {
    pid = spawn_process(spec);
  } catch (...) {
    close(p[0]);
    close(p[1]);
    throw;
  }
  close(p[1]);
  char buf[8192];
  bool open_pipe = true;
  while (open_pipe) {
    const double left = time_limit_s - std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (left <= 0) {
      r.timed_out = true;
      break;
    }
    pollfd pf{p[0], POLLIN, 0};
    int pr = poll(&pf, 1, int(left * 1000) + 1);
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) continue;
    ssize_t n = read(p[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      open_pipe = false;
      break;
    }
    if (r.output.size() < max_output) r.output.append(buf, std::min<std::size_t>(size_t(n), max_output - r.output.size()));
    else r.truncated = true;
  }
  close(p[0]);
  if (r.timed_out) {
    r.status = kill_and_reap(pid);
  } else {
    // The pipe closed; the compiler may still be finishing (or a descendant held the pipe).
    int status = 0;
    while (true) {
      pid_t w = waitpid(pid, &status, WNOHANG);
      if (w == pid) break;
      const double left = time_limit_s - std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (left <= 0) {
        r.timed_out = true;
        status = kill_and_reap(pid);
        break;
      }
      usleep(2000);
    }
    kill(-pid, SIGKILL);  // no descendant outlives the run
    r.status = status;
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::vector<std::string> pick_env(const std::vector<std::string>& keep) {
  std::vector<std::string> out;
  for (const auto& k : keep)
    if (const char* v = std::getenv(k.c_str())) out.push_back(k + "=" + v);
  return out;
}

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int s = WTERMSIG(status);
    const char* name = sigabbrev_np(s);
    return std::string("killed by SIG") + (name ? name : std::to_string(s).c_str());
  }
  return "status " + std::to_string(status);
}

}  // namespace kf::evaluator
