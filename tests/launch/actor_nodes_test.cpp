// The head's side of actor nodes (ActorNodeLink) against a real redis-server and a real
// run shared memory, no processes: a group pushed to kf:groups as an actor node sends it is
// opened in the replay, its forwarded candidate queued as a handle that resolves to the
// candidate, its actor-scored result joined and its lost candidate marked lost; the same
// group delivered again is dropped; weights go to the store only once an actor node has
// announced itself, newest version with its size.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "actor_nodes.h"
#include "kf/netqueue/netqueue.h"
#include "kf/replay/replay.h"

namespace {
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// The head's options against a test's own Redis server on this host, with a small stream bound.
kf::launch::ClusterOptions head_options(int port, const std::string& password) {
  kf::launch::ClusterOptions co;
  co.role = "head";
  co.node_name = "head";
  co.host = "127.0.0.1";
  co.port = port;
  co.password = password;
  co.bound = 16;
  return co;
}

bool wait_until(const std::function<bool()>& f, std::chrono::milliseconds limit) {
  const auto until = Clock::now() + limit;
  while (Clock::now() < until) {
    if (f()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return f();
}

kf::replay::ScoredGroup remote_group() {
  kf::replay::ScoredGroup g;
  g.group_id = 77;
  g.task = "001_relu";
  g.policy_version = 3;
  g.prompt_tokens = {5, 6, 7, 8};
  for (uint32_t i = 0; i < 3; ++i) {
    kf::replay::Candidate c;
    c.id = 1001 + i;
    c.task = g.task;
    c.group_id = g.group_id;
    c.index_in_group = i;
    c.policy_version = 3;
    c.completion_tokens = {40 + static_cast<int32_t>(i), 41};
    c.behaviour_logprobs = {-0.5f, -0.25f};
    c.source = "kernel " + std::to_string(i);
    g.candidates.push_back(c);
    kf::replay::Result r;
    r.candidate_id = c.id;
    r.group_id = g.group_id;
    r.index_in_group = i;
    r.evaluator_id = kf::launch::kForwardedEvaluatorId;  // 0: forwarded to the head
    g.results.push_back(r);
    g.missing.push_back(0);
  }
  g.results[1].verdict = kf::replay::Verdict::compile_error;  // 1: an extraction failure the actor scored
  g.results[1].evaluator_id = -1;
  g.results[1].reward = -1.0;
  g.candidates[1].source.clear();
  g.candidates[1].extraction_error = "no code block";
  g.missing[2] = 1;  // 2: lost on the actor node
  return g;
}
}  // namespace

TEST(LaunchActorNodesTest, HeadOpensARemoteGroupQueuesItsHandlesAndDropsARedelivery) {
  kf::netqueue::ServerOptions so;
  so.password = "actorNodesTestPw" + std::to_string(getpid());
  auto srv = kf::netqueue::RedisServer::start(so);
  auto co = head_options(srv.port(), so.password);
  const std::string name = "kfant" + std::to_string(getpid());
  kf::replay::RunShmConfig rc;
  rc.candidates.capacity = 8;
  auto shm = kf::replay::RunShm::create(name, rc);
  shm->control().set_state(kf::replay::RunState::running);
  kf::launch::ActorNodeLink link(*shm, co, 30.0, 3);

  auto sc = srv.client_config();
  sc.stream = kf::launch::kGroupsStream;
  sc.group = "head";
  auto out = kf::netqueue::StreamQueue::open(sc);
  const std::string bytes = kf::netqueue::encode_groups({remote_group()});
  ASSERT_TRUE(out.push(77, bytes, 1s));
  ASSERT_TRUE(out.push(77, bytes, 1s));  // the same group again (as after a claim)
  ASSERT_TRUE(wait_until([&] { return link.counters().duplicates == 1; }, 10s));
  const auto c = link.counters();
  EXPECT_EQ(c.groups, 1u);
  EXPECT_EQ(c.candidates_queued, 1u);
  EXPECT_EQ(c.actor_scored, 1u);
  EXPECT_EQ(c.lost, 1u);
  EXPECT_EQ(c.groups_dropped + c.undecodable, 0u);
  EXPECT_EQ(shm->replay().stats().opened, 1u);
  EXPECT_EQ(shm->candidate_ledger().created, 1u);  // only the forwarded candidate entered the queue
  // The handle resolves in the head's replay to the candidate as the actor made it.
  std::vector<kf::replay::Candidate> got;
  std::vector<kf::replay::ShmQueue::Slot> claims;
  ASSERT_EQ(shm->candidates().claim(got, claims, 4, 1s, "test"), 1u);
  EXPECT_EQ(got[0].id, 1001u);
  EXPECT_EQ(got[0].group_id, 77u);
  EXPECT_EQ(got[0].prompt_tokens, (std::vector<int32_t>{5, 6, 7, 8}));
  EXPECT_EQ(got[0].behaviour_logprobs, (std::vector<float>{-0.5f, -0.25f}));
  EXPECT_EQ(got[0].source, "kernel 0");
  // Its result completes the group: the actor-scored one and the lost one are in already.
  kf::replay::Result r;
  r.candidate_id = 1001;
  r.group_id = 77;
  r.index_in_group = 0;
  r.verdict = kf::replay::Verdict::ok;
  r.reward = 1.0;
  ASSERT_TRUE(shm->replay().add_result(r));
  shm->candidates().raw().release(claims.data(), 1);
  std::vector<kf::replay::ScoredGroup> ready;
  ASSERT_EQ(shm->replay().take_ready(ready, 4, 3, 100, 1s), 1u);
  EXPECT_EQ(ready[0].group_id, 77u);
  EXPECT_EQ(ready[0].results[1].verdict, kf::replay::Verdict::compile_error);
  EXPECT_EQ(ready[0].missing, (std::vector<uint8_t>{0, 0, 1}));
  EXPECT_FALSE(ready[0].deadline_hit);
  link.stop();
  shm->shutdown();
}

TEST(LaunchActorNodesTest, WeightsGoToTheStoreOnlyOnceAnActorNodeAnnouncedItself) {
  kf::netqueue::ServerOptions so;
  so.password = "actorNodesWeightsPw" + std::to_string(getpid());
  auto srv = kf::netqueue::RedisServer::start(so);
  kf::launch::ClusterOptions co;
  co.role = "head";
  co.node_name = "head";
  co.port = srv.port();
  co.password = so.password;
  const std::string name = "kfanw" + std::to_string(getpid());
  auto shm = kf::replay::RunShm::create(name, {});
  shm->control().set_state(kf::replay::RunState::running);
  std::vector<unsigned char> blob(100000);
  for (std::size_t i = 0; i < blob.size(); ++i) blob[i] = static_cast<unsigned char>(i * 7);
  shm->snapshots().publish(4, blob.data(), blob.size());
  kf::launch::ActorNodeLink link(*shm, co, 30.0, 2);
  auto ks = kf::netqueue::KeyStore::open(srv.client_config());
  std::this_thread::sleep_for(1500ms);  // three publish checks
  EXPECT_FALSE(ks.get(kf::launch::kWeightsVersionKey).has_value()) << "weights copied with no actor node";
  EXPECT_EQ(ks.get(kf::launch::kRunStateKey).value_or(""), "running");
  ks.set(kf::launch::kActorNodesKey, "a1");
  ASSERT_TRUE(wait_until([&] { return ks.get(kf::launch::kWeightsVersionKey).value_or("") == "4"; }, 5s));
  shm->snapshots().publish(9, blob.data(), blob.size() / 2);
  ASSERT_TRUE(wait_until([&] { return ks.get(kf::launch::kWeightsVersionKey).value_or("") == "9"; }, 5s));
  const auto rec = ks.get(kf::launch::kWeightsKey);
  ASSERT_TRUE(rec.has_value());
  ASSERT_EQ(rec->size(), 20 + blob.size() / 2);
  EXPECT_EQ(rec->compare(0, 4, "KFW1"), 0);
  int64_t version = 0;
  uint64_t n = 0;
  std::memcpy(&version, rec->data() + 4, 8);
  std::memcpy(&n, rec->data() + 12, 8);
  EXPECT_EQ(version, 9);
  EXPECT_EQ(n, blob.size() / 2);
  EXPECT_EQ(std::memcmp(rec->data() + 20, blob.data(), n), 0);
  // The (empty) kernel database too, in the same pass as the first weights.
  EXPECT_TRUE(ks.get(kf::launch::kKernelsVersionKey).has_value());
  link.stop();
  EXPECT_EQ(ks.get(kf::launch::kRunStateKey).value_or(""), "draining");
  shm->shutdown();
}

// Node seconds travel from a node's reporter to the head's bridge through the server: the
// newest cumulative figures per session, unchanged figures not sent again.
TEST(LaunchActorNodesTest, NodeReportsReachTheHeadsBridge) {
  kf::netqueue::ServerOptions so;
  so.password = "nodeSecondsTestPw" + std::to_string(getpid());
  auto srv = kf::netqueue::RedisServer::start(so);
  auto co = head_options(srv.port(), so.password);
  const std::string name = "kfns" + std::to_string(getpid());
  kf::replay::RunShmConfig rc;
  rc.candidates.capacity = 8;
  auto shm = kf::replay::RunShm::create(name, rc);
  kf::launch::RemoteBridge bridge(*shm, co, false);
  kf::launch::ClusterOptions node = co;
  node.role = "evaluators";
  node.node_name = "n1";
  kf::launch::NodeReporter rep(node);
  EXPECT_EQ(rep.session().rfind("n1/" + std::to_string(getpid()) + "/", 0), 0u) << rep.session();
  rep.report({0, 1.5, 2.5, 0, 3});
  ASSERT_TRUE(wait_until([&] { return bridge.reported_verdicts() == 3; }, 5000ms));
  rep.report({0, 2.0, 4.0, 0, 5}, /*force=*/true);
  ASSERT_TRUE(wait_until([&] { return bridge.reported_verdicts() == 5; }, 5000ms));
  const auto got = bridge.node_seconds();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_DOUBLE_EQ(got.at(rep.session()).compile_s, 2.0);
  EXPECT_DOUBLE_EQ(got.at(rep.session()).verify_s, 4.0);
  rep.report({0, 2.0, 4.0, 0, 5}, /*force=*/true);  // unchanged: not sent
  std::this_thread::sleep_for(400ms);
  EXPECT_EQ(bridge.counters().reports, 2u);
  bridge.stop();
  shm->shutdown();
}
