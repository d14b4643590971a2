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
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <algorithm>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "../actors/test_util.h"
#include "launch_util.h"
#include "kf/actors/actors.h"
#include "kf/common/config.h"
#include "kf/common/run_dir.h"
#include "kf/policy/policy.h"
#include "kf/replay/replay.h"
#include "kf/tasks/tasks.h"

namespace {
using Clock = std::chrono::steady_clock;
namespace t = kf::test;

using kf::actors::test::exists;
using kf::actors::test::tasks_dir;
using kf::launch::test::Launch;
using kf::launch::test::slurp;
using kf::launch::test::start;
using kf::launch::test::wait_for;

#define NEED_LAUNCH()                                                                            \
  do {                                                                                           \
    if (tasks_dir().empty()) GTEST_SKIP() << "task 001_relu is not imported (run setup.sh)";     \
    if (!exists(t::build_dir() + "/launch/kf-launch")) GTEST_SKIP() << "kf-launch is not built"; \
  } while (0)

std::string completion() {
  return "```cpp kernel\n" + t::read_file(t::source_dir() + "/tests/evaluator/kernels/cpu/good_relu.cpp") + "```\n";
}

// A small CPU run: one task, groups of 2, the memorised policy, a step budget.
std::string config_text(const std::string& dir, const std::string& policy_dir, int steps) {
  return "run: {name: t, root: " + dir +
         "/runs, backend: cpu, seed: 0}\n"
         "tasks: {dir: " +
         tasks_dir() +
         ", include: [001_relu]}\n"
         "evaluator: {correctness_sets: 2, stress_sets: 1, trials: 3, max_trials: 3, warmup: 1, max_spread: 100,\n"
         "            reward: {kind: speedup}}\n"
         "learner:\n  policy: " +
         policy_dir + "\n  temperature: 0.5\n  steps: " + std::to_string(steps) +
         "\n  groups_per_step: 1\n  take_timeout_ms: 200\n  checkpoint: {every: 2, keep: 10}\n"
         "actors:\n  group_size: 2\n  metrics_every_s: 1\n"
         "  sampling: {max_new_tokens: " +
         std::to_string(completion().size() + 8) +
         "}\n"
         "  prompt: {mode: no_exemplars, context_tokens: 8192, template: " +
         dir + "/template.txt, abi_header: " + t::source_dir() +
         "/evaluator/include/kf/kernel.h}\n"
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

bool wait_until(const std::function<bool()>& cond, double timeout_s) {
  const auto until = Clock::now() + std::chrono::milliseconds(static_cast<long long>(timeout_s * 1000));
  while (Clock::now() < until) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return false;
}

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

// The control segment of any run named `run` (its key adds a hash of the folder's path).
bool shm_exists(const std::string& run) {
  const std::string prefix = "kf." + run + "-";
  for (const auto& n : kf::list_dir("/dev/shm"))
    if (n.rfind(prefix, 0) == 0 && n.size() > 4 && n.compare(n.size() - 4, 4, ".ctl") == 0) return true;
  return false;
}

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
  EXPECT_EQ(slurp(run + "/best/001_relu.cpp"),
            t::read_file(t::source_dir() + "/tests/evaluator/kernels/cpu/good_relu.cpp"));
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

// Chaos: every role but the launcher is SIGKILLed twice while the run trains (the
// launcher's own death is KilledLauncherKeepsItsClockAndTotals...). Each is restarted, the
// run reaches its step budget, and the candidate queue's account adds up exactly: every
// candidate created was scored, counted as lost, or is still queued when the step budget
// stopped the run (nothing trains on it then); none is left in flight; and every scored
// candidate has its verdict in a verdict log.
TEST(LaunchTest, EachRoleKilledTwiceIsRestartedAndEveryCandidateIsAccountedFor) {
  NEED_LAUNCH();
  t::TempDir tmp("launch-test");
  const std::string name = "lk" + std::to_string(getpid());
  const std::string run = tmp.path + "/runs/" + name;
  auto l = start({write_config(tmp.path, 10), "--name", name}, tmp.path + "/out.txt");
  for (const char* who : {"actor 0", "evaluator 0", "learner 0", "actor 0", "evaluator 0", "learner 0"}) {
    // The learner is killed after it has checkpointed (checkpoint.every: 2), so that its
    // restart resumes instead of starting over.
    const int64_t step = learner_step(run);
    ASSERT_TRUE(wait_until(
        [&] { return learner_step(run) >= std::max<int64_t>(1, step + 1) && !checkpoints(run).empty(); }, 240))
        << who << "\n"
        << slurp(l.out);
    const pid_t pid = worker_pid(run, who);
    ASSERT_GT(pid, 0) << who;
    ::kill(pid, SIGKILL);
    ASSERT_TRUE(wait_until(
        [&] {
          const pid_t p = worker_pid(run, who);
          return p > 0 && p != pid;
        },
        60))
        << who << " was not restarted\n"
        << slurp(run + "/logs/launch-0.log");
  }
  ASSERT_EQ(wait_for(l, 400), 0) << slurp(l.out);
  EXPECT_GE(learner_step(run), 10);
  const std::string log = slurp(run + "/logs/launch-0.log");
  for (const char* who : {"actor 0", "evaluator 0", "learner 0"}) {
    const std::string killed = std::string(who) + " killed by SIGKILL";
    std::size_t n = 0;
    for (auto p = log.find(killed); p != std::string::npos; p = log.find(killed, p + 1)) ++n;
    EXPECT_EQ(n, 2u) << killed << "\n" << log;
  }
  // The launcher's closing account: created = scored + lost + queued + in flight, with
  // nothing left in flight after the drain.
  std::smatch m;
  const std::regex ledger(
      "candidates of this session: created ([0-9]+) = scored ([0-9]+) \\+ lost ([0-9]+) \\([^)]*\\) "
      "\\+ queued ([0-9]+) \\+ in flight ([0-9]+)");
  ASSERT_TRUE(std::regex_search(log, m, ledger)) << log;
  const int64_t created = std::stoll(m[1]), scored = std::stoll(m[2]), lost = std::stoll(m[3]);
  EXPECT_EQ(created, scored + lost + std::stoll(m[4]) + std::stoll(m[5])) << m[0];
  EXPECT_EQ(std::stoll(m[5]), 0) << m[0];
  EXPECT_GT(scored, 0) << m[0];
  EXPECT_EQ(log.find("does not add up"), std::string::npos) << log;
  // Every scored candidate has a verdict line (an evaluator killed after its verdict line
  // but before storing the result re-scores it: ids are counted once).
  std::set<std::string> ids;
  for (int e = 0; e < 4; ++e) {
    std::istringstream in(slurp(run + "/metrics/verdicts-" + std::to_string(e) + ".jsonl"));
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) ids.insert(std::to_string(nlohmann::json::parse(line).at("candidate").get<uint64_t>()));
  }
  EXPECT_GE(int64_t(ids.size()), scored);
  EXPECT_LE(int64_t(ids.size()), scored + lost);
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
  EXPECT_EQ(slurp(run + "/best/001_relu.cpp"),
            t::read_file(t::source_dir() + "/tests/evaluator/kernels/cpu/good_relu.cpp"));
  const auto state = nlohmann::json::parse(slurp(run + "/checkpoints/launch_state.json"));
  EXPECT_GT(state["verdicts"]["ok"].get<int64_t>(), 0) << state.dump();
  EXPECT_FALSE(shm_exists(name));
}

TEST(LaunchTest, ShippedCpuConfigsPassTheChecks) {
  NEED_LAUNCH();
  t::TempDir tmp("launch-test");
  for (const char* c : {"configs/quickstart.yaml", "configs/default.yaml"}) {
    auto l =
        start({t::source_dir() + "/" + c, "--check", "--set", "tasks.dir=" + tasks_dir(), "--set",
               "run.root=" + tmp.path + "/runs", "--set", "learner.policy=" + t::source_dir() + "/policies/default"},
              tmp.path + "/out.txt");
    EXPECT_EQ(wait_for(l, 120), 0) << c << "\n" << slurp(l.out);
  }
  EXPECT_FALSE(exists(tmp.path + "/runs"));
}

// ---- Nothing lost, nothing leaked: config gaps, resume safety, --clean, crash survival.

namespace {
// Every path under `dir` with its size: a fingerprint to show that a command changed nothing.
std::string tree_listing(const std::string& dir) {
  std::string out;
  std::function<void(const std::string&)> walk = [&](const std::string& d) {
    std::vector<std::string> names;
    if (DIR* h = opendir(d.c_str())) {
      while (dirent* e = readdir(h)) {
        const std::string n = e->d_name;
        if (n != "." && n != "..") names.push_back(n);
      }
      closedir(h);
    }
    std::sort(names.begin(), names.end());
    for (const auto& n : names) {
      const std::string p = d + "/" + n;
      struct stat st {};
      ::lstat(p.c_str(), &st);
      out += p + " " + std::to_string(S_ISDIR(st.st_mode) ? -1 : st.st_size) + "\n";
      if (S_ISDIR(st.st_mode)) walk(p);
    }
  };
  walk(dir);
  return out;
}

std::vector<std::string> names_with(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (std::string(e->d_name).rfind(prefix, 0) == 0) out.push_back(e->d_name);
    closedir(d);
  }
  return out;
}

// run.jsonl / learner.jsonl lines as JSON.
std::vector<nlohmann::json> jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::istringstream in(slurp(path));
  for (std::string line; std::getline(in, line);) {
    try {
      out.push_back(nlohmann::json::parse(line));
    } catch (...) {
    }
  }
  return out;
}

