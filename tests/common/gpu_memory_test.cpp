// GpuMemoryBudget: a real claims file, real child processes, SIGKILL.
#include "kf/common/gpu_memory.h"
#include "kf/common/error.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>

using kf::GpuMemoryBudget;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t GiB = std::size_t(1) << 30;

std::string temp_dir() {
  char t[] = "/tmp/kf-gpumem-XXXXXX";
  return mkdtemp(t);
}

struct Child {
  pid_t pid = -1;
  int to_child = -1;  // a byte here: release the claim and exit
};

// Forks a child that claims `bytes` of a `budget` (the child's own object), reports
// through a pipe, then waits for a byte (release, exit 0) or to be killed.
Child child_claiming(const std::string& dir, std::size_t budget, std::size_t bytes) {
  int up[2], down[2];
  EXPECT_EQ(pipe(up), 0);
  EXPECT_EQ(pipe(down), 0);
  Child c;
  c.pid = fork();
  if (c.pid == 0) {
    close(up[0]);
    close(down[1]);
    GpuMemoryBudget b(dir, "0000:01:00.0", budget);
    const char ok = b.claim(bytes, 5000ms) ? 'y' : 'n';
    (void)!write(up[1], &ok, 1);
    char x;
    (void)!read(down[0], &x, 1);
    b.release();
    _exit(0);
  }
  close(up[1]);
  close(down[0]);
  char ok = 0;
  EXPECT_EQ(read(up[0], &ok, 1), 1);
  close(up[0]);
  EXPECT_EQ(ok, 'y');
  c.to_child = down[1];
  return c;
}

void release_and_reap(const Child& c) {
  const char x = 'r';
  (void)!write(c.to_child, &x, 1);
  close(c.to_child);
  int st = 0;
  waitpid(c.pid, &st, 0);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

}  // namespace

TEST(GpuMemoryBudgetTest, ClaimsThatFitRunTogetherAndOneThatDoesNotWaitsForARelease) {
  const std::string dir = temp_dir();
  const Child a = child_claiming(dir, 100 * GiB, 40 * GiB);
  const Child b = child_claiming(dir, 100 * GiB, 40 * GiB);  // 80 of 100: fits
  GpuMemoryBudget self(dir, "0000:01:00.0", 100 * GiB);
  EXPECT_EQ(self.claimed_by_others(), 80 * GiB);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(self.claim(40 * GiB, 150ms)) << "120 GiB of a 100 GiB budget was granted";
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 150ms);
  EXPECT_TRUE(self.claim(20 * GiB, 100ms)) << "100 of 100 GiB fits";
  EXPECT_EQ(self.held(), 20 * GiB);
  self.release();
  EXPECT_EQ(self.held(), 0u);
  release_and_reap(a);
  EXPECT_EQ(self.claimed_by_others(), 40 * GiB);
  EXPECT_TRUE(self.claim(40 * GiB, 100ms));
  release_and_reap(b);
  self.release();
  EXPECT_EQ(self.claimed_by_others(), 0u);
}

TEST(GpuMemoryBudgetTest, AKilledHoldersClaimIsDropped) {
  const std::string dir = temp_dir();
  const Child a = child_claiming(dir, 10 * GiB, 8 * GiB);
  GpuMemoryBudget self(dir, "0000:01:00.0", 10 * GiB);
  EXPECT_FALSE(self.claim(8 * GiB, 50ms));
  kill(a.pid, SIGKILL);
  int st = 0;
  waitpid(a.pid, &st, 0);
  close(a.to_child);
  EXPECT_TRUE(self.claim(8 * GiB, 100ms)) << "a SIGKILLed process still holds its claim";
  EXPECT_EQ(self.claimed_by_others(), 0u);
}

TEST(GpuMemoryBudgetTest, AClaimBiggerThanTheBudgetRunsAloneAndOtherGpusAreApart) {
  const std::string dir = temp_dir();
  GpuMemoryBudget self(dir, "0000:01:00.0", 10 * GiB);
  EXPECT_TRUE(self.claim(50 * GiB, 10ms)) << "nobody else holds a claim: the big task must still run";
  // Another process now waits until the big claim is gone.
  pid_t pid = fork();
  if (pid == 0) {
    GpuMemoryBudget other(dir, "0000:01:00.0", 10 * GiB);
    GpuMemoryBudget other_gpu(dir, "0000:02:00.0", 10 * GiB);
    const bool waited = !other.claim(1 * GiB, 50ms);
    const bool apart = other_gpu.claim(5 * GiB, 50ms);
    _exit(waited && apart ? 0 : 1);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "a claim on the same GPU was granted next to 50 of 10 GiB, "
                                                        "or one on another GPU was not";
  self.release();
}

TEST(GpuMemoryBudgetTest, VerifyEstimateGrowsWithTheTensors) {
  const std::size_t small = kf::verify_gpu_bytes(1 << 20, 1 << 20);
  const std::size_t big = kf::verify_gpu_bytes(4 * GiB, 4 * GiB);
  // Above the 21.75 GiB measured on the H200 with 4 GiB in and out, and small
  // enough that three such verifications share the 0.7 budget of an H200 (139.8 GiB).
  EXPECT_GT(big, 22 * GiB);
  EXPECT_LE(3 * big, static_cast<std::size_t>(0.7 * 139.8 * double(GiB)));
  EXPECT_GE(small, GiB) << "a CUDA context and workspaces even for tiny tensors";
  EXPECT_GT(kf::verify_gpu_bytes(4 * GiB, 8 * GiB), big);
}

TEST(GpuMemoryBudgetTest, AnUnwritableFolderIsNamed) {
  try {
    GpuMemoryBudget b("/proc/kf-no-such-dir", "0", GiB);
    FAIL() << "no error for a folder that cannot hold the claims file";
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/proc/kf-no-such-dir/kf-gpu0.mem"), std::string::npos) << e.what();
  }
}
