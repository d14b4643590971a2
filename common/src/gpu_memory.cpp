// GpuMemoryBudget (see gpu_memory.h): a claim table under flock.
#include "kf/common/gpu_memory.h"

#include <errno.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstring>
#include <sstream>
#include <thread>
#include <vector>

#include "kf/common/error.h"
#include "kf/common/gpu_lock.h"
#include "kf/common/proc.h"

namespace kf {
namespace {

struct ClaimLine {
  pid_t pid = 0;
  uint64_t start = 0, bytes = 0;
};

class FileLock {
 public:
  FileLock(int fd, const std::string& path) : fd_(fd) {
    while (::flock(fd_, LOCK_EX) != 0)
      if (errno != EINTR) throw error_at(path, std::string("flock: ") + std::strerror(errno));
  }
  ~FileLock() { ::flock(fd_, LOCK_UN); }

 private:
  int fd_;
};

std::vector<ClaimLine> read_claims(int fd) {
  std::string text;
  char buf[4096];
  ::lseek(fd, 0, SEEK_SET);
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) text.append(buf, static_cast<std::size_t>(n));
  std::vector<ClaimLine> out;
  std::istringstream in(text);
  ClaimLine c;
  while (in >> c.pid >> c.start >> c.bytes)
    if (c.pid > 0 && proc_start_time(c.pid) == c.start) out.push_back(c);  // the dead are dropped
  return out;
}

void write_claims(int fd, const std::string& path, const std::vector<ClaimLine>& claims) {
  std::string text;
  for (const auto& c : claims)
    text += std::to_string(c.pid) + " " + std::to_string(c.start) + " " + std::to_string(c.bytes) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size()))
    throw error_at(path, std::string("cannot write GPU memory claims: ") + std::strerror(errno));
}

}  // namespace

std::size_t verify_gpu_bytes(std::size_t input_bytes, std::size_t output_bytes) {
  return 2 * input_bytes + 4 * output_bytes + (std::size_t(3) << 30);
}

GpuMemoryBudget::GpuMemoryBudget(const std::string& dir, const std::string& gpu, std::size_t budget_bytes)
    : path_(gpu_file_path(dir, gpu, ".mem")), fd_(open_gpu_file(path_)), budget_(budget_bytes) {}

GpuMemoryBudget::~GpuMemoryBudget() {
  try {
    release();
  } catch (...) {  // a destructor must not throw; the next reader drops a dead claim anyway
  }
  if (fd_ >= 0) ::close(fd_);
}

bool GpuMemoryBudget::try_claim(std::size_t bytes) {
  FileLock lock(fd_, path_);
  auto claims = read_claims(fd_);
  const pid_t self = ::getpid();
  std::size_t others = 0;
  std::vector<ClaimLine> kept;
  for (const auto& c : claims)
    if (c.pid != self) others += c.bytes, kept.push_back(c);
  if (!kept.empty() && others + bytes > budget_) {
    write_claims(fd_, path_, claims);  // at least the dead are gone
    return false;
  }
  kept.push_back({self, proc_start_time(self), bytes});
  write_claims(fd_, path_, kept);
  held_ = bytes;
  return true;
}

bool GpuMemoryBudget::claim(std::size_t bytes, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!try_claim(bytes)) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

void GpuMemoryBudget::release() {
  if (held_ == 0) return;
  FileLock lock(fd_, path_);
  auto claims = read_claims(fd_);
  std::vector<ClaimLine> kept;
  for (const auto& c : claims)
    if (c.pid != ::getpid()) kept.push_back(c);
  write_claims(fd_, path_, kept);
  held_ = 0;
}

std::size_t GpuMemoryBudget::claimed_by_others() {
  FileLock lock(fd_, path_);
  std::size_t others = 0;
  for (const auto& c : read_claims(fd_))
    if (c.pid != ::getpid()) others += c.bytes;
  return others;
}

}  // namespace kf
