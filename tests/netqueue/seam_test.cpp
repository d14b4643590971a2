// The work seam on the network (stream_groups, stream_candidates, stream_ready_groups)
// against a real redis-server and real run shared memory: an actor's group reaches two
// evaluators, one of which dies holding a candidate (the other claims it after
// claim_idle), and the head's learner rank 0 gathers the group with every result into its
// replay, the verified kernel into its kernel database; a second result is not joined
// twice; a full candidate stream stops a publish whose keep_going turns false, and the
// members it never handed over are marked lost on the head; an actor
// node mirrors the head's snapshot and kernel database into its own run.
#include <unistd.h>

#include <algorithm>
#include <set>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "kf/common/config.h"
#include "kf/common/error.h"
#include "kf/netqueue/netqueue.h"
#include "kf/replay/replay.h"
#include "test_util.h"

namespace kf::netqueue {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

const char* kPasswordEnv = "KF_NETQUEUE_SEAM_TEST_PASSWORD";

// A run config on this test's server (the password through the environment, as on a node).
Config config_for(const RedisServer& srv, const std::string& role, const std::vector<std::string>& more = {}) {
  ::setenv(kPasswordEnv, srv.client_config().password.c_str(), 1);
  std::vector<std::string> sets = {"cluster.role=" + role,
                                   "cluster.node_name=testnode",
                                   "cluster.redis.host=127.0.0.1",
                                   "cluster.redis.port=" + std::to_string(srv.port()),
                                   std::string("cluster.redis.password_env=") + kPasswordEnv,
                                   "cluster.redis.bound=64",
                                   "cluster.redis.claim_idle_s=1",
                                   "cluster.redis.gone_after_s=30",
                                   "run.name=seamtest"};
  sets.insert(sets.end(), more.begin(), more.end());
  return Config::parse("{}", "seam test", sets);
}

// A small run segment set with a unique name (removed at the end of the test).
struct TestRun {
  std::unique_ptr<replay::RunShm> shm;
  explicit TestRun(const std::string& tag) {
    replay::RunShmConfig c;
    c.candidates.capacity = 64;
    c.replay.capacity = 16;
    c.replay.group_bytes = 64 << 10;
    c.kernels.capacity = 64;
    c.kernels.source_bytes = 4096;
    c.snapshot.max_bytes = 1 << 20;
    shm = replay::RunShm::create("nqseam" + std::to_string(::getpid()) + tag, c);
  }
  ~TestRun() {
    if (shm) shm->shutdown();
  }
  replay::RunShm* operator->() { return shm.get(); }
  replay::RunShm* get() { return shm.get(); }
};

replay::Candidate candidate(uint64_t group, uint32_t index, const std::string& task = "001_relu") {
  replay::Candidate c;
  c.id = group * 100 + index;
  c.task = task;
  c.group_id = group;
  c.index_in_group = index;
  c.policy_version = 4;
  c.prompt_tokens = {1, 2, 3};
  c.completion_tokens = {5, 6, static_cast<int32_t>(index)};
  c.behaviour_logprobs = {-0.5f, -1.0f, -1.5f};
  c.source = "extern \"C\" int kf_forward() { return " + std::to_string(c.id) + "; }\n";
  return c;
}

replay::GroupPublish group(uint64_t id, uint32_t g) {
  replay::GroupPublish p;
  for (uint32_t i = 0; i < g; ++i) p.candidates.push_back(candidate(id, i));
  p.deadline = std::chrono::seconds(60);
  return p;
}

replay::Result result_for(const replay::Candidate& c, replay::Verdict v, double speedup = 0) {
  replay::Result r;
  r.candidate_id = c.id;
  r.group_id = c.group_id;
  r.index_in_group = c.index_in_group;
  r.verdict = v;
  r.speedup = speedup;
  r.reward = v == replay::Verdict::ok ? 1.0 : -1.0;
  r.evaluator_id = 1;
  return r;
}

replay::TakeRequest want(int64_t groups) {
  replay::TakeRequest r;
  r.step = 1;
  r.groups = groups;
  r.version = 4;
  r.max_lag = 100;
  return r;
}

const auto kNoStop = [] { return true; };

// kf:results as the head's learner rank 0 reads it.
StreamQueue head_results(const RedisServer& srv) {
  StreamConfig sc = srv.client_config();
  sc.stream = kResultsStream;
  sc.group = kHeadGroup;
  return StreamQueue::open(sc);
}

TEST(NetqueueSeamTest, ClaimedAwayCandidateIsScoredOnceAndTheHeadGathersTheGroup) {
  auto srv = test::start_server();
  const Config cfg = config_for(srv, "head");
  TestRun head("a");
  auto sink = stream_groups(cfg, head.get(), "actor 0");
  auto g = group(10, 3);
  replay::Result extraction = result_for(g.candidates[2], replay::Verdict::compile_error);
  extraction.evaluator_id = -1;  // the actor scored it
  g.known.push_back(extraction);
  ASSERT_EQ(sink->publish(g, 1s, kNoStop), replay::PublishOutcome::published);

  std::vector<replay::Claim> claims;
  {
    auto dying = stream_candidates(cfg, "evaluator 0");
    ASSERT_EQ(dying->claim(claims, 1, 5s), 1u);
    EXPECT_EQ(claims[0].candidate.id, 1000u);
    EXPECT_EQ(claims[0].candidate.source, g.candidates[0].source);
    EXPECT_EQ(claims[0].deliveries, 1u);
  }  // gone without completing: its entry stays pending under its name
  claims.clear();
  auto ev = stream_candidates(cfg, "evaluator 1");
  const auto t0 = Clock::now();
  while (claims.size() < 2 && test::seconds_since(t0) < 15) {
    ev->claim(claims, 2, 200ms);
    ev->keep_alive(claims);  // as the evaluator's keeper thread does for what it verifies
  }
  ASSERT_EQ(claims.size(), 2u) << "the dead evaluator's candidate was never claimed";
  std::sort(claims.begin(), claims.end(),
            [](const replay::Claim& a, const replay::Claim& b) { return a.candidate.id < b.candidate.id; });
  EXPECT_EQ(claims[0].candidate.id, 1000u);
  EXPECT_GT(claims[0].deliveries, 1u) << "taken over from the dead evaluator";
  EXPECT_EQ(claims[1].candidate.id, 1001u);
  ev->keep_alive(claims);
  EXPECT_TRUE(ev->complete(claims[0], result_for(claims[0].candidate, replay::Verdict::ok, 2.0)).first);
  EXPECT_TRUE(ev->complete(claims[1], result_for(claims[1].candidate, replay::Verdict::incorrect)).first);
  EXPECT_EQ(ev->claim(claims, 1, 100ms), 0u) << "nothing else is queued";

  auto learner = stream_ready_groups(cfg, head.get(), 0, 1, 5000ms);
  const auto got = learner->take(want(4));
  ASSERT_EQ(got.size(), 1u);
  const auto& sg = got[0];
  EXPECT_EQ(sg.group_id, 10u);
  ASSERT_EQ(sg.results.size(), 3u);
  EXPECT_EQ(sg.missing, std::vector<uint8_t>({0, 0, 0}));
  EXPECT_EQ(sg.results[0].verdict, replay::Verdict::ok);
  EXPECT_EQ(sg.results[1].verdict, replay::Verdict::incorrect);
  EXPECT_EQ(sg.results[2].verdict, replay::Verdict::compile_error);
  EXPECT_EQ(sg.candidates[0].completion_tokens, g.candidates[0].completion_tokens);
  // The verified kernel entered the head's kernel database by the rule.
  const auto best = head->kernels().best("001_relu");
  ASSERT_TRUE(best.has_value());
  EXPECT_EQ(best->speedup, 2.0);
  EXPECT_EQ(best->source, g.candidates[0].source);
  EXPECT_EQ(best->policy_version, 4);

  sink.reset(), ev.reset(), learner.reset();  // each adds its counts when it closes
  const auto n = network_counts(srv.client_config());
  EXPECT_EQ(n.groups_published, 1u);
  EXPECT_EQ(n.candidates_published, 2u);
  EXPECT_EQ(n.known_results, 1u);
  EXPECT_EQ(n.results_sent, 2u);
  EXPECT_EQ(n.claimed_again, 1u);
  EXPECT_EQ(n.groups_opened, 1u);
  EXPECT_EQ(n.results_joined, 3u);
  EXPECT_EQ(n.results_orphan, 0u);
  EXPECT_EQ(n.kernels_inserted, 1u);
}

TEST(NetqueueSeamTest, GivenBackCandidateGoesToAnotherEvaluatorAtOnce) {
  auto srv = test::start_server();
  const Config cfg = config_for(srv, "head", {"cluster.redis.claim_idle_s=60"});
  auto sink = stream_groups(cfg, nullptr, "actor 0");
  ASSERT_EQ(sink->publish(group(50, 1), 1s, kNoStop), replay::PublishOutcome::published);
  std::vector<replay::Claim> mine, theirs;
  auto a = stream_candidates(cfg, "evaluator 0");
  ASSERT_EQ(a->claim(mine, 1, 2s), 1u);
  a->give_back(mine[0]);  // stopping: unscored, to another evaluator, not after claim_idle (60 s)
  auto b = stream_candidates(cfg, "evaluator 1");
  ASSERT_EQ(b->claim(theirs, 1, 2s), 1u);
  EXPECT_EQ(theirs[0].candidate.id, 5000u);
  EXPECT_TRUE(b->complete(theirs[0], result_for(theirs[0].candidate, replay::Verdict::incorrect)).first);
}

// An evaluator's claim takes one candidate, then its share of the unclaimed rest: all it
// asks for while it is the only evaluator seen, a share once others read too; every
// candidate is claimed once.
TEST(NetqueueSeamTest, ClaimTakesItsShareOfTheBacklog) {
  auto srv = test::start_server();
  // claim_idle 4 s: each evaluator reads who is live at most every 1 s.
  const Config cfg = config_for(srv, "head", {"cluster.redis.claim_idle_s=4"});
  auto sink = stream_groups(cfg, nullptr, "actor 0");
  ASSERT_EQ(sink->publish(group(60, 10), 1s, kNoStop), replay::PublishOutcome::published);
  auto a = stream_candidates(cfg, "evaluator 0");
  auto b = stream_candidates(cfg, "evaluator 1");
  std::vector<replay::Claim> ca, cb;
  EXPECT_EQ(a->claim(ca, 4, 2s), 4u) << "alone, from a backlog of 10: all it asked for";
  EXPECT_EQ(b->claim(cb, 8, 2s), 3u) << "one, then half of the 5 left: two evaluators are seen now";
  std::this_thread::sleep_for(1100ms);  // evaluator 0 reads again who is live
  EXPECT_EQ(a->claim(ca, 8, 2s), 2u) << "one, then half of the 2 left";
  EXPECT_EQ(b->claim(cb, 8, 2s), 1u) << "the last one";
  EXPECT_EQ(a->claim(ca, 8, 100ms), 0u);
  std::set<uint64_t> ids;
  for (const auto* v : {&ca, &cb})
    for (const auto& c : *v) ids.insert(c.candidate.id);
  EXPECT_EQ(ids.size(), 10u) << "a candidate was claimed twice";
}

// An evaluator that has not read for claim_idle (dead or gone) takes no share.
TEST(NetqueueSeamTest, ClaimShareLeavesOutEvaluatorsNotSeenForClaimIdle) {
  auto srv = test::start_server();
  const Config cfg = config_for(srv, "head");  // claim_idle 1 s
  std::vector<replay::Claim> none, mine;
  {
    auto gone = stream_candidates(cfg, "evaluator 9");
    EXPECT_EQ(gone->claim(none, 8, 50ms), 0u);  // it read once: the group knows it
  }
  std::this_thread::sleep_for(1500ms);
  auto sink = stream_groups(cfg, nullptr, "actor 0");
  ASSERT_EQ(sink->publish(group(61, 10), 1s, kNoStop), replay::PublishOutcome::published);
  auto a = stream_candidates(cfg, "evaluator 0");
  EXPECT_EQ(a->claim(mine, 8, 2s), 8u) << "the gone evaluator was counted as one to share with";
}

// The sink's room, which an actor waits on before it samples: cluster.redis.bound less the
// candidates not yet acknowledged (claimed but unscored ones included).
TEST(NetqueueSeamTest, RoomIsTheBoundLessTheCandidatesNotYetScored) {
  auto srv = test::start_server();
  const Config cfg = config_for(srv, "head", {"cluster.redis.bound=8", "cluster.redis.claim_idle_s=30"});
  auto sink = stream_groups(cfg, nullptr, "actor 0");
  const auto empty = sink->room();
  EXPECT_EQ(empty.capacity, 8u);
  EXPECT_EQ(empty.free_slots, 8u);
  ASSERT_EQ(sink->publish(group(70, 3), 1s, kNoStop), replay::PublishOutcome::published);
  std::this_thread::sleep_for(150ms);  // the room is read at most every 100 ms
  EXPECT_EQ(sink->room().free_slots, 5u);
  auto ev = stream_candidates(cfg, "evaluator 0");
  std::vector<replay::Claim> claims;
  for (const auto t0 = Clock::now(); claims.size() < 3 && test::seconds_since(t0) < 10;) ev->claim(claims, 3, 200ms);
  ASSERT_EQ(claims.size(), 3u);
  std::this_thread::sleep_for(150ms);
  EXPECT_EQ(sink->room().free_slots, 5u) << "claimed, not yet scored: still taking room";
  for (const auto& c : claims) ev->complete(c, result_for(c.candidate, replay::Verdict::incorrect));
  std::this_thread::sleep_for(150ms);
  EXPECT_EQ(sink->room().free_slots, 8u);
}

TEST(NetqueueSeamTest, SecondResultIsNotJoinedTwiceAndALateOneIsAnOrphan) {
  auto srv = test::start_server();
  const Config cfg = config_for(srv, "head");
  TestRun head("b");
  auto sink = stream_groups(cfg, head.get(), "actor 0");
  const auto g = group(20, 2);
  ASSERT_EQ(sink->publish(g, 1s, kNoStop), replay::PublishOutcome::published);
  auto ev = stream_candidates(cfg, "evaluator 0");
  std::vector<replay::Claim> claims;
  for (auto t0 = Clock::now(); claims.size() < 2 && test::seconds_since(t0) < 10;) ev->claim(claims, 2, 500ms);
  ASSERT_EQ(claims.size(), 2u);
  for (const auto& c : claims) ev->complete(c, result_for(c.candidate, replay::Verdict::incorrect));
  // Another result for candidate 2000, as a redelivery would bring it.
  auto dup = result_for(g.candidates[0], replay::Verdict::ok, 3.0);
  std::string bytes(replay::encoded_size(dup), '\0');
  replay::encode(dup, reinterpret_cast<unsigned char*>(bytes.data()));
  ASSERT_TRUE(head_results(srv).push(dup.candidate_id, bytes, 1s));
  auto learner = stream_ready_groups(cfg, head.get(), 0, 1, 3000ms);
  const auto got = learner->take(want(4));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].results[0].verdict, replay::Verdict::incorrect) << "the first result counts";
  EXPECT_FALSE(head->kernels().best("001_relu").has_value()) << "the duplicate's kernel did not enter";
  // A result for the group already taken: counted orphan, acknowledged.
  ASSERT_TRUE(head_results(srv).push(dup.candidate_id, bytes, 1s));
  EXPECT_TRUE(learner->take(want(4)).empty());
  sink.reset(), ev.reset(), learner.reset();
  const auto n = network_counts(srv.client_config());
  EXPECT_EQ(n.results_joined, 2u);
  EXPECT_EQ(n.results_duplicate, 1u);
  EXPECT_EQ(n.results_orphan, 1u);
  EXPECT_EQ(n.kernels_inserted, 0u);
  EXPECT_GE(head->replay().stats().results_duplicate, 1u);
  EXPECT_EQ(head_results(srv).depth().length, 0u) << "every result entry was acknowledged";
}

