#include "kf/common/run_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kf/common/error.h"

namespace fs = std::filesystem;

namespace kf {
namespace {
const char* const kSubdirs[] = {"logs", "metrics", "checkpoints", "kernels", "best"};
}

RunDir RunDir::create(const std::string& root, const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos)
    throw error_at("run.name", "'" + name + "' is not a valid run name (non-empty, no '/')");
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) throw error_at(root, "cannot create run root: " + ec.message());
  RunDir run;
  for (int n = 1;; ++n) {
    run.name_ = n == 1 ? name : name + "-" + std::to_string(n);
    run.path_ = root + "/" + run.name_;
    // create_directory is atomic: two launchers never get the same folder.
    if (fs::create_directory(run.path_, ec)) break;
    if (ec) throw error_at(run.path_, "cannot create run directory: " + ec.message());
  }
  for (const char* sub : kSubdirs) {
    fs::create_directories(run.path_ + "/" + sub, ec);
    if (ec) throw error_at(run.path_ + "/" + sub, "cannot create: " + ec.message());
  }
  return run;
}

RunDir RunDir::open(const std::string& path) {
  if (!fs::is_directory(path) || !fs::exists(path + "/config.yaml"))
    throw error_at(path, "not a run directory (no config.yaml)");
  RunDir run;
  run.path_ = fs::path(path).lexically_normal().string();
  if (!run.path_.empty() && run.path_.back() == '/') run.path_.pop_back();
  run.name_ = fs::path(run.path_).filename().string();
  return run;
}

std::string RunDir::shm_key() const {
  std::error_code ec;
  fs::path abs = fs::weakly_canonical(fs::absolute(path_, ec), ec);
  if (ec) abs = fs::absolute(path_).lexically_normal();
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a
  for (unsigned char c : abs.string()) h = (h ^ c) * 0x100000001b3ULL;
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x", static_cast<unsigned>(h ^ (h >> 32)));
  return name_ + "-" + hex;
}

std::string RunDir::log_file(const std::string& role, int id) const {
  return path_ + "/logs/" + role + "-" + std::to_string(id) + ".log";
}

void write_file_atomic(const std::string& path, const std::string& contents) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw error_at(tmp, std::string("cannot create: ") + std::strerror(errno));
  std::size_t done = 0;
  while (done < contents.size()) {
    ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw error_at(tmp, std::string("write failed: ") + std::strerror(e));
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    throw error_at(tmp, std::string("fsync/close failed: ") + std::strerror(errno));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    throw error_at(path, std::string("rename failed: ") + std::strerror(e));
  }
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw error_at(path, "cannot open file");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    out.push_back(it->path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace kf
