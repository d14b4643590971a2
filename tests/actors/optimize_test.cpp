// tools/optimize (kf-optimize) end to end on the CPU backend: a tiny byte-level model is
// overfit on the tool's own prompt (built by the same library call, optimize_prompt) ->
// a known-good ReLU kernel, written as an HF folder, and the real binary samples,
// extracts and verifies it with the real evaluator; tools/score-policy then scores the same
// model on two tasks (train and held-out split). Also: bad inputs exit 2 naming the thing.
// No mocks.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include "kf/actors/actors.h"
#include "kf/common/config.h"
#include "kf/policy/policy.h"
#include "kf/replay/replay.h"
#include "optimize.h"  // actors/src: load_exemplars
#include "test_util.h"

using namespace kf::actors;

namespace {

struct ToolRun {
  int rc = -1;
  std::string out, err;
};

// Runs the program all[0] with the rest as arguments, `env` added to its environment;
// stdout and stderr are captured through files in `dir`.
ToolRun run_program(std::vector<std::string> all, const std::string& dir,
                    const std::vector<std::pair<std::string, std::string>>& env = {}) {
  const std::string out = dir + "/tool.stdout", err = dir + "/tool.stderr";
  const pid_t pid = fork();
  if (pid == 0) {
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(o, 1);
    ::dup2(e, 2);
    // In the build tree, not a 0700 temp dir: the sandbox worker drops privileges and must read it.
    ::setenv("KF_EVAL_CACHE", (test::build_dir() + "/actors-test-eval-cache").c_str(), 1);
    for (const auto& [name, value] : env) ::setenv(name.c_str(), value.c_str(), 1);
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    _exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ToolRun r;
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = test::read_text(out);
  r.err = test::read_text(err);
  return r;
}

// Runs kf-optimize with `args`.
ToolRun run_tool(const std::vector<std::string>& args, const std::string& dir) {
  std::vector<std::string> all = {KF_OPTIMIZE_BIN};
  all.insert(all.end(), args.begin(), args.end());
  return run_program(std::move(all), dir);
}

// Runs tools/score-policy with the test's interpreter; its tools/optimize runs find this
// build's kf-optimize through KF_BUILD_DIR.
ToolRun run_score_policy(const std::vector<std::string>& args, const std::string& dir) {
  std::vector<std::string> all = {test::source_dir() + "/tools/score-policy"};
  all.insert(all.end(), args.begin(), args.end());
  return run_program(std::move(all), dir, {{"KF_PYTHON", kf::test::python()}, {"KF_BUILD_DIR", test::build_dir()}});
}

// The --set list the tool gets and the test builds its options from: CPU, the short
// template, greedy sampling, and a light evaluator (a loaded 2-core CI machine).
std::vector<std::string> tool_sets(const std::string& tpl, std::size_t max_new) {
  return {"run.backend=cpu",
          "actors.prompt.template=" + tpl,
          "actors.sampling.max_new_tokens=" + std::to_string(max_new),
          "learner.temperature=0",
          "evaluator.correctness_sets=2",
          "evaluator.stress_sets=1",
          "evaluator.warmup=1",
          "evaluator.trials=3",
          "evaluator.max_trials=3",
          "evaluator.max_spread=100",
          "evaluator.cpu_threads=2"};
}

std::vector<std::string> with_sets(std::vector<std::string> args, const std::vector<std::string>& sets) {
  for (const auto& s : sets) args.insert(args.end(), {"--set", s});
  return args;
}

}  // namespace

TEST(OptimizeTest, OverfitExportedModelGivesVerifiedBestKernelAndReport) {
  KF_NEED_TASKS();
  const auto t_start = std::chrono::steady_clock::now();
  test::TempDir tmp;
  torch::manual_seed(0);
  at::set_num_threads(2);
  const std::string tpl = tmp.path + "/short.txt";
  test::write_file(tpl, test::kShortTemplate);
  const std::string kernel = test::read_text(test::source_dir() + "/tests/evaluator/kernels/cpu/good_relu.cpp");
  ASSERT_FALSE(kernel.empty());
  const std::string completion = "Plan: one pass.\n```cpp kernel\n" + kernel + "```\n";
  const auto sets = tool_sets(tpl, completion.size() + 8);

  // The prompt exactly as the tool builds it: same config, same library call.
  auto pol = test::tiny_policy(0);
  auto model = pol.model;
  const auto o = actor_options(kf::Config::parse("", "optimize_test", sets), 0);
  const auto task = test::relu_task();
  const auto prompt = optimize_prompt(o, pol, *task, {});
  ASSERT_NE(prompt.text.find("Write one ```cpp kernel block"), std::string::npos) << prompt.text;

  // Overfit with a margin: the tool decodes two rows from a loaded copy; a margin keeps
  // greedy decoding exact.
  const int step = test::memorise(model, prompt.tokens, completion, 1.0f);
  ASSERT_GE(step, 0) << "tiny model did not memorise the kernel";
  std::cerr << "memorised after " << step << " Adam steps, "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count() << " s\n";

  // The HF folder tools/export writes for a byte-level model: config.json + model.safetensors
  // (no tokenizer.json: the byte codec).
  const std::string model_dir = tmp.path + "/model";
  ::mkdir(model_dir.c_str(), 0755);
  kf::policy::save_weights(model, model_dir);

  const std::string out = tmp.path + "/out";
  auto r = run_tool(
      with_sets({"--model", model_dir, "--task", "001_relu", "--tasks-dir", test::tasks_dir(), "-n", "2", "--out", out},
                sets),
      tmp.path);
  std::cerr << r.out << "kf-optimize done at "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count() << " s\n";
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_EQ(test::read_text(out + "/best.cpp"), kernel);
  EXPECT_FALSE(test::exists(out + "/best.cu"));
  const auto rep = nlohmann::json::parse(test::read_text(out + "/report.json"));
  EXPECT_EQ(rep["task"], "001_relu");
  EXPECT_EQ(rep["backend"], "cpu");
  EXPECT_EQ(rep["verified_ok"], 2);
  EXPECT_EQ(rep["best_file"], "best.cpp");
  EXPECT_EQ(rep["prompt_tokens"], prompt.tokens.size());
  EXPECT_EQ(test::read_text(out + "/prompt.txt"), prompt.text);
  ASSERT_EQ(rep["candidates"].size(), 2u);
  for (const auto& c : rep["candidates"]) {
    EXPECT_EQ(c["verdict"], "ok") << c.dump();
    EXPECT_TRUE(c["extracted"].get<bool>());
    EXPECT_GT(c["speedup"].get<double>(), 0);
    // The speedup's 95 % interval from the paired trials, and the flags.
    EXPECT_GT(c["speedup_lo"].get<double>(), 0) << c.dump();
    EXPECT_LE(c["speedup_lo"].get<double>(), c["speedup"].get<double>()) << c.dump();
    EXPECT_GE(c["speedup_hi"].get<double>(), c["speedup"].get<double>()) << c.dump();
    EXPECT_FALSE(c["timing_unstable"].get<bool>()) << c.dump();  // evaluator.max_spread=100
    EXPECT_FALSE(c["task_degenerate"].get<bool>()) << c.dump();
    EXPECT_EQ(test::read_text(out + "/" + c["source_file"].get<std::string>()), kernel);
    EXPECT_EQ(test::read_text(out + "/" + c["completion_file"].get<std::string>()), completion);
  }
  // The evaluator's full report for the first; the identical second one reuses it.
  EXPECT_EQ(rep["candidates"][0]["result"]["verdict"], "ok");
  EXPECT_EQ(rep["candidates"][1]["duplicate_of"], 0);
  EXPECT_DOUBLE_EQ(rep["best_speedup"].get<double>(), rep["candidates"][0]["speedup"].get<double>());
  EXPECT_NE(r.out.find("2 verified ok"), std::string::npos) << r.out;
  EXPECT_DOUBLE_EQ(rep["best_speedup_lo"].get<double>(), rep["candidates"][0]["speedup_lo"].get<double>());
  EXPECT_DOUBLE_EQ(rep["best_speedup_hi"].get<double>(), rep["candidates"][0]["speedup_hi"].get<double>());
  // The table: an interval column, and the best line with the interval.
  EXPECT_NE(r.out.find("95 % interval"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("best #0 at "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("x (95 % "), std::string::npos) << r.out;
  const std::string report_txt = test::read_text(out + "/report.txt");
  EXPECT_NE(report_txt.find("verdict    ok"), std::string::npos);
  EXPECT_NE(report_txt.find("speedup    "), std::string::npos) << report_txt;
  EXPECT_NE(report_txt.find("x (95 % "), std::string::npos) << report_txt;

  // tools/score-policy on the same model (here, not in a test of its own: memorising is the
  // slow part): 001_relu, held out by the test's list, is solved; 002_gelu (train) gets the
  // ReLU kernel or nothing, never a correct GELU: 0 ok, counted as 1.0x.
  const std::string heldout = tmp.path + "/heldout.txt";
  test::write_file(heldout, "# the test's split\n001_relu\n");
  const std::string sp = tmp.path + "/scores";
  r = run_score_policy(
      with_sets({"--model", model_dir, "--out", sp, "--tasks-dir", test::tasks_dir(), "--include", "001_relu,002_gelu",
                 "--heldout", heldout, "-n", "2", "--jobs", "2", "--backend", "cpu", "--label", "memorised"},
                sets),
      tmp.path);
  std::cerr << "tools/score-policy done at "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count() << " s\n";
  ASSERT_EQ(r.rc, 0) << r.out << r.err << test::read_text(sp + "/tasks/001_relu.log")
                     << test::read_text(sp + "/tasks/002_gelu.log");
  const auto sc = nlohmann::json::parse(test::read_text(sp + "/scores.json"));
  EXPECT_EQ(sc["n"], 2);
  EXPECT_EQ(sc["backend"], "cpu");
  EXPECT_EQ(sc["label"], "memorised");
  EXPECT_TRUE(sc["failed"].empty()) << sc.dump(1);
  ASSERT_EQ(sc["tasks"].size(), 2u) << sc.dump(1);
  const auto& relu = sc["tasks"][0];  // in --include order
  EXPECT_EQ(relu["task"], "001_relu");
  EXPECT_EQ(relu["split"], "held-out");
  EXPECT_EQ(relu["level"], 1);
  EXPECT_EQ(relu["status"], "scored");
  EXPECT_EQ(relu["samples"], 2);
  // Its log says why a candidate was not ok (a verification the machine failed is run again).
  EXPECT_EQ(relu["ok"], 2) << relu << test::read_text(sp + "/tasks/001_relu.log");
  EXPECT_EQ(relu["verdicts"].value("ok", 0), 2) << relu;
  ASSERT_TRUE(relu["best_speedup"].is_number()) << relu;
  const double best = relu["best_speedup"].get<double>();
  EXPECT_GT(best, 0);
  EXPECT_DOUBLE_EQ(relu["counted_speedup"].get<double>(), best);
  EXPECT_EQ(test::read_text(sp + "/tasks/001_relu/best.cpp"), kernel);
  const auto& gelu = sc["tasks"][1];
  EXPECT_EQ(gelu["task"], "002_gelu");
  EXPECT_EQ(gelu["split"], "train");
  EXPECT_EQ(gelu["status"], "scored") << gelu;
  EXPECT_EQ(gelu["samples"], 2);
  EXPECT_EQ(gelu["ok"], 0) << gelu;
  EXPECT_TRUE(gelu["best_speedup"].is_null()) << gelu;
  EXPECT_DOUBLE_EQ(gelu["counted_speedup"].get<double>(), 1.0);
  // Rows: per split, level 1 then the split's total ("all"), train first.
  ASSERT_EQ(sc["rows"].size(), 4u) << sc.dump(1);
  for (int i = 0; i < 4; ++i) {
    const auto& row = sc["rows"][i];
    const bool train = i < 2;
    EXPECT_EQ(row["split"], train ? "train" : "held-out") << row;
    if (i % 2 == 0) {
      EXPECT_EQ(row["level"], 1) << row;
    } else {
      EXPECT_EQ(row["level"], "all") << row;
    }
    EXPECT_EQ(row["tasks"], 1) << row;
    EXPECT_EQ(row["failed"], 0) << row;
    EXPECT_EQ(row["samples"], 2) << row;
    EXPECT_EQ(row["ok"], train ? 0 : 2) << row;
    EXPECT_DOUBLE_EQ(row["correct_pct"].get<double>(), train ? 0.0 : 100.0) << row;
    EXPECT_DOUBLE_EQ(row["solved_pct"].get<double>(), train ? 0.0 : 100.0) << row;
    EXPECT_DOUBLE_EQ(row["fast1_pct"].get<double>(), !train && best > 1.0 ? 100.0 : 0.0) << row;
    EXPECT_DOUBLE_EQ(row["mean_speedup"].get<double>(), train ? 1.0 : best) << row;
    EXPECT_DOUBLE_EQ(row["median_speedup"].get<double>(), train ? 1.0 : best) << row;
    if (train) {
      EXPECT_TRUE(row["mean_ok_speedup"].is_null()) << row;
    } else {
      EXPECT_DOUBLE_EQ(row["mean_ok_speedup"].get<double>(), best) << row;  // the duplicate has the same result
    }
  }
  const std::string table = test::read_text(sp + "/table.md");
  EXPECT_NE(table.find("| train | 1 | 1 | 0 | 2 | 0.0 | 0.0 | 0.0 | 1.000 | 1.000 |"), std::string::npos) << table;
  EXPECT_NE(table.find("| held-out | 1 | 1 | 0 | 2 | 100.0 |"), std::string::npos) << table;
  EXPECT_NE(table.find("(memorised): n = 2 per task, backend cpu"), std::string::npos) << table;
  EXPECT_NE(table.find("no-exemplar (first-round) prompt"), std::string::npos) << table;
  EXPECT_NE(r.out.find("| held-out | all |"), std::string::npos) << r.out;  // the table is printed
}

// tools/score-policy checks its task lists before it runs anything: an unknown --include
// name, or a held-out line that is not a task name, exits 2 naming it.
TEST(OptimizeTest, ScorePolicyBadTaskListExitsTwoNamingIt) {
  KF_NEED_TASKS();
  test::TempDir tmp;
  const std::string out = tmp.path + "/scores";
  auto r = run_score_policy({"--model", tmp.path, "--out", out, "--tasks-dir", test::tasks_dir(), "--backend", "cpu",
                             "--include", "001_relu,no_such_task"},
                            tmp.path);
  EXPECT_EQ(r.rc, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("--include: no task 'no_such_task' in " + test::tasks_dir()), std::string::npos) << r.err;
  EXPECT_FALSE(test::exists(out));

  const std::string heldout = tmp.path + "/heldout.txt";
  test::write_file(heldout, "# split\n001_relu\ntasks/002_gelu\n");
  r = run_score_policy({"--model", tmp.path, "--out", out, "--tasks-dir", test::tasks_dir(), "--backend", "cpu",
                        "--include", "001_relu", "--heldout", heldout},
                       tmp.path);
  EXPECT_EQ(r.rc, 2) << r.out << r.err;
  EXPECT_NE(r.err.find(heldout + ":3: 'tasks/002_gelu' is not a task name"), std::string::npos) << r.err;
  EXPECT_FALSE(test::exists(out));
}

// tools/score-policy --compare: two score folders (written here, as the tool writes them)
// in one table, on the tasks both scored; a task one policy failed is left out and named;
// a missing file, a missing field or a split that differs between folders exits 2 naming it.
TEST(OptimizeTest, ScorePolicyCompareTablesOnlyTheTasksEveryPolicyScored) {
  test::TempDir tmp;
  using nlohmann::json;
  auto scored = [](const std::string& task, const std::string& split, int level, std::vector<double> oks) {
    const double best = oks.empty() ? 0.0 : *std::max_element(oks.begin(), oks.end());
    return json{{"task", task},
                {"split", split},
                {"level", level},
                {"status", "scored"},
                {"samples", 4},
                {"ok", static_cast<int>(oks.size())},
                {"ok_speedups", oks},
                {"best_speedup", oks.empty() ? json(nullptr) : json(best)},
                {"counted_speedup", oks.empty() ? 1.0 : best}};
  };
  auto folder = [&](const std::string& name, const std::string& label, const json& tasks) {
    const std::string dir = tmp.path + "/" + name;
    ::mkdir(dir.c_str(), 0755);
    test::write_file(dir + "/scores.json", json{{"format", "kf-policy-scores"},
                                                {"label", label},
                                                {"model", "m/" + name},
                                                {"n", 4},
                                                {"backend", "cpu"},
                                                {"seed", 0},
                                                {"machine", "CPU"},
                                                {"tasks", tasks}}
                                               .dump());
    return dir;
  };
  const std::string sft =
      folder("sft", "SFT",
             json::array({scored("001_relu", "train", 1, {0.5, 1.5}), scored("002_gelu", "train", 1, {}),
                          scored("101_linear", "train", 2, {2.0}), scored("005_tanh", "held-out", 1, {})}));
  const std::string rl = folder(
      "rl", "RL",
      json::array(
          {scored("001_relu", "train", 1, {1.0, 1.0, 2.0, 3.0}),
           json{{"task", "002_gelu"}, {"split", "train"}, {"level", 1}, {"status", "failed"}, {"reason", "exit 3"}},
           scored("101_linear", "train", 2, {}), scored("005_tanh", "held-out", 1, {0.5})}));
  const std::string md = tmp.path + "/compare.md";
  auto r = run_score_policy({"--compare", sft, rl, "--out", md}, tmp.path);
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_EQ(test::read_text(md) + "\n", r.out);  // printed and written alike
  // Rows per (split, level), the policies side by side in the order given.
  for (const char* row :
       {"| SFT | train | 1 | 1 | 4 | 50.0 | 100.0 | 100.0 | 1.500 | 1.500 | 1.000 |",
        "| RL | train | 1 | 1 | 4 | 100.0 | 100.0 | 100.0 | 3.000 | 3.000 | 1.750 |",
        "| SFT | train | 2 | 1 | 4 | 25.0 | 100.0 | 100.0 | 2.000 | 2.000 | 2.000 |",
        "| RL | train | 2 | 1 | 4 | 0.0 | 0.0 | 0.0 | 1.000 | 1.000 | – |",
        "| SFT | train | all | 2 | 8 | 37.5 | 100.0 | 100.0 | 1.750 | 1.750 | 1.333 |",
        "| RL | train | all | 2 | 8 | 50.0 | 50.0 | 50.0 | 2.000 | 2.000 | 1.750 |",
        "| SFT | held-out | all | 1 | 4 | 0.0 | 0.0 | 0.0 | 1.000 | 1.000 | – |",
        "| RL | held-out | all | 1 | 4 | 25.0 | 0.0 | 100.0 | 0.500 | 0.500 | 0.500 |",
        "| 001_relu | train | 2/4, 1.500x | 4/4, 3.000x |", "| 005_tanh | held-out | 0/4 | 1/4, 0.500x |"}) {
    EXPECT_NE(r.out.find(row), std::string::npos) << row << "\n" << r.out;
  }
  EXPECT_LT(r.out.find("| RL | train | all |"), r.out.find("| SFT | held-out | 1 |")) << r.out;
  EXPECT_NE(r.out.find("on the 3 task(s) every one of them scored (2 train, 1 held-out)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1 task(s) left out, not scored by every policy: 002_gelu (not scored by RL)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("Same settings for all: n = 4 per task, backend cpu"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("| 002_gelu |"), std::string::npos) << r.out;

  // Bad inputs: each names the file and what is wrong, and writes nothing.
  const std::string none = tmp.path + "/none";
  r = run_score_policy({"--compare", sft, none, "--out", tmp.path + "/bad.md"}, tmp.path);
  EXPECT_EQ(r.rc, 2) << r.out << r.err;
  EXPECT_NE(r.err.find(none + "/scores.json: cannot read"), std::string::npos) << r.err;
  EXPECT_FALSE(test::exists(tmp.path + "/bad.md"));
  const std::string no_ok =
      folder("no_ok", "X",
             json::array(
                 {scored("001_relu", "train", 1, {1.0}),
                  json{{"task", "002_gelu"}, {"split", "train"}, {"level", 1}, {"status", "scored"}, {"samples", 4}}}));
  r = run_score_policy({"--compare", sft, no_ok}, tmp.path);
  EXPECT_EQ(r.rc, 2) << r.out << r.err;
  EXPECT_NE(r.err.find(no_ok + "/scores.json: tasks[1] (002_gelu): field ok: missing"), std::string::npos) << r.err;
  const std::string moved = folder("moved", "Y", json::array({scored("001_relu", "held-out", 1, {1.0})}));
  r = run_score_policy({"--compare", sft, moved}, tmp.path);
  EXPECT_EQ(r.rc, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("task 001_relu is train/held-out across the folders"), std::string::npos) << r.err;
  r = run_score_policy({"--compare", sft}, tmp.path);
  EXPECT_EQ(r.rc, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("--compare: expected two or more score folders"), std::string::npos) << r.err;
}

// A KernelBench .py file is imported first (into <out>/task); an untrained model writes no
// kernel, so no candidate verifies: exit 1, and the report is written all the same.
TEST(OptimizeTest, PyTaskIsImportedAndNoVerifiedCandidateExitsOneWithReport) {
  KF_NEED_TASKS();
  test::TempDir tmp;
  const std::string model_dir = tmp.path + "/model";
  ::mkdir(model_dir.c_str(), 0755);
  auto m = test::tiny_policy(2).model;
  kf::policy::save_weights(m, model_dir);
  const std::string out = tmp.path + "/out";
  const auto r =
      run_tool({"--model", model_dir, "--task", test::source_dir() + "/tasks/suite/level1/001_relu.py", "--backend",
                "cpu", "-n", "3", "--temperature", "1", "--seed", "5", "--max-new-tokens", "48", "--out", out},
               tmp.path);
  ASSERT_EQ(r.rc, 1) << r.out << r.err;
  EXPECT_TRUE(test::exists(out + "/task/001_relu/task.json"));
  EXPECT_FALSE(test::exists(out + "/best.cpp"));
  EXPECT_NE(r.out.find("no candidate verified ok"), std::string::npos) << r.out;
  const auto rep = nlohmann::json::parse(test::read_text(out + "/report.json"));
  EXPECT_EQ(rep["task"], "001_relu");
  EXPECT_EQ(rep["task_from"], out + "/task/001_relu");
  EXPECT_EQ(rep["verified_ok"], 0);
  EXPECT_TRUE(rep["best"].is_null());
  EXPECT_EQ(rep["seed"], 5);
  ASSERT_EQ(rep["candidates"].size(), 3u);
  for (const auto& c : rep["candidates"]) {
    EXPECT_EQ(c["verdict"], "compile_error");
    EXPECT_FALSE(c["extracted"].get<bool>());
    EXPECT_EQ(c["extraction_error"].get<std::string>().rfind("extract: ", 0), 0u) << c.dump();
    EXPECT_EQ(c["reason"], c["extraction_error"]);
    EXPECT_LE(c["completion_tokens"].get<int>(), 48);
    EXPECT_TRUE(test::exists(out + "/" + c["completion_file"].get<std::string>()));
  }
  // The table names a completion without a code block for what it is, and no compiler ran.
  const std::string txt = test::read_text(out + "/report.txt");
  EXPECT_NE(txt.find("no_code_block"), std::string::npos) << txt;
  EXPECT_EQ(txt.find("compiler errors:"), std::string::npos) << txt;
}

TEST(OptimizeTest, MissingTaskExitsTwoNamingIt) {
  KF_NEED_TASKS();
  test::TempDir tmp;
  auto r = run_tool(
      {"--model", tmp.path, "--task", "no_such_task", "--tasks-dir", test::tasks_dir(), "--out", tmp.path + "/out"},
      tmp.path);
  EXPECT_EQ(r.rc, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("no task 'no_such_task' in " + test::tasks_dir()), std::string::npos) << r.err;
  EXPECT_FALSE(test::exists(tmp.path + "/out/report.json"));

  // A .py file that is not a KernelBench problem: the importer's reason, exit 2.
  const std::string bad_py = tmp.path + "/broken_task.py";
  test::write_file(bad_py, "import torch\nx = 1\n");
  r = run_tool({"--model", tmp.path, "--task", bad_py, "--out", tmp.path + "/out-py"}, tmp.path);
  EXPECT_EQ(r.rc, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("importing " + bad_py + " failed"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("missing 'Model'"), std::string::npos) << r.err;
}

TEST(OptimizeTest, BadModelFolderExitsTwoNamingTheFile) {
  KF_NEED_TASKS();
  test::TempDir tmp;
  const std::vector<std::string> base = {"--task",          "001_relu", "--tasks-dir",
                                         test::tasks_dir(), "--out",    tmp.path + "/out"};
  auto args = [&](const std::string& model) {
    std::vector<std::string> a = {"--model", model};
    a.insert(a.end(), base.begin(), base.end());
    return a;
  };
  // No such folder.
  auto r = run_tool(args(tmp.path + "/nowhere"), tmp.path);
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("model folder '" + tmp.path + "/nowhere' does not exist"), std::string::npos) << r.err;
  // A folder without config.json.
  const std::string empty = tmp.path + "/empty";
  ::mkdir(empty.c_str(), 0755);
  r = run_tool(args(empty), tmp.path);
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find(empty + "/config.json"), std::string::npos) << r.err;
  // Truncated weights.
  const std::string cut = tmp.path + "/cut";
  ::mkdir(cut.c_str(), 0755);
  auto m = test::tiny_policy(1).model;
  kf::policy::save_weights(m, cut);
  const std::string st = test::read_text(cut + "/model.safetensors");
  ASSERT_GT(st.size(), 1000u);
  test::write_file(cut + "/model.safetensors", st.substr(0, st.size() / 2));
  r = run_tool(args(cut), tmp.path);
  EXPECT_EQ(r.rc, 2) << r.out << r.err;
  EXPECT_NE(r.err.find(cut + "/model.safetensors"), std::string::npos) << r.err;
  EXPECT_FALSE(test::exists(tmp.path + "/out/report.json"));
}

// --exemplars: a saved kernel database (as a run writes kernels/kernel_db.json) or a seed
// folder; the task's kernels come back ascending and the prompt shows them.
TEST(OptimizeTest, ExemplarsFromKernelDbFileRunFolderAndSeedFolder) {
  KF_NEED_TASKS();
  test::TempDir tmp;
  const std::string name = "kfopt-test." + std::to_string(::getpid());
  auto db = kf::replay::KernelDb::create(name, kf::replay::KernelDbConfig{});
  kf::replay::ShmSegment::remove(name);
  for (int i = 0; i < 6; ++i) db.insert({"001_relu", 0.5 + i, i, "// relu kernel " + std::to_string(i) + "\n", 0});
  db.insert({"002_other", 9.0, 1, "// other task\n", 0});
  ::mkdir((tmp.path + "/run").c_str(), 0755);
  ::mkdir((tmp.path + "/run/kernels").c_str(), 0755);
  db.save(tmp.path + "/run/kernels/kernel_db.json");

  for (const std::string& from : {tmp.path + "/run/kernels/kernel_db.json", tmp.path + "/run"}) {
    const auto ex = load_exemplars(from, "001_relu", 3, 7);
    ASSERT_EQ(ex.size(), 3u) << from;
    for (std::size_t i = 1; i < ex.size(); ++i) EXPECT_LT(ex[i - 1].speedup, ex[i].speedup);
    for (const auto& e : ex) EXPECT_EQ(e.source.rfind("// relu kernel ", 0), 0u);
    EXPECT_TRUE(load_exemplars(from, "003_absent", 3, 7).empty());
  }

  const std::string seed = tmp.path + "/seed";
  ::mkdir(seed.c_str(), 0755);
  ::mkdir((seed + "/001_relu").c_str(), 0755);
  test::write_file(seed + "/001_relu/a.cpp", "// seeded fast\n");
  test::write_file(seed + "/001_relu/a.json", "{\"speedup\": 2.5}");
  test::write_file(seed + "/001_relu/b.cpp", "// seeded slow\n");
  auto ex = load_exemplars(seed, "001_relu", 4, 0);
  ASSERT_EQ(ex.size(), 2u);
  EXPECT_EQ(ex[0].source, "// seeded slow\n");  // speedup 1.0 without a .json
  EXPECT_DOUBLE_EQ(ex[1].speedup, 2.5);

  // The default (shipped) template shows them, slowest first.
  ActorOptions o;
  o.max_new_tokens = 256;
  o.context_tokens = 1 << 15;  // the whole shipped prompt in bytes; the budget is not under test here
  const auto prompt = optimize_prompt(o, test::tiny_policy(0), *test::relu_task(), ex);
  ASSERT_EQ(prompt.shown.size(), 2u);
  const auto slow = prompt.text.find("// seeded slow"), fast = prompt.text.find("// seeded fast");
  ASSERT_NE(slow, std::string::npos);
  ASSERT_NE(fast, std::string::npos);
  EXPECT_LT(slow, fast);

  // Bad input names the file.
  test::write_file(tmp.path + "/bad.json", "{\"format\": \"nope\"}");
  try {
    load_exemplars(tmp.path + "/bad.json", "001_relu", 2, 0);
    ADD_FAILURE() << "no error for a bad kernel database";
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find(tmp.path + "/bad.json"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_exemplars(tmp.path + "/nowhere", "001_relu", 2, 0), kf::Error);
}