void flip_byte_at_end(const std::string& path, long from_end) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-from_end, std::ios::end);
  char c;
  f.read(&c, 1);
  c ^= 0x5a;
  f.seekp(-from_end, std::ios::end);
  f.write(&c, 1);
}
}  // namespace

TEST(LaunchTest, ConfigGapsAreRejectedBeforeAnythingIsCreated) {
  NEED_LAUNCH();
  t::TempDir tmp("launch-test");
  const std::string cfg = write_config(tmp.path, 2);
  const std::string name = "lc" + std::to_string(getpid());
  // Policy copies with a truncated weight file and a truncated tokenizer.json.
  const std::string good = policy_dir(), trunc_w = tmp.path + "/pol-w", trunc_t = tmp.path + "/pol-t";
  ASSERT_EQ(std::system(("cp -r '" + good + "' '" + trunc_w + "' && cp -r '" + good + "' '" + trunc_t + "'").c_str()),
            0);
  struct stat st {};
  ASSERT_EQ(::stat((trunc_w + "/model.safetensors").c_str(), &st), 0);
  ASSERT_EQ(::truncate((trunc_w + "/model.safetensors").c_str(), st.st_size / 2), 0);
  t::write_file(trunc_t + "/tokenizer.json",
                t::read_file(t::source_dir() + "/policies/default/tokenizer.json").substr(0, 300));
  t::write_file(tmp.path + "/empty.yaml", "# nothing here\n");
  struct Case {
    std::vector<std::string> args;
    std::string named;  // what the error must name
  };
  const std::vector<Case> cases = {
      {{tmp.path + "/empty.yaml", "--name", name}, "empty.yaml"},
      {{cfg, "--name", name, "--set", "launch.max_minutes=-1"}, "launch.max_minutes"},
      {{cfg, "--name", name, "--set", "learner.steps=-2"}, "learner.steps"},
      {{cfg, "--name", name, "--set", "launch.restart_backoff_s=-1"}, "launch.restart_backoff_s"},
      {{cfg, "--name", name, "--set", "learner.checkpoint.every=0"}, "learner.checkpoint.every"},
      {{cfg, "--name", "bad name!"}, "run.name"},
      {{cfg, "--name", ".hidden"}, "run.name"},
      {{cfg, "--name", name, "--set", "learner.policy=" + trunc_w}, "model.safetensors"},
      {{cfg, "--name", name, "--set", "learner.policy=" + trunc_t}, "tokenizer.json"},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    auto l = start(cases[i].args, tmp.path + "/out" + std::to_string(i) + ".txt");
    EXPECT_EQ(wait_for(l, 120), 2) << cases[i].named << "\n" << slurp(l.out);
    const std::string out = slurp(l.out);
    EXPECT_NE(out.find(cases[i].named), std::string::npos) << out;
    EXPECT_NE(out.find("nothing was started"), std::string::npos) << out;
    EXPECT_FALSE(exists(tmp.path + "/runs")) << cases[i].named << ": a run folder was made";
    EXPECT_FALSE(shm_exists(name)) << cases[i].named;
  }
}

TEST(LaunchTest, ResumeWithoutAValidCheckpointIsAnErrorThatChangesNothing) {
  NEED_LAUNCH();
  t::TempDir tmp("launch-test");
  const std::string name = "lr" + std::to_string(getpid());
  const std::string run = tmp.path + "/runs/" + name;
  ASSERT_EQ(std::system(("mkdir -p '" + run + "/checkpoints' '" + run + "/kernels'").c_str()), 0);
  t::write_file(run + "/config.yaml", t::read_file(write_config(tmp.path, 4)));
  // No checkpoint at all.
  auto l0 = start({"--resume", run}, tmp.path + "/out0.txt");
  EXPECT_EQ(wait_for(l0, 120), 2) << slurp(l0.out);
  EXPECT_NE(slurp(l0.out).find("no valid checkpoint"), std::string::npos) << slurp(l0.out);
  EXPECT_NE(slurp(l0.out).find("none was written"), std::string::npos) << slurp(l0.out);
  // Two unusable ones: a partial folder (no manifest) and one whose manifest is garbage.
  const std::string a = run + "/checkpoints/step-000000000002", b = run + "/checkpoints/step-000000000004";
  ASSERT_EQ(std::system(("mkdir -p '" + a + "' '" + b + "'").c_str()), 0);
  t::write_file(a + "/model.safetensors", "half a model");
  t::write_file(b + "/MANIFEST.json", "{not json");
  t::write_file(run + "/kernels/kernel_db.json", "{\"format\": \"kf-kernel-db\", \"version\": 1, \"entries\": []}");
  const std::string before = tree_listing(run);
  auto l = start({"--resume", run}, tmp.path + "/out.txt");
  EXPECT_EQ(wait_for(l, 120), 2) << slurp(l.out);
  const std::string out = slurp(l.out);
  EXPECT_NE(out.find(a + ": "), std::string::npos) << out;
  EXPECT_NE(out.find("MANIFEST.json: missing"), std::string::npos) << out;
  EXPECT_NE(out.find(b + ": "), std::string::npos) << out;
  EXPECT_NE(out.find("not valid JSON"), std::string::npos) << out;
  // Nothing created, renamed or overwritten; no shared memory.
  EXPECT_EQ(tree_listing(run), before);
  EXPECT_FALSE(shm_exists(name));
}

TEST(LaunchTest, CleanRemovesADeadLaunchersLeftoversAndRefusesWhileItLives) {
  NEED_LAUNCH();
  t::TempDir tmp("launch-test");
  ::chmod(tmp.path.c_str(), 0755);  // the scratch folders then live under the run (nobody can reach them)
  const std::string name = "ln" + std::to_string(getpid());
  const std::string run = tmp.path + "/runs/" + name;
  ASSERT_EQ(std::system(("mkdir -p '" + run + "/tmp/evaluator-0/kf-sandbox-abc123'").c_str()), 0);
  t::write_file(run + "/config.yaml", t::read_file(write_config(tmp.path, 4)));
  t::write_file(run + "/tmp/evaluator-0/kf-sandbox-abc123/candidate.so", "left by a killed worker");
  // A launcher that died: its shared memory stays behind.
  const pid_t child = ::fork();
  if (child == 0) {
    try {
      auto shm = kf::replay::RunShm::create(kf::RunDir::open(run).shm_key());
      ::_exit(shm ? 0 : 1);  // no shutdown(): as if SIGKILLed
    } catch (...) {
      ::_exit(3);
    }
  }
  int st = 0;
  ASSERT_EQ(::waitpid(child, &st, 0), child);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  ASSERT_TRUE(shm_exists(name));
  auto c = start({"--clean", run}, tmp.path + "/clean.txt");
  ASSERT_EQ(wait_for(c, 60), 0) << slurp(c.out);
  const std::string out = slurp(c.out);
  const std::string key = kf::RunDir::open(run).shm_key();
  EXPECT_NE(out.find("/dev/shm/kf." + key + ".ctl"), std::string::npos) << out;
  EXPECT_NE(out.find("1 sandbox scratch folder"), std::string::npos) << out;
  EXPECT_FALSE(shm_exists(name));
  EXPECT_TRUE(names_with("/dev/shm", "kf." + key + ".").empty());
  EXPECT_FALSE(exists(run + "/tmp/evaluator-0/kf-sandbox-abc123"));
  // Again: nothing left, still exit 0.
  auto c2 = start({"--clean", run}, tmp.path + "/clean2.txt");
  ASSERT_EQ(wait_for(c2, 60), 0) << slurp(c2.out);
  EXPECT_NE(slurp(c2.out).find("nothing to clean"), std::string::npos) << slurp(c2.out);
  // A live launcher (this process holds the run's shared memory): refused, nothing removed.
  auto live = kf::replay::RunShm::create(key);
  auto c3 = start({"--clean", run}, tmp.path + "/clean3.txt");
  EXPECT_EQ(wait_for(c3, 60), 1) << slurp(c3.out);
  EXPECT_NE(slurp(c3.out).find("is alive"), std::string::npos) << slurp(c3.out);
  EXPECT_NE(slurp(c3.out).find(std::to_string(getpid())), std::string::npos) << slurp(c3.out);
  EXPECT_TRUE(shm_exists(name));
  live->shutdown();
}

