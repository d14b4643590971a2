// tools/launch --slurm without Slurm: the node list from SLURM_JOB_NODELIST, the role of
// each node (node 0 head, or cluster.nodes), the --set lines a node's launcher gets, the
// srun line; and cluster.* config errors (no password, a role this build cannot run).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <map>

#include "cluster.h"
#include "kf/common/config.h"
#include "kf/common/error.h"
#include "kf/learner/learner.h"
#include "launch_common.h"
#include <torch/torch.h>

namespace {
using kf::launch::expand_nodelist;
using kf::launch::slurm_plan;
using Env = std::map<std::string, std::string>;

std::function<std::string(const std::string&)> env_of(const Env& e) {
  return [e](const std::string& k) {
    auto it = e.find(k);
    return it == e.end() ? std::string() : it->second;
  };
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const kf::Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(LaunchClusterTest, NodeListsExpandAsSlurmWritesThem) {
  EXPECT_EQ(expand_nodelist("gpu7"), std::vector<std::string>({"gpu7"}));
  EXPECT_EQ(expand_nodelist("node[01-03,07]"), std::vector<std::string>({"node01", "node02", "node03", "node07"}));
  EXPECT_EQ(expand_nodelist("a[1-2],b5,c[9-10]-ib"), std::vector<std::string>({"a1", "a2", "b5", "c9-ib", "c10-ib"}));
  EXPECT_EQ(expand_nodelist("x[8-11]"), std::vector<std::string>({"x8", "x9", "x10", "x11"}));
  EXPECT_NE(error_of([] { expand_nodelist("node[1-3"); }).find("'[' without ']'"), std::string::npos);
  EXPECT_NE(error_of([] { expand_nodelist("node[3-1]"); }).find("backwards"), std::string::npos);
  EXPECT_NE(error_of([] { expand_nodelist("node[a-b]"); }).find("not N or N-M"), std::string::npos);
  EXPECT_NE(error_of([] { expand_nodelist(""); }).find("no node names"), std::string::npos);
}

TEST(LaunchClusterTest, SlurmNodeZeroIsTheHeadAndTheRestEvaluate) {
  Env e = {{"SLURM_JOB_ID", "4242"}, {"SLURM_JOB_NODELIST", "gn[03-05]"}};
  // The batch script's launcher (no KF_SLURM_STEP): the srun line, no roles applied yet.
  auto outer = slurm_plan(env_of(e), {});
  EXPECT_FALSE(outer.in_step);
  EXPECT_EQ(outer.nodes, 3);
  EXPECT_EQ(outer.head_host, "gn03");
  EXPECT_TRUE(outer.sets.empty());
  const auto line = kf::launch::srun_argv(outer, {"/b/launch/kf-launch", "run.yaml", "--slurm"});
  EXPECT_EQ(line,
            std::vector<std::string>({"srun", "--nodes=3", "--ntasks=3", "--ntasks-per-node=1", "--kill-on-bad-exit=0",
                                      "--export=ALL,KF_SLURM_STEP=1", "/b/launch/kf-launch", "run.yaml", "--slurm"}));
  // One launcher per node inside the step.
  e["KF_SLURM_STEP"] = "1";
  e["SLURM_NODEID"] = "0";
  auto n0 = slurm_plan(env_of(e), {});
  EXPECT_TRUE(n0.in_step);
  EXPECT_EQ(n0.role, "head");
  EXPECT_EQ(n0.sets,
            std::vector<std::string>({"cluster.role=head", "cluster.redis.host=gn03", "cluster.node_name=gn03"}));
  e["SLURM_NODEID"] = "2";
  auto n2 = slurm_plan(env_of(e), {});
  EXPECT_EQ(n2.role, "evaluators");
  EXPECT_EQ(n2.sets,
            std::vector<std::string>({"cluster.role=evaluators", "cluster.redis.host=gn03", "cluster.node_name=gn05"}));
  // cluster.nodes moves the head.
  auto moved = slurm_plan(env_of(e), {"evaluators", "evaluators", "head"});
  EXPECT_EQ(moved.role, "head");
  EXPECT_EQ(moved.head_host, "gn05");
  // One node: the single-node run, unchanged.
  Env one = {{"SLURM_JOB_ID", "1"}, {"SLURM_JOB_NODELIST", "solo"}, {"KF_SLURM_STEP", "1"}, {"SLURM_NODEID", "0"}};
  EXPECT_EQ(slurm_plan(env_of(one), {}).role, "all");
}

TEST(LaunchClusterTest, SlurmMistakesAreNamed) {
  EXPECT_NE(error_of([] { slurm_plan(env_of({}), {}); }).find("SLURM_JOB_ID is not set"), std::string::npos);
  EXPECT_NE(error_of([] {
              slurm_plan(env_of({{"SLURM_JOB_ID", "7"}}), {});
            }).find("SLURM_JOB_NODELIST is not set"),
            std::string::npos);
  const Env e = {{"SLURM_JOB_ID", "7"}, {"SLURM_JOB_NODELIST", "n[1-2]"}};
  EXPECT_NE(error_of([&] { slurm_plan(env_of(e), {"head"}); }).find("cluster.nodes: 1 role(s) for the allocation's 2"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              slurm_plan(env_of(e), {"head", "head"});
            }).find("exactly one node must be the head"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              slurm_plan(env_of(e), {"head", "trainers"});
            }).find("entry 1 is 'trainers'; each is head, evaluators, learners or actors"),
            std::string::npos);
  Env bad = e;
  bad["KF_SLURM_STEP"] = "1";
  bad["SLURM_NODEID"] = "5";
  EXPECT_NE(error_of([&] { slurm_plan(env_of(bad), {}); }).find("SLURM_NODEID 5 but SLURM_JOB_NODELIST names 2"),
            std::string::npos);
}

