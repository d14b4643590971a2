// Candidate claims (ShmQueue take/release as a claim): a consumer killed while it holds
// records gives them back to the queue (up to max_claims), the ledger adds up exactly at
// every moment, and a reaper killed mid-requeue leaves the count exact. Real processes,
// real SIGKILLs.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <set>
#include <thread>

#include "kf/replay/replay.h"
#include "proc_util.h"
#include "queue.h"

using namespace kf::replay;
using namespace kf::replay::test;
using namespace std::chrono_literals;

namespace {
struct ClaimFixture : ::testing::Test {
  std::string name = unique_name(::testing::UnitTest::GetInstance()->current_test_info()->name());
  void TearDown() override { ShmSegment::remove(name); }
};
using ReplayClaimTest = ClaimFixture;

QueueConfig claims_cfg(uint32_t max_claims) {
  QueueConfig c{16, 64, std::chrono::milliseconds(100000)};
  c.max_claims = max_claims;
  return c;
}

// The run's candidate queue as a plain ShmQueue (slot handles are valid in any mapping).
ShmQueue cand_queue(const std::string& run) { return ShmQueue::attach(RunShm::segment_name(run, "cand"), 1s); }

void push_ids(ShmQueue& q, uint64_t from, uint64_t n) {
  for (uint64_t id = from; id < from + n; ++id) ASSERT_TRUE(q.push(&id, sizeof id, id, 1s));
}

// A child that takes up to n records, reports how many it holds, then waits to be killed.
pid_t take_and_hold(const std::string& name, std::size_t n, int fd) {
  return spawn([&name, n, fd] {
    ShmQueue mine = ShmQueue::attach(name);
    std::vector<ShmQueue::Slot> s(n);
    const std::size_t k = mine.take(s.data(), n, 1s);
    char c = static_cast<char>(k);
    (void)!::write(fd, &c, 1);
    for (;;) ::pause();
    return 0;
  });
}

std::size_t held_by_child(const std::string& name, std::size_t n) {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  pid_t p = take_and_hold(name, n, fds[1]);
  char c = 0;
  EXPECT_EQ(::read(fds[0], &c, 1), 1);
  kill_and_wait(p);
  ::close(fds[0]);
  ::close(fds[1]);
  return static_cast<std::size_t>(c);
}
}  // namespace

TEST_F(ReplayClaimTest, DeadConsumersClaimsGoBackToTheQueueAndAreScoredOnce) {
  ShmQueue q = ShmQueue::create(name, claims_cfg(3));
  push_ids(q, 1, 10);
  ASSERT_EQ(held_by_child(name, 4), 4u);
  QueueLedger l = q.ledger();
  EXPECT_EQ(l.in_flight, 4u);  // the dead child's claims until someone reaps
  EXPECT_EQ(l.queued, 6u);
  EXPECT_TRUE(l.balanced());
  EXPECT_EQ(q.reap(), 4u);
  l = q.ledger();
  EXPECT_EQ(l.requeued, 4u);
  EXPECT_EQ(l.queued, 10u);
  EXPECT_EQ(l.in_flight, 0u);
  EXPECT_EQ(l.lost(), 0u);
  EXPECT_TRUE(l.balanced());
  // Everything is delivered exactly once to a consumer that acknowledges.
  std::vector<ShmQueue::Slot> s(16);
  std::multiset<uint64_t> got;
  std::size_t k;
  while ((k = q.take(s.data(), s.size(), 0ms)) > 0) {
    for (std::size_t i = 0; i < k; ++i) got.insert(s[i].tag);
    q.release(s.data(), k);
  }
  EXPECT_EQ(got.size(), 10u);
  for (uint64_t id = 1; id <= 10; ++id) EXPECT_EQ(got.count(id), 1u) << id;
  l = q.ledger();
  EXPECT_EQ(l.created, 10u);
  EXPECT_EQ(l.scored, 10u);
  EXPECT_TRUE(l.balanced());
}