TEST(LaunchTest, TaskTooLargeForTheDeviceIsRefusedNamingBytesAndLimit) {
  if (tasks_dir().empty()) GTEST_SKIP() << "task 001_relu is not imported (run setup.sh)";
  const auto task = kf::tasks::Task::load(tasks_dir() + "/001_relu");
  ::setenv("KF_TASK_MEMORY_LIMIT_BYTES", "1000", 1);
  std::string err;
  try {
    (void)task->make_inputs(kf::tasks::Backend::CPU, 0, at::kCPU);
  } catch (const kf::Error& e) {
    err = e.what();
  }
  ::unsetenv("KF_TASK_MEMORY_LIMIT_BYTES");
  EXPECT_NE(err.find("001_relu [cpu]"), std::string::npos) << err;
  EXPECT_NE(err.find("has 1000 bytes"), std::string::npos) << err;
  EXPECT_NE(err.find("inputs "), std::string::npos) << err;
  EXPECT_THROW(
      {
        ::setenv("KF_TASK_MEMORY_LIMIT_BYTES", "1000", 1);
        struct Unset {
          ~Unset() { ::unsetenv("KF_TASK_MEMORY_LIMIT_BYTES"); }
        } unset;
        (void)task->new_reference(kf::tasks::Backend::CPU, at::kCPU);
      },
      kf::Error);
  // Within the machine's memory it loads as before.
  EXPECT_FALSE(task->make_inputs(kf::tasks::Backend::CPU, 0, at::kCPU).empty());
}

// Chaos: a clean stop, then the newest checkpoint is corrupted and the run's kernel DB and
// best/ hold entries the older checkpoints never saw. Resume falls back and keeps them all.
TEST(LaunchTest, ResumeAfterACorruptNewestCheckpointKeepsTheNewerKernelsAndBest) {
  NEED_LAUNCH();
  t::TempDir tmp("launch-test");
  const std::string name = "lv" + std::to_string(getpid());
  const std::string run = tmp.path + "/runs/" + name;
  auto l = start({write_config(tmp.path, 40), "--name", name}, tmp.path + "/out.txt");
  ASSERT_TRUE(wait_until([&] { return checkpoints(run).size() >= 2; }, 300)) << slurp(l.out);
  ::kill(l.pid, SIGINT);
  ASSERT_EQ(wait_for(l, 180), 0) << slurp(l.out);
  const auto ck = checkpoints(run);
  ASSERT_GE(ck.size(), 2u);
  const std::string newest = run + "/checkpoints/" + ck.back();
  // Kernels found after the older checkpoints: three more entries and a best-only task.
  auto db = nlohmann::json::parse(slurp(run + "/kernels/kernel_db.json"));
  for (int i = 0; i < 3; ++i) {
    const std::string src = "// extra " + std::to_string(i) + "\nextern \"C\" int kf_forward() { return 0; }\n";
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(kf::replay::kernel_source_hash(src)));
    db["entries"].push_back(
        {{"task", "zz_extra"}, {"speedup", 1.5 + i}, {"policy_version", 99}, {"source", src}, {"hash", hex}});
  }
  t::write_file(run + "/kernels/kernel_db.json", db.dump(1));
  auto index = nlohmann::json::parse(slurp(run + "/best/index.json"));
  index["zz_best_only"] = {{"speedup", 3.0}, {"policy_version", 99}, {"file", "zz_best_only.cpp"}};
  t::write_file(run + "/best/index.json", index.dump(1));
  t::write_file(run + "/best/zz_best_only.cpp", "// best of a task no checkpoint knows\n");
  std::set<std::string> hashes_before;
  for (const auto& e : db["entries"]) hashes_before.insert(e["hash"].get<std::string>());
  flip_byte_at_end(newest + "/model.safetensors", 3);

  const int64_t budget = std::stoll(ck.back().substr(5)) + 2;
  auto r = start({"--resume", run, "--set", "learner.steps=" + std::to_string(budget)}, tmp.path + "/out-resume.txt");
  ASSERT_EQ(wait_for(r, 300), 0) << slurp(r.out);
  // Every kernel-DB entry and every best/ task survived the fallback.
  std::set<std::string> hashes_after;
  const auto db_after = nlohmann::json::parse(slurp(run + "/kernels/kernel_db.json"));
  for (const auto& e : db_after["entries"]) hashes_after.insert(e["hash"].get<std::string>());
  for (const auto& h : hashes_before) EXPECT_TRUE(hashes_after.count(h)) << "kernel " << h << " was lost";
  EXPECT_GE(db_after["entries"].size(), db["entries"].size());
  const auto index_after = nlohmann::json::parse(slurp(run + "/best/index.json"));
  for (const auto& [task, e] : index.items()) EXPECT_TRUE(index_after.contains(task)) << task << " left best/";
  EXPECT_EQ(slurp(run + "/best/zz_best_only.cpp"), "// best of a task no checkpoint knows\n");
  EXPECT_NE(slurp(run + "/logs/launch-0.log").find("merged " + run + "/kernels/kernel_db.json"), std::string::npos)
      << slurp(run + "/logs/launch-0.log");
  // The corrupt checkpoint was set aside with its data, not overwritten.
  const auto aside = names_with(run + "/checkpoints", ck.back() + ".corrupt-");
  ASSERT_EQ(aside.size(), 1u) << tree_listing(run + "/checkpoints");
  EXPECT_TRUE(exists(run + "/checkpoints/" + aside[0] + "/model.safetensors"));
  EXPECT_NE(slurp(r.out).find("unusable"), std::string::npos) << slurp(r.out);
}

// Chaos: SIGKILL of the launcher itself. Its clock and totals were persisted every few
// seconds; the next start removes the shared memory it left (logged) and continues them.
TEST(LaunchTest, KilledLauncherKeepsItsClockAndTotalsAndItsSharedMemoryIsCleaned) {
  NEED_LAUNCH();
  t::TempDir tmp("launch-test");
  const std::string name = "lx" + std::to_string(getpid());
  const std::string run = tmp.path + "/runs/" + name;
  // No periodic checkpoint: only the launcher's own saves keep its clock.
  auto l = start({write_config(tmp.path, 200), "--name", name, "--set", "learner.checkpoint.every=1000"},
                 tmp.path + "/out.txt");
  nlohmann::json saved;
  ASSERT_TRUE(wait_until(
      [&] {
        try {
          saved = nlohmann::json::parse(slurp(run + "/checkpoints/launch_state.json"));
          // launch_state.json is saved every 5 s: wait for one written after the learner
          // published its first step's weights.
          return saved.value("elapsed_s", 0.0) >= 12 && learner_step(run) >= 1 &&
                 saved.value("policy_version", int64_t{-1}) >= 1;
        } catch (...) {
          return false;
        }
      },
      300))
      << slurp(l.out);
  ::kill(l.pid, SIGKILL);
  int st = 0;
  ::waitpid(l.pid, &st, 0);
  // Its workers stop on their own (parent-death signal); the learner writes a checkpoint.
  ASSERT_TRUE(wait_until([&] { return !checkpoints(run).empty(); }, 120)) << slurp(run + "/logs/learner-0.out");
  std::this_thread::sleep_for(std::chrono::seconds(2));
  ASSERT_TRUE(shm_exists(name)) << "a SIGKILLed launcher cannot remove its shared memory";
  const double elapsed_before = saved["elapsed_s"].get<double>();
  const auto results_before = saved.value("results_total", int64_t{0});

  const auto t0 = Clock::now();
  const int64_t budget = std::stoll(checkpoints(run).back().substr(5)) + 1;
  auto r = start({"--resume", run, "--set", "learner.steps=" + std::to_string(budget)}, tmp.path + "/out-resume.txt");
  ASSERT_EQ(wait_for(r, 300), 0) << slurp(r.out);
  const double session = std::chrono::duration<double>(Clock::now() - t0).count();
  const auto after = nlohmann::json::parse(slurp(run + "/checkpoints/launch_state.json"));
  // The clock continued from the saved value (not from zero), the totals too.
  EXPECT_GE(after["elapsed_s"].get<double>(), elapsed_before + session - 5) << after.dump();
  EXPECT_GE(after.value("results_total", int64_t{0}), results_before);
  // The newest published snapshot version is kept too, never lowered by a later session.
  EXPECT_GE(saved.value("policy_version", int64_t{-1}), 1) << saved.dump();
  EXPECT_GE(after.value("policy_version", int64_t{-1}), saved.value("policy_version", int64_t{-1})) << after.dump();
  const std::string log = slurp(run + "/logs/launch-0.log");
  EXPECT_NE(log.find("removed the shared memory its dead launcher left"), std::string::npos) << log;
  EXPECT_FALSE(shm_exists(name));
}

