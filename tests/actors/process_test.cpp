// The kf-actor process: SIGKILL mid-run and restart resumes pushing without corrupting
// the queue or the replay, and a snapshot published mid-run is picked up.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <set>
#include <thread>

#include "kf/replay/replay.h"
#include "test_util.h"
#include "weights_blob.h"

using namespace kf::actors;
namespace rp = kf::replay;

namespace {

pid_t spawn_actor(const std::string& run, const std::string& config, const std::string& run_dir) {
  const pid_t pid = fork();
  if (pid == 0) {
    const std::string bin = KF_ACTOR_BIN;
    execl(bin.c_str(), bin.c_str(), "--run", run.c_str(), "--config", config.c_str(), "--id", "0", "--run-dir",
          run_dir.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

}  // namespace

TEST(ActorProcessTest, SigkillAndRestartResumePushingAndPickUpASnapshot) {
  KF_NEED_TASKS();
  test::TempDir tmp;
  const std::string run = test::run_name("p");
  rp::RunShmConfig c;
  c.candidates = {16, 256 * 1024};
  c.replay.capacity = 64;
  c.replay.group_bytes = 4u << 20;
  c.snapshot.max_bytes = 8u << 20;
  auto shm = rp::RunShm::create(run, c);
  shm->control().set_state(rp::RunState::running);
  ::mkdir((tmp.path + "/logs").c_str(), 0755);
  ::mkdir((tmp.path + "/metrics").c_str(), 0755);
  const std::string cfg = tmp.path + "/config.yaml";
  test::write_file(cfg,
                   "run: {seed: 0, backend: cpu}\n"
                   "tasks: {dir: " +
                       test::tasks_dir() +
                       ", include: [001_relu]}\n"
                       "learner: {init_shape: tiny}\n"
                       "actors:\n  group_size: 2\n  score_extraction_failures: false\n  metrics_every_s: 0.5\n"
                       "  sampling: {max_new_tokens: 12}\n"
                       "  prompt: {context_tokens: 8192, template: " +
                       test::source_dir() + "/configs/prompts/contrastive.txt, abi_header: " + test::source_dir() +
                       "/evaluator/include/kf/kernel.h}\n");
  test::Evaluators evaluators(*shm);  // the test acts as the evaluators, through the seam
  std::vector<rp::Candidate> got;
  auto pump = [&](auto done, double timeout_s) {
    const auto t0 = std::chrono::steady_clock::now();
    while (!done()) {
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s) return false;
      const auto batch = evaluators.score(16, std::chrono::milliseconds(50));
      got.insert(got.end(), batch.begin(), batch.end());
    }
    return true;
  };

  pid_t a = spawn_actor(run, cfg, tmp.path);
  ASSERT_TRUE(pump([&] { return got.size() >= 4; }, 120)) << test::read_text(tmp.path + "/logs/actor-0.log");
  // Kill it at whatever instruction it is at (sampling, filling a group, mid-push).
  ::kill(a, SIGKILL);
  int status = 0;
  ::waitpid(a, &status, 0);
  shm->reap();  // what the killed actor held (a slot mid-push, a group being filled)
  const std::size_t before = got.size();

  pid_t b = spawn_actor(run, cfg, tmp.path);
  ASSERT_TRUE(pump([&] { return got.size() >= before + 4; }, 120)) << test::read_text(tmp.path + "/logs/actor-0.log");
  // The learner publishes v7 while the restarted actor runs.
  auto v7 = test::tiny_policy(11);
  const auto blob = make_weights_blob(v7.model, 7);
  shm->snapshots().publish(7, blob.data(), blob.size());
  ASSERT_TRUE(pump([&] { return !got.empty() && got.back().policy_version == 7; }, 120))
      << test::read_text(tmp.path + "/logs/actor-0.log");

  // Stop: the actor leaves cleanly.
  shm->control().set_state(rp::RunState::stopped);
  const auto t0 = std::chrono::steady_clock::now();
  pid_t w = 0;
  while ((w = ::waitpid(b, &status, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30)) {
    pump([] { return true; }, 1);
    evaluators.score(16, std::chrono::milliseconds(20));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (w == 0) ::kill(b, SIGKILL), ::waitpid(b, &status, 0);
  ASSERT_EQ(w, b) << "actor did not stop within 30 s of the run stopping";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;

  // Nothing corrupt, no id twice, every group of one run, and no slot leaked.
  shm->reap();
  for (auto& c : evaluators.score(16, std::chrono::milliseconds(300))) got.push_back(std::move(c));  // the last ones
  const auto ledger = shm->candidate_ledger();
  EXPECT_EQ(ledger.corrupt, 0u);
  EXPECT_LE(ledger.lost_producer, 2u);  // at most the killed actor's in-flight push
  std::set<uint64_t> ids;
  for (const auto& x : got) {
    EXPECT_TRUE(ids.insert(x.id).second) << "candidate id " << x.id << " delivered twice";
    EXPECT_EQ(x.task, "001_relu");
    EXPECT_EQ(x.behaviour_logprobs.size(), x.completion_tokens.size());
  }
  EXPECT_TRUE(ledger.balanced()) << "created " << ledger.created << " != scored " << ledger.scored << " + lost "
                                 << ledger.lost() << " + queued " << ledger.queued << " + in flight "
                                 << ledger.in_flight;
  EXPECT_EQ(ledger.queued + ledger.in_flight, 0u);
  const auto room = shm->candidate_room();
  EXPECT_EQ(room.free_slots, room.capacity) << "a slot is still held";
  const auto rs = shm->replay().stats();
  EXPECT_LE(rs.lost_filling, 1u);
  const std::string log = test::read_text(tmp.path + "/logs/actor-0.log");
  EXPECT_NE(log.find("loaded policy snapshot v7"), std::string::npos) << log;
  const std::string metrics = test::read_text(tmp.path + "/metrics/actor-0.jsonl");
  EXPECT_NE(metrics.find("\"tokens_per_s\""), std::string::npos) << metrics;
  shm->shutdown();
}
