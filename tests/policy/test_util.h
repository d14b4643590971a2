// Shared helpers for the policy tests: where the HF reference files are (made by the
// PolicyHfReferences CTest fixture, tests/policy/hf_reference.py), temp dirs, tensors.
#pragma once
#include <ftw.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>


namespace kf::policy::test {

inline std::string env_or(const char* name, const char* dflt) {
  const char* v = std::getenv(name);
  return v && *v ? v : dflt;
}
inline std::string build_dir() { return env_or("KF_BUILD_DIR", KF_BUILD_DIR_DEFAULT); }
inline std::string source_dir() { return env_or("KF_SOURCE_DIR", KF_SOURCE_DIR_DEFAULT); }
inline std::string refs_dir() { return build_dir() + "/policy_refs"; }
#ifndef KF_PYTHON_DEFAULT
#define KF_PYTHON_DEFAULT "python3"
#endif
inline std::string python() { return env_or("KF_PYTHON", KF_PYTHON_DEFAULT); }

// Not std::filesystem::remove_all: libtorch.so exports its own copy of that symbol.
inline void remove_tree(const std::string& dir) {
  ::nftw(dir.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }, 16,
         FTW_DEPTH | FTW_PHYS);
}

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/kf-policy-test-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { remove_tree(path); }
};

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace kf::policy::test