// Chaos: the learner is SIGKILLed before its first checkpoint. The restarted one starts at
// step 0 but never publishes a snapshot version the store already gave to other weights,
// and the status shows its own step (not the old process's plus the new one's).
TEST(LaunchTest, LearnerKilledBeforeItsFirstCheckpointKeepsVersionsMonotonic) {
  NEED_LAUNCH();
  t::TempDir tmp("launch-test");
  const std::string name = "lm" + std::to_string(getpid());
  const std::string run = tmp.path + "/runs/" + name;
  auto l = start({write_config(tmp.path, 200), "--name", name, "--set", "learner.checkpoint.every=1000"},
                 tmp.path + "/out.txt");
  ASSERT_TRUE(wait_until([&] { return learner_step(run) >= 3; }, 300)) << slurp(l.out);
  const pid_t learner = worker_pid(run, "learner 0");
  ASSERT_GT(learner, 0);
  ::kill(learner, SIGKILL);
  ASSERT_TRUE(wait_until([&] { return worker_pid(run, "learner 0") != learner; }, 60))
      << slurp(run + "/logs/launch-0.log");
  // Wait until the restarted learner published again, past the old versions.
  ASSERT_TRUE(wait_until(
      [&] { return slurp(run + "/logs/learner-0.out").find("publishing again at version") != std::string::npos; }, 300))
      << slurp(run + "/logs/learner-0.out");
  std::this_thread::sleep_for(std::chrono::seconds(3));  // a few more status/metrics lines
  ::kill(l.pid, SIGINT);
  ASSERT_EQ(wait_for(l, 180), 0) << slurp(l.out);
  const std::string llog = slurp(run + "/logs/learner-0.out");
  EXPECT_NE(llog.find("not publishing version 0"), std::string::npos) << llog;
  int64_t max_learner_step = 0;
  for (const auto& j : jsonl(run + "/metrics/learner.jsonl"))
    max_learner_step = std::max(max_learner_step, j.value("step", int64_t{0}));
  int64_t last_version = -1;
  int lines = 0;
  for (const auto& j : jsonl(run + "/metrics/run.jsonl")) {
    const auto v = static_cast<int64_t>(j.value("policy_version", -1.0));
    EXPECT_GE(v, last_version) << "snapshot version went back: " << j.dump();
    last_version = std::max(last_version, v);
    EXPECT_LE(j.value("step", int64_t{0}), max_learner_step)
        << "status step above any step the learner reached: " << j.dump();
    ++lines;
  }
  EXPECT_GT(lines, 3);
}

// ---- Several nodes: a head (learner, actor, Redis server) and two evaluator nodes, each
// its own tools/launch process, every worker on the network transport (the launchers only
// supervise); one evaluator node is SIGKILLed mid-run with its evaluators. In network namespaces joined by veth pairs
// when the test may make them (CAP_NET_ADMIN, iproute2), else on loopback (a printed note says so).

namespace {
bool has_cap_net_admin() {
  std::ifstream in("/proc/self/status");
  for (std::string l; std::getline(in, l);)
    if (l.rfind("CapEff:", 0) == 0) return (std::stoull(l.substr(7), nullptr, 16) >> 12) & 1;  // CAP_NET_ADMIN = 12
  return false;
}

bool sh_ok(const std::string& cmd, std::string* out = nullptr) {
  std::string text;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return false;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p)) text += buf;
  if (out) *out = text;
  return ::pclose(p) == 0;
}

// Namespaces <p>h (head) and <p>1 .. <p>count (the other nodes); veth head<->node k on
// 10.79.k.0/24, the head at 10.79.k.1.
struct Nodes {
  std::string p = "kfl" + std::to_string(getpid());
  int count = 2;
  std::vector<std::string> made;
  std::string error;
  bool setup() {
    std::vector<std::string> cmds = {"ip netns add " + p + "h", "ip -n " + p + "h link set lo up"};
    for (int k = 1; k <= count; ++k) {
      const std::string ns = p + std::to_string(k), a = p + "a" + std::to_string(k), b = p + "b" + std::to_string(k),
                        net = "10.79." + std::to_string(k);
      for (const std::string& c :
           {"ip netns add " + ns, "ip -n " + ns + " link set lo up", "ip link add " + a + " type veth peer name " + b,
            "ip link set " + a + " netns " + p + "h", "ip link set " + b + " netns " + ns,
            "ip -n " + p + "h addr add " + net + ".1/24 dev " + a,
            "ip -n " + ns + " addr add " + net + ".2/24 dev " + b, "ip -n " + p + "h link set " + a + " up",
            "ip -n " + ns + " link set " + b + " up"})
        cmds.push_back(c);
    }
    for (const auto& c : cmds) {
      std::string out;
      const bool ok = sh_ok(c, &out);
      if (c.rfind("ip netns add ", 0) == 0 && ok) made.push_back(c.substr(13));
      if (!ok) {
        error = "'" + c + "' failed: " + out;
        return false;
      }
    }
    return true;
  }
  ~Nodes() {
    for (const auto& n : made) sh_ok("ip netns del " + n);  // removes the veth pairs too
  }
};

// The launcher, optionally inside a network namespace (ip netns exec execs in place: same pid).
Launch start_in(const std::string& ns, const std::vector<std::string>& args, const std::string& out) {
  if (ns.empty()) return start(args, out);
  Launch l;
  l.out = out;
  l.pid = ::fork();
  if (l.pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::vector<std::string> a = {"/usr/sbin/ip", "netns", "exec", ns, t::build_dir() + "/launch/kf-launch"};
    if (::access(a[0].c_str(), X_OK) != 0) a[0] = "/sbin/ip";
    a.insert(a.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& s : a) argv.push_back(s.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    _exit(127);
  }
  return l;
}

std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& n : kf::list_dir("/proc")) {
    if (n.find_first_not_of("0123456789") != std::string::npos) continue;
    std::istringstream in(slurp("/proc/" + n + "/stat"));
    std::string pid, comm, state;
    pid_t ppid = 0;
    // comm may hold spaces; it ends at the last ')'
    const std::string s = in.str();
    const auto close = s.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(s.substr(close + 2));
    rest >> state >> ppid;
    if (ppid == parent) out.push_back(std::stoi(n));
  }
  return out;
}