TEST(NetqueueSeamTest, FullCandidateStreamWaitsAndStopsWhenKeepGoingTurnsFalse) {
  auto srv = test::start_server();
  const Config cfg = config_for(srv, "head", {"cluster.redis.bound=2"});
  auto sink = stream_groups(cfg, nullptr, "actor 0");
  int asked = 0;
  std::size_t unqueued = 99;
  const auto t0 = Clock::now();
  const auto out = sink->publish(
      group(30, 4), 1s, [&] { return ++asked < 3; }, &unqueued);
  EXPECT_EQ(out, replay::PublishOutcome::stopped);
  EXPECT_EQ(unqueued, 2u) << "two of four fit under the bound of 2";
  EXPECT_EQ(asked, 3);
  EXPECT_GE(test::seconds_since(t0), 0.3) << "it waited for room between the calls";
  // kf:groups (bound 2 too) takes one more group record, then is full for room_wait.
  auto all_known = [](uint64_t id) {
    auto g = group(id, 1);
    g.known.push_back(result_for(g.candidates[0], replay::Verdict::compile_error));
    return g;
  };
  EXPECT_EQ(sink->publish(all_known(31), 1s, kNoStop), replay::PublishOutcome::published);
  EXPECT_EQ(sink->publish(all_known(32), 200ms, kNoStop), replay::PublishOutcome::full);
  // Without the head's run, a held group's state is unknown here.
  replay::ScoredGroup sg;
  EXPECT_EQ(sink->peek(30, &sg, true), replay::GroupPeek::absent);
  sink.reset();
  const auto n = network_counts(srv.client_config());
  EXPECT_EQ(n.groups_published, 2u);
  EXPECT_EQ(n.candidates_published, 2u);
  EXPECT_EQ(n.unqueued, 2u);
  EXPECT_EQ(n.known_results, 1u);
}

