// Learner ranks on several nodes: kf-learner --rendezvous redis. The NCCL unique id goes
// through the run's Redis server (a real redis-server with a password), and a CPU run
// that asks for it is refused at start, naming the key, because the cpu communicator is
// one host's shared memory. A rank off the head takes its groups from rank 0 (the network
// transport's relay). The GPU test needs two CUDA devices and skips without them.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <regex>
#include <string>
#include <vector>

#include "../test_support.h"
#include "kf/common/config.h"
#include "kf/learner/learner.h"
#include "kf/netqueue/netqueue.h"
#include "kf/replay/replay.h"

extern char** environ;

namespace {

std::string learner_bin() { return kf::test::build_dir() + "/learner/kf-learner"; }

using kf::test::spawn;
using kf::test::wait_exit;

// A tiny synthetic-data learner config; ranks meet at the given Redis port. cluster: extra
// cluster keys (role, the ranks off the head), written to <name><suffix>.yaml.
std::string write_config(const std::string& dir, const std::string& name, int ranks, int redis_port,
                         const std::string& cluster = "", const std::string& suffix = "") {
  const std::string path = dir + "/" + name + suffix + ".yaml";
  kf::test::write_file(
      path, "run:\n  name: " + name + "\n  root: " + dir +
                "\n  seed: 5\nlearner:\n  groups_per_step: 8\n"
                "  micro_batch_tokens: 96\n  deterministic: true\n  optim:\n    lr: 1.0e-3\n  schedule:\n"
                "    warmup_steps: 0\n  snapshot:\n    every: 0\n  checkpoint:\n    every: 0\n  dist:\n    ranks: " +
                std::to_string(ranks) + "\n    comm: auto\ncluster:\n" + cluster +
                "  redis:\n    host: 127.0.0.1\n    port: " + std::to_string(redis_port) +
                "\n    password_env: KF_TEST_REDIS_PASSWORD\n");
  return path;
}

}  // namespace

TEST(LaunchLearnerNodesTest, CpuRanksOnSeveralNodesAreRefusedAtStartNamingTheKey) {
  kf::test::TempDir tmp("learner-nodes");
  const auto cfg = write_config(tmp.path, "cpunodes", 2, 6390);
  const std::string log = tmp.path + "/rank0.log";
  const auto t0 = std::chrono::steady_clock::now();
  const int code = wait_exit(spawn(
      {learner_bin(), cfg, "--synthetic", "--device", "cpu", "--steps", "1", "--rank", "0", "--rendezvous", "redis"},
      log));
  const std::string out = kf::test::read_file(log);
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("learner.dist.comm: 'auto' means the cpu (shared-memory) communicator here (device cpu), which "
                     "works only among the ranks of one host"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("--rendezvous redis"), std::string::npos) << out;
  EXPECT_NE(out.find("exiting with status 1"), std::string::npos) << out;
  // Refused before any rendezvous wait (nothing listens on 6390 here).
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);
}

