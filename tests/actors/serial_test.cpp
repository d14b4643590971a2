// Serial mode end to end on the CPU backend: a tiny byte-level model overfit on one
// prompt -> completion pair writes a known-good ReLU kernel; the actor samples it
// greedily, extracts it, the evaluator verifies it for real, and the Result lands in the
// ReplayBuffer group and the kernel in the KernelDb. No mocks.
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kf/actors/actors.h"
#include "kf/evaluator/evaluator.h"
#include "test_util.h"

using namespace kf::actors;
namespace rp = kf::replay;

TEST(SerialTest, OverfitPolicyKernelIsVerifiedAndLandsInReplayAndKernelDb) {
  KF_NEED_TASKS();
  const auto t_start = std::chrono::steady_clock::now();
  test::TempDir tmp;
  torch::manual_seed(0);
  at::set_num_threads(2);
  // A short plain prompt (template files are data: a test may bring its own).
  const std::string tpl = tmp.path + "/short.txt";
  test::write_file(tpl, "=== plain ===\nTask {{task}} ({{lang}} {{marker}}):\n");
  const std::string kernel = test::read_text(test::source_dir() + "/tests/evaluator/kernels/cpu/good_relu.cpp");
  ASSERT_FALSE(kernel.empty());
  const std::string completion = "```cpp kernel\n" + kernel + "```\n";

  rp::RunShmConfig c;
  c.candidates = {16, 256 * 1024};
  c.replay.capacity = 8;
  auto shm = rp::RunShm::create(test::run_name("s"), c);
  shm->control().set_state(rp::RunState::running);

  ActorOptions o;
  o.tasks_dir = test::tasks_dir();
  o.include = {"001_relu"};
  o.mode = PromptMode::plain;
  o.template_path = tpl;
  o.abi_header_path = test::source_dir() + "/evaluator/include/kf/kernel.h";
  o.group_size = 1;
  o.temperature = 0;  // greedy
  o.max_new_tokens = static_cast<int64_t>(completion.size()) + 8;
  auto pol = test::tiny_policy(0);
  auto model = pol.model;
  auto tasks = load_actor_tasks(o);
  Actor actor(o, std::move(pol), tasks, *shm);
  const auto prompt = actor.build_task_prompt(*tasks[0], 0).tokens;

  // Overfit: teacher-forced argmax must reproduce every completion token (then greedy
  // decoding does too). Completion ends with EOS (id 0).
  const int steps = test::memorise(model, prompt, completion, /*margin=*/0.0f, 1500);
  ASSERT_GE(steps, 0) << "tiny model did not memorise the kernel in 1500 steps";
  std::cerr << "memorised after " << steps << " Adam steps, "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count() << " s\n";

  kf::evaluator::EvalOptions eo;
  // In the build tree, not the 0700 temp dir: the sandbox worker drops privileges and must read it.
  eo.compile.cache_dir = test::build_dir() + "/actors-test-eval-cache";
  eo.correctness_sets = 1;
  eo.stress_sets = 1;
  eo.warmup = 1;
  eo.trials = 3;
  eo.max_trials = 3;
  eo.max_spread = 100;  // a loaded CI machine: time, but never give up on spread
  eo.cpu_threads = 2;
  kf::evaluator::Evaluator ev(eo);
  SerialRunner serial(actor, ev, *shm, tasks, kf::tasks::Backend::CPU);
  ASSERT_EQ(serial.step(), StepResult::pushed);
  ASSERT_EQ(serial.results().size(), 1u);
  const auto& r = serial.results()[0];
  EXPECT_EQ(r.verdict, rp::Verdict::ok) << r.reason;
  EXPECT_GT(r.speedup, 0);

  std::vector<rp::ScoredGroup> groups;
  ASSERT_EQ(shm->replay().take_ready(groups, 4, 0, 100, std::chrono::seconds(5)), 1u);
  const auto& g = groups[0];
  EXPECT_EQ(g.task, "001_relu");
  ASSERT_EQ(g.results.size(), 1u);
  EXPECT_EQ(g.results[0].verdict, rp::Verdict::ok);
  EXPECT_EQ(g.candidates[0].source, kernel);
  EXPECT_EQ(g.prompt_tokens, prompt);
  EXPECT_EQ(g.candidates[0].completion_tokens.back(), 0);  // EOS kept
  const auto best = shm->kernels().best("001_relu");
  ASSERT_TRUE(best.has_value());
  EXPECT_EQ(best->source, kernel);
  EXPECT_DOUBLE_EQ(best->speedup, r.speedup);
  EXPECT_EQ(best->policy_version, 0);

  // The next prompt of this task (contrastive mode) shows that kernel as an exemplar.
  shm->shutdown();
}

// The learning-curve probe through the real evaluator (serial mode): with the actor's
// extraction failures sent to the evaluator, every probe sample gets a verdict line that
// says "probe": true, and the training group's lines do not; the actor then records the
// probe from the group's results.
TEST(SerialTest, ProbeSamplesAreVerifiedAndTheirVerdictLinesSaySo) {
  KF_NEED_TASKS();
  test::TempDir tmp;
  const std::string tpl = tmp.path + "/short.txt";
  test::write_file(tpl, "=== plain ===\nTask {{task}} ({{lang}} {{marker}}):\n");
  rp::RunShmConfig c;
  c.candidates = {16, 256 * 1024};
  c.replay.capacity = 8;
  auto shm = rp::RunShm::create(test::run_name("sp"), c);
  shm->control().set_state(rp::RunState::running);
  ActorOptions o;
  o.tasks_dir = test::tasks_dir();
  o.include = {"001_relu"};
  o.mode = PromptMode::plain;
  o.template_path = tpl;
  o.abi_header_path = test::source_dir() + "/evaluator/include/kf/kernel.h";
  o.group_size = 2;
  o.max_new_tokens = 8;
  o.score_extraction_failures = false;  // every sample goes to the evaluator
  o.probe_every = 5;
  o.probe_samples = 3;
  auto tasks = load_actor_tasks(o);
  Actor actor(o, test::tiny_policy(0), tasks, *shm);
  kf::evaluator::EvalOptions eo;
  eo.compile.cache_dir = test::build_dir() + "/actors-test-eval-cache";
  kf::evaluator::Evaluator ev(eo);
  const std::string log = tmp.path + "/verdicts-0.jsonl";
  SerialRunner serial(actor, ev, *shm, tasks, kf::tasks::Backend::CPU, log);
  ASSERT_EQ(serial.step(), StepResult::pushed);  // the probe of v0
  ASSERT_EQ(serial.step(), StepResult::pushed);  // a training group; the probe is read first
  std::size_t probe_lines = 0, other_lines = 0;
  std::istringstream in(test::read_text(log));
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line);
    (j.value("probe", false) ? probe_lines : other_lines) += 1;
  }
  EXPECT_EQ(probe_lines, 3u);
  EXPECT_EQ(other_lines, 2u);
  ASSERT_EQ(actor.probe_records().size(), 1u);
  const auto& r = actor.probe_records()[0];
  EXPECT_EQ(r.version, 0);
  EXPECT_EQ(r.all.samples, 3u);
  EXPECT_EQ(r.all.scored, 3u);
  EXPECT_EQ(r.all.ok, 0u);  // an untrained model writes no kernel
  shm->shutdown();
}
