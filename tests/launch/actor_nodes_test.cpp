// The launchers' supervision of several nodes against a real redis-server, no processes
// (launch/src/cluster.h: ClusterWatch on the head, HeadWatch and NodeReporter on a node):
// the head's run state reaches a node and a node tells a gone server; nodes' reports reach
// the head, newest per session, and an actor node's last report says its actors are done;
// the head's account of the network comes from the server's streams and counts and adds up.
// What moves work between nodes (groups opened in the head's replay, results joined, the
// weights and kernels for actor nodes) is the network transport's, tested in tests/netqueue/.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <thread>

#include "cluster.h"
#include "kf/netqueue/netqueue.h"

namespace {
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A head's options against a test's own Redis server on this host.
kf::launch::ClusterOptions options(const kf::netqueue::RedisServer& srv, const std::string& password,
                                   const std::string& role, const std::string& node) {
  kf::launch::ClusterOptions co;
  co.role = role;
  co.node_name = node;
  co.host = "127.0.0.1";
  co.port = srv.port();
  co.password = password;
  co.gone_after = 1500ms;
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
}  // namespace

// The head writes the run's state; a node reads it (an actor node stops its actors on
// draining) and, once the server is gone for cluster.redis.gone_after_s, says so.
TEST(LaunchActorNodesTest, TheHeadsRunStateReachesANodeAndAGoneServerIsTold) {
  kf::netqueue::ServerOptions so;
  so.password = "runStatePw" + std::to_string(getpid());
  auto srv = kf::netqueue::RedisServer::start(so);
  kf::launch::ClusterWatch head(options(srv, so.password, "head", "head"));
  kf::launch::HeadWatch node(options(srv, so.password, "actors", "a1"));
  EXPECT_EQ(node.run_state(), "");  // nothing written yet
  head.set_run_state("running");
  ASSERT_TRUE(head.poll(/*now=*/true));
  ASSERT_TRUE(wait_until([&] { return node.run_state() == "running"; }, 3s));
  EXPECT_FALSE(node.gone());
  head.set_run_state("draining");
  ASSERT_TRUE(head.poll(/*now=*/true));
  ASSERT_TRUE(wait_until([&] { return node.run_state() == "draining"; }, 3s));
  srv.kill();
  EXPECT_FALSE(head.poll(/*now=*/true));
  EXPECT_GE(head.errors(), 1u);
  // The last state read stays; gone() once the server has been silent for gone_after.
  ASSERT_TRUE(wait_until(
      [&] {
        (void)node.run_state();
        return node.gone();
      },
      5s));
  EXPECT_EQ(node.run_state(), "draining");
}

// Nodes' reports reach the head's watch: the newest cumulative figures per session, summed
// verdict lines, and an actor node counted running until its last report (done).
TEST(LaunchActorNodesTest, NodeReportsReachTheHeadAndAnActorNodesLastOneSaysDone) {
  kf::netqueue::ServerOptions so;
  so.password = "nodeReportsPw" + std::to_string(getpid());
  auto srv = kf::netqueue::RedisServer::start(so);
  kf::launch::ClusterWatch head(options(srv, so.password, "head", "head"));
  kf::launch::NodeReporter evals(options(srv, so.password, "evaluators", "n1"), "evaluators");
  kf::launch::NodeReporter actors(options(srv, so.password, "actors", "a1"), "actors");
  EXPECT_EQ(evals.session().rfind("n1/" + std::to_string(getpid()) + "/", 0), 0u) << evals.session();
  evals.report({0, 1.5, 2.5, 0, 3});
  kf::launch::NodeSeconds a;
  a.generate_s = 4.0;
  a.pushed = 6;
  a.extraction_failures = 2;
  a.lag_sum = 3;
  actors.report(a);
  auto heard = [&](uint64_t verdicts, int running) {
    return wait_until(
        [&] {
          (void)head.poll(/*now=*/true);
          return head.reported_verdicts() == verdicts && head.actor_nodes_running() == running;
        },
        5s);
  };
  ASSERT_TRUE(heard(3, 1));
  evals.report({0, 2.0, 4.0, 0, 5}, /*force=*/true);
  ASSERT_TRUE(heard(5, 1));
  const auto got = head.node_seconds();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_DOUBLE_EQ(got.at(evals.session()).compile_s, 2.0);
  EXPECT_DOUBLE_EQ(got.at(evals.session()).verify_s, 4.0);
  EXPECT_EQ(got.at(actors.session()).pushed, 6u);
  EXPECT_EQ(got.at(actors.session()).extraction_failures, 2u);
  EXPECT_DOUBLE_EQ(got.at(actors.session()).generate_s, 4.0);
  // The actor node's last report: its actors have all exited.
  a.pushed = 8;
  ASSERT_TRUE(actors.finish(a));
  ASSERT_TRUE(heard(5, 0));
  EXPECT_EQ(head.node_seconds().at(actors.session()).pushed, 8u);
}

// The head's account of the network: what the processes counted (kf:counts) and what the
// streams hold. Here the test plays an actor (3 candidates published), an evaluator (2 taken,
// 1 result sent) and a dead-lettered record; the account adds up as the launcher prints it.
TEST(LaunchActorNodesTest, TheNetworkAccountComesFromTheServersCountsAndStreams) {
  namespace nq = kf::netqueue;
  nq::ServerOptions so;
  so.password = "accountPw" + std::to_string(getpid());
  auto srv = nq::RedisServer::start(so);
  kf::launch::ClusterWatch head(options(srv, so.password, "head", "head"));
  ASSERT_TRUE(head.poll(/*now=*/true));
  EXPECT_TRUE(head.account().read);
  EXPECT_EQ(head.account().created, 0u);
  EXPECT_FALSE(head.actor_nodes_seen());

  auto sc = srv.client_config();
  sc.stream = nq::kCandidatesStream;
  sc.group = nq::kEvaluatorsGroup;
  sc.consumer = "test-evaluator";
  auto q = nq::StreamQueue::open(sc);
  ASSERT_EQ(q.push_batch({{1, "c1"}, {2, "c2"}, {3, "c3"}}, 1s), 3u);
  auto store = nq::KeyStore::open(srv.client_config());
  store.add(nq::kCountsKey, {{"candidates_published", 3}, {"groups_published", 1}});
  const auto taken = q.take(2, 1s);
  ASSERT_EQ(taken.size(), 2u);
  ASSERT_EQ(q.ack_forward({taken[0].id}, {{taken[0].tag, "result"}}, nq::kResultsStream), 1u);
  store.add(nq::kCountsKey, {{"results_sent", 1}});
  store.set(nq::kActorNodesKey, "a1");
  ASSERT_TRUE(head.poll(/*now=*/true));
  auto a = head.account();
  EXPECT_EQ(a.created, 3u);
  EXPECT_EQ(a.scored, 1u);
  EXPECT_EQ(a.queued, 1u);
  EXPECT_EQ(a.in_flight, 1u);
  EXPECT_EQ(a.lost(), 0u);
  EXPECT_EQ(a.results_waiting, 1u);
  EXPECT_EQ(a.groups_published, 1u);
  EXPECT_TRUE(a.balanced());
  ASSERT_TRUE(wait_until(
      [&] {
        (void)head.poll(/*now=*/true);
        return head.actor_nodes_seen();
      },
      3s));
  // The counts reach the server a moment after the streams change: until they do, the
  // account does not add up (the launcher's drain waits for it).
  ASSERT_EQ(q.ack_forward({taken[1].id}, {{taken[1].tag, "result"}}, nq::kResultsStream), 1u);
  ASSERT_TRUE(head.poll(/*now=*/true));
  EXPECT_FALSE(head.account().balanced());
  store.add(nq::kCountsKey, {{"results_sent", 1}});
  ASSERT_TRUE(head.poll(/*now=*/true));
  a = head.account();
  EXPECT_EQ(a.scored, 2u);
  EXPECT_EQ(a.in_flight, 0u);
  EXPECT_EQ(a.results_waiting, 2u);
  EXPECT_TRUE(a.balanced());
}
