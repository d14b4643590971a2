// The work seam over shared memory (shm_groups, shm_candidates, shm_ready_groups,
// kernel_entry_of): an actor's group goes through the candidate queue to evaluators and back to
// the learner; known results are not queued; a full queue at shutdown counts the rest lost;
// completion enters kernels by the one rule; claims given back, completed twice or left by a
// dead evaluator are settled exactly once.
#include <gtest/gtest.h>

#include <chrono>
#include <set>

#include "kf/common/error.h"
#include "kf/replay/replay.h"
#include "proc_util.h"
#include "queue.h"

using namespace kf::replay;
using namespace kf::replay::test;
using namespace std::chrono_literals;

namespace {

struct ReplaySeamTest : ::testing::Test {
  std::string run = unique_name(::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::unique_ptr<RunShm> shm;
  void open(uint32_t queue_capacity = 64, uint32_t groups = 8) {
    RunShmConfig cfg;
    cfg.candidates.capacity = queue_capacity;
    cfg.replay = ReplayConfig{groups, 256 * 1024, 512};
    cfg.kernels = KernelDbConfig{64, 4096, 8};
    cfg.snapshot = SnapshotConfig{1 << 16};
    shm = RunShm::create(run, cfg);
  }
  void TearDown() override {
    if (shm) shm->shutdown();
    RunShm::remove(run);
  }
};

GroupPublish group(uint64_t gid, uint32_t n, const std::string& task = "t", int64_t version = 0) {
  GroupPublish g;
  g.deadline = 60s;
  for (uint32_t i = 0; i < n; ++i) {
    Candidate c;
    c.id = gid * 100 + i;
    c.task = task;
    c.group_id = gid;
    c.index_in_group = i;
    c.policy_version = version;
    c.prompt_tokens = {1, 2, 3};
    c.completion_tokens = {4, 5};
    c.behaviour_logprobs = {-0.1f, -0.2f};
    c.source = "kernel " + std::to_string(c.id);
    g.candidates.push_back(c);
  }
  return g;
}

Result result_of(const Candidate& c, Verdict v = Verdict::ok, double speedup = 1.5) {
  Result r;
  r.candidate_id = c.id;
  r.group_id = c.group_id;
  r.index_in_group = c.index_in_group;
  r.verdict = v;
  r.speedup = speedup;
  r.reward = speedup - 1;
  return r;
}

const std::function<bool()> kGoOn = [] { return true; };

}  // namespace

// Actor -> evaluator -> learner: the group is opened with one known result, the other
// members are claimed (read from the group), completed, and the learner takes the whole group.
TEST_F(ReplaySeamTest, PublishClaimCompleteTakeRoundTrip) {
  open();
  auto sink = shm_groups(*shm, "actor 0");
  auto source = shm_candidates(*shm, "evaluator 0");
  auto ready = shm_ready_groups(shm->replay(), 200ms);
  GroupPublish g = group(7, 3);
  g.known.push_back(result_of(g.candidates[1], Verdict::compile_error, 0));
  std::size_t unqueued = 99;
  ASSERT_EQ(sink->publish(g, 1s, kGoOn, &unqueued), PublishOutcome::published);
  EXPECT_EQ(unqueued, 0u);
  EXPECT_TRUE(ready->take({0, 0, 1, 4, 0, 100}).empty()) << "two members are still being scored";

  std::vector<Claim> claims;
  ASSERT_EQ(source->claim(claims, 8, 1s), 2u);
  std::set<uint64_t> ids;
  for (const Claim& c : claims) {
    ids.insert(c.candidate.id);
    EXPECT_EQ(c.deliveries, 1u);
    EXPECT_EQ(c.candidate.source, "kernel " + std::to_string(c.candidate.id)) << "read from its group";
    EXPECT_EQ(c.candidate.prompt_tokens, (std::vector<int32_t>{1, 2, 3}));
    EXPECT_GT(c.candidate.t_pushed_ns, 0);
  }
  EXPECT_EQ(ids, (std::set<uint64_t>{700, 702})) << "the known result's member is not queued";
  for (const Claim& c : claims) {
    const Completion done = source->complete(c, result_of(c.candidate));
    EXPECT_TRUE(done.joined);
    EXPECT_TRUE(done.first);
  }
  const auto got = ready->take({0, 0, 1, 4, 0, 100});
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].group_id, 7u);
  EXPECT_EQ(got[0].missing, (std::vector<uint8_t>{0, 0, 0}));
  EXPECT_EQ(got[0].results[1].verdict, Verdict::compile_error);
  EXPECT_EQ(got[0].results[2].verdict, Verdict::ok);
  EXPECT_FALSE(got[0].deadline_hit);
  const QueueLedger l = shm->candidate_ledger();
  EXPECT_EQ(l.created, 2u);
  EXPECT_EQ(l.scored, 2u);
  EXPECT_TRUE(l.balanced());
  EXPECT_EQ(source->unresolved_gone() + source->unresolved_scored(), 0u);
  EXPECT_EQ(source->where(), "candidate queue of run " + run);
}

