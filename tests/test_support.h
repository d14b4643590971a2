// Helpers every component's tests share: where the tree, the build and Python are, temp
// folders, whole-file reads and writes, starting a process with its output in a log.
// Component test_util.h files add their own.
// Torch-free; safe in torch-linked tests (no std::filesystem::remove_all, see remove_tree).
#pragma once
#include <fcntl.h>
#include <ftw.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace kf::test {

inline std::string env_or(const char* name, const std::string& dflt) {
  const char* v = std::getenv(name);
  return v && *v ? v : dflt;
}
// kf_add_test compiles these defaults in (gtest discovery drops all but one ENVIRONMENT entry).
inline std::string source_dir() { return env_or("KF_SOURCE_DIR", KF_SOURCE_DIR_DEFAULT); }
inline std::string build_dir() { return env_or("KF_BUILD_DIR", KF_BUILD_DIR_DEFAULT); }
inline std::string python() { return env_or("KF_PYTHON", KF_PYTHON_DEFAULT); }

// Not std::filesystem::remove_all: libtorch.so exports its own copy of that symbol.
inline void remove_tree(const std::string& dir) {
  ::nftw(
      dir.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }, 16,
      FTW_DEPTH | FTW_PHYS);
}

// A fresh folder under /tmp, removed with everything in it when the object goes.
struct TempDir {
  std::string path;
  explicit TempDir(const std::string& tag = "test") {
    std::string tmpl = "/tmp/kf-" + tag + "-XXXXXX";
    path = ::mkdtemp(tmpl.data());
  }
  ~TempDir() { remove_tree(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}
inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Starts argv[0] with args, stdout+stderr to `log`. Returns the pid, -1 if it could not start.
inline pid_t spawn(const std::vector<std::string>& args, const std::string& log) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}
// The exit code, or 128 + the signal that ended it (a signal to the waiter retries the wait).
inline int wait_exit(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace kf::test