TEST(LaunchClusterTest, RemoteRolesNeedThePasswordInTheEnvironment) {
  ::unsetenv("KF_TEST_NO_SUCH_PW");
  const auto cfg = kf::Config::parse("cluster: {role: head, redis: {password_env: KF_TEST_NO_SUCH_PW}}\n", "c.yaml");
  const std::string err = error_of([&] { kf::launch::cluster_options(cfg); });
  if (!kf::launch::cluster_supported()) {
    EXPECT_NE(err.find("hiredis"), std::string::npos) << err;
    return;
  }
  EXPECT_NE(err.find("c.yaml"), std::string::npos) << err;
  EXPECT_NE(err.find("KF_TEST_NO_SUCH_PW"), std::string::npos) << err;
  ::setenv("KF_TEST_NO_SUCH_PW", "s3cret", 1);
  const auto o = kf::launch::cluster_options(cfg);
  EXPECT_EQ(o.password, "s3cret");
  EXPECT_EQ(o.bind, std::vector<std::string>({"127.0.0.1"}));  // cluster.redis.host when bind is empty
  ::setenv("KF_TEST_NO_SUCH_PW", "has space", 1);
  EXPECT_NE(error_of([&] { kf::launch::cluster_options(cfg); }).find("whitespace"), std::string::npos);
  // The single-node default needs nothing of this.
  EXPECT_FALSE(kf::launch::cluster_options(kf::Config::parse("run: {seed: 1}\n", "d.yaml")).remote());
  const auto badname = kf::Config::parse("cluster: {node_name: 'a/b'}\n", "n.yaml");
  EXPECT_NE(error_of([&] { kf::launch::cluster_options(badname); }).find("cluster.node_name"), std::string::npos);
}