// As on one node (ReplaySeamTest.FullQueueWhileStopping...): the members a stopped publish
// never handed over are marked lost on the head, so the group is ready once the others are
// scored, long before its deadline (60 s).
TEST(NetqueueSeamTest, StoppedPublishMarksItsUnsentMembersLostOnTheHead) {
  auto srv = test::start_server();
  const Config cfg = config_for(srv, "head", {"cluster.redis.bound=2"});
  TestRun head("l");
  auto sink = stream_groups(cfg, head.get(), "actor 0");
  int asked = 0;
  std::size_t unqueued = 0;
  ASSERT_EQ(sink->publish(
                group(60, 4), 1s, [&] { return ++asked < 3; }, &unqueued),
            replay::PublishOutcome::stopped);
  EXPECT_EQ(unqueued, 2u);

  auto ev = stream_candidates(cfg, "evaluator 0");
  std::vector<replay::Claim> claims;
  const auto t0 = Clock::now();
  while (claims.size() < 2 && test::seconds_since(t0) < 10) ev->claim(claims, 2, 200ms);
  ASSERT_EQ(claims.size(), 2u);
  for (const auto& c : claims) EXPECT_TRUE(ev->complete(c, result_for(c.candidate, replay::Verdict::incorrect)).first);

  auto learner = stream_ready_groups(cfg, head.get(), 0, 1, 5000ms);
  const auto got = learner->take(want(1));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].group_id, 60u);
  EXPECT_EQ(got[0].missing, (std::vector<uint8_t>{0, 0, 1, 1}));
  EXPECT_FALSE(got[0].deadline_hit) << "ready by the losses, not by the deadline (60 s)";
  EXPECT_LT(test::seconds_since(t0), 20) << "the group waited for its deadline";

  sink.reset(), ev.reset(), learner.reset();
  const auto n = network_counts(srv.client_config());
  EXPECT_EQ(n.unqueued, 2u);
  EXPECT_EQ(n.members_lost, 2u);
  EXPECT_EQ(n.results_joined, 2u);
  EXPECT_EQ(n.results_orphan, 0u);
  EXPECT_EQ(head->replay().stats().candidates_lost, 2u);
  EXPECT_EQ(head_results(srv).depth().length, 0u) << "the marks were acknowledged";
}

