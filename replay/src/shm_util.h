// Private helpers shared by the replay components: monotonic clock, process identity
// (pid + start time, so a recycled pid is never mistaken for a live owner), futex
// waits on shared memory, robust process-shared mutexes, a fast content hash, and
// the test stall points. Everything here is usable from any thread of any process.
#pragma once
#include <pthread.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "kf/common/proc.h"

namespace kf::replay::detail {

int64_t now_ns();  // CLOCK_MONOTONIC: one clock for every process on the node

// Identity of a process: pid plus its start time in clock ticks since boot
// (kf/common/proc.h). A zombie or absent pid has start time 0.
using kf::proc_start_time;
pid_t self_pid();                            // getpid(), cached (refreshed after fork)
uint64_t self_start();                       // proc_start_time(self_pid()), cached
bool proc_alive(pid_t pid, uint64_t start);  // same pid and same start time, not a zombie

// Owner words pack a small state and a pid into one 64-bit store, so a reader
// (holding the component's lock) never sees a half-updated owner.
inline uint64_t owner_word(uint32_t state, pid_t pid) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(pid)) << 8) | (state & 0xffu);
}
inline uint32_t word_state(uint64_t w) { return static_cast<uint32_t>(w & 0xffu); }
inline pid_t word_pid(uint64_t w) { return static_cast<pid_t>(w >> 8); }

// Futex on a 32-bit word inside a MAP_SHARED mapping (not FUTEX_PRIVATE: other
// processes wait on it). Waiting returns on wake, value change, timeout or signal.
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_ns);
void futex_wake(std::atomic<uint32_t>* word, int count);

// A pthread mutex that is process-shared and robust. If its owner dies, the next
// locker gets the lock plus the duty to repair the protected data; the `repair`
// callback runs before pthread_mutex_consistent, so if the repairer dies too the
// next locker repairs again (repairs must be idempotent).
void robust_mutex_init(pthread_mutex_t* m);
class RobustLock {
 public:
  // `what` names the lock in errors. `recoveries` (may be null) counts repairs.
  RobustLock(pthread_mutex_t* m, const char* what, const std::function<void()>& repair,
             std::atomic<uint64_t>* recoveries);
  ~RobustLock();
  RobustLock(const RobustLock&) = delete;
  RobustLock& operator=(const RobustLock&) = delete;
  void unlock();

 private:
  pthread_mutex_t* m_;
  bool held_ = false;
};

// Content hash for checksums and dedup (64-bit, 4 lanes of multiply-xorshift).
uint64_t hash_bytes(const void* data, std::size_t n, uint64_t seed = 0);

// Test stall points: a test installs a hook in a child process; library code
// calls stall_point("name") at the interesting instructions. One load and a
// branch when no hook is installed.
using StallHook = void (*)(const char* point);
extern std::atomic<StallHook> g_stall_hook;
inline void stall_point(const char* point) {
  StallHook h = g_stall_hook.load(std::memory_order_relaxed);
  if (h) h(point);
}

// Name check shared by segments and runs: [A-Za-z0-9._-], 1..200 chars.
void check_name(const std::string& name, const char* what);

inline int64_t to_ns(std::chrono::nanoseconds t) { return t.count(); }

}  // namespace kf::replay::detail