TEST_F(ReplayClaimTest, RecordThatKillsEveryConsumerIsCountedLostAfterMaxClaims) {
  ShmQueue q = ShmQueue::create(name, claims_cfg(2));
  push_ids(q, 42, 1);
  ASSERT_EQ(held_by_child(name, 1), 1u);
  EXPECT_EQ(q.reap(), 1u);  // claim 1 of 2: back to the queue
  EXPECT_EQ(q.ledger().queued, 1u);
  ASSERT_EQ(held_by_child(name, 1), 1u);
  EXPECT_EQ(q.reap(), 1u);  // claim 2 of 2: lost
  QueueLedger l = q.ledger();
  EXPECT_EQ(l.requeued, 1u);
  EXPECT_EQ(l.lost_consumer, 1u);
  EXPECT_EQ(l.queued + l.in_flight, 0u);
  EXPECT_TRUE(l.balanced());
  uint64_t cursor = 0;
  EXPECT_EQ(q.lost_tags(&cursor), std::vector<uint64_t>{42});
}

TEST_F(ReplayClaimTest, WithoutMaxClaimsADeadConsumersRecordsAreCountedLost) {
  ShmQueue q = ShmQueue::create(name, claims_cfg(0));
  push_ids(q, 1, 3);
  ASSERT_EQ(held_by_child(name, 2), 2u);
  EXPECT_EQ(q.reap(), 2u);
  QueueLedger l = q.ledger();
  EXPECT_EQ(l.lost_consumer, 2u);
  EXPECT_EQ(l.requeued, 0u);
  EXPECT_EQ(l.queued, 1u);
  EXPECT_TRUE(l.balanced());
}

TEST_F(ReplayClaimTest, GiveBackAndDropAreCountedAndBalance) {
  ShmQueue q = ShmQueue::create(name, claims_cfg(3));
  push_ids(q, 1, 4);
  std::vector<ShmQueue::Slot> s(4);
  ASSERT_EQ(q.take(s.data(), 4, 0ms), 4u);
  q.give_back(&s[0], 2);  // ids 1, 2 back at the tail
  q.drop(&s[2], 1);       // id 3: result could not be stored
  q.release(&s[3], 1);    // id 4: scored
  QueueLedger l = q.ledger();
  EXPECT_EQ(l.requeued, 2u);
  EXPECT_EQ(l.dropped, 1u);
  EXPECT_EQ(l.scored, 1u);
  EXPECT_EQ(l.queued, 2u);
  EXPECT_TRUE(l.balanced());
  ASSERT_EQ(q.take(s.data(), 4, 0ms), 2u);
  EXPECT_EQ(s[0].tag, 1u);
  EXPECT_EQ(s[1].tag, 2u);
  q.release(s.data(), 2);
  l = q.ledger();
  EXPECT_EQ(l.created, l.scored + l.lost());
  EXPECT_EQ(l.scored, 3u);
}

TEST_F(ReplayClaimTest, ReaperKilledMidRequeueKeepsTheRecordAndTheCountExact) {
  ShmQueue q = ShmQueue::create(name, claims_cfg(3));
  push_ids(q, 1, 3);
  ASSERT_EQ(held_by_child(name, 1), 1u);
  Staller reaper;
  pid_t r = spawn([&] {
    ShmQueue mine = ShmQueue::attach(name);
    reaper.arm("queue.requeue_journaled");
    mine.reap();  // dies after journaling the requeue, holding the lock
    return 0;
  });
  ASSERT_TRUE(reaper.wait_stalled());
  kill_and_wait(r);
  EXPECT_EQ(q.reap(), 0u);  // lock recovery redoes the requeue
  QueueLedger l = q.ledger();
  EXPECT_EQ(l.requeued, 1u);
  EXPECT_EQ(l.queued, 3u);
  EXPECT_EQ(l.in_flight, 0u);
  EXPECT_TRUE(l.balanced());
  EXPECT_EQ(q.stats().recoveries, 1u);
  std::vector<ShmQueue::Slot> s(4);
  ASSERT_EQ(q.take(s.data(), 4, 0ms), 3u);
  std::set<uint64_t> ids{s[0].tag, s[1].tag, s[2].tag};
  EXPECT_EQ(ids, (std::set<uint64_t>{1, 2, 3}));
}

