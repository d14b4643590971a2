// Helpers shared by the evaluator tests: corpus paths, temp folders, process checks.
#pragma once
#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace kf::evaluator::test {

inline std::string kernels_dir() { return KF_KERNELS_DIR; }
inline std::string read_kernel(const std::string& rel) {
  std::ifstream f(kernels_dir() + "/" + rel);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
inline std::string temp_dir(const std::string& tag) {
  const char* tmp = std::getenv("TMPDIR");
  std::string t = std::string(tmp && *tmp ? tmp : "/tmp") + "/kf-evaltest-" + tag + "-XXXXXX";
  if (!mkdtemp(t.data())) std::abort();
  return t;
}
// Processes whose parent is this process (a leftover worker or compiler would show here).
inline int child_processes() {
  int n = 0;
  const pid_t me = getpid();
  DIR* d = opendir("/proc");
  while (dirent* e = d ? readdir(d) : nullptr) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::ifstream f(std::string("/proc/") + e->d_name + "/stat");
    std::string s;
    std::getline(f, s);
    auto p = s.rfind(')');
    if (p == std::string::npos) continue;
    std::istringstream in(s.substr(p + 2));
    char state;
    pid_t ppid;
    in >> state >> ppid;
    if (ppid == me) ++n;
  }
  if (d) closedir(d);
  return n;
}
inline bool process_exists(pid_t pid) { return pid > 0 && (kill(pid, 0) == 0 || errno != ESRCH); }

}  // namespace kf::evaluator::test