// Rank 1 "on another node" (cluster.role learners): it attaches no run and takes its groups
// from rank 0 through Redis (--remote-from 1); rank 0 (cluster.role head) takes them from the
// head's replay, which holds the synthetic stream's groups in order. The two ranks still meet
// over the CPU communicator here, as only the groups' path is under test. The weights must be
// bit-identical to the same two ranks each taking their own synthetic groups.
TEST(LaunchLearnerNodesTest, RemoteRankTakesItsGroupsThroughRankZeroAndTrainsIdentically) {
  kf::test::TempDir tmp("learner-nodes");
  kf::netqueue::ServerOptions so;
  so.password = "learnerNodesRelayPw7";
  auto srv = kf::netqueue::RedisServer::start(so);
  ::setenv("KF_TEST_REDIS_PASSWORD", so.password.c_str(), 1);
  ::setenv("OMP_NUM_THREADS", "1", 1);
  const int steps = 3;
  // The head's run: every group of the synthetic stream, steps x 8, rank 0's share of each
  // step before rank 1's (the replay hands out the oldest first).
  const std::string shm_name = "kflnodes" + std::to_string(::getpid());
  auto shm = kf::replay::RunShm::create(shm_name);
  {
    const auto lc = kf::learner::learner_config_from(kf::Config::load(write_config(tmp.path, "fill", 2, srv.port())));
    kf::learner::SyntheticConfig sc;  // as kf-learner --synthetic makes it
    sc.seed = lc.seed + 1;
    sc.vocab = kf::learner::model_shape(lc.init_shape).vocab_size;
    kf::learner::SyntheticSource src(sc);
    src.groups_per_step_total = lc.groups_per_step;
    for (int64_t step = 0; step < steps; ++step)
      for (int rank = 0; rank < 2; ++rank) {
        kf::replay::TakeRequest r;
        r.step = step;
        r.rank = rank;
        r.world = 2;
        r.max_lag = lc.max_staleness;
        for (auto g : src.take(r)) {
          for (auto& c : g.candidates) c.prompt_tokens = g.prompt_tokens;
          ASSERT_TRUE(shm->replay().open_group(g.candidates, std::chrono::minutes(10)));
          for (const auto& res : g.results) ASSERT_TRUE(shm->replay().add_result(res));
        }
      }
  }
  auto run2 = [&](const std::string& name, bool relay) {
    std::vector<pid_t> pids;
    for (int r : {0, 1}) {
      const std::string role = r == 0 ? "head" : "learners";
      const auto cfg =
          relay ? write_config(tmp.path, name, 2, srv.port(),
                               "  role: " + role + "\n  head_learner_ranks: 1\n  learner_ranks: 1\n", "-" + role)
                : write_config(tmp.path, name, 2, srv.port());
      std::vector<std::string> a = {learner_bin(), cfg,
                                    "--device",    "cpu",
                                    "--steps",     std::to_string(steps),
                                    "--rank",      std::to_string(r),
                                    "--comm-name", "kf.test.lnodes." + name + "." + std::to_string(::getpid())};
      if (!relay) a.push_back("--synthetic");
      if (relay) a.insert(a.end(), {"--remote-from", "1"});
      if (relay && r == 0) a.insert(a.end(), {"--run", shm_name});
      pids.push_back(spawn(a, tmp.path + "/" + name + "-" + std::to_string(r) + ".log"));
    }
    std::vector<std::string> sums, logs;
    for (int r = 0; r < 2; ++r) {
      const int code = wait_exit(pids[r]);
      logs.push_back(kf::test::read_file(tmp.path + "/" + name + "-" + std::to_string(r) + ".log"));
      EXPECT_EQ(code, 0) << name << " rank " << r << ":\n" << logs.back();
      std::smatch m;
      if (std::regex_search(logs.back(), m, std::regex("WEIGHTS_CHECKSUM ([0-9a-f]+)"))) sums.push_back(m[1]);
    }
    if (relay) {
      EXPECT_NE(logs[0].find("serves the groups of ranks 1..1"), std::string::npos) << logs[0];
      EXPECT_NE(logs[1].find("takes its groups from rank 0"), std::string::npos) << logs[1];
    }
    return sums;
  };
  const auto local = run2("local", false);
  const auto relayed = run2("relayed", true);
  ASSERT_EQ(local.size(), 2u);
  ASSERT_EQ(relayed.size(), 2u);
  EXPECT_EQ(local[0], local[1]);
  EXPECT_EQ(relayed[0], relayed[1]);
  EXPECT_EQ(relayed[0], local[0]) << "the relayed groups must be exactly the ones rank 1 takes itself";
  shm->shutdown();
}

// Two ranks on two GPUs meet through Redis (as ranks on two nodes would) and train
// exactly as the same two ranks meeting through a folder: the same weights checksum on
// every rank of both runs.
TEST(LaunchLearnerNodesTest, TwoGpuRanksMeetThroughRedisAndTrainAsThroughAFolder) {
  if (!torch::cuda::is_available() || torch::cuda::device_count() < 2)
    GTEST_SKIP() << "needs 2 CUDA devices (found " << (torch::cuda::is_available() ? torch::cuda::device_count() : 0)
                 << ")";
  kf::test::TempDir tmp("learner-nodes");
  kf::netqueue::ServerOptions so;
  so.password = "learnerNodesTestPw42";
  auto srv = kf::netqueue::RedisServer::start(so);
  ::setenv("KF_TEST_REDIS_PASSWORD", so.password.c_str(), 1);
  ::setenv("NCCL_NVLS_ENABLE", "0", 1);  // NVLink multicast off, as tools/launch runs NCCL
  auto run2 = [&](const std::string& name, const std::string& rendezvous) {
    const auto cfg = write_config(tmp.path, name, 2, srv.port());
    std::vector<pid_t> pids;
    // Rank 1 first: it waits for rank 0's publication.
    for (int r : {1, 0})
      pids.push_back(spawn({learner_bin(), cfg, "--synthetic", "--device", "cuda:" + std::to_string(r), "--steps", "3",
                            "--rank", std::to_string(r), "--rendezvous", rendezvous},
                           tmp.path + "/" + name + "-" + std::to_string(r) + ".log"));
    std::vector<std::string> sums;
    for (int i = 0; i < 2; ++i) {
      const int r = i == 0 ? 1 : 0;
      const int code = wait_exit(pids[i]);
      const std::string out = kf::test::read_file(tmp.path + "/" + name + "-" + std::to_string(r) + ".log");
      EXPECT_EQ(code, 0) << name << " rank " << r << ":\n" << out;
      std::smatch m;
      if (std::regex_search(out, m, std::regex("WEIGHTS_CHECKSUM ([0-9a-f]+)"))) sums.push_back(m[1]);
      if (rendezvous == "redis")
        EXPECT_NE(out.find("NCCL rendezvous through redis at 127.0.0.1:" + std::to_string(srv.port())),
                  std::string::npos)
            << out;
    }
    return sums;
  };
  const auto via_redis = run2("viaredis", "redis");
  const auto via_dir = run2("viadir", tmp.path);
  ASSERT_EQ(via_redis.size(), 2u);
  ASSERT_EQ(via_dir.size(), 2u);
  EXPECT_EQ(via_redis[0], via_redis[1]);
  EXPECT_EQ(via_redis[0], via_dir[0]);
  EXPECT_EQ(via_dir[0], via_dir[1]);
}