// Learner ranks on several nodes (cluster.head_learner_ranks, role learners): the layout
// must fit learner.dist.ranks, and the ranks must be able to talk across nodes (NCCL on
// CUDA: the cpu communicator is one host's shared memory). Refused at start, naming the key.
TEST(LaunchClusterTest, LearnerRanksOnSeveralNodesNeedNcclAndAFittingLayout) {
  if (!kf::launch::cluster_supported()) GTEST_SKIP() << "no hiredis in this build";
  ::setenv("KF_TEST_LN_PW", "s3cret", 1);
  auto cfg = [](const std::string& cluster, const std::string& more = "") {
    return kf::Config::parse("run: {backend: cpu}\nlearner: {dist: {ranks: 3" + more +
                                 "}}\ncluster: {redis: {password_env: KF_TEST_LN_PW}, " + cluster + "}\n",
                             "l.yaml");
  };
  auto err = [&](const std::string& cluster, const std::string& more = "") {
    return error_of([&] { kf::launch::cluster_options(cfg(cluster, more)); });
  };
  // The cpu communicator (asked for, or all there is without a GPU): refused for the head
  // and for a learners node; an evaluator node runs no learner rank and does not care.
  for (const char* role : {"head", "learners"}) {
    const std::string e = err(std::string("role: ") + role + ", head_learner_ranks: 1", ", comm: cpu");
    EXPECT_NE(e.find("l.yaml"), std::string::npos) << e;
    EXPECT_NE(e.find("cluster.head_learner_ranks: 1 of learner.dist.ranks 3 on the head puts learner ranks on several "
                     "nodes, which needs NCCL on CUDA (here "),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("learner.dist.comm cpu"), std::string::npos) << e;
    EXPECT_NE(e.find("the cpu communicator is one host's shared memory and cannot cross nodes"), std::string::npos)
        << e;
    if (torch::cuda::device_count() == 0 || !torch::cuda::is_available()) {
      const std::string no_gpu = err(std::string("role: ") + role + ", head_learner_ranks: 1");
      EXPECT_NE(no_gpu.find("(here no GPU is visible on this node, learner.dist.comm auto"), std::string::npos)
          << no_gpu;
    }
  }
  EXPECT_EQ(err("role: evaluators, head_learner_ranks: 1", ", comm: cpu"), "");
  // The layout.
  EXPECT_NE(err("role: head, head_learner_ranks: 4")
                .find("cluster.head_learner_ranks: 4 is more than learner.dist.ranks (3)"),
            std::string::npos);
  EXPECT_NE(err("role: learners")
                .find("cluster.role: learners, but cluster.head_learner_ranks (0) leaves no learner "
                      "rank off the head: set it to 1..2"),
            std::string::npos);
  EXPECT_NE(err("role: all, head_learner_ranks: 2").find("but cluster.role is all (one node)"), std::string::npos);
  EXPECT_NE(err("role: learners, head_learner_ranks: 1, learner_ranks: 2, learner_node_index: 1")
                .find("cluster.learner_node_index: learners node 1 would run ranks 3..4, beyond learner.dist.ranks 3"),
            std::string::npos);
  // All ranks on the head (the default): nothing of this applies, CPU or not.
  const auto all_on_head = kf::launch::cluster_options(cfg("role: head"));
  EXPECT_FALSE(all_on_head.learners_split());
  EXPECT_EQ(all_on_head.head_ranks(), 3);
  // With NCCL and a GPU the layout is accepted.
  const auto nccl_cfg = kf::Config::parse(
      "run: {backend: cuda}\nlearner: {dist: {ranks: 3, comm: nccl}}\ncluster: {role: learners, head_learner_ranks: 1, "
      "learner_ranks: 1, learner_node_index: 1, redis: {password_env: KF_TEST_LN_PW}}\n",
      "n.yaml");
  if (kf::learner::nccl_available() && torch::cuda::is_available()) {
    const auto o = kf::launch::cluster_options(nccl_cfg);
    EXPECT_TRUE(o.learners_split());
    EXPECT_EQ(o.first_learner_rank(), 2);
  } else {
    const std::string e = error_of([&] { kf::launch::cluster_options(nccl_cfg); });
    EXPECT_NE(e.find(kf::learner::nccl_available() ? "no GPU is visible" : "and this build has no NCCL"),
              std::string::npos)
        << e;
  }
}