// Many consumers killed at random while they hold claims: after the survivors drain the
// queue, every record was acknowledged exactly once or counted lost, and the ledger
// balanced at every check in between.
TEST_F(ReplayClaimTest, RandomConsumerKillsLoseNothingAndBalanceExactly) {
  QueueConfig cfg{64, 64, std::chrono::milliseconds(20)};
  cfg.max_claims = 1000;
  ShmQueue q = ShmQueue::create(name, cfg);
  const uint64_t n = 800;
  auto consumer = [this] {
    return spawn([this] {
      ShmQueue mine = ShmQueue::attach(name);
      std::vector<ShmQueue::Slot> s(4);
      for (;;) {
        const std::size_t k = mine.take(s.data(), s.size(), 200ms);
        std::this_thread::sleep_for(std::chrono::microseconds(k ? 1000 : 0));  // "scoring", claims in hand
        mine.release(s.data(), k);
      }
      return 0;
    });
  };
  std::vector<pid_t> kids;
  for (int i = 0; i < 3; ++i) kids.push_back(consumer());
  std::mt19937 rng(7);
  uint64_t pushed = 0;
  int kills = 0;
  // Until all are pushed and scored AND 40 kills happened (consumers can drain the queue
  // before the 40th kill on a fast machine).
  while (pushed < n || kills < 40 || q.ledger().queued + q.ledger().in_flight > 0) {
    for (int i = 0; i < 8 && pushed < n; ++i, ++pushed) {
      const uint64_t id = pushed + 1;
      ASSERT_TRUE(q.push(&id, sizeof id, id, 5s));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 5));
    if (kills < 40 && rng() % 2 == 0) {
      const std::size_t v = rng() % kids.size();
      kill_and_wait(kids[v]);
      ++kills;
      kids[v] = consumer();
    }
    const QueueLedger l = q.ledger();
    ASSERT_TRUE(l.balanced()) << "created " << l.created << " scored " << l.scored << " lost " << l.lost() << " queued "
                              << l.queued << " in flight " << l.in_flight;
    if (pushed >= n) q.reap();
  }
  for (pid_t p : kids) kill_and_wait(p);
  q.reap();
  const QueueLedger l = q.ledger();
  EXPECT_EQ(kills, 40);
  EXPECT_EQ(l.created, n);
  EXPECT_EQ(l.lost(), 0u);
  EXPECT_EQ(l.queued + l.in_flight, 0u);
  // A consumer killed between its "scoring" and release() is re-scored: acknowledged once.
  EXPECT_EQ(l.scored, n);
  EXPECT_GT(l.requeued, 0u);
}

TEST(ReplayExcludedGroupTest, AGroupWithAnExcludedResultIsLeftOutOfTraining) {
  ScoredGroup g;
  g.task = "041_mse_loss";
  g.results.resize(3);
  g.missing = {0, 0, 1};
  EXPECT_FALSE(excluded_from_training(g));
  g.results[1].task_degenerate = true;  // flagged, but the evaluator was told to train on it
  EXPECT_FALSE(excluded_from_training(g));
  g.results[2].exclude_from_training = true;  // a missing result does not count
  EXPECT_FALSE(excluded_from_training(g));
  g.results[0].exclude_from_training = true;
  EXPECT_TRUE(excluded_from_training(g));
}

