// Small POSIX file helpers (kf::fsutil). Why not std::filesystem: libtorch.so exports its
// own copies of some std::filesystem symbols (built against another libstdc++), and a
// process that links torch can bind to them and crash (seen: remove_all). These are safe
// anywhere. Pure functions; any thread.
#pragma once
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <string>

namespace kf::fsutil {

inline bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}
inline bool is_file(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}
// mkdir -p with `mode` for every folder it creates. Returns false on failure.
inline bool make_dirs(const std::string& p, mode_t mode = 0755) {
  if (p.empty()) return false;
  std::string cur;
  for (std::size_t i = 0; i <= p.size(); ++i) {
    if (i == p.size() || (p[i] == '/' && i > 0)) {
      cur = p.substr(0, i);
      if (::mkdir(cur.c_str(), mode) != 0 && errno != EEXIST) return false;
    }
  }
  return true;
}
inline int remove_entry_(const char* path, const struct stat*, int, struct FTW*) { return ::remove(path); }
// rm -rf; never follows symlinks out of the tree.
inline void remove_tree(const std::string& p) {
  if (!p.empty()) ::nftw(p.c_str(), remove_entry_, 16, FTW_DEPTH | FTW_PHYS);
}
inline std::string extension(const std::string& p) {
  const auto slash = p.rfind('/'), dot = p.rfind('.');
  return dot == std::string::npos || (slash != std::string::npos && dot < slash) ? "" : p.substr(dot);
}
inline std::string filename(const std::string& p) {
  const auto slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

}  // namespace kf::fsutil