TEST(LaunchClusterTest, SlurmLearnersNodesGetTheirPlaceInOrder) {
  Env e = {{"SLURM_JOB_ID", "9"}, {"SLURM_JOB_NODELIST", "g[1-4]"}, {"KF_SLURM_STEP", "1"}};
  const std::vector<std::string> roles = {"learners", "head", "evaluators", "learners"};
  e["SLURM_NODEID"] = "0";
  EXPECT_EQ(slurm_plan(env_of(e), roles).sets,
            std::vector<std::string>({"cluster.role=learners", "cluster.redis.host=g2", "cluster.node_name=g1",
                                      "cluster.learner_node_index=0"}));
  e["SLURM_NODEID"] = "3";
  EXPECT_EQ(slurm_plan(env_of(e), roles).sets.back(), "cluster.learner_node_index=1");
  e["SLURM_NODEID"] = "2";
  EXPECT_EQ(slurm_plan(env_of(e), roles).sets.size(), 3u);  // not a learners node
}

// Actor nodes: cluster.nodes may name them, and the schema takes cluster.role actors with every
// other key kept (an actor node's kf-actor processes read the run's own config.yaml).
TEST(LaunchClusterTest, ActorNodesInTheSlurmPlanAndTheirWorkersConfig) {
  const Env e = {
      {"SLURM_JOB_ID", "7"}, {"SLURM_JOB_NODELIST", "n[1-3]"}, {"KF_SLURM_STEP", "1"}, {"SLURM_NODEID", "2"}};
  const auto p = slurm_plan(env_of(e), {"head", "evaluators", "actors"});
  EXPECT_EQ(p.role, "actors");
  EXPECT_EQ(p.head_host, "n1");
  EXPECT_EQ(p.sets.front(), "cluster.role=actors");
  const std::string text = "cluster: {role: actors, node_name: a1}\nactors: {group_size: 4}\n";
  const auto cfg = kf::Config::parse(text, "c.yaml");
  EXPECT_EQ(cfg.get_string("cluster.role"), "actors");
  EXPECT_EQ(cfg.get_int("actors.group_size"), 4);
  EXPECT_EQ(cfg.get_string("cluster.node_name"), "a1");
  // Any other role is still refused by name.
  EXPECT_NE(error_of([] { kf::Config::parse("cluster: {role: trainers}\n", "c.yaml"); }).find("cluster.role"),
            std::string::npos);
}

// A head that runs no actor of its own (cluster.head_actors 0) needs actor nodes: on one
// node, or in an allocation whose roles name no actor node, it is refused naming the key.
TEST(LaunchClusterTest, HeadWithoutActorsNeedsActorNodes) {
  ::setenv("KF_TEST_HEAD_ACTORS_PW", "s3cret", 1);
  auto cfg = [](const std::string& cluster) {
    return kf::Config::parse(
        "actors: {count: 3}\ncluster: {" + cluster + "redis: {password_env: KF_TEST_HEAD_ACTORS_PW}}\n", "h.yaml");
  };
  // The default: the head runs actors.count, as one node does.
  EXPECT_EQ(kf::launch::cluster_options(cfg("")).local_actors(3), 3);
  const std::string one = error_of([&] { kf::launch::cluster_options(cfg("head_actors: 0, ")); });
  EXPECT_NE(one.find("cluster.head_actors: 0 on one node"), std::string::npos) << one;
  EXPECT_NE(one.find("h.yaml"), std::string::npos) << one;
  EXPECT_NE(one.find("nothing would sample"), std::string::npos) << one;
  // Below -1: the schema's bound names the key.
  EXPECT_NE(error_of([&] { cfg("head_actors: -2, "); }).find("cluster.head_actors"), std::string::npos);
  if (!kf::launch::cluster_supported()) return;
  // cluster.nodes without an actor node.
  const std::string none =
      error_of([&] { kf::launch::cluster_options(cfg("role: head, head_actors: 0, nodes: [head, evaluators], ")); });
  EXPECT_NE(none.find("cluster.head_actors: 0, but no node of the run is an actor node"), std::string::npos) << none;
  const auto ok = kf::launch::cluster_options(cfg("role: head, head_actors: 0, nodes: [head, actors, evaluators], "));
  EXPECT_EQ(ok.local_actors(3), 0);
  // A head started by hand (no cluster.nodes): accepted; the launcher waits for actor nodes.
  EXPECT_EQ(kf::launch::cluster_options(cfg("role: head, head_actors: 2, ")).local_actors(3), 2);
  EXPECT_EQ(kf::launch::cluster_options(cfg("role: head, head_actors: 0, ")).local_actors(3), 0);
  // Other roles keep actors.count (an actor node runs actors.count with the same config).
  EXPECT_EQ(kf::launch::cluster_options(cfg("role: actors, head_actors: 0, ")).local_actors(3), 3);
  // --slurm without cluster.nodes: every node but the head evaluates, so no actor node.
  Env e = {{"SLURM_JOB_ID", "9"}, {"SLURM_JOB_NODELIST", "n[1-3]"}, {"KF_SLURM_STEP", "1"}, {"SLURM_NODEID", "0"}};
  const auto plan = slurm_plan(env_of(e), {});
  const std::string slurm =
      error_of([&] { kf::launch::check_head_actors(cfg("role: head, head_actors: 0, "), plan.roles); });
  EXPECT_NE(slurm.find("without cluster.nodes --slurm makes every node but the head an evaluator node"),
            std::string::npos)
      << slurm;
  EXPECT_EQ(error_of([&] {
              kf::launch::check_head_actors(cfg("role: head, head_actors: 0, "),
                                            slurm_plan(env_of(e), {"head", "actors", "evaluators"}).roles);
            }),
            "");
}

