// ControlBlock: run state, heartbeats and dead-peer detection, rendezvous.
#include <gtest/gtest.h>

#include <thread>

#include "kf/replay/replay.h"
#include "proc_util.h"

using namespace kf::replay;
using namespace kf::replay::test;
using namespace std::chrono_literals;

namespace {
struct ReplayControlTest : ::testing::Test {
  std::string name = unique_name(::testing::UnitTest::GetInstance()->current_test_info()->name());
  void TearDown() override { ShmSegment::remove(name); }
};
}  // namespace

TEST_F(ReplayControlTest, RunStateChangesWakeWaiters) {
  ControlBlock c = ControlBlock::create(name);
  EXPECT_EQ(c.state(), RunState::starting);
  pid_t child = spawn([&] {
    ControlBlock mine = ControlBlock::attach(name);
    return mine.wait_state_change(RunState::starting, 5s) == RunState::draining ? 0 : 1;
  });
  std::this_thread::sleep_for(30ms);
  c.set_state(RunState::draining);
  EXPECT_EQ(wait_exit(child), 0);
  EXPECT_STREQ(run_state_name(c.state()), "draining");
}

TEST_F(ReplayControlTest, HeartbeatsAndDeadPeersAreDetected) {
  ControlBlock c = ControlBlock::create(name);
  int me = c.register_process("learner", 0);
  c.add_counter(me, 0, 5);
  Staller st;
  pid_t child = spawn([&] {
    ControlBlock mine = ControlBlock::attach(name);
    int slot = mine.register_process("actor", 3);
    mine.heartbeat(slot);
    mine.add_counter(slot, 1, 7);
    st.arm("now");
    kf::replay::testing::set_stall_hook(&stall_hook);
    stall_hook("now");  // signal the parent, then wait to be killed
    return 0;
  });
  ASSERT_TRUE(st.wait_stalled());
  auto peers = c.peers(1s);
  ASSERT_EQ(peers.size(), 2u);
  const PeerInfo* actor = peers[0].role == "actor" ? &peers[0] : &peers[1];
  EXPECT_TRUE(actor->alive && actor->fresh);
  EXPECT_EQ(actor->id, 3);
  EXPECT_EQ(actor->counters[1], 7u);
  kill_and_wait(child);
  peers = c.peers(1s);
  actor = peers[0].role == "actor" ? &peers[0] : &peers[1];
  EXPECT_FALSE(actor->alive);
  EXPECT_EQ(actor->counters[1], 7u) << "a dead process's counters stay readable";
  // A stale heartbeat (live process) is reported as not fresh.
  std::this_thread::sleep_for(20ms);
  peers = c.peers(10ms);
  const PeerInfo* learner = peers[0].role == "learner" ? &peers[0] : &peers[1];
  EXPECT_TRUE(learner->alive);
  EXPECT_FALSE(learner->fresh);
  // The dead entry is reused.
  int again = c.register_process("actor", 4);
  EXPECT_EQ(again, actor->slot);
  EXPECT_EQ(c.peers(1s).size(), 2u);
}

TEST_F(ReplayControlTest, RendezvousCarriesAnNcclUniqueId) {
  ControlBlock c = ControlBlock::create(name);
  pid_t rank0 = spawn([&] {
    ControlBlock mine = ControlBlock::attach(name);
    std::this_thread::sleep_for(20ms);
    unsigned char id[128];
    for (int i = 0; i < 128; ++i) id[i] = static_cast<unsigned char>(i * 7);
    mine.rendezvous_put("nccl_id", id, sizeof id);
    return 0;
  });
  auto got = c.rendezvous_get("nccl_id", 5s);
  ASSERT_TRUE(got.has_value());
  ASSERT_EQ(got->size(), 128u);
  for (int i = 0; i < 128; ++i) EXPECT_EQ(static_cast<unsigned char>((*got)[i]), static_cast<unsigned char>(i * 7));
  EXPECT_EQ(wait_exit(rank0), 0);
  EXPECT_FALSE(c.rendezvous_get("absent", 5ms).has_value());
}
