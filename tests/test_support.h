// Helpers every component's tests share: where the tree, the build and Python are, temp
// folders, whole-file reads and writes. Component test_util.h files add their own.
// Torch-free; safe in torch-linked tests (no std::filesystem::remove_all, see remove_tree).
#pragma once
#include <ftw.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

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

}  // namespace kf::test