// The evaluator's protocol (EvaluatorService::step, the head's bridge): claim a handle,
// read the candidate from its group, write its result into the group's empty slot, then
// acknowledge the claim. An evaluator SIGKILLed between the write and the acknowledgement
// loses nothing: the claim goes back to the queue, the next evaluator finds the result
// already in the group and acknowledges it without scoring it again; the group holds the
// first result and the candidate is counted scored once.
TEST(ReplayResultPathTest, EvaluatorKilledAfterWritingItsResultLosesNothingAndCountsOnce) {
  const std::string run = unique_name("respath");
  auto shm = RunShm::create(run);
  std::vector<Candidate> g(2);
  for (uint32_t i = 0; i < 2; ++i) {
    g[i].id = 10 + i;
    g[i].task = "t";
    g[i].group_id = 5;
    g[i].index_in_group = i;
    g[i].prompt_tokens = {1, 2};
    g[i].completion_tokens = {3};
    g[i].behaviour_logprobs = {-0.5f};
    g[i].source = "k";
  }
  ASSERT_TRUE(shm->replay().open_group(g, 60s));
  for (const auto& c : g) ASSERT_TRUE(shm->candidates().push(ref_of(c), 1s));
  auto result = [](const Candidate& c, double reward) {
    Result r;
    r.candidate_id = c.id;
    r.group_id = c.group_id;
    r.index_in_group = c.index_in_group;
    r.verdict = Verdict::ok;
    r.reward = reward;
    return r;
  };
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t p = spawn([&] {
    auto mine = RunShm::attach(run);
    std::vector<Candidate> got;
    std::vector<ShmQueue::Slot> claims;
    if (mine->candidates().claim(got, claims, 1, 1s, "test evaluator") != 1) return 1;
    if (got[0].source != "k" || got[0].prompt_tokens != std::vector<int32_t>{1, 2}) return 3;  // read from its group
    if (!mine->replay().add_result(result(got[0], 1.5))) return 2;
    char c = 'w';
    (void)!::write(fds[1], &c, 1);
    for (;;) ::pause();  // killed before it acknowledges
    return 0;
  });
  char c = 0;
  ASSERT_EQ(::read(fds[0], &c, 1), 1);
  kill_and_wait(p);
  ::close(fds[0]);
  ::close(fds[1]);
  EXPECT_EQ(shm->candidate_ledger().in_flight, 1u);
  EXPECT_EQ(shm->reap(), 1u);  // the dead evaluator's claim goes back

  std::vector<Candidate> got;
  std::vector<ShmQueue::Slot> claims;
  Unresolved un;
  ASSERT_EQ(shm->candidates().claim(got, claims, 4, 1s, "test evaluator", &un), 1u)
      << "the candidate whose result is in its group is not handed out again";
  ASSERT_EQ(un.scored.size(), 1u);
  EXPECT_TRUE(un.gone.empty());
  int joined = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    joined += shm->replay().add_result(result(got[i], 2.5));
    cand_queue(run).release(&claims[i], 1);
  }
  EXPECT_EQ(joined, 1);
  const ReplayStats st = shm->replay().stats();
  EXPECT_EQ(st.results_joined, 2u);
  EXPECT_EQ(st.results_duplicate, 0u) << "nothing was scored twice";
  const QueueLedger l = shm->candidate_ledger();
  EXPECT_EQ(l.scored, 2u);
  EXPECT_EQ(l.lost(), 0u);
  EXPECT_EQ(l.requeued, 1u);
  EXPECT_TRUE(l.balanced());
  std::vector<ScoredGroup> ready;
  ASSERT_EQ(shm->replay().take_ready(ready, 4, 0, 100, 1s), 1u);
  ASSERT_EQ(ready[0].results.size(), 2u);
  EXPECT_EQ(ready[0].missing, (std::vector<uint8_t>{0, 0}));
  EXPECT_FALSE(ready[0].deadline_hit);
  // The killed evaluator's result stays; the first claim's candidate was either one.
  double rewards = ready[0].results[0].reward + ready[0].results[1].reward;
  EXPECT_DOUBLE_EQ(rewards, 1.5 + 2.5);
  uint64_t cursor = 0;
  EXPECT_EQ(shm->replay().recent_results(&cursor).size(), 2u) << "the live status sees each candidate once";
  shm->shutdown();
}