// A group whose results are all known goes to the learner without touching the queue.
TEST_F(ReplaySeamTest, KnownResultsAreNotQueued) {
  open();
  auto sink = shm_groups(*shm, "actor 0");
  GroupPublish g = group(3, 2);
  for (const auto& c : g.candidates) g.known.push_back(result_of(c, Verdict::compile_error, 0));
  ASSERT_EQ(sink->publish(g, 1s, kGoOn), PublishOutcome::published);
  EXPECT_EQ(shm->candidate_ledger().created, 0u);
  auto ready = shm_ready_groups(shm->replay(), 200ms);
  const auto got = ready->take({0, 0, 1, 4, 0, 100});
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].missing, (std::vector<uint8_t>{0, 0}));
}

// The evaluators' queue stays full while the actor is told to stop: the members not queued
// are counted lost, so the group is ready once the queued ones are scored, long before its
// deadline.
TEST_F(ReplaySeamTest, FullQueueWhileStoppingReturnsStoppedAndMarksTheRestLost) {
  open(2);
  auto sink = shm_groups(*shm, "actor 0");
  int asked = 0;
  std::size_t unqueued = 0;
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(sink->publish(
                group(5, 4), 1s, [&] { return ++asked < 3; }, &unqueued),
            PublishOutcome::stopped);
  EXPECT_EQ(asked, 3) << "keep_going is asked between 100 ms tries";
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 250ms);
  EXPECT_EQ(unqueued, 2u);
  EXPECT_EQ(shm->candidate_ledger().created, 2u);
  EXPECT_EQ(shm->replay().stats().candidates_lost, 2u);

  auto source = shm_candidates(*shm, "evaluator 0");
  std::vector<Claim> claims;
  ASSERT_EQ(source->claim(claims, 8, 1s), 2u);
  for (const Claim& c : claims) source->complete(c, result_of(c.candidate));
  auto ready = shm_ready_groups(shm->replay(), 1s);
  const auto got = ready->take({0, 0, 1, 4, 0, 100});
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].missing, (std::vector<uint8_t>{0, 0, 1, 1}));
  EXPECT_FALSE(got[0].deadline_hit) << "ready by the losses, not by the deadline (60 s)";
}

// No room in the replay (its one slot held by an actor frozen mid-fill): `full`, and nothing
// is queued. A malformed group is a kf::Error.
TEST_F(ReplaySeamTest, FullReplayIsReportedFullAndNothingIsQueued) {
  open(64, 1);
  Staller st;
  const pid_t p = spawn([&] {
    auto mine = RunShm::attach(run);
    st.arm("replay.fill_mid");
    shm_groups(*mine, "actor 1")->publish(group(1, 1), 1s, kGoOn);
    return 0;
  });
  ASSERT_TRUE(st.wait_stalled());
  auto sink = shm_groups(*shm, "actor 0");
  EXPECT_EQ(sink->publish(group(2, 2), 0ms, kGoOn), PublishOutcome::full);
  EXPECT_EQ(shm->candidate_ledger().created, 0u);
  EXPECT_EQ(shm->replay().stats().dropped_full, 1u);
  kill_and_wait(p);
  GroupPublish bad = group(3, 1);
  bad.candidates[0].index_in_group = 5;
  EXPECT_THROW(sink->publish(bad, 0ms, kGoOn), kf::Error);
}