std::size_t count_of(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

// Waits until the evaluator whose log is `eval_log` has scored at least `scored` candidates
// and, right after one of them, the head's last status line showed candidates queued on the
// network (so it took its next one at once): true then, 300 ms later (it is verifying that
// one). An evaluator logs a candidate when it is scored, not when it takes one.
bool wait_until_busy(const std::string& eval_log, const std::string& head_log, std::size_t scored, double timeout_s) {
  const auto until = Clock::now() + std::chrono::milliseconds(static_cast<long long>(timeout_s * 1000));
  std::size_t seen = 0;
  while (Clock::now() < until) {
    const std::size_t n = count_of(slurp(eval_log), " of 001_relu (level");
    if (n >= scored && n > seen) {
      const std::string head = slurp(head_log);
      std::smatch m;
      const auto at = head.rfind("status: ");
      const std::string line = at == std::string::npos ? "" : head.substr(at, head.find('\n', at) - at);
      if (std::regex_search(line, m, std::regex(", queue ([0-9]+)")) && std::stoll(m[1]) > 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        return true;
      }
    }
    seen = n;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}
}  // namespace

// The head's closing line about the network (launch/src/launcher.cpp, log_network): groups and
// candidates published [1, 2], results sent back [3], claimed from a dead or stalled evaluator
// [4], late results dropped [5], dead-lettered [6], dropped [7], queued [8], in flight [9];
// groups the head's replay opened [10], dropped [11], duplicate [12]; results it joined [13],
// orphan [14], duplicate [15]; unsent members it marked lost [16]; results [17] and groups
// [18] left unjoined.
const char* const kNetworkLine =
    "network: ([0-9]+) group\\(s\\) and ([0-9]+) candidate\\(s\\) published to the head's server, ([0-9]+) "
    "result\\(s\\) sent back by evaluators \\(([0-9]+) candidate\\(s\\) claimed from a dead or stalled evaluator, "
    "([0-9]+) late result\\(s\\) dropped\\), ([0-9]+) dead-lettered, ([0-9]+) dropped, ([0-9]+) queued, ([0-9]+) in "
    "flight; the head's replay opened ([0-9]+) group\\(s\\) \\(([0-9]+) dropped, ([0-9]+) duplicate\\) and joined "
    "([0-9]+) result\\(s\\) \\(([0-9]+) orphan, ([0-9]+) duplicate result\\(s\\) dropped\\) and marked ([0-9]+) unsent "
    "member\\(s\\) lost; ([0-9]+) result\\(s\\) and ([0-9]+) group\\(s\\) left unjoined";

TEST(LaunchClusterTest, HeadAndTwoEvaluatorNodesOneKilledLosesNoCandidate) {
  NEED_LAUNCH();
  if (::access("/usr/bin/redis-server", X_OK) != 0 && !sh_ok("command -v redis-server"))
    GTEST_SKIP() << "redis-server is not installed (setup.sh installs it)";
  t::TempDir tmp("launch-cluster");
  Nodes nodes;
  bool netns = has_cap_net_admin() && nodes.setup();
  if (!netns)
    std::printf("note: %s; the three nodes run on loopback instead of in network namespaces\n",
                has_cap_net_admin() ? ("cannot make network namespaces: " + nodes.error).c_str() : "no CAP_NET_ADMIN");
  const std::string head_ns = netns ? nodes.p + "h" : "", ns1 = netns ? nodes.p + "1" : "",
                    ns2 = netns ? nodes.p + "2" : "";
  const std::string addr1 = netns ? "10.79.1.1" : "127.0.0.1", addr2 = netns ? "10.79.2.1" : "127.0.0.1";
  const int port = 20000 + getpid() % 20000;
  const std::string name = "cl" + std::to_string(getpid());
  const int steps = 4;
  const std::string cfg =
      write_config(tmp.path, steps,
                   "cluster:\n  redis: {bound: 8, port: " + std::to_string(port) + ", bind: [" + addr1 +
                       (netns ? ", " + addr2 : "") + "], claim_idle_s: 4, gone_after_s: 4}\n");
  ::setenv("KF_REDIS_PASSWORD", ("pw" + std::to_string(getpid()) + "x7Q").c_str(), 1);
  const std::string run = tmp.path + "/runs/" + name;
  // The drain waits for what is on the network: the queue's 8 candidates, one node left.
  auto head = start_in(head_ns,
                       {cfg, "--name", name, "--set", "cluster.role=head", "--set", "cluster.redis.host=" + addr1,
                        "--set", "launch.drain_timeout_s=120"},
                       tmp.path + "/head.txt");
  auto ev1 = start_in(ns1,
                      {cfg, "--name", name, "--set", "cluster.role=evaluators", "--set", "cluster.node_name=n1",
                       "--set", "cluster.redis.host=" + addr1},
                      tmp.path + "/n1.txt");
  auto ev2 = start_in(ns2,
                      {cfg, "--name", name, "--set", "cluster.role=evaluators", "--set", "cluster.node_name=n2",
                       "--set", "cluster.redis.host=" + addr2},
                      tmp.path + "/n2.txt");
  const std::string n2_log = run + ".n2/logs/evaluator-0.out";
  // Node 2 scored a candidate and took its next one: kill it and its evaluator mid-run.
  ASSERT_TRUE(wait_until_busy(n2_log, run + "/logs/launch-0.log", 2, 150))
      << slurp(tmp.path + "/head.txt") << slurp(n2_log);
  for (pid_t c : children_of(ev2.pid)) ::kill(c, SIGKILL);
  ::kill(ev2.pid, SIGKILL);
  EXPECT_EQ(wait_for(ev2, 10), -SIGKILL);

  ASSERT_EQ(wait_for(head, 240), 0) << slurp(tmp.path + "/head.txt");
  EXPECT_EQ(wait_for(ev1, 60), 0) << slurp(tmp.path + "/n1.txt");
  EXPECT_GE(learner_step(run), steps);
  const std::string log = slurp(run + "/logs/launch-0.log");
  // The closing account: everything created was scored, nothing lost, nothing left over.
  std::smatch m;
  const std::regex ledger(
      "candidates of this session: created ([0-9]+) = scored ([0-9]+) \\+ lost ([0-9]+) \\([^)]*\\) "
      "\\+ queued ([0-9]+) \\+ in flight ([0-9]+)");
  ASSERT_TRUE(std::regex_search(log, m, ledger)) << log;
  EXPECT_GT(std::stoll(m[1]), 0) << m[0];
  EXPECT_EQ(std::stoll(m[1]), std::stoll(m[2])) << log;
  EXPECT_EQ(std::stoll(m[3]), 0) << m[0];
  EXPECT_EQ(std::stoll(m[4]) + std::stoll(m[5]), 0) << m[0];
  // Every candidate went over the network and came back once; node 1's evaluator claimed
  // what node 2's held when it died.
  ASSERT_TRUE(std::regex_search(log, m, std::regex(kNetworkLine))) << log;
  EXPECT_EQ(m[2], m[3]) << m[0];
  EXPECT_GE(std::stoll(m[4]), 1) << m[0];
  EXPECT_EQ(std::stoll(m[6]) + std::stoll(m[7]) + std::stoll(m[8]) + std::stoll(m[9]), 0) << m[0];
  std::printf("%s\n", m[0].str().c_str());
  // Learner rank 0 joined what was scored after its last step: nothing is left in the server.
  EXPECT_EQ(std::stoll(m[17]) + std::stoll(m[18]), 0) << m[0];
  EXPECT_EQ(std::stoll(m[13]) + std::stoll(m[14]) + std::stoll(m[15]), std::stoll(m[3])) << m[0];
  EXPECT_NE(slurp(run + "/logs/learner-0.log").find("last step done; joining"), std::string::npos);
  const int64_t results_sent = std::stoll(m[3]);
  // Each node's verdict log: together one line per scored candidate id.
  std::set<uint64_t> ids;
  for (const char* n : {".n1", ".n2"}) {
    std::istringstream in(slurp(run + n + "/metrics/verdicts-0.jsonl"));
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) ids.insert(nlohmann::json::parse(line).at("candidate").get<uint64_t>());
  }
  EXPECT_EQ(static_cast<int64_t>(ids.size()), results_sent) << m[0];
  // Node 1 took over what node 2's evaluator held when it died.
  const std::string n1 = slurp(run + ".n1/logs/evaluator-0.out");
  EXPECT_NE(n1.find("was claimed from a dead or stalled evaluator"), std::string::npos) << n1;
  EXPECT_GT(count_of(n1, " of 001_relu (level"), 0u);
  // The server required the password and listened only where told.
  const std::string conf = slurp(run + "/redis/redis.conf");
  EXPECT_NE(conf.find("bind " + addr1), std::string::npos) << conf;
  EXPECT_EQ(conf.find("0.0.0.0"), std::string::npos) << conf;
  struct stat st {};
  ASSERT_EQ(::stat((run + "/redis/redis.conf").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 077, 0u) << "the server's config (with the password) is readable by others";
}

// The whole allocation dies (head and evaluator node SIGKILLed with every child); --resume
// on both nodes finishes the run. The candidates the dead head had on the network are
// counted lost (launcher died) by the resumed head; the resumed launcher loses none.
TEST(LaunchClusterTest, WholeAllocationKilledThenResumedFinishes) {
  NEED_LAUNCH();
  if (::access("/usr/bin/redis-server", X_OK) != 0 && !sh_ok("command -v redis-server"))
    GTEST_SKIP() << "redis-server is not installed (setup.sh installs it)";
  t::TempDir tmp("launch-cluster");
  const int port = 20000 + (getpid() + 7919) % 20000;
  const std::string name = "cr" + std::to_string(getpid());
  const int steps = 4;
  const std::string cfg = write_config(
      tmp.path, steps,
      "cluster:\n  redis: {bound: 8, port: " + std::to_string(port) + ", claim_idle_s: 4, gone_after_s: 3}\n");
  ::setenv("KF_REDIS_PASSWORD", ("pw" + std::to_string(getpid()) + "r2Z").c_str(), 1);
  const std::string run = tmp.path + "/runs/" + name;
  const std::vector<std::string> node = {"--set", "cluster.role=evaluators", "--set", "cluster.node_name=n1"};
  // The drain waits for what is on the network (kept by the resumed run's config.yaml).
  auto head = start({cfg, "--name", name, "--set", "cluster.role=head", "--set", "launch.drain_timeout_s=120"},
                    tmp.path + "/head.txt");
  std::vector<std::string> a = {cfg, "--name", name};
  a.insert(a.end(), node.begin(), node.end());
  auto ev = start(a, tmp.path + "/n1.txt");
  ASSERT_TRUE(wait_until([&] { return learner_step(run) >= 2 && !checkpoints(run).empty(); }, 180))
      << slurp(tmp.path + "/head.txt");
  for (const Launch* l : {&head, &ev}) {
    for (pid_t c : children_of(l->pid)) ::kill(c, SIGKILL);
    ::kill(l->pid, SIGKILL);
    EXPECT_EQ(wait_for(*l, 10), -SIGKILL);
  }
  std::vector<std::string> r = {"--resume", run};
  auto head2 = start({"--resume", run}, tmp.path + "/head2.txt");
  r.insert(r.end(), node.begin(), node.end());
  auto ev2 = start(r, tmp.path + "/n1b.txt");
  ASSERT_EQ(wait_for(head2, 240), 0) << slurp(tmp.path + "/head2.txt");
  EXPECT_EQ(wait_for(ev2, 60), 0) << slurp(tmp.path + "/n1b.txt");
  EXPECT_GE(learner_step(run), steps);
  const std::string log = slurp(run + "/logs/launch-0.log");
  std::smatch m;
  // The dead launcher's account, closed by the resumed head: what it had out is lost.
  const std::regex dead(
      "candidates of the dead launcher's session: created ([0-9]+) = scored ([0-9]+) \\+ lost ([0-9]+) "
      "\\([^)]*launcher died ([0-9]+)\\) \\+ queued 0 \\+ in flight 0");
  ASSERT_TRUE(std::regex_search(log, m, dead)) << log;
  EXPECT_EQ(std::stoll(m[1]), std::stoll(m[2]) + std::stoll(m[3])) << m[0];
  EXPECT_EQ(m[3], m[4]) << m[0];
  const std::regex now(
      "candidates of this session: created ([0-9]+) = scored ([0-9]+) \\+ lost ([0-9]+) \\([^)]*\\) "
      "\\+ queued ([0-9]+) \\+ in flight ([0-9]+)");
  ASSERT_TRUE(std::regex_search(log, m, now)) << log;
  EXPECT_GT(std::stoll(m[1]), 0) << m[0];
  EXPECT_EQ(std::stoll(m[1]), std::stoll(m[2])) << log;
  EXPECT_EQ(std::stoll(m[3]) + std::stoll(m[4]) + std::stoll(m[5]), 0) << m[0];
}

// Learner ranks on two nodes (here two launchers on one host, each seeing one GPU): the
// head runs rank 0 with the actor, the CPU evaluators and the Redis server; a learners node
// runs rank 1, which meets rank 0 over NCCL through the Redis rendezvous and gets its groups
// from it. The run reaches its step budget and both launchers end cleanly. Needs 2 GPUs.
TEST(LaunchClusterTest, HeadAndLearnersNodeTrainTogetherOverNccl) {
  NEED_LAUNCH();
  if (!torch::cuda::is_available() || torch::cuda::device_count() < 2)
    GTEST_SKIP() << "needs 2 CUDA devices (learner ranks on two nodes talk over NCCL only)";
  if (::access("/usr/bin/redis-server", X_OK) != 0 && !sh_ok("command -v redis-server"))
    GTEST_SKIP() << "redis-server is not installed (setup.sh installs it)";
  t::TempDir tmp("launch-learners");
  const int port = 20000 + (getpid() + 4099) % 20000;
  const std::string name = "ln" + std::to_string(getpid());
  const int steps = 4;
  const std::string cfg =
      write_config(tmp.path, steps,
                   "cluster:\n  head_learner_ranks: 1\n  learner_ranks: 1\n  redis: {port: " + std::to_string(port) +
                       ", gone_after_s: 60}\n");
  ::setenv("KF_REDIS_PASSWORD", ("pw" + std::to_string(getpid()) + "L9").c_str(), 1);
  const std::string run = tmp.path + "/runs/" + name;
  const std::vector<std::string> common = {
      cfg, "--name", name, "--set", "learner.dist.ranks=2", "--set", "learner.groups_per_step=2"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = common;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  ::setenv("CUDA_VISIBLE_DEVICES", "0", 1);
  auto head = start(with({"--set", "cluster.role=head"}), tmp.path + "/head.txt");
  ::setenv("CUDA_VISIBLE_DEVICES", "1", 1);
  auto node = start(with({"--set", "cluster.role=learners", "--set", "cluster.node_name=l1"}), tmp.path + "/l1.txt");
  ::unsetenv("CUDA_VISIBLE_DEVICES");
  const int head_exit = wait_for(head, 400);
  const int node_exit = wait_for(node, 120);
  const std::string rank1 = slurp(run + ".l1/logs/learner-1.out");
  ASSERT_EQ(head_exit, 0) << slurp(tmp.path + "/head.txt") << slurp(run + "/logs/learner-0.out") << rank1;
  EXPECT_EQ(node_exit, 0) << slurp(tmp.path + "/l1.txt") << rank1;
  EXPECT_GE(learner_step(run), steps);
  EXPECT_NE(slurp(run + "/logs/learner-0.out").find("serves the groups of ranks 1..1"), std::string::npos);
  EXPECT_NE(rank1.find("NCCL rendezvous through redis at 127.0.0.1:" + std::to_string(port)), std::string::npos)
      << rank1;
  EXPECT_NE(rank1.find("takes its groups from rank 0"), std::string::npos) << rank1;
  EXPECT_NE(slurp(tmp.path + "/l1.txt").find("learner ranks 1..1 of 2"), std::string::npos)
      << slurp(tmp.path + "/l1.txt");
}

namespace {
// The learner's trained sequences, summed over metrics/learner.jsonl (one line per step).
int64_t sequences_trained(const std::string& run) {
  std::istringstream in(slurp(run + "/metrics/learner.jsonl"));
  int64_t n = 0;
  for (std::string line; std::getline(in, line);) {
    try {
      const auto j = nlohmann::json::parse(line);
      if (j.contains("sequences")) n += static_cast<int64_t>(j.at("sequences").get<double>());
    } catch (...) {
    }
  }
  return n;
}

// compile_s + verify_s summed over a verdict log's lines.
std::pair<double, double> verdict_seconds(const std::string& path) {
  std::istringstream in(slurp(path));
  double c = 0, v = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line);
    c += j.at("compile_s").get<double>();
    v += j.at("verify_s").get<double>();
  }
  return {c, v};
}

nlohmann::json last_run_line(const std::string& run) {
  nlohmann::json last;
  std::istringstream in(slurp(run + "/metrics/run.jsonl"));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) last = nlohmann::json::parse(line);
  return last;
}

