// ShmQueue: FIFO, batches, back-pressure, typed records, and the kill cases
// (torn write, lock owner killed, reaper killed mid-journal), with real processes.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "kf/common/error.h"
#include "kf/replay/replay.h"
#include "proc_util.h"
#include "queue.h"

using namespace kf::replay;
using namespace kf::replay::test;
using namespace std::chrono_literals;

namespace {
struct QueueFixture : ::testing::Test {
  std::string name = unique_name(::testing::UnitTest::GetInstance()->current_test_info()->name());
  void TearDown() override { ShmSegment::remove(name); }
};
using ReplayQueueTest = QueueFixture;

std::string rec(int i, std::size_t len) {
  std::string s(len, '\0');
  for (std::size_t j = 0; j < len; ++j) s[j] = static_cast<char>((i * 31 + j) & 0xff);
  return s;
}
}  // namespace

TEST_F(ReplayQueueTest, PushPopIsFifoWithBatches) {
  ShmQueue q = ShmQueue::create(name, QueueConfig{16, 128});
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(q.push(rec(i, 10 + i).data(), 10 + i, i, 0ms));
  std::vector<std::string> recs{rec(5, 1), rec(6, 0), rec(7, 128)};
  EXPECT_EQ(q.push_batch(recs, {5, 6, 7}, 0ms), 3u);
  std::vector<std::string> out;
  EXPECT_EQ(q.pop_batch(out, 3, 0ms), 3u);
  EXPECT_EQ(q.pop_batch(out, 100, 0ms), 5u);
  ASSERT_EQ(out.size(), 8u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(out[i], rec(i, 10 + i));
  EXPECT_EQ(out[5], rec(5, 1));
  EXPECT_EQ(out[6], "");
  EXPECT_EQ(out[7], rec(7, 128));
  EXPECT_EQ(q.pop_batch(out, 1, 0ms), 0u);
  QueueStats s = q.stats();
  EXPECT_EQ(s.pushed, 8u);
  EXPECT_EQ(s.popped, 8u);
  EXPECT_EQ(s.free_slots, 16u);
}

TEST_F(ReplayQueueTest, FullQueueBlocksProducerThenCountsTheDrop) {
  ShmQueue q = ShmQueue::create(name, QueueConfig{4, 64});
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(q.push("x", 1, i, 0ms));
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(q.push("y", 1, 99, 60ms));  // back-pressure: waits, then gives up
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 55ms);
  EXPECT_EQ(q.stats().dropped_full, 1u);
  // A consumer frees a slot while the producer waits: the push goes through.
  std::thread consumer([&] {
    std::this_thread::sleep_for(30ms);
    std::vector<std::string> out;
    q.pop_batch(out, 1, 0ms);
  });
  EXPECT_TRUE(q.push("z", 1, 100, 5s));
  consumer.join();
  EXPECT_EQ(q.stats().dropped_full, 1u);
  EXPECT_EQ(q.stats().queued, 4u);
}

TEST_F(ReplayQueueTest, TooLargeRecordIsCountedNotSilent) {
  ShmQueue q = ShmQueue::create(name, QueueConfig{4, 64});
  std::string big(65, 'b');
  EXPECT_FALSE(q.push(big.data(), big.size(), 1, 0ms));
  EXPECT_EQ(q.stats().dropped_too_large, 1u);
  EXPECT_EQ(q.stats().queued, 0u);
}

TEST_F(ReplayQueueTest, BlockedConsumerWakesOnPushFromAnotherProcess) {
  ShmQueue q = ShmQueue::create(name, QueueConfig{8, 64});
  pid_t child = spawn([&] {
    ShmQueue mine = ShmQueue::attach(name);  // attach by name, as a worker would
    std::this_thread::sleep_for(50ms);
    return mine.push("hello", 5, 7, 1s) ? 0 : 1;
  });
  std::vector<std::string> out;
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(q.pop_batch(out, 4, 5s), 1u);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  EXPECT_EQ(out.at(0), "hello");
  EXPECT_EQ(wait_exit(child), 0);
}

TEST_F(ReplayQueueTest, TypedCandidateHandlesRoundTrip) {
  CandidateQueue cq(ShmQueue::create(name, QueueConfig{8, static_cast<uint32_t>(kCandidateRefBytes)}), nullptr);
  Candidate c;
  c.id = 42;
  c.group_id = 9;
  c.index_in_group = 3;
  c.t_pushed_ns = 1234;
  ASSERT_TRUE(cq.push(ref_of(c), 0ms));
  std::vector<CandidateRef> got;
  ASSERT_EQ(cq.pop_batch(got, 4, 0ms), 1u);
  EXPECT_EQ(got[0].candidate_id, 42u);
  EXPECT_EQ(got[0].group_id, 9u);
  EXPECT_EQ(got[0].index_in_group, 3u);
  EXPECT_EQ(got[0].t_pushed_ns, 1234);
  uint64_t cursor = 0;
  EXPECT_EQ(ShmQueue::attach(name).lost_tags(&cursor).size(), 0u);
  // Resolving needs the replay buffer: without one, claiming candidates is an error.
  std::vector<Candidate> cands;
  std::vector<ShmQueue::Slot> claims;
  EXPECT_THROW(cq.claim(cands, claims, 1, 0ms, "test"), kf::Error);

  // A slot one byte short of a handle refuses it (counted).
  ShmSegment::remove(name);
  CandidateQueue small(ShmQueue::create(name, QueueConfig{8, static_cast<uint32_t>(kCandidateRefBytes - 1)}), nullptr);
  EXPECT_FALSE(small.push(ref_of(c), 0ms));
  EXPECT_EQ(ShmQueue::attach(name).stats().dropped_too_large, 1u);
}

