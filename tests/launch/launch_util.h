// Starting and waiting for tools/launch (kf-launch) from a test: shared by the launch tests.
#pragma once
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "../actors/test_util.h"

namespace kf::launch::test {

struct Launch {
  pid_t pid = -1;
  std::string out;  // stdout + stderr file
};

inline Launch start(const std::vector<std::string>& args, const std::string& out) {
  Launch l;
  l.out = out;
  l.pid = ::fork();
  if (l.pid == 0) {
    // A test that fails or times out must not leave a running cluster behind to slow the
    // next tests down: the launcher dies with the test process (its workers with it).
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::vector<std::string> a = {kf::test::build_dir() + "/launch/kf-launch"};
    a.insert(a.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& s : a) argv.push_back(s.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    _exit(127);
  }
  return l;
}

// Exit code, or -signal; -1000 on timeout (the launcher is then killed).
inline int wait_for(const Launch& l, double timeout_s) {
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<long long>(timeout_s * 1000));
  for (;;) {
    int st = 0;
    if (::waitpid(l.pid, &st, WNOHANG) == l.pid) return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
    if (std::chrono::steady_clock::now() > until) {
      ::kill(l.pid, SIGKILL);
      ::waitpid(l.pid, &st, 0);
      return -1000;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

inline std::string slurp(const std::string& p) { return kf::actors::test::exists(p) ? kf::test::read_file(p) : ""; }

}  // namespace kf::launch::test