TEST(NetqueueSeamTest, HeldGroupIsPendingUntilTheHeadOpensAndReleasedToTheLearner) {
  auto srv = test::start_server();
  const Config cfg = config_for(srv, "head");
  TestRun head("c");
  auto sink = stream_groups(cfg, head.get(), "actor 0");
  auto g = group(40, 1);
  g.hold = true;
  g.known.push_back(result_for(g.candidates[0], replay::Verdict::compile_error));
  ASSERT_EQ(sink->publish(g, 1s, kNoStop), replay::PublishOutcome::published);
  replay::ScoredGroup sg;
  EXPECT_EQ(sink->peek(40, &sg, false), replay::GroupPeek::pending) << "published, not yet opened on the head";
  auto learner = stream_ready_groups(cfg, head.get(), 0, 1, 300ms);
  EXPECT_TRUE(learner->take(want(4)).empty()) << "held: the actor reads it first";
  EXPECT_EQ(sink->peek(40, &sg, true), replay::GroupPeek::ready);
  EXPECT_EQ(sg.results.at(0).verdict, replay::Verdict::compile_error);
  EXPECT_EQ(learner->take(want(4)).size(), 1u) << "released to the learner";
}

TEST(NetqueueSeamTest, ActorNodeMirrorsTheHeadsSnapshotAndKernelDatabase) {
  auto srv = test::start_server();
  const Config head_cfg = config_for(srv, "head");
  const Config node_cfg = config_for(srv, "actors", {"cluster.node_name=nodeA"});
  TestRun head("d"), node("e");
  auto node_sink = stream_groups(node_cfg, node.get(), "actor 0");
  replay::ScoredGroup sg;
  EXPECT_EQ(node_sink->peek(1, &sg, true), replay::GroupPeek::absent);  // announces the node
  std::vector<unsigned char> blob(100000);
  for (std::size_t i = 0; i < blob.size(); ++i) blob[i] = static_cast<unsigned char>((i * 131 + 7) & 0xff);
  head->snapshots().publish(7, blob.data(), blob.size());
  head->kernels().insert({"001_relu", 1.5, 3, "extern \"C\" int kf_forward() { return 7; }\n", 0});
  auto learner = stream_ready_groups(head_cfg, head.get(), 0, 1, 100ms);
  const auto t0 = Clock::now();
  bool copied = false;
  while (!copied && test::seconds_since(t0) < 15) {
    (void)learner->take(want(0));  // publishes for actor nodes once one announced itself
    (void)node_sink->peek(1, &sg, true);
    copied = node->snapshots().latest().version == 7 && node->kernels().best("001_relu").has_value();
    if (!copied) std::this_thread::sleep_for(200ms);
  }
  ASSERT_TRUE(copied) << "the actor node never got the head's snapshot and kernel database";
  std::vector<unsigned char> back;
  EXPECT_EQ(node->snapshots().read(back).version, 7);
  EXPECT_TRUE(back == blob);
  const auto k = node->kernels().best("001_relu");
  EXPECT_EQ(k->speedup, 1.5);
  EXPECT_EQ(k->policy_version, 3);
  EXPECT_EQ(KeyStore::open(srv.client_config()).get(kActorNodesKey).value_or(""), "nodeA");
}

}  // namespace
}  // namespace kf::netqueue
