#include "shm_util.h"

#include <linux/futex.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cctype>
#include <cstring>

#include "kf/common/error.h"

namespace kf::replay::detail {

std::atomic<StallHook> g_stall_hook{nullptr};

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

namespace {
std::atomic<pid_t> g_cached_pid{0};
std::atomic<uint64_t> g_cached_start{0};
void refresh_identity() {
  pid_t pid = ::getpid();
  if (g_cached_pid.load(std::memory_order_relaxed) != pid) {
    g_cached_start.store(proc_start_time(pid), std::memory_order_relaxed);
    g_cached_pid.store(pid, std::memory_order_relaxed);
  }
}
}  // namespace

pid_t self_pid() {
  refresh_identity();
  return g_cached_pid.load(std::memory_order_relaxed);
}
uint64_t self_start() {
  refresh_identity();
  return g_cached_start.load(std::memory_order_relaxed);
}

bool proc_alive(pid_t pid, uint64_t start) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  uint64_t s = proc_start_time(pid);
  return s != 0 && (start == 0 || s == start);
}

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_ns) {
  if (timeout_ns <= 0) return;
  timespec ts{static_cast<time_t>(timeout_ns / 1000000000LL), static_cast<long>(timeout_ns % 1000000000LL)};
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake(std::atomic<uint32_t>* word, int count) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, count, nullptr, nullptr, 0);
}

void robust_mutex_init(pthread_mutex_t* m) {
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
  int rc = pthread_mutex_init(m, &a);
  pthread_mutexattr_destroy(&a);
  if (rc != 0) throw Error(std::string("replay: pthread_mutex_init failed: ") + std::strerror(rc));
}

RobustLock::RobustLock(pthread_mutex_t* m, const char* what, const std::function<void()>& repair,
                       std::atomic<uint64_t>* recoveries)
    : m_(m) {
  int rc = EBUSY;
  // Short critical sections: spin on trylock first, then sleep in the kernel.
  for (int i = 0; i < 64 && rc == EBUSY; ++i) {
    rc = pthread_mutex_trylock(m);
    if (rc == EBUSY) __builtin_ia32_pause();
  }
  if (rc == EBUSY) rc = pthread_mutex_lock(m);
  if (rc == EOWNERDEAD) {
    held_ = true;
    if (repair) repair();
    if (recoveries) recoveries->fetch_add(1, std::memory_order_relaxed);
    pthread_mutex_consistent(m);
    return;
  }
  if (rc != 0)
    throw Error(std::string("replay: ") + what + ": lock failed: " + std::strerror(rc) +
                " (mutex not recoverable; recreate the run's segments)");
  held_ = true;
}

RobustLock::~RobustLock() { unlock(); }

void RobustLock::unlock() {
  if (held_) {
    held_ = false;
    pthread_mutex_unlock(m_);
  }
}

uint64_t hash_bytes(const void* data, std::size_t n, uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  constexpr uint64_t k1 = 0x9E3779B185EBCA87ULL, k2 = 0xC2B2AE3D27D4EB4FULL;
  uint64_t h[4] = {seed ^ k1, seed ^ k2, seed + k1, seed - k2};
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int l = 0; l < 4; ++l) {
      uint64_t v;
      std::memcpy(&v, p + i + 8 * l, 8);
      h[l] = (h[l] ^ v) * k1;
      h[l] ^= h[l] >> 29;
    }
  }
  uint64_t acc = h[0] ^ (h[1] * 3) ^ (h[2] * 5) ^ (h[3] * 7) ^ (n * k2);
  for (; i < n; ++i) acc = (acc ^ p[i]) * 0x100000001B3ULL;
  acc ^= acc >> 33;
  acc *= 0xFF51AFD7ED558CCDULL;
  acc ^= acc >> 33;
  return acc;
}

void check_name(const std::string& name, const char* what) {
  bool ok = !name.empty() && name.size() <= 200;
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) ok = false;
  if (!ok)
    throw Error(std::string("replay: ") + what + " '" + name + "' is not valid (1..200 chars of [A-Za-z0-9._-])");
}

}  // namespace kf::replay::detail
