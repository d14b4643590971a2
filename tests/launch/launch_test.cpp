// tools/launch end to end on the CPU backend: the real kf-launch supervising real
// kf-evaluator, kf-actor and kf-learner processes over the run's shared memory. The
// policy is a tiny byte-level model that memorised a correct ReLU kernel for the run's
// prompt (sampled at temperature 0.5 it writes that kernel, now and then a broken
// variant), so candidates are verified for real, kernels reach the kernel database and
// the learner gets groups whose rewards differ. What is checked is the supervision:
// start, step budget, stop order, checkpoints, resume, restarts after SIGKILL, and config
// errors before anything starts.
#include <gtest/gtest.h>
#include <signal.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <algorithm>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "../actors/test_util.h"
#include "kf/actors/optimize.h"
#include "kf/common/config.h"
#include "kf/policy/checkpoint.h"

namespace {
using Clock = std::chrono::steady_clock;
namespace t = kf::test;

using kf::actors::test::exists;
using kf::actors::test::tasks_dir;

#define NEED_LAUNCH()                                                                                  \
  do {                                                                                                 \
    if (tasks_dir().empty()) GTEST_SKIP() << "task 001_relu is not imported (run setup.sh)";           \
    if (!exists(t::build_dir() + "/tools/kf-launch")) GTEST_SKIP() << "kf-launch is not built";        \
  } while (0)

std::string completion() {
  return "```cpp kernel\n" + t::read_file(t::source_dir() + "/tests/evaluator/kernels/cpu/good_relu.cpp") + "```\n";
}

// A small CPU run: one task, groups of 2, the memorised policy, a step budget.
std::string config_text(const std::string& dir, const std::string& policy_dir, int steps) {
  return "run: {name: t, root: " + dir + "/runs, backend: cpu, seed: 0}\n"
         "tasks: {dir: " + tasks_dir() + ", include: [001_relu]}\n"
         "evaluator: {correctness_sets: 2, stress_sets: 1, trials: 3, max_trials: 3, warmup: 1, max_spread: 100,\n"
         "            reward: {kind: speedup}}\n"
         "learner:\n  policy: " + policy_dir + "\n  temperature: 0.5\n  steps: " + std::to_string(steps) +
         "\n  groups_per_step: 1\n  take_timeout_ms: 200\n  checkpoint: {every: 2, keep: 10}\n"
         "actors:\n  group_size: 2\n  metrics_every_s: 1\n"
         "  sampling: {max_new_tokens: " + std::to_string(completion().size() + 8) + "}\n"
         "  prompt: {mode: no_exemplars, context_tokens: 8192, template: " + dir + "/template.txt, abi_header: " +
         t::source_dir() + "/evaluator/include/kf/kernel.h}\n"
         "replay: {candidate_queue: {capacity: 8}}\n"
         "launch: {status_every_s: 1, metrics_every_s: 1, restart_backoff_s: 0.2, drain_timeout_s: 20}\n";
}

// The memorised policy, made once per build tree (tests run as separate processes; a
// concurrent maker loses the rename race harmlessly).
std::string policy_dir() {
  const std::string dir = t::build_dir() + "/launch-test-policy";
  if (exists(dir + "/model.safetensors")) return dir;
  t::TempDir tmp("launch-policy");
  t::write_file(tmp.path + "/template.txt", kf::actors::test::kShortTemplate);
  const auto cfg = kf::Config::parse(config_text(tmp.path, dir, 1), "launch_test");
  const auto o = kf::actors::actor_options(cfg, 0);
  torch::manual_seed(0);
  auto pol = kf::actors::test::tiny_policy(0);
  const auto task = kf::tasks::Task::load(tasks_dir() + "/001_relu");
  const auto prompt = kf::actors::optimize_prompt(o, pol, *task, {});
  if (kf::actors::test::memorise(pol.model, prompt.tokens, completion(), 6.0f, 4000) < 0) return "";
  const std::string staging = tmp.path + "/model";
  ::mkdir(staging.c_str(), 0755);
  kf::policy::save_weights(pol.model, staging);
  if (::rename(staging.c_str(), dir.c_str()) != 0 && !exists(dir + "/model.safetensors")) return "";
  return dir;
}

std::string write_config(const std::string& dir, int steps, const std::string& extra = "") {
  t::write_file(dir + "/template.txt", kf::actors::test::kShortTemplate);
  const std::string policy = policy_dir();
  EXPECT_FALSE(policy.empty()) << "the tiny policy did not memorise the kernel";
  const std::string p = dir + "/config.yaml";
  t::write_file(p, config_text(dir, policy, steps) + extra);
  return p;
}

struct Launch {
  pid_t pid = -1;
  std::string out;  // stdout + stderr file
};

Launch start(const std::vector<std::string>& args, const std::string& out) {
  Launch l;
  l.out = out;
  l.pid = ::fork();
  if (l.pid == 0) {
    const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::vector<std::string> a = {t::build_dir() + "/tools/kf-launch"};
    a.insert(a.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& s : a) argv.push_back(s.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    _exit(127);
  }
  return l;
}

// Exit code, or -signal; -1000 on timeout (the launcher is then killed).
int wait_for(const Launch& l, double timeout_s) {
  const auto until = Clock::now() + std::chrono::milliseconds(static_cast<long long>(timeout_s * 1000));
  for (;;) {
    int st = 0;
    if (::waitpid(l.pid, &st, WNOHANG) == l.pid) return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
    if (Clock::now() > until) {
      ::kill(l.pid, SIGKILL);
      ::waitpid(l.pid, &st, 0);
      return -1000;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

bool wait_until(const std::function<bool()>& cond, double timeout_s) {
  const auto until = Clock::now() + std::chrono::milliseconds(static_cast<long long>(timeout_s * 1000));
  while (Clock::now() < until) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return false;
}

std::string slurp(const std::string& p) { return exists(p) ? t::read_file(p) : ""; }

// The highest learner step written to metrics/learner.jsonl.
int64_t learner_step(const std::string& run) {
  std::istringstream in(slurp(run + "/metrics/learner.jsonl"));
  int64_t best = -1;
  for (std::string line; std::getline(in, line);) {
    try {
      best = std::max<int64_t>(best, nlohmann::json::parse(line).at("step").get<int64_t>());
    } catch (...) {
    }
  }
  return best;
}

// pid of "<role> <id>" as the launcher logged it last ("started actor 0 pid N" / "restarted ... as pid N").
pid_t worker_pid(const std::string& run, const std::string& who) {
  const std::string log = slurp(run + "/logs/launch-0.log");
  std::regex re("(started|restarted) " + who + " (as )?pid ([0-9]+)");
  pid_t pid = -1;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator(); ++it)
    pid = std::stoi((*it)[3]);
  return pid;
}

std::vector<std::string> checkpoints(const std::string& run) {
  std::vector<std::string> out;
  if (DIR* d = opendir((run + "/checkpoints").c_str())) {
    while (dirent* e = readdir(d))
      if (std::string(e->d_name).rfind("step-", 0) == 0) out.push_back(e->d_name);
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool shm_exists(const std::string& run) { return exists("/dev/shm/kf." + run + ".ctl"); }

}  // namespace

TEST(LaunchTest, BadConfigFailsBeforeAnythingStarts) {
  NEED_LAUNCH();
  t::TempDir tmp("launch-test");
  const std::string cfg = write_config(tmp.path, 2, "learner:\n  optim: {lr_typo: 1}\n");
  auto l = start({cfg, "--name", "bad" + std::to_string(getpid())}, tmp.path + "/out.txt");
  EXPECT_EQ(wait_for(l, 60), 2);
  const std::string out = slurp(l.out);
  EXPECT_NE(out.find("nothing was started"), std::string::npos) << out;
  EXPECT_FALSE(exists(tmp.path + "/runs")) << "a run folder was made for a rejected config";
  EXPECT_FALSE(shm_exists("bad" + std::to_string(getpid())));

  // A task selection that matches nothing is a config error too, named by its key.
  const std::string cfg2 = write_config(tmp.path, 2, "");
  auto l2 = start({cfg2, "--set", "tasks.include=[no_such_task]"}, tmp.path + "/out2.txt");
  EXPECT_EQ(wait_for(l2, 60), 2);
  EXPECT_NE(slurp(l2.out).find("tasks.include"), std::string::npos) << slurp(l2.out);
  EXPECT_FALSE(exists(tmp.path + "/runs"));
}

TEST(LaunchTest, RunReachesTheStepBudgetAndStopsInOrder) {
  NEED_LAUNCH();
  t::TempDir tmp("launch-test");
  const std::string name = "lq" + std::to_string(getpid());
  auto l = start({write_config(tmp.path, 4), "--name", name}, tmp.path + "/out.txt");
  const int code = wait_for(l, 300);
  const std::string run = tmp.path + "/runs/" + name;
  ASSERT_EQ(code, 0) << slurp(l.out);
  EXPECT_GE(learner_step(run), 4) << slurp(run + "/logs/learner-0.out");
  // A final checkpoint at the budget, the launcher's state and outputs, metrics of every kind.
  const auto ck = checkpoints(run);
  ASSERT_FALSE(ck.empty());
  EXPECT_EQ(ck.back(), "step-000000000004");
  EXPECT_TRUE(exists(run + "/checkpoints/launch_state.json"));
  EXPECT_TRUE(exists(run + "/kernels/kernel_db.json"));
  EXPECT_TRUE(exists(run + "/best/index.json"));
  EXPECT_TRUE(exists(run + "/metrics/run.jsonl"));
  EXPECT_TRUE(exists(run + "/metrics/actor-0.jsonl"));
  const auto state = nlohmann::json::parse(slurp(run + "/checkpoints/launch_state.json"));
  EXPECT_GT(state["results_total"].get<int64_t>(), 0) << "no result went through the evaluator";
  EXPECT_GT(state["verdicts"]["ok"].get<int64_t>(), 0) << state.dump();
  // The memorised kernel was verified and is the run's best for the task.
  EXPECT_EQ(slurp(run + "/best/001_relu.cpp"), t::read_file(t::source_dir() + "/tests/evaluator/kernels/cpu/good_relu.cpp"));
  const std::string log = slurp(run + "/logs/launch-0.log");
  EXPECT_NE(log.find("learner reached learner.steps"), std::string::npos) << log;
  EXPECT_NE(log.find("status:"), std::string::npos) << "no status line when stdout is not a terminal";
  EXPECT_EQ(log.find("restart"), std::string::npos) << log;
  EXPECT_FALSE(shm_exists(name)) << "shared memory left behind";

  // tools/report turns the finished run into plots and a page with the best kernel.
  const std::string cmd = t::source_dir() + "/tools/report " + run + " > " + tmp.path + "/report.txt 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(tmp.path + "/report.txt");
  for (const char* f : {"index.html", "reward.png", "speedup.png", "verdicts.png", "throughput.png"})
    EXPECT_TRUE(exists(run + "/report/" + f)) << f << "\n" << slurp(tmp.path + "/report.txt");
  EXPECT_NE(slurp(run + "/report/index.html").find("001_relu"), std::string::npos);
}

TEST(LaunchTest, SigintDrainsCheckpointsAndResumeFinishesTheRun) {
  NEED_LAUNCH();
  t::TempDir tmp("launch-test");
  const std::string name = "li" + std::to_string(getpid());
  const std::string run = tmp.path + "/runs/" + name;
  auto l = start({write_config(tmp.path, 8), "--name", name}, tmp.path + "/out.txt");
  ASSERT_TRUE(wait_until([&] { return learner_step(run) >= 2; }, 240)) << slurp(l.out);
  ::kill(l.pid, SIGINT);
  ASSERT_EQ(wait_for(l, 180), 0) << slurp(l.out);
  const int64_t stopped_at = learner_step(run);
  EXPECT_LT(stopped_at, 8);
  const auto ck = checkpoints(run);
  ASSERT_FALSE(ck.empty()) << "no checkpoint after SIGINT";
  EXPECT_NE(slurp(run + "/logs/launch-0.log").find("stop signal"), std::string::npos);
  EXPECT_FALSE(shm_exists(name));

  auto r = start({"--resume", run}, tmp.path + "/out-resume.txt");
  ASSERT_EQ(wait_for(r, 300), 0) << slurp(r.out);
  EXPECT_GE(learner_step(run), 8);
  const std::string llog = slurp(run + "/logs/learner-0.out");
  EXPECT_NE(llog.find("resumed from"), std::string::npos) << llog;
  EXPECT_EQ(checkpoints(run).back(), "step-000000000008");
  // Run totals carry over the resume.
  const auto state = nlohmann::json::parse(slurp(run + "/checkpoints/launch_state.json"));
  EXPECT_GT(state["elapsed_s"].get<double>(), 0);
}

TEST(LaunchTest, KilledActorAndEvaluatorAreRestartedAndTheRunCompletes) {
  NEED_LAUNCH();
  t::TempDir tmp("launch-test");
  const std::string name = "lk" + std::to_string(getpid());
  const std::string run = tmp.path + "/runs/" + name;
  auto l = start({write_config(tmp.path, 8), "--name", name}, tmp.path + "/out.txt");
  ASSERT_TRUE(wait_until([&] { return learner_step(run) >= 1; }, 240)) << slurp(l.out);
  const pid_t actor = worker_pid(run, "actor 0"), evaluator = worker_pid(run, "evaluator 0");
  ASSERT_GT(actor, 0);
  ASSERT_GT(evaluator, 0);
  ::kill(actor, SIGKILL);
  ::kill(evaluator, SIGKILL);
  ASSERT_TRUE(wait_until([&] { return worker_pid(run, "actor 0") != actor && worker_pid(run, "evaluator 0") != evaluator; },
                         60))
      << slurp(run + "/logs/launch-0.log");
  ASSERT_EQ(wait_for(l, 300), 0) << slurp(l.out);
  EXPECT_GE(learner_step(run), 8);
  const std::string log = slurp(run + "/logs/launch-0.log");
  EXPECT_NE(log.find("actor 0 killed by SIGKILL"), std::string::npos) << log;
  EXPECT_NE(log.find("evaluator 0 killed by SIGKILL"), std::string::npos) << log;
  // Results kept flowing after the restart: the evaluator that replaced the killed one scored some.
  const auto state = nlohmann::json::parse(slurp(run + "/checkpoints/launch_state.json"));
  EXPECT_GT(state["results_total"].get<int64_t>(), 0);
}

// Issue 10's checks that CPUs allow: a 2-rank learner (shared-memory all-reduce) trains, a
// SIGKILLed rank makes the launcher stop the run (exit 1, no hang) with a checkpoint left,
// and --resume continues on 2 ranks from that checkpoint.
TEST(LaunchTest, TwoLearnerRanksAKilledRankStopsTheRunAndResumeContinues) {
  NEED_LAUNCH();
  t::TempDir tmp("launch-test");
  const std::string name = "l2" + std::to_string(getpid());
  const std::string run = tmp.path + "/runs/" + name;
  auto l = start({write_config(tmp.path, 40), "--name", name, "--set", "learner.dist.ranks=2", "--set",
                  "learner.groups_per_step=2"},
                 tmp.path + "/out.txt");
  ASSERT_TRUE(wait_until([&] { return learner_step(run) >= 2 && !checkpoints(run).empty(); }, 300)) << slurp(l.out);
  const pid_t rank1 = worker_pid(run, "learner 1");
  ASSERT_GT(rank1, 0) << slurp(run + "/logs/launch-0.log");
  ::kill(rank1, SIGKILL);
  ASSERT_EQ(wait_for(l, 180), 1) << "expected 'stopped after a failure'\n" << slurp(l.out);
  const std::string log = slurp(run + "/logs/launch-0.log");
  EXPECT_NE(log.find("a multi-rank learner cannot continue without it"), std::string::npos) << log;
  EXPECT_EQ(log.find("restarted learner"), std::string::npos) << "a lone rank cannot rejoin; it must not be restarted";
  const auto ck = checkpoints(run);
  ASSERT_FALSE(ck.empty());
  EXPECT_FALSE(shm_exists(name));
  const int64_t stopped_at = learner_step(run);
  ASSERT_LT(stopped_at, 40);
  const int64_t resumed_from = std::stoll(ck.back().substr(5));

  const int64_t budget = stopped_at + 2;
  auto r = start({"--resume", run, "--set", "learner.steps=" + std::to_string(budget)}, tmp.path + "/out-resume.txt");
  ASSERT_EQ(wait_for(r, 300), 0) << slurp(r.out);
  EXPECT_GE(learner_step(run), budget);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string llog = slurp(run + "/logs/learner-" + std::to_string(rank) + ".out");
    EXPECT_NE(llog.find("rank " + std::to_string(rank) + ": resumed from"), std::string::npos) << llog;
    EXPECT_NE(llog.find("at step " + std::to_string(resumed_from)), std::string::npos) << llog;
  }
}

TEST(LaunchTest, SerialModeRunsThePipelineInOneProcess) {
  NEED_LAUNCH();
  t::TempDir tmp("launch-test");
  const std::string name = "ls" + std::to_string(getpid());
  const std::string run = tmp.path + "/runs/" + name;
  auto l = start({write_config(tmp.path, 2), "--name", name, "--set", "launch.mode=serial"}, tmp.path + "/out.txt");
  ASSERT_EQ(wait_for(l, 300), 0) << slurp(l.out);
  EXPECT_GE(learner_step(run), 2);
  EXPECT_EQ(checkpoints(run).back(), "step-000000000002");
  // No worker processes: everything ran inside the launcher.
  EXPECT_FALSE(exists(run + "/logs/actor-0.out"));
  EXPECT_FALSE(exists(run + "/logs/evaluator-0.out"));
  EXPECT_EQ(slurp(run + "/best/001_relu.cpp"), t::read_file(t::source_dir() + "/tests/evaluator/kernels/cpu/good_relu.cpp"));
  const auto state = nlohmann::json::parse(slurp(run + "/checkpoints/launch_state.json"));
  EXPECT_GT(state["verdicts"]["ok"].get<int64_t>(), 0) << state.dump();
  EXPECT_FALSE(shm_exists(name));
}

TEST(LaunchTest, ShippedCpuConfigsPassTheChecks) {
  NEED_LAUNCH();
  t::TempDir tmp("launch-test");
  for (const char* c : {"configs/quickstart.yaml", "configs/default.yaml"}) {
    auto l = start({t::source_dir() + "/" + c, "--check", "--set", "tasks.dir=" + tasks_dir(), "--set",
                    "run.root=" + tmp.path + "/runs", "--set",
                    "learner.policy=" + t::source_dir() + "/policies/default"},
                   tmp.path + "/out.txt");
    EXPECT_EQ(wait_for(l, 120), 0) << c << "\n" << slurp(l.out);
  }
  EXPECT_FALSE(exists(tmp.path + "/runs"));
}
