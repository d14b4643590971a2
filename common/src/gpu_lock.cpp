// GpuTimingLock (see gpu_lock.h): flock on a lock file plus a turnstile file.
#include "kf/common/gpu_lock.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "kf/common/error.h"

namespace kf {
namespace {}  // namespace

std::string gpu_file_path(const std::string& dir_in, const std::string& gpu_in, const std::string& suffix) {
  std::string gpu = gpu_in;
  for (char& c : gpu)  // a PCI bus id has ':' and '.'; keep file names plain
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '-';
  std::string dir = dir_in;
  if (dir.empty()) {
    const char* e = std::getenv("KF_GPU_LOCK_DIR");
    dir = e && *e ? e : "/tmp";
  }
  ::mkdir(dir.c_str(), 0777);  // may exist
  return dir + "/kf-gpu" + gpu + suffix;
}

int open_gpu_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) throw error_at(path, std::string("cannot open GPU lock file: ") + std::strerror(errno));
  ::fchmod(fd, 0666);  // shared by every process of the run, whatever its uid
  return fd;
}

std::string gpu_lock_key_pci(int domain, int bus, int device) {
  char key[32];
  std::snprintf(key, sizeof key, "%04x:%02x:%02x.0", domain & 0xffff, bus & 0xff, device & 0xff);
  return key;
}

GpuTimingLock::GpuTimingLock(const std::string& dir, const std::string& gpu) {
  path_ = gpu_file_path(dir, gpu, ".lock");
  turnstile_path_ = gpu_file_path(dir, gpu, ".turnstile");
  fd_ = open_gpu_file(path_);
  try {
    turnstile_fd_ = open_gpu_file(turnstile_path_);
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

GpuTimingLock::~GpuTimingLock() {
  unlock();
  if (fd_ >= 0) ::close(fd_);
  if (turnstile_fd_ >= 0) ::close(turnstile_fd_);
}

// flock has no timed wait: poll with LOCK_NB, backing off from 50 us to 2 ms (a trial
// lasts milliseconds, so waiters should notice a release quickly).
bool GpuTimingLock::acquire(int fd, int op, std::chrono::steady_clock::time_point deadline) {
  auto pause = std::chrono::microseconds(50);
  while (true) {
    if (::flock(fd, op | LOCK_NB) == 0) return true;
    if (errno != EWOULDBLOCK && errno != EINTR) throw error_at(path_, std::string("flock: ") + std::strerror(errno));
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(2000));
  }
}

bool GpuTimingLock::lock_exclusive(std::chrono::milliseconds timeout) {
  if (held_) return true;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  // Hold the turnstile while waiting: new shared holders queue behind us.
  if (!acquire(turnstile_fd_, LOCK_EX, deadline)) return false;
  const bool ok = acquire(fd_, LOCK_EX, deadline);
  ::flock(turnstile_fd_, LOCK_UN);
  held_ = ok;
  return ok;
}

bool GpuTimingLock::lock_shared(std::chrono::milliseconds timeout) {
  if (held_) return true;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  if (!acquire(turnstile_fd_, LOCK_EX, deadline)) return false;  // pass the turnstile
  ::flock(turnstile_fd_, LOCK_UN);
  held_ = acquire(fd_, LOCK_SH, deadline);
  return held_;
}

void GpuTimingLock::unlock() {
  if (!held_) return;
  ::flock(fd_, LOCK_UN);
  held_ = false;
}

GpuTimingLock::Hold::Hold(GpuTimingLock* lock, bool exclusive, std::chrono::milliseconds timeout) : lock_(lock) {
  if (lock_) ok_ = exclusive ? lock_->lock_exclusive(timeout) : lock_->lock_shared(timeout);
}
GpuTimingLock::Hold::~Hold() {
  if (lock_ && ok_) lock_->unlock();
}

}  // namespace kf
