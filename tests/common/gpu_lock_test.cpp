// GpuTimingLock: real flock files, real child processes and SIGKILL.
#include "kf/common/gpu_lock.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

using kf::GpuTimingLock;
using namespace std::chrono_literals;

namespace {

std::string temp_dir() {
  char t[] = "/tmp/kf-gpulock-XXXXXX";
  return mkdtemp(t);
}

// Forks a child that takes the lock (exclusive or shared), reports through a pipe, then
// waits to be killed. Returns its pid once the lock is held.
pid_t child_holding(const std::string& dir, bool exclusive) {
  int p[2];
  EXPECT_EQ(pipe(p), 0);
  pid_t pid = fork();
  if (pid == 0) {
    close(p[0]);
    GpuTimingLock lock(dir, 0);
    bool ok = exclusive ? lock.lock_exclusive(5000ms) : lock.lock_shared(5000ms);
    char c = ok ? 'y' : 'n';
    (void)!write(p[1], &c, 1);
    while (true) pause();
  }
  close(p[1]);
  char c = 0;
  EXPECT_EQ(read(p[0], &c, 1), 1);
  close(p[0]);
  EXPECT_EQ(c, 'y');
  return pid;
}

void kill_child(pid_t pid) {
  kill(pid, SIGKILL);
  int st = 0;
  waitpid(pid, &st, 0);
}

}  // namespace

TEST(GpuTimingLockTest, SharedHoldersRunTogether) {
  const std::string dir = temp_dir();
  GpuTimingLock a(dir, 0), b(dir, 0);
  EXPECT_TRUE(a.lock_shared(100ms));
  EXPECT_TRUE(b.lock_shared(100ms));
  GpuTimingLock timer(dir, 0);
  EXPECT_FALSE(timer.lock_exclusive(30ms)) << "the timer must wait while GPU work is running";
  a.unlock();
  b.unlock();
  EXPECT_TRUE(timer.lock_exclusive(100ms));
}

TEST(GpuTimingLockTest, TimerExcludesOtherProcessesUntilItReleases) {
  const std::string dir = temp_dir();
  pid_t holder = child_holding(dir, /*exclusive=*/true);
  GpuTimingLock learner(dir, 0);
  EXPECT_FALSE(learner.lock_shared(50ms)) << "GPU work must pause while a trial is timed";
  kill_child(holder);
  EXPECT_TRUE(learner.lock_shared(1000ms));
}

TEST(GpuTimingLockTest, SigkilledHolderNeverWedgesTheGpu) {
  const std::string dir = temp_dir();
  for (bool exclusive : {true, false}) {
    pid_t holder = child_holding(dir, exclusive);
    kill_child(holder);  // dies holding the lock
    GpuTimingLock timer(dir, 0);
    EXPECT_TRUE(timer.lock_exclusive(1000ms)) << (exclusive ? "exclusive" : "shared") << " holder was SIGKILLed";
  }
}

TEST(GpuTimingLockTest, WaitingTimerIsNotStarvedByOverlappingSharedHolders) {
  const std::string dir = temp_dir();
  std::atomic<bool> stop{false};
  std::vector<std::thread> workers;
  for (int w = 0; w < 3; ++w)
    workers.emplace_back([&] {
      GpuTimingLock lock(dir, 0);  // own open file: behaves as another process would
      while (!stop) {
        if (lock.lock_shared(100ms)) {
          std::this_thread::sleep_for(3ms);  // staggered holders always overlap
          lock.unlock();
        }
      }
    });
  std::this_thread::sleep_for(20ms);
  GpuTimingLock timer(dir, 0);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(timer.lock_exclusive(2000ms));
  const auto waited = std::chrono::steady_clock::now() - t0;
  timer.unlock();
  stop = true;
  for (auto& t : workers) t.join();
  EXPECT_LT(waited, 500ms);
}

TEST(GpuTimingLockTest, UnwritableDirectoryIsAClearError) {
  try {
    GpuTimingLock lock("/proc/kf-no-such-dir", 0);
    FAIL() << "expected kf::Error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("kf-gpu0.lock"), std::string::npos) << e.what();  // int overload
  }
}

TEST(GpuTimingLockTest, EachPhysicalGpuHasItsOwnLock) {
  const std::string dir = temp_dir();
  GpuTimingLock a(dir, "0000:19:00.0"), b(dir, "0000:3b:00.0"), a_again(dir, "0000:19:00.0");
  EXPECT_TRUE(a.lock_exclusive(100ms));
  EXPECT_TRUE(b.lock_exclusive(100ms)) << "another GPU's timer must not wait";
  EXPECT_FALSE(a_again.lock_shared(30ms)) << "the same GPU, named by its bus id, must wait";
  EXPECT_NE(a.path().find("kf-gpu0000-19-00-0.lock"), std::string::npos) << a.path();
}