// An evaluator node's seconds come from its evaluators' verdict lines: complete lines only,
// each once, however the file grows between reads.
TEST(LaunchClusterTest, VerdictSecondsAreSummedOncePerCompleteLine) {
  char tmpl[] = "/tmp/kf-verdicts-XXXXXX";
  const int fd = ::mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  ::close(fd);
  const std::string path = tmpl;
  uint64_t offset = 0;
  kf::launch::NodeSeconds s;
  kf::launch::add_verdict_seconds(path + ".missing", &offset, &s);
  EXPECT_EQ(offset, 0u);
  {
    std::ofstream out(path);
    out << R"({"candidate": 1, "compile_s": 1.25, "verify_s": 0.5})"
        << "\n"
        << R"({"candidate": 2, "compile_s": 0.25, "verify_s": 2.0})"
        << "\n"
        << R"({"candidate": 3, "compile_s": 9)";  // torn: the evaluator is mid-write
  }
  kf::launch::add_verdict_seconds(path, &offset, &s);
  EXPECT_DOUBLE_EQ(s.compile_s, 1.5);
  EXPECT_DOUBLE_EQ(s.verify_s, 2.5);
  EXPECT_EQ(s.verdicts, 2u);
  kf::launch::add_verdict_seconds(path, &offset, &s);  // nothing new: nothing added
  EXPECT_EQ(s.verdicts, 2u);
  {
    std::ofstream out(path, std::ios::app);
    out << R"(, "verify_s": 1.0})"
        << "\n";
  }
  kf::launch::add_verdict_seconds(path, &offset, &s);
  EXPECT_DOUBLE_EQ(s.compile_s, 10.5);
  EXPECT_DOUBLE_EQ(s.verify_s, 3.5);
  EXPECT_EQ(s.verdicts, 3u);
  s.pushed = 4;  // actor nodes' counts travel in the same report
  s.lag_sum = 2;
  const auto back =
      kf::launch::decode_node_report(kf::launch::encode_node_report({"n1/42/7", "evaluators", s, true}), "test report");
  EXPECT_EQ(back.session, "n1/42/7");
  EXPECT_EQ(back.role, "evaluators");
  EXPECT_TRUE(back.done);
  EXPECT_TRUE(back.figures == s);
  EXPECT_NE(error_of([] {
              kf::launch::decode_node_report("{\"session\": \"x\"}", "kf:node_seconds entry 1-0");
            }).find("kf:node_seconds entry 1-0: not a node report"),
            std::string::npos);
  ::unlink(path.c_str());
}