struct Ledger {
  int64_t created = -1, scored = -1, lost = -1, queued = -1, in_flight = -1;
};
Ledger ledger_of(const std::string& log) {
  Ledger l;
  std::smatch m;
  const std::regex re(
      "candidates of this session: created ([0-9]+) = scored ([0-9]+) \\+ lost ([0-9]+) \\([^)]*\\) "
      "\\+ queued ([0-9]+) \\+ in flight ([0-9]+)");
  if (std::regex_search(log, m, re))
    l = {std::stoll(m[1]), std::stoll(m[2]), std::stoll(m[3]), std::stoll(m[4]), std::stoll(m[5])};
  return l;
}
}  // namespace

// A head (learner and Redis, no actor of its own: cluster.head_actors 0), an actor node (two
// actors publishing to the head's server, weights mirrored from it) and two evaluator nodes,
// each its own kf-launch in its own network namespace. Evaluator node 2 is SIGKILLed mid-run.
// The run reaches its steps with the same groups trained as a one-node run of the same
// config; every group came from the actor node, was opened in the head's replay by its
// learner and verified on the evaluator nodes; nothing lost. The head's time split holds the nodes'
// seconds: generating from the actor node, compiling and verifying from the evaluator nodes'
// verdict lines.
TEST(LaunchClusterTest, HeadActorNodeAndTwoEvaluatorNodesMatchOneNodeRun) {
  NEED_LAUNCH();
  if (::access("/usr/bin/redis-server", X_OK) != 0 && !sh_ok("command -v redis-server"))
    GTEST_SKIP() << "redis-server is not installed (setup.sh installs it)";
  t::TempDir tmp("launch-actors");
  Nodes nodes;
  nodes.count = 3;
  bool netns = has_cap_net_admin() && nodes.setup();
  if (!netns)
    std::printf("note: %s; the four nodes run on loopback instead of in network namespaces\n",
                has_cap_net_admin() ? ("cannot make network namespaces: " + nodes.error).c_str() : "no CAP_NET_ADMIN");
  auto ns = [&](const std::string& k) { return netns ? nodes.p + k : std::string(); };
  auto head_addr = [&](int k) { return netns ? "10.79." + std::to_string(k) + ".1" : std::string("127.0.0.1"); };
  const int port = 20000 + (getpid() + 3331) % 20000;
  const std::string name = "ca" + std::to_string(getpid());
  const int steps = 2;
  const std::string cfg = write_config(tmp.path, steps,
                                       "cluster:\n  redis: {port: " + std::to_string(port) + ", bind: [" +
                                           head_addr(1) + (netns ? ", " + head_addr(2) + ", " + head_addr(3) : "") +
                                           "], claim_idle_s: 3, gone_after_s: 3}\n");
  // The one-node run of the same config: what the cluster's counts must match.
  const auto t0 = Clock::now();
  // A queue of two groups: the drain after the last step has little left to score.
  const std::string small_queue = "replay.candidate_queue.capacity=4";
  const std::string small_stream = "cluster.redis.bound=4";  // the same on the network (kf:candidates)
  auto one = start({cfg, "--name", name + "-one", "--set", "launch.drain_timeout_s=60", "--set", small_queue},
                   tmp.path + "/one.txt");
  ASSERT_EQ(wait_for(one, 120), 0) << slurp(tmp.path + "/one.txt");
  const auto t1 = Clock::now();
  const std::string one_run = tmp.path + "/runs/" + name + "-one";
  const Ledger l1 = ledger_of(slurp(one_run + "/logs/launch-0.log"));
  ASSERT_GT(l1.created, 0) << slurp(one_run + "/logs/launch-0.log");

  ::setenv("KF_REDIS_PASSWORD", ("pw" + std::to_string(getpid()) + "a5K").c_str(), 1);
  const std::string run = tmp.path + "/runs/" + name;
  auto node = [&](const std::string& role, int k) {
    return std::vector<std::string>{cfg,
                                    "--name",
                                    name,
                                    "--set",
                                    "cluster.role=" + role,
                                    "--set",
                                    "cluster.node_name=n" + std::to_string(k),
                                    "--set",
                                    "cluster.redis.host=" + head_addr(k),
                                    "--set",
                                    small_queue,
                                    "--set",
                                    small_stream};
  };
  // The head waits cluster.redis.gone_after_s for the actor node: longer than the nodes' 3 s.
  auto head =
      start_in(ns("h"),
               {cfg, "--name", name, "--set", "cluster.role=head", "--set", "cluster.redis.host=" + head_addr(1),
                "--set", "launch.drain_timeout_s=60", "--set", small_queue, "--set", small_stream, "--set",
                "cluster.head_actors=0", "--set", "cluster.redis.gone_after_s=60"},
               tmp.path + "/head.txt");
  auto ev1 = start_in(ns("1"), node("evaluators", 1), tmp.path + "/n1.txt");
  auto ev2 = start_in(ns("2"), node("evaluators", 2), tmp.path + "/n2.txt");
  // Two actors on the actor node (the head runs none): candidates enough that node 2 holds
  // one when it is killed.
  auto actor_args = node("actors", 3);
  actor_args.insert(actor_args.end(), {"--set", "actors.count=2"});
  auto act = start_in(ns("3"), actor_args, tmp.path + "/n3.txt");
  const std::string n2_log = run + ".n2/logs/evaluator-0.out";
  ASSERT_TRUE(wait_until_busy(n2_log, run + "/logs/launch-0.log", 2, 120))
      << slurp(tmp.path + "/head.txt") << slurp(n2_log) << slurp(tmp.path + "/n3.txt");
  for (pid_t c : children_of(ev2.pid)) ::kill(c, SIGKILL);
  ::kill(ev2.pid, SIGKILL);
  EXPECT_EQ(wait_for(ev2, 10), -SIGKILL);

  ASSERT_EQ(wait_for(head, 180), 0) << slurp(tmp.path + "/head.txt");
  const auto t2 = Clock::now();
  EXPECT_EQ(wait_for(ev1, 30), 0) << slurp(tmp.path + "/n1.txt");
  EXPECT_EQ(wait_for(act, 30), 0) << slurp(tmp.path + "/n3.txt");
  const std::string log = slurp(run + "/logs/launch-0.log");
  std::printf("one-node run %.1f s, cluster run (head) %.1f s, nodes ended %.1f s later%s\n",
              std::chrono::duration<double>(t1 - t0).count(), std::chrono::duration<double>(t2 - t1).count(),
              std::chrono::duration<double>(Clock::now() - t2).count(), netns ? " (network namespaces)" : "");
  if (std::getenv("KF_TEST_SHOW_LOGS"))
    std::printf("%s\n----\n%s\n", log.c_str(), slurp(run + ".n3/logs/launch-0.log").c_str());
  // The fields that must match the one-node run: steps, groups (sequences) trained, and
  // nothing lost. A drain cut by its timeout on a loaded machine may leave candidates queued
  // or in flight: they are counted (the ledger closes), not lost, so only loss fails here.
  EXPECT_GE(learner_step(run), steps);
  EXPECT_EQ(sequences_trained(run), sequences_trained(one_run));
  EXPECT_GT(sequences_trained(run), 0);
  const Ledger l = ledger_of(log);
  ASSERT_GT(l.created, 0) << log;
  EXPECT_EQ(l.lost, 0) << log;
  EXPECT_EQ(l.created, l.scored + l.queued + l.in_flight) << log;
  EXPECT_EQ(l1.lost, 0) << slurp(one_run + "/logs/launch-0.log");
  EXPECT_EQ(l1.created, l1.scored + l1.queued + l1.in_flight);
  // The actor node's groups were opened in the head's replay (by its learner rank 0) and
  // their candidates went to the evaluator nodes: none dropped, none twice.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log, m, std::regex(kNetworkLine))) << log;
  EXPECT_GT(std::stoll(m[10]), 0) << m[0];
  EXPECT_EQ(std::stoll(m[11]) + std::stoll(m[12]) + std::stoll(m[15]), 0) << m[0];
  EXPECT_EQ(std::stoll(m[6]) + std::stoll(m[7]), 0) << m[0];
  const int64_t unjoined = std::stoll(m[17]), orphans = std::stoll(m[14]);
  // The head ran no actor: every candidate it created came from the actor node.
  EXPECT_NE(log.find("the head runs no actor of its own (cluster.head_actors 0)"), std::string::npos) << log;
  EXPECT_EQ(log.find("started actor"), std::string::npos) << log;
  // Every group the head's server got is one the actor node's actors logged (groups-<id>.jsonl),
  // and their members to score cover every candidate created.
  const int64_t groups_published = std::stoll(m[1]);
  std::set<uint64_t> remote_groups;
  int64_t remote_members = 0;
  for (const char* a : {"0", "1"}) {
    std::istringstream in(slurp(run + ".n3/metrics/groups-" + a + ".jsonl"));
    for (std::string line; std::getline(in, line);) {
      if (line.empty()) continue;
      const auto j = nlohmann::json::parse(line);
      remote_groups.insert(j.at("group").get<uint64_t>());
      remote_members += j.at("completions").get<int64_t>() - j.at("extraction_failures").get<int64_t>();
    }
  }
  EXPECT_EQ(static_cast<int64_t>(remote_groups.size()), groups_published) << log;
  EXPECT_GE(remote_members, l.created) << log;
  const std::string n3 = slurp(run + ".n3/logs/launch-0.log");
  // The actor node's actors mirrored the head's weights into the node (a version there)
  // and its groups' candidates were verified on the evaluator nodes (verdict lines name the group).
  ASSERT_TRUE(std::regex_search(n3, m, std::regex("newest policy version here ([0-9-]+)"))) << n3;
  EXPECT_GE(std::stoll(m[1]), 0) << m[0];
  std::set<uint64_t> ids;
  std::size_t remote_verdicts = 0;
  for (const char* n : {".n1", ".n2"}) {
    std::istringstream in(slurp(run + n + "/metrics/verdicts-0.jsonl"));
    for (std::string line; std::getline(in, line);) {
      if (line.empty()) continue;
      const auto j = nlohmann::json::parse(line);
      ids.insert(j.at("candidate").get<uint64_t>());
      remote_verdicts += remote_groups.count(j.at("group").get<uint64_t>());
    }
  }
  EXPECT_GT(remote_verdicts, 0u) << "no candidate of the actor node's groups was verified";
  EXPECT_EQ(static_cast<int64_t>(ids.size()), l.scored) << "a candidate was scored twice or not at all";
  // The head's metrics count the remote work under the local keys: every candidate the
  // head queued (its actor's and the actor node's) in samples_total, every result from the
  // evaluator nodes in verified_total and in the verdict counts.
  const nlohmann::json last = last_run_line(run);
  ASSERT_TRUE(last.contains("verified_total")) << last.dump();
  EXPECT_EQ(last.at("verified_total").get<double>(), static_cast<double>(l.scored)) << last.dump();
  EXPECT_EQ(last.at("samples_total").get<double>(), static_cast<double>(l.created)) << last.dump();
  // The verdict mix counts the results joined into the head's replay: every scored one but
  // those whose group was gone (learner rank 0 joins until the run stops: none is left unjoined).
  int64_t verdicts = 0;
  for (const auto& [k, v] : last.at("verdicts").items()) verdicts += v.get<int64_t>();
  EXPECT_GT(verdicts, 0) << last.dump();
  EXPECT_EQ(unjoined, 0) << m[0];
  EXPECT_GE(verdicts + orphans, l.scored) << last.dump();
  // Node 1 took over what node 2's evaluator held when it died.
  const std::string n1 = slurp(run + ".n1/logs/evaluator-0.out");
  EXPECT_NE(n1.find("was claimed from a dead or stalled evaluator"), std::string::npos) << n1;
  // The time split: no local actor or evaluator, so every second is a node's. Node 1 ran to
  // the end (all its verdict lines reported before the head stopped); node 2 was killed (its
  // last lines may have gone unreported). The actor node's generating seconds: at most its
  // own final figure.
  const auto [c1, v1] = verdict_seconds(run + ".n1/metrics/verdicts-0.jsonl");
  const auto [c2, v2] = verdict_seconds(run + ".n2/metrics/verdicts-0.jsonl");
  const double compile_s = last.at("compile_s").get<double>(), verify_s = last.at("verify_s").get<double>();
  EXPECT_GT(verify_s, 0.0) << last.dump();
  EXPECT_GT(compile_s, 0.0) << last.dump();
  EXPECT_GE(verify_s, v1 - 1e-6) << last.dump();
  EXPECT_LE(verify_s, v1 + v2 + 1e-6) << last.dump();
  EXPECT_GE(compile_s, c1 - 1e-6) << last.dump();
  EXPECT_LE(compile_s, c1 + c2 + 1e-6) << last.dump();
  ASSERT_TRUE(std::regex_search(n3, m, std::regex("; generate ([0-9.e+-]+) s, GPU wait"))) << n3;
  EXPECT_GT(last.at("generate_s").get<double>(), 0.0) << last.dump();
  EXPECT_LE(last.at("generate_s").get<double>(), std::stod(m[1]) + 1e-6) << last.dump() << m[0];
}

