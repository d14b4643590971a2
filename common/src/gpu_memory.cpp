// GpuMemoryBudget (see gpu_memory.h): a claim table under flock.
#include "kf/common/gpu_memory.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "kf/common/error.h"

namespace kf {
namespace {

struct ClaimLine {
  long pid = 0;
  unsigned long long start = 0, bytes = 0;
};

// Field 22 of /proc/<pid>/stat (start time in clock ticks), 0 when the process is gone or
// a zombie: a pid reused by another process has another start time.
unsigned long long start_time(long pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const auto close = s.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos) return 0;
  std::istringstream rest(s.substr(close + 2));
  std::string state, field;
  rest >> state;
  if (state == "Z" || state == "X") return 0;
  for (int i = 4; i < 22 && rest >> field; ++i) {
  }
  unsigned long long t = 0;
  rest >> t;
  return t;
}

std::string lock_dir(const std::string& dir) {
  if (!dir.empty()) return dir;
  const char* e = std::getenv("KF_GPU_LOCK_DIR");
  return e && *e ? e : "/tmp";
}

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
    if (c.pid > 0 && start_time(c.pid) == c.start) out.push_back(c);  // the dead are dropped
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
  return 4 * input_bytes + 8 * output_bytes + (std::size_t(1) << 30);
}

GpuMemoryBudget::GpuMemoryBudget(const std::string& dir_in, const std::string& gpu_in, std::size_t budget_bytes)
    : budget_(budget_bytes) {
  std::string gpu = gpu_in;
  for (char& c : gpu)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '-';
  const std::string dir = lock_dir(dir_in);
  ::mkdir(dir.c_str(), 0777);  // may exist
  path_ = dir + "/kf-gpu" + gpu + ".mem";
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd_ < 0) throw error_at(path_, std::string("cannot open GPU memory claims file: ") + std::strerror(errno));
  ::fchmod(fd_, 0666);
}

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
  const long self = static_cast<long>(::getpid());
  std::size_t others = 0;
  std::vector<ClaimLine> kept;
  for (const auto& c : claims)
    if (c.pid != self) others += c.bytes, kept.push_back(c);
  if (!kept.empty() && others + bytes > budget_) {
    write_claims(fd_, path_, claims);  // at least the dead are gone
    return false;
  }
  kept.push_back({self, start_time(self), bytes});
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
    if (c.pid != static_cast<long>(::getpid())) kept.push_back(c);
  write_claims(fd_, path_, kept);
  held_ = 0;
}

std::size_t GpuMemoryBudget::claimed_by_others() {
  FileLock lock(fd_, path_);
  std::size_t others = 0;
  for (const auto& c : read_claims(fd_))
    if (c.pid != static_cast<long>(::getpid())) others += c.bytes;
  return others;
}

}  // namespace kf
