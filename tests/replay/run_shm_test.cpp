// Segments and whole runs: attach checks, live vs stale detection (dead creator,
// hung creator), replacement of a killed launcher's run, clean shutdown, and the
// run-directory checkpoint round trip.
#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "kf/common/error.h"
#include "kf/replay/replay.h"
#include "proc_util.h"
#include "queue.h"
#include "segment.h"

using namespace kf::replay;
using namespace kf::replay::test;
using namespace std::chrono_literals;

namespace {
struct ReplaySegmentTest : ::testing::Test {
  std::string name = unique_name(::testing::UnitTest::GetInstance()->current_test_info()->name());
  void TearDown() override {
    ShmSegment::remove(name);
    RunShm::remove(name);
  }
};
using ReplayRunShmTest = ReplaySegmentTest;

RunShmConfig small_config() {
  RunShmConfig c;
  c.candidates = QueueConfig{16, 4096};
  c.replay = ReplayConfig{8, 64 * 1024, 512};
  c.kernels = KernelDbConfig{16, 4096, 4};
  c.snapshot = SnapshotConfig{1 << 16};
  return c;
}
bool shm_exists(const std::string& n) { return std::filesystem::exists("/dev/shm/" + n); }
}  // namespace

TEST_F(ReplaySegmentTest, AttachChecksKindAndPresence) {
  EXPECT_THROW(attach_segment(name, SegmentKind::Queue, 10ms), kf::Error);
  EXPECT_EQ(ShmSegment::probe(name), SegmentState::Absent);
  ShmSegment s = create_segment(name, SegmentKind::Test, 4096);
  mark_segment_ready(s);
  EXPECT_EQ(ShmSegment::probe(name), SegmentState::Live);
  EXPECT_NO_THROW(attach_segment(name, SegmentKind::Test, 10ms));
  try {
    attach_segment(name, SegmentKind::Queue, 10ms);
    FAIL();
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("field kind"), std::string::npos) << e.what();
  }
  EXPECT_THROW(create_segment(name, SegmentKind::Test, 4096), kf::Error) << "live segment replaced";
  EXPECT_THROW(create_segment("bad/name", SegmentKind::Test, 4096), kf::Error);
}

TEST_F(ReplaySegmentTest, NotReadySegmentIsNotAttached) {
  ShmSegment s = create_segment(name, SegmentKind::Test, 4096);  // not marked ready
  EXPECT_THROW(attach_segment(name, SegmentKind::Test, 30ms), kf::Error);
}

TEST_F(ReplaySegmentTest, StaleSegmentOfADeadCreatorIsReplaced) {
  Staller st;
  pid_t launcher = spawn([&] {
    ShmSegment s = create_segment(name, SegmentKind::Test, 8192);
    static_cast<char*>(segment_body(s))[0] = 'X';
    mark_segment_ready(s);
    st.arm("now");
    kf::replay::testing::set_stall_hook(&stall_hook);
    stall_hook("now");
    return 0;
  });
  ASSERT_TRUE(st.wait_stalled());
  uint64_t old_inc = attach_segment(name, SegmentKind::Test, 1s).incarnation();
  EXPECT_EQ(ShmSegment::probe(name), SegmentState::Live);
  kill_and_wait(launcher);
  EXPECT_EQ(ShmSegment::probe(name), SegmentState::Stale);
  ShmSegment fresh = create_segment(name, SegmentKind::Test, 4096);
  mark_segment_ready(fresh);
  EXPECT_NE(fresh.incarnation(), old_inc);
  EXPECT_EQ(static_cast<char*>(segment_body(fresh))[0], 0) << "old contents must not leak into the new segment";
  EXPECT_EQ(segment_size(fresh), 4096u);
}

TEST_F(ReplaySegmentTest, HungCreatorWithAnOldHeartbeatIsStale) {
  ShmSegment s = create_segment(name, SegmentKind::Test, 4096);
  mark_segment_ready(s);  // heartbeat now
  EXPECT_EQ(ShmSegment::probe(name, 50ms), SegmentState::Live);
  std::this_thread::sleep_for(80ms);
  EXPECT_EQ(ShmSegment::probe(name, 50ms), SegmentState::Stale);
  beat_segment(s);
  EXPECT_EQ(ShmSegment::probe(name, 50ms), SegmentState::Live);
}

TEST_F(ReplayRunShmTest, WorkersAttachByNameAndShutdownRemovesEverything) {
  auto run = RunShm::create(name, small_config());
  run->control().set_state(RunState::running);
  pid_t worker = spawn([&] {
    auto mine = RunShm::attach(name, 1s);
    CandidateRef c;
    c.candidate_id = 5;
    if (!mine->candidates().push(c, 1s)) return 1;
    unsigned char w[64] = {1};
    mine->snapshots().publish(3, w, sizeof w);
    return mine->control().state() == RunState::running ? 0 : 2;
  });
  EXPECT_EQ(wait_exit(worker), 0);
  std::vector<CandidateRef> got;
  EXPECT_EQ(run->candidates().pop_batch(got, 4, 1s), 1u);
  EXPECT_EQ(run->snapshots().latest().version, 3);
  EXPECT_THROW(RunShm::create(name, small_config()), kf::Error) << "a live run was replaced";
  for (const char* p : {"ctl", "cand", "replay", "kdb", "snap"})
    EXPECT_TRUE(shm_exists(RunShm::segment_name(name, p))) << p;
  EXPECT_FALSE(shm_exists(RunShm::segment_name(name, "res")))
      << "results have no queue: evaluators write into the groups";
  run->shutdown();
  for (const char* p : {"ctl", "cand", "replay", "kdb", "snap"})
    EXPECT_FALSE(shm_exists(RunShm::segment_name(name, p))) << p;
  EXPECT_EQ(RunShm::probe(name), SegmentState::Absent);
}