// The candidate queue carries handles; the candidate lives in its group. A handle whose
// group was evicted before anyone claimed it is settled at claim time: dropped (counted
// lost in the ledger), reported to the caller, counted by the replay, and never handed out.
TEST(ReplayResultPathTest, HandleOfAnEvictedGroupIsReportedLostAndCountedAndNeverHandedOut) {
  const std::string run = unique_name("gone");
  RunShmConfig cfg;
  cfg.replay.capacity = 1;  // the second group evicts the first
  auto shm = RunShm::create(run, cfg);
  auto group = [](uint64_t gid, uint64_t first_id, uint32_t n) {
    std::vector<Candidate> g(n);
    for (uint32_t i = 0; i < n; ++i) {
      g[i].id = first_id + i;
      g[i].task = "t";
      g[i].group_id = gid;
      g[i].index_in_group = i;
      g[i].prompt_tokens = {7, 8, 9};
      g[i].source = "src" + std::to_string(first_id + i);
    }
    return g;
  };
  const auto old_group = group(1, 100, 2), new_group = group(2, 200, 1);
  ASSERT_TRUE(shm->replay().open_group(old_group, 60s));
  for (const auto& c : old_group) ASSERT_TRUE(shm->candidates().push(ref_of(c), 1s));
  ASSERT_TRUE(shm->replay().open_group(new_group, 60s));
  ASSERT_EQ(shm->replay().stats().evicted, 1u);
  ASSERT_TRUE(shm->candidates().push(ref_of(new_group[0]), 1s));

  // A handle that names the right group but another candidate does not resolve either.
  Candidate out;
  CandidateRef wrong = ref_of(new_group[0]);
  wrong.candidate_id = 999;
  EXPECT_FALSE(shm->replay().read_candidate(wrong, out));

  std::vector<Candidate> got;
  std::vector<ShmQueue::Slot> claims;
  Unresolved un;
  ASSERT_EQ(shm->candidates().claim(got, claims, 8, 1s, "test evaluator", &un), 1u);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].id, 200u);
  EXPECT_EQ(got[0].source, "src200");
  EXPECT_EQ(got[0].prompt_tokens, (std::vector<int32_t>{7, 8, 9}));
  ASSERT_EQ(un.gone.size(), 2u);
  EXPECT_EQ(un.gone[0].candidate_id, 100u);
  EXPECT_EQ(un.gone[1].candidate_id, 101u);
  EXPECT_TRUE(un.scored.empty());
  cand_queue(run).release(claims.data(), claims.size());

  EXPECT_EQ(shm->replay().stats().refs_unresolved, 3u);  // two evicted, one wrong id
  EXPECT_EQ(shm->replay().stats().results_joined, 0u) << "nothing was scored";
  const QueueLedger l = shm->candidate_ledger();
  EXPECT_EQ(l.created, 3u);
  EXPECT_EQ(l.dropped, 2u);
  EXPECT_EQ(l.scored, 1u);
  EXPECT_EQ(l.queued + l.in_flight, 0u);
  EXPECT_TRUE(l.balanced());
  shm->shutdown();
}

// A candidate-queue slot holds one handle, whatever the candidate's size: the slot is
// exactly the encoded handle (the layout's fields, tag and version), and a candidate far
// larger than a slot goes through the queue by its handle.
TEST(ReplayResultPathTest, CandidateQueueSlotsHoldOnlyTheHandle) {
  const CandidateRef r{1, 2, 3, 4};
  const std::size_t layout = sizeof(uint32_t) /* tag */ + sizeof(uint32_t) /* version */ + sizeof r.candidate_id +
                             sizeof r.group_id + sizeof r.index_in_group + sizeof r.t_pushed_ns;
  EXPECT_EQ(encoded_size(r), layout);
  const std::string run = unique_name("slot");
  RunShmConfig cfg;
  cfg.candidates.slot_bytes = 1u << 20;  // ignored: the slots are sized to the handle
  auto shm = RunShm::create(run, cfg);
  EXPECT_EQ(cand_queue(run).slot_bytes(), layout);
  std::vector<Candidate> g(1);
  g[0].id = 1;
  g[0].task = "t";
  g[0].group_id = 3;
  g[0].source.assign(64 * 1024, 'x');  // far larger than a slot
  g[0].completion_tokens.assign(8000, 5);
  ASSERT_GT(encoded_size(g[0]), 100 * layout);
  ASSERT_TRUE(shm->replay().open_group(g, 60s));
  ASSERT_TRUE(shm->candidates().push(ref_of(g[0]), 1s));
  std::vector<Candidate> got;
  ASSERT_EQ(shm->candidates().pop_batch(got, 4, 1s), 1u);
  EXPECT_EQ(got[0].source, g[0].source);
  EXPECT_EQ(got[0].completion_tokens, g[0].completion_tokens);
  EXPECT_EQ(cand_queue(run).stats().dropped_too_large, 0u);
  shm->shutdown();
}