// A head with cluster.head_actors 0 and no actor node: nothing would sample, so the head
// stops the run after cluster.redis.gone_after_s with an error naming the key (exit 1).
TEST(LaunchClusterTest, HeadWithoutActorsStopsWhenNoActorNodeConnects) {
  NEED_LAUNCH();
  if (::access("/usr/bin/redis-server", X_OK) != 0 && !sh_ok("command -v redis-server"))
    GTEST_SKIP() << "redis-server is not installed (setup.sh installs it)";
  t::TempDir tmp("launch-noactors");
  const int port = 20000 + (getpid() + 5557) % 20000;
  const std::string name = "na" + std::to_string(getpid());
  const std::string cfg = write_config(
      tmp.path, 4, "cluster:\n  redis: {port: " + std::to_string(port) + ", gone_after_s: 2}\n  head_actors: 0\n");
  ::setenv("KF_REDIS_PASSWORD", ("pw" + std::to_string(getpid()) + "n0A").c_str(), 1);
  // On one node the same key is refused before anything starts.
  auto one = start({cfg, "--name", name + "-one"}, tmp.path + "/one.txt");
  EXPECT_EQ(wait_for(one, 60), 2) << slurp(tmp.path + "/one.txt");
  EXPECT_NE(slurp(tmp.path + "/one.txt").find("cluster.head_actors: 0 on one node"), std::string::npos)
      << slurp(tmp.path + "/one.txt");
  EXPECT_FALSE(exists(tmp.path + "/runs/" + name + "-one"));
  auto head = start({cfg, "--name", name, "--set", "cluster.role=head"}, tmp.path + "/head.txt");
  EXPECT_EQ(wait_for(head, 120), 1) << slurp(tmp.path + "/head.txt");
  const std::string log = slurp(tmp.path + "/runs/" + name + "/logs/launch-0.log");
  EXPECT_NE(log.find("cluster.head_actors is 0 and no actor node has connected"), std::string::npos) << log;
  EXPECT_EQ(log.find("started actor"), std::string::npos) << log;
  EXPECT_NE(log.find("stopped after a failure (no actor node connected)"), std::string::npos) << log;
  // --resume keeps cluster.head_actors 0 (the run's config.yaml): the resumed head again runs
  // no actor, waits for actor nodes and stops the same way.
  auto again = start({"--resume", tmp.path + "/runs/" + name}, tmp.path + "/head2.txt");
  EXPECT_EQ(wait_for(again, 120), 1) << slurp(tmp.path + "/head2.txt");
  const std::string log2 = slurp(tmp.path + "/runs/" + name + "/logs/launch-0.log");
  EXPECT_EQ(count_of(log2, "cluster.head_actors is 0 and no actor node has connected"), 2u) << log2;
  EXPECT_EQ(log2.find("started actor"), std::string::npos) << log2;
}