TEST_F(ReplayRunShmTest, RunOfAKilledLauncherIsDetectedAndReplaced) {
  Staller st;
  pid_t launcher = spawn([&] {
    auto run = RunShm::create(name, small_config());
    CandidateRef c;
    c.candidate_id = 1;
    run->candidates().push(c, 1s);
    st.arm("now");
    kf::replay::testing::set_stall_hook(&stall_hook);
    stall_hook("now");
    return 0;
  });
  ASSERT_TRUE(st.wait_stalled());
  auto old_worker = RunShm::attach(name, 1s);  // a worker of the old run, still mapped
  kill_and_wait(launcher);
  EXPECT_EQ(RunShm::probe(name), SegmentState::Stale);
  auto run = RunShm::create(name, small_config());
  EXPECT_EQ(run->candidate_ledger().queued, 0u) << "fresh segments";
  EXPECT_NE(run->control().segment().incarnation(), old_worker->control().segment().incarnation());
  EXPECT_EQ(old_worker->candidate_ledger().queued, 1u) << "old mapping stays valid for its holder";
  auto new_worker = RunShm::attach(name, 1s);
  EXPECT_EQ(new_worker->control().segment().incarnation(), run->control().segment().incarnation());
}

TEST_F(ReplayRunShmTest, HalfCreatedRunIsStale) {
  // A launcher that died after some parts but before the control block.
  ShmQueue::create(RunShm::segment_name(name, "cand"), QueueConfig{4, 64});
  EXPECT_EQ(RunShm::probe(name), SegmentState::Stale);
  EXPECT_THROW(RunShm::attach(name, 20ms), kf::Error);
}

TEST_F(ReplayRunShmTest, CheckpointToRunDirAndResume) {
  const std::string dir = "/tmp/" + name + ".run";
  {
    auto run = RunShm::create(name, small_config());
    std::vector<Candidate> g(2);
    for (int i = 0; i < 2; ++i) {
      g[i].id = 10 + i;
      g[i].task = "relu";
      g[i].group_id = 77;
      g[i].index_in_group = i;
      g[i].prompt_tokens = {1, 2};
    }
    run->replay().open_group(g, 60s);
    run->kernels().insert(KernelEntry{"relu", 2.0, 3, "fast relu", 0});
    run->save(dir);
  }
  EXPECT_TRUE(std::filesystem::exists(dir + "/checkpoints/replay.bin"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/kernels/kernel_db.json"));
  auto run = RunShm::create(name, small_config());
  EXPECT_EQ(run->load(dir), 2);
  EXPECT_EQ(run->replay().stats().open_now, 1u);
  EXPECT_EQ(run->kernels().best("relu")->source, "fast relu");
  std::filesystem::remove_all(dir);
}

TEST_F(ReplayRunShmTest, HungRunIsStaleOnlyWithoutAnyFreshHeartbeat) {
  RunShmConfig cfg = small_config();
  cfg.stale_after = 60ms;
  auto run = RunShm::create(name, cfg);
  EXPECT_EQ(RunShm::probe(name, 60ms), SegmentState::Live);
  int worker = run->control().register_process("evaluator", 0);
  std::this_thread::sleep_for(40ms);
  run->control().heartbeat(worker);  // a worker's heartbeat keeps the run live...
  std::this_thread::sleep_for(40ms);
  EXPECT_EQ(RunShm::probe(name, 60ms), SegmentState::Live);
  std::this_thread::sleep_for(80ms);  // ...until no one has beaten for stale_after
  EXPECT_EQ(RunShm::probe(name, 60ms), SegmentState::Stale);
  run->heartbeat();
  EXPECT_EQ(RunShm::probe(name, 60ms), SegmentState::Live);
}

TEST(RunShmConfigTest, ReplayKeysReachTheSegmentsAndBadValuesNameTheKey) {
  const kf::Config c = kf::Config::parse("replay:\n  groups:\n    capacity: 17\n  candidate_queue:\n    capacity: 64\n",
                                         "test.yaml", {"replay.kernels.max_per_task=5"});
  const kf::replay::RunShmConfig r = kf::replay::run_shm_config(c);
  EXPECT_EQ(r.replay.capacity, 17u);
  EXPECT_EQ(r.candidates.capacity, 64u);
  EXPECT_EQ(r.candidates.slot_bytes, kf::replay::kCandidateRefBytes);
  EXPECT_EQ(r.kernels.max_per_task, 5u);
  EXPECT_EQ(r.candidates.max_claims, 3u);  // schema default
  // The candidate queue holds handles: a config that sizes its slots is refused by key name.
  try {
    kf::replay::run_shm_config(kf::Config::parse("replay:\n  candidate_queue:\n    slot_bytes: 65536\n", "old.yaml"));
    FAIL() << "expected kf::Error";
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("replay.candidate_queue.slot_bytes"), std::string::npos) << e.what();
  }
  // Results have no queue: the old key is unknown, and the error names it.
  try {
    kf::Config::parse("replay:\n  result_queue:\n    capacity: 64\n", "old.yaml");
    FAIL() << "expected kf::Error";
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown key 'replay.result_queue"), std::string::npos) << e.what();
  }
  try {
    kf::replay::run_shm_config(kf::Config::parse("replay:\n  groups:\n    capacity: 0\n", "bad.yaml"));
    FAIL() << "expected kf::Error";
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.yaml"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("replay.groups.capacity"), std::string::npos) << e.what();
  }
}