// complete() enters the kernel by kernel_entry_of: the speedup of an ok result, 1.0 for a
// degenerate task, nothing for a failed verdict.
TEST_F(ReplaySeamTest, CompleteInsertsTheKernelByTheOneRule) {
  open();
  auto sink = shm_groups(*shm, "actor 0");
  auto source = shm_candidates(*shm, "evaluator 0");
  ASSERT_EQ(sink->publish(group(1, 1, "fast"), 1s, kGoOn), PublishOutcome::published);
  ASSERT_EQ(sink->publish(group(2, 1, "degenerate"), 1s, kGoOn), PublishOutcome::published);
  ASSERT_EQ(sink->publish(group(3, 1, "wrong"), 1s, kGoOn), PublishOutcome::published);
  std::vector<Claim> claims;
  ASSERT_EQ(source->claim(claims, 8, 1s), 3u);
  for (const Claim& c : claims) {
    Result r = result_of(c.candidate, Verdict::ok, 2.5);
    if (c.candidate.task == "degenerate") r.task_degenerate = true;
    if (c.candidate.task == "wrong") r.verdict = Verdict::incorrect;
    const Completion done = source->complete(c, r);
    EXPECT_EQ(done.kernel_inserted, c.candidate.task != "wrong") << c.candidate.task;
  }
  ASSERT_TRUE(shm->kernels().best("fast"));
  EXPECT_DOUBLE_EQ(shm->kernels().best("fast")->speedup, 2.5);
  EXPECT_EQ(shm->kernels().best("fast")->source, "kernel 100");
  ASSERT_TRUE(shm->kernels().best("degenerate"));
  EXPECT_DOUBLE_EQ(shm->kernels().best("degenerate")->speedup, 1.0);
  EXPECT_FALSE(shm->kernels().best("wrong"));

  Candidate c = group(4, 1).candidates[0];
  c.policy_version = 12;
  auto e = kernel_entry_of(c, result_of(c, Verdict::ok, 3.0));
  ASSERT_TRUE(e);
  EXPECT_EQ(e->task, "t");
  EXPECT_EQ(e->policy_version, 12);
  EXPECT_DOUBLE_EQ(e->speedup, 3.0);
  EXPECT_FALSE(kernel_entry_of(c, result_of(c, Verdict::rejected_cheat, 3.0)));
  c.source.clear();
  EXPECT_FALSE(kernel_entry_of(c, result_of(c))) << "no source, no kernel";
}

// A claim given back goes to the next claim, unscored and not counted as a delivery.
TEST_F(ReplaySeamTest, ClaimGivenBackIsClaimedAgain) {
  open();
  auto sink = shm_groups(*shm, "actor 0");
  auto source = shm_candidates(*shm, "evaluator 0");
  ASSERT_EQ(sink->publish(group(4, 1), 1s, kGoOn), PublishOutcome::published);
  std::vector<Claim> first;
  ASSERT_EQ(source->claim(first, 1, 1s), 1u);
  source->give_back(first[0]);
  source->give_back(first[0]);  // settled already: logged, nothing changes
  EXPECT_EQ(shm->candidate_ledger().requeued, 1u);
  std::vector<Claim> again;
  ASSERT_EQ(source->claim(again, 1, 1s), 1u);
  EXPECT_EQ(again[0].candidate.id, first[0].candidate.id);
  EXPECT_EQ(again[0].deliveries, 1u);
  EXPECT_TRUE(source->complete(again[0], result_of(again[0].candidate)).joined);
  const QueueLedger l = shm->candidate_ledger();
  EXPECT_EQ(l.scored, 1u);
  EXPECT_TRUE(l.balanced());
}

