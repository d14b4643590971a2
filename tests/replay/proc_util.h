// Test helpers: real child processes, real SIGKILLs, stall hooks that freeze a child
// at a named point so the parent can kill it there. Used only by the replay tests.
#pragma once
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

#include "../test_support.h"
#include "testing.h"

namespace kf::replay::test {

// A segment/run name unique to this test process.
inline std::string unique_name(const std::string& what) { return "kft" + std::to_string(::getpid()) + "." + what; }

// Forks a child that runs fn and _exits with its return value (exceptions: 100).
inline pid_t spawn(const std::function<int()>& fn) {
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    int rc = 100;
    try {
      rc = fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child %d: %s\n", ::getpid(), e.what());
    }
    ::_exit(rc);
  }
  return pid;
}

using kf::test::wait_exit;

inline void kill_and_wait(pid_t pid) {
  ::kill(pid, SIGKILL);
  wait_exit(pid);
}

// --- stall at a named point: the child writes one byte to the pipe, then sleeps forever.
inline const char* g_stall_point = nullptr;
inline int g_stall_fd = -1;
inline void stall_hook(const char* point) {
  if (g_stall_point && std::strcmp(point, g_stall_point) == 0) {
    char c = 's';
    (void)!::write(g_stall_fd, &c, 1);
    for (;;) ::pause();
  }
}

struct Staller {
  int fds[2];
  Staller() {
    if (::pipe(fds) != 0) std::abort();
  }
  ~Staller() {
    ::close(fds[0]);
    ::close(fds[1]);
  }
  // In the child: arm the hook for `point`.
  void arm(const char* point) {
    g_stall_point = point;
    g_stall_fd = fds[1];
    kf::replay::testing::set_stall_hook(&stall_hook);
  }
  // In the parent: true once the child reached the point (within timeout_ms).
  bool wait_stalled(int timeout_ms = 10000) {
    pollfd p{fds[0], POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) != 1) return false;
    char c;
    return ::read(fds[0], &c, 1) == 1;
  }
};

}  // namespace kf::replay::test
