// ReplayBuffer: joining results to groups, readiness by completion / deadline / lost
// candidates, staleness and eviction, a learner killed mid-take, persistence.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "kf/common/error.h"
#include "kf/common/run_dir.h"
#include "kf/replay/replay.h"
#include "proc_util.h"

using namespace kf::replay;
using namespace kf::replay::test;
using namespace std::chrono_literals;

namespace {
struct ReplayBufferTest : ::testing::Test {
  std::string name = unique_name(::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::string dir = "/tmp/" + name;
  void SetUp() override { std::filesystem::create_directories(dir); }
  void TearDown() override {
    ShmSegment::remove(name);
    ShmSegment::remove(name + ".q");
    std::filesystem::remove_all(dir);
  }
};

std::vector<Candidate> group(uint64_t gid, int g, int64_t version, const std::string& task = "t1") {
  std::vector<Candidate> out;
  for (int i = 0; i < g; ++i) {
    Candidate c;
    c.id = gid * 100 + i;
    c.task = task;
    c.group_id = gid;
    c.index_in_group = i;
    c.policy_version = version;
    c.prompt_tokens = {1, 2, 3, static_cast<int32_t>(gid)};
    c.completion_tokens = {10 + i, 20 + i};
    c.behaviour_logprobs = {-0.5f * i, -0.25f};
    c.source = "kernel " + std::to_string(c.id);
    out.push_back(c);
  }
  return out;
}

Result result_for(const Candidate& c, double speedup) {
  Result r;
  r.candidate_id = c.id;
  r.group_id = c.group_id;
  r.index_in_group = c.index_in_group;
  r.verdict = Verdict::ok;
  r.reason = "verified";
  r.speedup = speedup;
  r.reward = speedup - 1;
  return r;
}
}  // namespace

TEST_F(ReplayBufferTest, GroupIsReadyWhenAllScored) {
  ReplayBuffer rb = ReplayBuffer::create(name, ReplayConfig{8, 64 * 1024, 512});
  auto g = group(1, 4, 5);
  ASSERT_TRUE(rb.open_group(g, 10s));
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(rb.add_result(result_for(g[i], 1.0 + i)));
  std::vector<ScoredGroup> out;
  EXPECT_EQ(rb.take_ready(out, 4, 5, 2, 0ms), 0u);
  EXPECT_TRUE(rb.add_result(result_for(g[3], 4.0)));
  ASSERT_EQ(rb.take_ready(out, 4, 5, 2, 1s), 1u);
  const ScoredGroup& sg = out[0];
  EXPECT_EQ(sg.group_id, 1u);
  EXPECT_EQ(sg.task, "t1");
  EXPECT_EQ(sg.prompt_tokens, g[0].prompt_tokens);
  ASSERT_EQ(sg.candidates.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(sg.candidates[i].id, g[i].id);
    EXPECT_EQ(sg.candidates[i].completion_tokens, g[i].completion_tokens);
    EXPECT_EQ(sg.candidates[i].behaviour_logprobs, g[i].behaviour_logprobs);
    EXPECT_EQ(sg.results[i].candidate_id, g[i].id);
    EXPECT_DOUBLE_EQ(sg.results[i].speedup, 1.0 + i);
    EXPECT_EQ(sg.missing[i], 0);
  }
  EXPECT_FALSE(sg.deadline_hit);
  EXPECT_EQ(rb.stats().taken, 1u);
  EXPECT_EQ(rb.stats().open_now, 0u);
}

TEST_F(ReplayBufferTest, DeadlineMakesAGroupReadyWithMissingMarked) {
  ReplayBuffer rb = ReplayBuffer::create(name, ReplayConfig{8, 64 * 1024, 512});
  auto g = group(2, 4, 1);
  ASSERT_TRUE(rb.open_group(g, 80ms));
  rb.add_result(result_for(g[0], 2.0));
  rb.add_result(result_for(g[2], 3.0));
  std::vector<ScoredGroup> out;
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(rb.take_ready(out, 4, 1, 10, 2s), 1u);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 60ms);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  EXPECT_TRUE(out[0].deadline_hit);
  EXPECT_EQ(out[0].missing, (std::vector<uint8_t>{0, 1, 0, 1}));
  EXPECT_EQ(out[0].results[1].candidate_id, g[1].id);
  // A late result for a group already taken is an orphan, counted.
  EXPECT_FALSE(rb.add_result(result_for(g[1], 1.0)));
  EXPECT_EQ(rb.stats().results_orphan, 1u);
}