TEST_F(ReplayQueueTest, TornWriteIsNeverDelivered) {
  ShmQueue q = ShmQueue::create(name, QueueConfig{4, 256, 20ms});
  Staller st;
  pid_t child = spawn([&] {
    ShmQueue mine = ShmQueue::attach(name);
    st.arm("queue.write_mid");
    std::string r = rec(1, 200);
    mine.push(r.data(), r.size(), 1234, 1s);  // stalls half-way through the copy
    return 0;
  });
  ASSERT_TRUE(st.wait_stalled());
  kill_and_wait(child);
  std::vector<std::string> out;
  EXPECT_EQ(q.pop_batch(out, 4, 150ms), 0u) << "a half-written record was delivered";
  EXPECT_EQ(q.reap(), 0u) << "already reaped by the waiting consumer";
  QueueStats s = q.stats();
  EXPECT_EQ(s.lost_producer, 1u);
  EXPECT_EQ(s.free_slots, 4u);
  uint64_t cursor = 0;
  EXPECT_EQ(q.lost_tags(&cursor), std::vector<uint64_t>{1234});
  // The queue keeps working.
  ASSERT_TRUE(q.push("ok", 2, 1, 0ms));
  EXPECT_EQ(q.pop_batch(out, 4, 0ms), 1u);
  EXPECT_EQ(out.at(0), "ok");
}

TEST_F(ReplayQueueTest, ProcessKilledHoldingTheLockIsRecovered) {
  ShmQueue q = ShmQueue::create(name, QueueConfig{8, 64});
  Staller st;
  pid_t child = spawn([&] {
    ShmQueue mine = ShmQueue::attach(name);
    mine.push("A", 1, 1, 1s);
    mine.push("B", 1, 2, 1s);
    st.arm("queue.commit_locked");
    mine.push("C", 1, 3, 1s);  // dies inside the critical section, mutex held
    return 0;
  });
  ASSERT_TRUE(st.wait_stalled());
  kill_and_wait(child);
  std::vector<std::string> out;
  ASSERT_EQ(q.pop_batch(out, 8, 1s), 2u);  // first locker gets EOWNERDEAD and repairs
  EXPECT_EQ(out[0], "A");
  EXPECT_EQ(out[1], "B");
  EXPECT_EQ(q.stats().recoveries, 1u);
  EXPECT_EQ(q.reap(), 1u);  // C was being committed by the dead process: lost, counted
  EXPECT_EQ(q.stats().lost_producer, 1u);
  EXPECT_EQ(q.stats().free_slots, 8u);
  ASSERT_TRUE(q.push("D", 1, 4, 0ms));
  EXPECT_EQ(q.pop_batch(out, 8, 0ms), 1u);
}

TEST_F(ReplayQueueTest, ReaperKilledMidJournalKeepsLostCountExact) {
  ShmQueue q = ShmQueue::create(name, QueueConfig{8, 64, std::chrono::milliseconds(100000)});
  Staller writer, reaper;
  pid_t w = spawn([&] {
    ShmQueue mine = ShmQueue::attach(name);
    writer.arm("queue.write_mid");
    mine.push("abcdef", 6, 77, 1s);
    return 0;
  });
  ASSERT_TRUE(writer.wait_stalled());
  kill_and_wait(w);
  pid_t r = spawn([&] {
    ShmQueue mine = ShmQueue::attach(name);
    reaper.arm("queue.reap_journaled");
    mine.reap();  // dies after journaling, before finishing the accounting
    return 0;
  });
  ASSERT_TRUE(reaper.wait_stalled());
  kill_and_wait(r);
  EXPECT_EQ(q.reap(), 0u);  // lock recovery redoes the journaled reap; nothing left to reap
  QueueStats s = q.stats();
  EXPECT_EQ(s.recoveries, 1u);
  EXPECT_EQ(s.lost_producer, 1u);
  EXPECT_EQ(s.free_slots, 8u);
  uint64_t cursor = 0;
  EXPECT_EQ(q.lost_tags(&cursor), std::vector<uint64_t>{77});
}