// The head's Redis server is SIGKILLed mid-run: the head says so and stops the run (exit 1,
// final checkpoint), no candidate is scored twice; --resume on both nodes (a fresh server)
// finishes the run.
TEST(LaunchClusterTest, RedisKilledStopsTheRunCleanlyAndResumeFinishes) {
  NEED_LAUNCH();
  if (::access("/usr/bin/redis-server", X_OK) != 0 && !sh_ok("command -v redis-server"))
    GTEST_SKIP() << "redis-server is not installed (setup.sh installs it)";
  t::TempDir tmp("launch-redis");
  const int port = 20000 + (getpid() + 1237) % 20000;
  const std::string name = "rk" + std::to_string(getpid());
  const int steps = 4;
  const std::string cfg = write_config(
      tmp.path, steps,
      "cluster:\n  redis: {bound: 8, port: " + std::to_string(port) + ", claim_idle_s: 3, gone_after_s: 3}\n");
  ::setenv("KF_REDIS_PASSWORD", ("pw" + std::to_string(getpid()) + "k3R").c_str(), 1);
  const std::string run = tmp.path + "/runs/" + name;
  const std::vector<std::string> node = {"--set", "cluster.role=evaluators", "--set", "cluster.node_name=n1"};
  auto head = start({cfg, "--name", name, "--set", "cluster.role=head", "--set", "launch.drain_timeout_s=20"},
                    tmp.path + "/head.txt");
  std::vector<std::string> a = {cfg, "--name", name};
  a.insert(a.end(), node.begin(), node.end());
  auto ev = start(a, tmp.path + "/n1.txt");
  ASSERT_TRUE(wait_until([&] { return learner_step(run) >= 1; }, 120)) << slurp(tmp.path + "/head.txt");
  std::smatch m;
  const std::string before = slurp(run + "/logs/launch-0.log");
  ASSERT_TRUE(std::regex_search(before, m, std::regex("redis-server pid ([0-9]+)"))) << before;
  ::kill(std::stoi(m[1]), SIGKILL);
  EXPECT_EQ(wait_for(head, 90), 1) << slurp(tmp.path + "/head.txt");
  EXPECT_EQ(wait_for(ev, 30), 0) << slurp(tmp.path + "/n1.txt");
  const std::string log = slurp(run + "/logs/launch-0.log");
  EXPECT_NE(log.find("died; log"), std::string::npos) << log;
  EXPECT_NE(log.find("stopping the run"), std::string::npos) << log;
  // Nothing scored twice: no duplicate result in the head's replay.
  ASSERT_TRUE(std::regex_search(log, m, std::regex("([0-9]+) duplicate result\\(s\\) dropped"))) << log;
  EXPECT_EQ(m[1], "0") << log;
  std::set<uint64_t> ids;
  std::size_t lines = 0;
  {
    std::istringstream in(slurp(run + ".n1/metrics/verdicts-0.jsonl"));
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) ++lines, ids.insert(nlohmann::json::parse(line).at("candidate").get<uint64_t>());
  }
  EXPECT_EQ(ids.size(), lines) << "a candidate was verified twice";
  const Ledger l = ledger_of(log);
  EXPECT_EQ(l.created, l.scored + l.lost + l.queued + l.in_flight) << log;
  // Resume: a fresh server, the run finishes.
  auto head2 = start({"--resume", run}, tmp.path + "/head2.txt");
  std::vector<std::string> r = {"--resume", run};
  r.insert(r.end(), node.begin(), node.end());
  auto ev2 = start(r, tmp.path + "/n1b.txt");
  ASSERT_EQ(wait_for(head2, 150), 0) << slurp(tmp.path + "/head2.txt");
  EXPECT_EQ(wait_for(ev2, 30), 0) << slurp(tmp.path + "/n1b.txt");
  EXPECT_GE(learner_step(run), steps);
}