TEST_F(ReplayBufferTest, LostCandidatesCompleteTheGroupEarly) {
  ReplayBuffer rb = ReplayBuffer::create(name, ReplayConfig{8, 64 * 1024, 512});
  auto g = group(3, 3, 1);
  ASSERT_TRUE(rb.open_group(g, 60s));
  rb.add_result(result_for(g[0], 1.0));
  rb.add_result(result_for(g[1], 1.0));
  EXPECT_EQ(rb.mark_lost({g[2].id, 999999}), 1u);  // e.g. the evaluator died holding it
  std::vector<ScoredGroup> out;
  ASSERT_EQ(rb.take_ready(out, 4, 1, 10, 100ms), 1u);
  EXPECT_EQ(out[0].missing, (std::vector<uint8_t>{0, 0, 1}));
  EXPECT_EQ(rb.stats().candidates_lost, 1u);
}

TEST_F(ReplayBufferTest, StaleGroupsAreDroppedAndCounted) {
  ReplayBuffer rb = ReplayBuffer::create(name, ReplayConfig{8, 64 * 1024, 512});
  for (uint64_t gid : {10, 11, 12}) {
    auto g = group(gid, 1, static_cast<int64_t>(gid - 10) * 4);  // versions 0, 4, 8
    ASSERT_TRUE(rb.open_group(g, 10s));
    rb.add_result(result_for(g[0], 1.0));
  }
  std::vector<ScoredGroup> out;
  ASSERT_EQ(rb.take_ready(out, 10, 10, 6, 0ms), 2u);  // lag 10 > 6 dropped; lags 6 and 2 kept
  EXPECT_EQ(out[0].policy_version, 4);                // oldest version first
  EXPECT_EQ(out[1].policy_version, 8);
  EXPECT_EQ(rb.stats().dropped_stale, 1u);
}

// Every result add_result() sees leaves a note for the live status (joined or orphan; a
// duplicate does not), read with a cursor; the ring keeps the newest kResultNotes and
// counts the ones overwritten unread.
TEST_F(ReplayBufferTest, ResultNotesTellTheLiveStatusEachResultOnce) {
  ReplayBuffer rb = ReplayBuffer::create(name, ReplayConfig{4, 64 * 1024, 512});
  const auto g = group(1, 2, 0);
  ASSERT_TRUE(rb.open_group(g, 10s));
  uint64_t cursor = 0, missed = 0;
  EXPECT_TRUE(rb.recent_results(&cursor, &missed).empty());
  Result a = result_for(g[0], 1.5);
  a.evaluator_id = 2;
  Result b = result_for(g[1], 0);
  b.verdict = Verdict::runtime_error;
  b.cause = Cause::environment;
  b.reward = -3;
  EXPECT_TRUE(rb.add_result(a));
  EXPECT_FALSE(rb.add_result(a));                                 // duplicate: no note
  EXPECT_FALSE(rb.add_result(result_for(group(9, 1, 0)[0], 2)));  // orphan: noted, not joined
  EXPECT_TRUE(rb.add_result(b));
  auto notes = rb.recent_results(&cursor, &missed);
  ASSERT_EQ(notes.size(), 3u);
  EXPECT_EQ(notes[0].candidate_id, g[0].id);
  EXPECT_EQ(notes[0].verdict, Verdict::ok);
  EXPECT_DOUBLE_EQ(notes[0].speedup, 1.5);
  EXPECT_DOUBLE_EQ(notes[0].reward, 0.5);
  EXPECT_EQ(notes[0].evaluator_id, 2);
  EXPECT_TRUE(notes[0].joined);
  EXPECT_EQ(notes[1].candidate_id, 900u);
  EXPECT_FALSE(notes[1].joined);
  EXPECT_EQ(notes[2].verdict, Verdict::runtime_error);
  EXPECT_EQ(notes[2].cause, Cause::environment);
  EXPECT_DOUBLE_EQ(notes[2].reward, -3);
  EXPECT_EQ(cursor, 3u);
  EXPECT_TRUE(rb.recent_results(&cursor, &missed).empty()) << "each note is read once";
  EXPECT_EQ(missed, 0u);
  // A reader that falls behind by more than the ring gets the newest kResultNotes.
  const uint64_t n = ReplayBuffer::kResultNotes + 5;
  for (uint64_t i = 0; i < n; ++i) {
    Result o = result_for(group(9, 1, 0)[0], 1);
    o.candidate_id = 10000 + i;
    rb.add_result(o);
  }
  notes = rb.recent_results(&cursor, &missed);
  ASSERT_EQ(notes.size(), ReplayBuffer::kResultNotes);
  EXPECT_EQ(missed, 5u);
  EXPECT_EQ(notes.front().candidate_id, 10005u);
  EXPECT_EQ(notes.back().candidate_id, 10000 + n - 1);
}