// Two claims of one candidate (its handle was queued twice): the first result joins, the
// second is reported not joined and not first; both claims are acknowledged once.
TEST_F(ReplaySeamTest, SecondCompleteOfACandidateIsNotJoined) {
  open();
  auto sink = shm_groups(*shm, "actor 0");
  auto source = shm_candidates(*shm, "evaluator 0");
  const GroupPublish g = group(6, 1);
  ASSERT_EQ(sink->publish(g, 1s, kGoOn), PublishOutcome::published);
  CandidateRef again = ref_of(g.candidates[0]);
  ASSERT_TRUE(shm->candidates().push(again, 1s));
  std::vector<Claim> claims;
  ASSERT_EQ(source->claim(claims, 2, 1s), 2u);
  const Completion a = source->complete(claims[0], result_of(claims[0].candidate));
  const Completion b = source->complete(claims[1], result_of(claims[1].candidate));
  EXPECT_TRUE(a.joined && a.first);
  EXPECT_FALSE(b.joined);
  EXPECT_FALSE(b.first) << "another result counts";
  const Completion c = source->complete(claims[1], result_of(claims[1].candidate));  // settled already
  EXPECT_FALSE(c.joined);
  const QueueLedger l = shm->candidate_ledger();
  EXPECT_EQ(l.scored, 2u);
  EXPECT_EQ(l.in_flight + l.queued, 0u);
  EXPECT_EQ(shm->replay().stats().results_duplicate, 2u);
}

// An evaluator killed holding a claim: the next source reaps it at construction and the
// candidate comes back, counted as a second delivery.
TEST_F(ReplaySeamTest, ClaimOfADeadEvaluatorComesBackAsASecondDelivery) {
  open();
  auto sink = shm_groups(*shm, "actor 0");
  ASSERT_EQ(sink->publish(group(8, 1), 1s, kGoOn), PublishOutcome::published);
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t p = spawn([&] {
    auto mine = RunShm::attach(run);
    auto src = shm_candidates(*mine, "evaluator 1");
    std::vector<Claim> got;
    if (src->claim(got, 1, 1s) != 1) return 1;
    char c = 'c';
    (void)!::write(fds[1], &c, 1);
    for (;;) ::pause();
    return 0;
  });
  char c = 0;
  ASSERT_EQ(::read(fds[0], &c, 1), 1);
  kill_and_wait(p);
  ::close(fds[0]);
  ::close(fds[1]);
  auto source = shm_candidates(*shm, "evaluator 0");  // reaps the dead claim
  std::vector<Claim> claims;
  ASSERT_EQ(source->claim(claims, 1, 1s), 1u);
  EXPECT_EQ(claims[0].candidate.id, 800u);
  EXPECT_EQ(claims[0].deliveries, 2u);
  EXPECT_TRUE(source->complete(claims[0], result_of(claims[0].candidate)).joined);
}

// The learner's take drops groups lagging more than max_lag behind and counts them.
TEST_F(ReplaySeamTest, StaleGroupsAreDroppedAndCounted) {
  open();
  auto sink = shm_groups(*shm, "actor 0");
  GroupPublish g = group(9, 1, "t", 1);
  g.known.push_back(result_of(g.candidates[0]));
  ASSERT_EQ(sink->publish(g, 1s, kGoOn), PublishOutcome::published);
  auto ready = shm_ready_groups(shm->replay(), 50ms);
  EXPECT_TRUE(ready->take({0, 0, 1, 4, 10, 2}).empty());
  EXPECT_EQ(ready->dropped_stale(), 1u);
  EXPECT_TRUE(ready->take({0, 0, 1, 0, 10, 2}).empty()) << "no share, no wait";
}

// A source destroyed while it holds claims gives them back: another evaluator scores them.
TEST_F(ReplaySeamTest, ClaimsHeldWhenTheSourceGoesAreGivenBack) {
  open();
  auto sink = shm_groups(*shm, "actor 0");
  ASSERT_EQ(sink->publish(group(2, 2), 1s, kGoOn), PublishOutcome::published);
  {
    auto source = shm_candidates(*shm, "evaluator 0");
    std::vector<Claim> claims;
    ASSERT_EQ(source->claim(claims, 2, 1s), 2u);
    source->complete(claims[0], result_of(claims[0].candidate));
  }
  EXPECT_EQ(shm->candidate_ledger().queued, 1u);
  auto next = shm_candidates(*shm, "evaluator 1");
  std::vector<Claim> claims;
  ASSERT_EQ(next->claim(claims, 2, 1s), 1u);
  EXPECT_EQ(claims[0].candidate.id, 201u);
}
