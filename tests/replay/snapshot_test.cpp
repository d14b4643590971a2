// SnapshotStore: newest-version reads, consistency under concurrent publish from
// another process, and a writer SIGKILLed mid-publish.
#include <gtest/gtest.h>

#include <thread>

#include "kf/common/error.h"
#include "kf/replay/replay.h"
#include "proc_util.h"

using namespace kf::replay;
using namespace kf::replay::test;
using namespace std::chrono_literals;

namespace {
struct ReplaySnapshotTest : ::testing::Test {
  std::string name = unique_name(::testing::UnitTest::GetInstance()->current_test_info()->name());
  void TearDown() override { ShmSegment::remove(name); }
};

// Every 8-byte word of blob v is v: a torn copy mixes two versions and fails.
std::vector<uint64_t> blob(int64_t v, std::size_t words) {
  return std::vector<uint64_t>(words, static_cast<uint64_t>(v));
}
bool uniform(const std::vector<unsigned char>& b, int64_t v) {
  if (b.size() % 8) return false;
  const uint64_t* w = reinterpret_cast<const uint64_t*>(b.data());
  for (std::size_t i = 0; i < b.size() / 8; ++i)
    if (w[i] != static_cast<uint64_t>(v)) return false;
  return true;
}
}  // namespace

TEST_F(ReplaySnapshotTest, ReadersGetTheNewestVersion) {
  SnapshotStore s = SnapshotStore::create(name, SnapshotConfig{1 << 20});
  std::vector<unsigned char> out;
  EXPECT_EQ(s.read(out).version, -1);
  auto b1 = blob(1, 1000), b2 = blob(2, 2000);
  s.publish(1, b1.data(), b1.size() * 8);
  s.publish(2, b2.data(), b2.size() * 8);
  SnapshotStore other = SnapshotStore::attach(name);
  SnapshotInfo info = other.read(out);
  EXPECT_EQ(info.version, 2);
  EXPECT_EQ(info.bytes, 16000u);
  EXPECT_TRUE(uniform(out, 2));
  EXPECT_EQ(other.latest().version, 2);
  std::vector<unsigned char> huge((1 << 20) + 1);
  EXPECT_THROW(s.publish(3, huge.data(), huge.size()), kf::Error);
  EXPECT_EQ(s.latest().version, 2);
}

TEST_F(ReplaySnapshotTest, ConsistentCopiesUnderConcurrentPublish) {
  constexpr std::size_t kWords = 512 * 1024;  // 4 MiB
  SnapshotStore s = SnapshotStore::create(name, SnapshotConfig{kWords * 8});
  pid_t writer = spawn([&] {
    SnapshotStore w = SnapshotStore::attach(name);
    auto t_end = std::chrono::steady_clock::now() + 1500ms;
    for (int64_t v = 1; std::chrono::steady_clock::now() < t_end; ++v) {
      auto b = blob(v, kWords - (v % 7) * 100);  // sizes vary too
      w.publish(v, b.data(), b.size() * 8);
    }
    return 0;
  });
  std::vector<pid_t> readers;
  for (int r = 0; r < 2; ++r)
    readers.push_back(spawn([&] {
      SnapshotStore rd = SnapshotStore::attach(name);
      std::vector<unsigned char> out;
      int64_t last = -1;
      int reads = 0;
      auto t_end = std::chrono::steady_clock::now() + 1500ms;
      while (std::chrono::steady_clock::now() < t_end) {
        SnapshotInfo info = rd.read(out);
        if (info.version < 0) continue;
        if (!uniform(out, info.version) || info.bytes != (kWords - (info.version % 7) * 100) * 8) return 1;  // torn
        if (info.version < last) return 2;  // went backwards
        last = info.version;
        ++reads;
      }
      return reads > 10 ? 0 : 3;
    }));
  EXPECT_EQ(wait_exit(writer), 0);
  for (pid_t r : readers) EXPECT_EQ(wait_exit(r), 0) << "1: torn copy, 2: version went back, 3: too few reads";
  EXPECT_GT(s.publishes(), 10u);
}

TEST_F(ReplaySnapshotTest, WriterKilledMidPublishLeavesTheNewestIntact) {
  SnapshotStore s = SnapshotStore::create(name, SnapshotConfig{1 << 20});
  Staller st;
  pid_t writer = spawn([&] {
    SnapshotStore w = SnapshotStore::attach(name);
    auto b1 = blob(1, 4096), b2 = blob(2, 4096);
    w.publish(1, b1.data(), b1.size() * 8);
    st.arm("snapshot.publish_mid");
    w.publish(2, b2.data(), b2.size() * 8);  // killed half-way, holding the writer mutex
    return 0;
  });
  ASSERT_TRUE(st.wait_stalled());
  kill_and_wait(writer);
  std::vector<unsigned char> out;
  SnapshotInfo info = s.read(out, 1, 1s);
  EXPECT_EQ(info.version, 1);
  EXPECT_TRUE(uniform(out, 1));
  // A new learner takes over publishing: the dead writer's lock and odd seq are repaired.
  auto b3 = blob(3, 4096);
  s.publish(3, b3.data(), b3.size() * 8);
  info = s.read(out, 1, 1s);
  EXPECT_EQ(info.version, 3);
  EXPECT_TRUE(uniform(out, 3));
  auto b4 = blob(4, 100);
  s.publish(4, b4.data(), b4.size() * 8);  // the buffer the dead writer tore is reused cleanly
  info = s.read(out, 1, 1s);
  EXPECT_EQ(info.version, 4);
  EXPECT_TRUE(uniform(out, 4));
}

TEST_F(ReplaySnapshotTest, ParallelCopyMatchesMemcpy) {
  std::vector<unsigned char> src(24u << 20), dst(src.size());
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 2654435761u >> 13);
  parallel_copy(dst.data(), src.data(), src.size(), 3);
  EXPECT_EQ(src, dst);
}