TEST_F(ReplayBufferTest, FullBufferEvictsTheOldestPolicyVersion) {
  ReplayBuffer rb = ReplayBuffer::create(name, ReplayConfig{2, 64 * 1024, 512});
  ASSERT_TRUE(rb.open_group(group(1, 2, 3), 10s));
  ASSERT_TRUE(rb.open_group(group(2, 2, 1), 10s));
  ASSERT_TRUE(rb.open_group(group(3, 2, 4), 10s));  // evicts group 2 (version 1)
  EXPECT_EQ(rb.stats().evicted, 1u);
  EXPECT_FALSE(rb.add_result(result_for(group(2, 2, 1)[0], 1.0)));
  EXPECT_TRUE(rb.add_result(result_for(group(1, 2, 3)[0], 1.0)));
  EXPECT_TRUE(rb.add_result(result_for(group(3, 2, 4)[1], 1.0)));
  EXPECT_FALSE(rb.add_result(result_for(group(3, 2, 4)[1], 1.0)));
  EXPECT_EQ(rb.stats().results_duplicate, 1u);
  EXPECT_THROW(rb.open_group(std::vector<Candidate>(70, group(4, 1, 1)[0]), 1s), kf::Error);
  auto too_big = group(5, 1, 1);
  too_big[0].source.assign(70000, 's');
  EXPECT_THROW(rb.open_group(too_big, 1s), kf::Error);
}

// Evaluators are other processes: each writes its results into the group itself, and the
// group is ready for a learner waiting in take_ready as soon as the last one is in.
TEST_F(ReplayBufferTest, EvaluatorProcessesWriteResultsIntoTheGroup) {
  ReplayBuffer rb = ReplayBuffer::create(name, ReplayConfig{8, 64 * 1024, 512});
  auto g = group(7, 3, 2);
  ASSERT_TRUE(rb.open_group(g, 60s));
  std::vector<pid_t> evaluators;
  for (const auto& c : g)
    evaluators.push_back(spawn([&] {
      ReplayBuffer mine = ReplayBuffer::attach(name);
      return mine.add_result(result_for(c, 1.5)) ? 0 : 1;
    }));
  std::vector<ScoredGroup> out;
  ASSERT_EQ(rb.take_ready(out, 1, 2, 1, 10s), 1u) << "woken when the last result is in, long before the deadline";
  for (pid_t p : evaluators) EXPECT_EQ(wait_exit(p), 0);
  EXPECT_FALSE(out[0].deadline_hit);
  EXPECT_EQ(out[0].missing, (std::vector<uint8_t>{0, 0, 0}));
  for (const auto& r : out[0].results) EXPECT_DOUBLE_EQ(r.speedup, 1.5);
  EXPECT_EQ(rb.stats().results_joined, 3u);
}

TEST_F(ReplayBufferTest, LearnerKilledWhileTakingLosesOnlyThoseGroups) {
  ReplayBuffer rb = ReplayBuffer::create(name, ReplayConfig{8, 64 * 1024, 512});
  for (uint64_t gid : {1, 2}) {
    auto g = group(gid, 1, static_cast<int64_t>(gid));
    rb.open_group(g, 10s);
    rb.add_result(result_for(g[0], 1.0));
  }
  Staller st;
  pid_t learner = spawn([&] {
    ReplayBuffer mine = ReplayBuffer::attach(name);
    st.arm("replay.take_mid");
    std::vector<ScoredGroup> out;
    mine.take_ready(out, 1, 1, 10, 1s);  // takes group 1, dies copying it
    return 0;
  });
  ASSERT_TRUE(st.wait_stalled());
  kill_and_wait(learner);
  EXPECT_EQ(rb.reap(), 1u);
  EXPECT_EQ(rb.stats().lost_taking, 1u);
  std::vector<ScoredGroup> out;
  ASSERT_EQ(rb.take_ready(out, 4, 2, 10, 0ms), 1u);
  EXPECT_EQ(out[0].group_id, 2u);
}

TEST_F(ReplayBufferTest, ActorKilledMidFillAndEvaluatorKilledHoldingTheLock) {
  ReplayBuffer rb = ReplayBuffer::create(name, ReplayConfig{4, 64 * 1024, 512});
  auto g = group(1, 2, 1);
  ASSERT_TRUE(rb.open_group(g, 10s));
  Staller fill, res;
  pid_t actor = spawn([&] {
    ReplayBuffer mine = ReplayBuffer::attach(name);
    fill.arm("replay.fill_mid");
    mine.open_group(group(2, 2, 1), 10s);
    return 0;
  });
  ASSERT_TRUE(fill.wait_stalled());
  kill_and_wait(actor);
  pid_t evaluator = spawn([&] {
    ReplayBuffer mine = ReplayBuffer::attach(name);
    res.arm("replay.result_locked");
    mine.add_result(result_for(g[0], 9.0));  // dies with the mutex held, result half-joined
    return 0;
  });
  ASSERT_TRUE(res.wait_stalled());
  kill_and_wait(evaluator);
  EXPECT_TRUE(rb.add_result(result_for(g[1], 2.0)));  // recovers the lock
  EXPECT_TRUE(rb.add_result(result_for(g[0], 1.0)));  // the half-joined result never counted
  EXPECT_EQ(rb.reap(), 1u);                           // the dead actor's half-filled group
  ReplayStats s = rb.stats();
  EXPECT_EQ(s.recoveries, 1u);
  EXPECT_EQ(s.lost_filling, 1u);
  std::vector<ScoredGroup> out;
  ASSERT_EQ(rb.take_ready(out, 4, 1, 10, 0ms), 1u);
  EXPECT_DOUBLE_EQ(out[0].results[0].speedup, 1.0);
  EXPECT_DOUBLE_EQ(out[0].results[1].speedup, 2.0);
}

TEST_F(ReplayBufferTest, PersistenceRoundTrip) {
  const std::string file = dir + "/replay.bin";
  {
    ReplayBuffer rb = ReplayBuffer::create(name, ReplayConfig{8, 64 * 1024, 512});
    auto a = group(1, 3, 4), b = group(2, 2, 5);
    rb.open_group(a, 60s);
    rb.open_group(b, 60s);
    rb.add_result(result_for(a[0], 1.25));
    rb.add_result(result_for(a[2], 3.5));
    rb.add_result(result_for(b[0], 2.0));
    rb.add_result(result_for(b[1], 0.5));
    rb.save(file);
  }
  ShmSegment::remove(name);
  ReplayBuffer rb = ReplayBuffer::create(name, ReplayConfig{8, 64 * 1024, 512});
  EXPECT_EQ(rb.load(file), 2u);
  std::vector<ScoredGroup> out;
  ASSERT_EQ(rb.take_ready(out, 4, 5, 10, 0ms), 1u);  // b is complete
  EXPECT_EQ(out[0].group_id, 2u);
  EXPECT_DOUBLE_EQ(out[0].results[1].speedup, 0.5);
  auto a = group(1, 3, 4);
  EXPECT_TRUE(rb.add_result(result_for(a[1], 2.0)));  // the restored group keeps joining
  ASSERT_EQ(rb.take_ready(out, 4, 5, 10, 0ms), 1u);
  const ScoredGroup& ga = out[1];
  EXPECT_EQ(ga.prompt_tokens, a[0].prompt_tokens);
  EXPECT_EQ(ga.candidates[2].source, a[2].source);
  EXPECT_DOUBLE_EQ(ga.results[0].speedup, 1.25);
  EXPECT_DOUBLE_EQ(ga.results[1].speedup, 2.0);
  EXPECT_DOUBLE_EQ(ga.results[2].speedup, 3.5);
}

TEST_F(ReplayBufferTest, CorruptOrForeignFileIsRejectedAndNothingIsLost) {
  const std::string file = dir + "/replay.bin";
  ReplayBuffer rb = ReplayBuffer::create(name, ReplayConfig{8, 64 * 1024, 512});
  rb.open_group(group(1, 2, 1), 60s);
  rb.save(file);
  std::string bytes = kf::read_file(file);
  auto expect_error = [&](const std::string& content, const std::string& field) {
    std::ofstream(file, std::ios::binary | std::ios::trunc) << content;
    try {
      rb.load(file);
      FAIL() << "accepted a bad file (" << field << ")";
    } catch (const kf::Error& e) {
      std::string what = e.what();
      EXPECT_NE(what.find(file), std::string::npos) << what;
      EXPECT_NE(what.find(field), std::string::npos) << what;
    }
  };
  std::string flipped = bytes;
  flipped[flipped.size() - 5] ^= 0x40;
  expect_error(flipped, "hash");
  std::string wrong_version = bytes;
  wrong_version[8] = 9;
  expect_error(wrong_version, "version");
  expect_error(bytes.substr(0, bytes.size() - 10), "group");
  expect_error("not a replay file at all", "magic");
  EXPECT_EQ(rb.stats().open_now, 1u) << "a failed load must not change what is stored";
}
