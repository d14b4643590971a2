// tools/report on run folders: one written by the real writers (kf::MetricsWriter streams
// named as the learner, launcher and an actor write them; kernels/kernel_db.json saved by
// a real KernelDb), one with corrupt inputs, one with the evaluators' verdict logs, and
// empty ones.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "../test_support.h"
#include "kf/common/metrics.h"
#include "kf/replay/replay.h"

namespace {

struct Result {
  int rc = -1;
  std::string out, err;
};

// tools/report ARGS, with the test's interpreter (the wrapper honours KF_PYTHON).
Result report(const std::vector<std::string>& args, const std::string& tmp) {
  std::string cmd = "KF_PYTHON='" + kf::test::python() + "' '" + kf::test::source_dir() + "/tools/report'";
  for (const auto& a : args) cmd += " '" + a + "'";
  const std::string err_file = tmp + "/report.stderr";
  Result r;
  std::FILE* p = ::popen((cmd + " 2>'" + err_file + "'").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = kf::test::read_file(err_file);
  return r;
}

bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

// A PNG: the 8-byte signature, then the IHDR chunk with a non-zero size, and IEND last.
void expect_png(const std::string& path) {
  const std::string b = kf::test::read_file(path);
  ASSERT_GT(b.size(), 33u) << path;
  EXPECT_EQ(b.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8)) << path;
  EXPECT_EQ(b.substr(12, 4), "IHDR") << path;
  auto be32 = [&](std::size_t at) {
    return (uint32_t(uint8_t(b[at])) << 24) | (uint32_t(uint8_t(b[at + 1])) << 16) |
           (uint32_t(uint8_t(b[at + 2])) << 8) | uint32_t(uint8_t(b[at + 3]));
  };
  EXPECT_GT(be32(16), 100u) << path;  // width
  EXPECT_GT(be32(20), 100u) << path;  // height
  EXPECT_EQ(b.substr(b.size() - 8, 4), "IEND") << path;
}

const char* const kPlots[] = {"reward.png",  "learner.png",  "learning.png",
                              "speedup.png", "verdicts.png", "throughput.png"};

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// One line as kf-evaluator appends it to metrics/verdicts-<id>.jsonl.
std::string verdict_line(double t, int evaluator, int candidate, const std::string& task, int level,
                         const std::string& verdict, double speedup = 0.0, const std::string& reason = "",
                         int policy_version = 1) {
  const nlohmann::json j = {{"t", t},
                            {"evaluator", evaluator},
                            {"candidate", candidate},
                            {"group", candidate / 4},
                            {"task", task},
                            {"level", level},
                            {"policy_version", policy_version},
                            {"actor", 0},
                            {"verdict", verdict},
                            {"speedup", speedup},
                            {"reward", 0.1},
                            {"compile_s", 1.0},
                            {"verify_s", 0.5},
                            {"reason", reason}};
  return j.dump() + "\n";
}

// An empty run folder with its metrics/ inside, as the launcher makes it.
std::string run_folder(const kf::test::TempDir& tmp) {
  const std::string run = tmp.path + "/run";
  ::mkdir(run.c_str(), 0755);
  ::mkdir((run + "/metrics").c_str(), 0755);
  return run;
}

void expect_matplotlib(const Result& r) {
  ASSERT_FALSE(contains(r.err, "matplotlib is not importable"))
      << "the matplotlib Python package is missing (" << kf::test::python()
      << "); install requirements.txt with ./setup.sh: " << r.err;
}

// A candidate's id as the actor makes it from its group id and index (actors/src/actor.cpp,
// finish_group): what the report uses to find a member in verdict lines without its index.
uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}
uint64_t candidate_id(uint64_t group, uint32_t index) {
  return splitmix(group ^ (uint64_t(index) + 1) * 0x9E3779B97F4A7C15ULL);
}

// A two-turn run (actors.turns = 2, G = 4). Turn 1: group A (relu: ok 1.0, incorrect,
// compile_error, no kernel), B (gelu: ok 2.0, ok 1.0, incorrect, runtime_error), C (softmax:
// rejected_cheat, timeout, ok 1.2, ok 0.8; no member goes on). Turn 2: A2, all four members
// (ok 2.0, ok 1.5, compile_error, ok 0.5); B2, members 1-3 of B (member 0 ended), so its
// index i is B's member i + 1 (ok 0.5, incorrect, ok 3.0). with_fields: verdict lines carry
// turn, parent_group and parent_index; without them the report finds turns from the group
// lines and members from the candidate ids.
struct TurnRun {
  uint64_t a = 0x9c3e5a7710000001ULL, b = 0x9c3e5a7710000002ULL, c = 0x9c3e5a7710000003ULL;
  uint64_t a2 = 0xf00dfeed20000004ULL, b2 = 0xf00dfeed20000005ULL;
};

std::string write_turn_run(const kf::test::TempDir& tmp, const std::string& name, bool with_fields) {
  const std::string run = tmp.path + "/" + name;
  ::mkdir(run.c_str(), 0755);
  ::mkdir((run + "/metrics").c_str(), 0755);
  const double t0 = 1796300000.0;
  {
    kf::MetricsWriter status(run + "/metrics", "run");
    status.write(1, {{"verified_total", 0}});
  }
  const TurnRun ids;
  auto group = [&](double t, uint64_t id, const char* task, int turn, uint64_t parent, int completions,
                   int failures) {
    return nlohmann::json({{"t", t},
                           {"actor", 0},
                           {"group", id},
                           {"task", task},
                           {"policy_version", 0},
                           {"prompt_tokens", 900},
                           {"exemplars_offered", 0},
                           {"exemplars_shown", 0},
                           {"exemplars_cut", 0},
                           {"exemplars_dropped", 0},
                           {"completions", completions},
                           {"extraction_failures", failures},
                           {"extraction_codes", nlohmann::json::object()},
                           {"turn", turn},
                           {"parent_group", parent}})
               .dump() +
           "\n";
  };
  // The last line is torn (an actor killed mid-write): skipped with a warning.
  kf::test::write_file(run + "/metrics/groups-0.jsonl",
                       group(t0 + 1, ids.a, "001_relu", 1, 0, 4, 1) + group(t0 + 2, ids.b, "002_gelu", 1, 0, 4, 0) +
                           group(t0 + 3, ids.c, "021_softmax", 1, 0, 4, 0) +
                           group(t0 + 60, ids.a2, "001_relu", 2, ids.a, 4, 0) +
                           group(t0 + 61, ids.b2, "002_gelu", 2, ids.b, 3, 0) + "{\"group\": 77, \"ta");
  auto verdict = [&](double t, uint64_t gid, uint32_t index, int turn, uint64_t root, uint32_t root_index,
                     const char* task, const char* v, double speedup) {
    nlohmann::json j = nlohmann::json::parse(verdict_line(t0 + t, 0, 0, task, 1, v, speedup));
    j["candidate"] = candidate_id(gid, index);
    j["group"] = gid;
    if (with_fields) {
      j["turn"] = turn;
      j["parent_group"] = turn > 1 ? root : 0;
      j["parent_index"] = root_index;
    }
    return j.dump() + "\n";
  };
  kf::test::write_file(
      run + "/metrics/verdicts-0.jsonl",
      verdict(10, ids.a, 0, 1, 0, 0, "001_relu", "ok", 1.0) + verdict(11, ids.a, 1, 1, 0, 1, "001_relu", "incorrect", 0) +
          verdict(12, ids.a, 2, 1, 0, 2, "001_relu", "compile_error", 0) +
          verdict(13, ids.b, 0, 1, 0, 0, "002_gelu", "ok", 2.0) + verdict(14, ids.b, 1, 1, 0, 1, "002_gelu", "ok", 1.0) +
          verdict(15, ids.b, 2, 1, 0, 2, "002_gelu", "incorrect", 0) +
          verdict(16, ids.b, 3, 1, 0, 3, "002_gelu", "runtime_error", 0) +
          verdict(17, ids.c, 0, 1, 0, 0, "021_softmax", "rejected_cheat", 0) +
          verdict(18, ids.c, 1, 1, 0, 1, "021_softmax", "timeout", 0) +
          verdict(19, ids.c, 2, 1, 0, 2, "021_softmax", "ok", 1.2) +
          verdict(20, ids.c, 3, 1, 0, 3, "021_softmax", "ok", 0.8) +
          verdict(70, ids.a2, 0, 2, ids.a, 0, "001_relu", "ok", 2.0) +
          verdict(71, ids.a2, 1, 2, ids.a, 1, "001_relu", "ok", 1.5) +
          verdict(72, ids.a2, 2, 2, ids.a, 2, "001_relu", "compile_error", 0) +
          verdict(73, ids.a2, 3, 2, ids.a, 3, "001_relu", "ok", 0.5) +
          verdict(74, ids.b2, 0, 2, ids.b, 1, "002_gelu", "ok", 0.5) +
          verdict(75, ids.b2, 1, 2, ids.b, 2, "002_gelu", "incorrect", 0) +
          verdict(76, ids.b2, 2, 2, ids.b, 3, "002_gelu", "ok", 3.0));
  return run;
}

}  // namespace

TEST(ReportTest, PlotsAndBestKernelPerTask) {
  kf::test::TempDir tmp("report");
  const std::string run = tmp.path + "/run";
  ::mkdir(run.c_str(), 0755);
  {
    kf::MetricsWriter learner(run + "/metrics", "learner");
    kf::MetricsWriter status(run + "/metrics", "run");
    kf::MetricsWriter actor(run + "/metrics", "actor-0");
    for (int s = 1; s <= 6; ++s) {
      learner.write(s, {{"loss", 1.0 / s}, {"grad_norm", 0.5}, {"lr", 1e-5}, {"seconds", 2.0}, {"updated", 1}});
      status.write(s, {{"elapsed_s", 5.0 * s},
                       {"samples_per_s", 1.5},
                       {"candidates_per_min", 40},
                       {"verified_total", 10.0 * s},
                       {"correct_frac", 0.1 * s},
                       {"incorrect_frac", 0.2},
                       {"compile_error_frac", 0.6 - 0.1 * s + 0.1},
                       {"runtime_error_frac", 0.05},
                       {"timeout_frac", 0.0},
                       {"cheat_frac", 0.05},
                       {"mean_speedup", 1.0 + 0.1 * s},
                       {"median_speedup", 1.0},
                       {"best_speedup", 1.5 + s},
                       {"fast1_frac", 0.1},
                       {"mean_reward", -0.5 + 0.1 * s},
                       {"policy_lag", 1},
                       {"candidate_queue_depth", s},
                       {"result_queue_depth", 0},
                       {"ready_groups", 2},
                       {"gpu_busy_frac", std::nan("")}});
      actor.write(s, {{"samples_per_s", 1.0}, {"policy_lag_mean", 0.5}});
    }
  }
  // The kernel database as the run saves it: a real KernelDb, saved at checkpoint.
  const std::string shm = "kft" + std::to_string(::getpid()) + ".report";
  {
    auto db = kf::replay::KernelDb::create(shm, kf::replay::KernelDbConfig{64, 4096, 16});
    db.insert({"001_relu", 1.25, 4, "// slow relu\nint relu_slow;", 0});
    db.insert({"001_relu", 3.5, 7, "#include <kf/kernel.h>\nif (a < b && c > d) {} // </pre><script>x</script>", 0});
    db.insert({"021_softmax", 0.8, -1, "// seed softmax \"quoted\" & <tagged>", 0});
    ::mkdir((run + "/kernels").c_str(), 0755);
    db.save(run + "/kernels/kernel_db.json");
  }
  kf::replay::ShmSegment::remove(shm);

  const Result r = report({run}, tmp.path);
  expect_matplotlib(r);
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string out = run + "/report";
  for (const char* png : kPlots) {
    EXPECT_TRUE(contains(r.out, out + "/" + png)) << r.out;  // every path written is printed
    expect_png(out + "/" + png);
  }
  EXPECT_TRUE(contains(r.out, out + "/index.html")) << r.out;
  const std::string page = kf::test::read_file(out + "/index.html");
  for (const char* png : kPlots) EXPECT_TRUE(contains(page, std::string("src=\"") + png + "\"")) << png;
  // Best kernel of each task, with its version and escaped source; the slower one is not shown.
  EXPECT_TRUE(contains(page, "<td>001_relu</td><td>3.500x</td><td>7</td><td>2</td>")) << page;
  EXPECT_TRUE(contains(page,
                       "#include &lt;kf/kernel.h&gt;\nif (a &lt; b &amp;&amp; c &gt; d) {} // "
                       "&lt;/pre&gt;&lt;script&gt;x&lt;/script&gt;"))
      << page;
  EXPECT_FALSE(contains(page, "<script>"));
  EXPECT_FALSE(contains(page, "relu_slow"));
  EXPECT_TRUE(contains(page, "<td>021_softmax</td><td>0.800x</td><td>seed</td><td>1</td>")) << page;
  EXPECT_TRUE(contains(page, "// seed softmax &quot;quoted&quot; &amp; &lt;tagged&gt;")) << page;
  EXPECT_TRUE(contains(page, "<details>")) << page;
  // The latest launcher status is summarised.
  EXPECT_TRUE(contains(page, "<tr><th>best speedup</th><td>7.5</td></tr>")) << page;
  // No verdict logs (a run from before them): said once on stdout, no windows outputs.
  EXPECT_TRUE(contains(r.out, "no verdict logs (" + run + "/metrics/verdicts-*.jsonl)")) << r.out;
  EXPECT_FALSE(exists(out + "/windows.json"));
  EXPECT_FALSE(exists(out + "/windows.png"));
  EXPECT_FALSE(contains(page, "windows.png")) << page;
}

// The evaluators' verdict logs: two files over 3 minutes, after a launcher line that comes
// first (the windows count from the earliest record of any stream, like the other plots).
// Window 0 has 4 verified (under the default --min-window 5), window 1 has 5, window 2 has
// 8; levels 1-3; two rejected cheats. Every figure below is exact.
TEST(ReportTest, VerdictLogsGiveWindowsLevelsAndCheats) {
  kf::test::TempDir tmp("report");
  const std::string run = run_folder(tmp);
  const double t0 = 1796300000.0;
  const nlohmann::json first = {{"step", 1}, {"time", t0}, {"verified_total", 0}};
  const nlohmann::json last = {{"step", 2}, {"time", t0 + 170}, {"verified_total", 17}, {"mean_speedup", 1.5}};
  kf::test::write_file(run + "/metrics/run.jsonl", first.dump() + "\n" + last.dump() + "\n");
  const std::string relu_cheat = "work outside the timed region: 2.5 ms of CPU after return";
  const std::string gelu_cheat = "output <written> before the timer & started";
  kf::test::write_file(run + "/metrics/verdicts-0.jsonl",
                       verdict_line(t0 + 10, 0, 1, "001_relu", 1, "ok", 0.5) +
                           verdict_line(t0 + 20, 0, 2, "001_relu", 1, "compile_error", 0, "error: x") +
                           verdict_line(t0 + 65, 0, 3, "001_relu", 1, "ok", 2.0) +
                           verdict_line(t0 + 70, 0, 4, "001_relu", 1, "rejected_cheat", 0, relu_cheat) +
                           verdict_line(t0 + 75, 0, 5, "021_softmax", 2, "ok", 1.0) +
                           verdict_line(t0 + 125, 0, 6, "001_relu", 1, "ok", 3.0) +
                           verdict_line(t0 + 130, 0, 7, "021_softmax", 2, "ok", 1.5) +
                           verdict_line(t0 + 135, 0, 8, "001_relu", 1, "incorrect") +
                           verdict_line(t0 + 140, 0, 9, "021_softmax", 2, "compile_error"));
  // Line 3 has no task, line 10 is torn (an evaluator killed mid-write): both skipped.
  kf::test::write_file(run + "/metrics/verdicts-1.jsonl",
                       verdict_line(t0 + 15, 1, 11, "002_gelu", 1, "ok", 1.5) +
                           verdict_line(t0 + 30, 1, 12, "021_softmax", 2, "incorrect") +
                           "{\"t\": 1796300040.0, \"verdict\": \"ok\", \"speedup\": 9.0}\n" +
                           verdict_line(t0 + 80, 1, 13, "002_gelu", 1, "ok", 0.75) +
                           verdict_line(t0 + 90, 1, 14, "021_softmax", 2, "timeout") +
                           verdict_line(t0 + 150, 1, 15, "002_gelu", 1, "ok", 2.0) +
                           verdict_line(t0 + 155, 1, 16, "002_gelu", 1, "rejected_cheat", 0, gelu_cheat) +
                           verdict_line(t0 + 160, 1, 17, "061_conv_relu", 3, "ok", 0.5) +
                           verdict_line(t0 + 165, 1, 18, "061_conv_relu", 3, "runtime_error") + "{\"t\": 17963");

  const Result r = report({run}, tmp.path);
  expect_matplotlib(r);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_FALSE(contains(r.err, "Traceback")) << r.err;
  EXPECT_TRUE(contains(r.err, run + "/metrics/verdicts-1.jsonl: 2 line(s) are not JSON objects with t, verdict and "
                                    "task (line 3, 10); skipped them"))
      << r.err;
  EXPECT_FALSE(contains(r.err, "verdicts-0.jsonl")) << r.err;
  const std::string out = run + "/report";
  for (const char* f : {"windows.png", "windows.json", "index.html"})
    EXPECT_TRUE(contains(r.out, out + "/" + f)) << r.out;
  expect_png(out + "/windows.png");

  const auto w = nlohmann::json::parse(kf::test::read_file(out + "/windows.json"));
  EXPECT_EQ(w["verified"], 17) << w.dump(1);
  EXPECT_EQ(w["min_window"], 5);
  struct Figures {
    int key, tasks, n, ok, fast1;  // key: the minute, or the level
    double correct_pct, fast1_pct, mean, median, best;
  };
  auto expect_figures = [](const nlohmann::json& g, const Figures& e) {
    EXPECT_EQ(g["n"], e.n) << g;
    EXPECT_EQ(g["ok"], e.ok) << g;
    EXPECT_EQ(g["fast1"], e.fast1) << g;
    EXPECT_DOUBLE_EQ(g["correct_pct"].get<double>(), e.correct_pct) << g;
    EXPECT_DOUBLE_EQ(g["fast1_pct"].get<double>(), e.fast1_pct) << g;
    EXPECT_DOUBLE_EQ(g["mean_speedup"].get<double>(), e.mean) << g;
    EXPECT_DOUBLE_EQ(g["median_speedup"].get<double>(), e.median) << g;
    EXPECT_DOUBLE_EQ(g["best_speedup"].get<double>(), e.best) << g;
  };
  const Figures windows[] = {{0, 0, 4, 2, 1, 50.0, 25.0, 1.0, 1.0, 1.5},
                             {1, 0, 5, 3, 1, 60.0, 20.0, 1.25, 1.0, 2.0},
                             {2, 0, 8, 4, 3, 50.0, 37.5, 1.75, 1.75, 3.0}};
  ASSERT_EQ(w["windows"].size(), 3u) << w.dump(1);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(w["windows"][i]["minute"], windows[i].key) << w["windows"][i];
    EXPECT_EQ(w["windows"][i]["few"], i == 0) << w["windows"][i];
    expect_figures(w["windows"][i], windows[i]);
  }
  const Figures levels[] = {{1, 2, 10, 6, 4, 60.0, 40.0, 1.625, 1.75, 3.0},
                            {2, 1, 5, 2, 1, 40.0, 20.0, 1.25, 1.25, 1.5},
                            {3, 1, 2, 1, 0, 50.0, 0.0, 0.5, 0.5, 0.5}};
  ASSERT_EQ(w["levels"].size(), 3u) << w.dump(1);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(w["levels"][i]["level"], levels[i].key) << w["levels"][i];
    EXPECT_EQ(w["levels"][i]["tasks"], levels[i].tasks) << w["levels"][i];
    expect_figures(w["levels"][i], levels[i]);
  }
  // Window 0 is under --min-window: the ratio is window 2's mean over window 1's.
  ASSERT_TRUE(w["first_final_ratio"].is_number()) << w.dump(1);
  EXPECT_NEAR(w["first_final_ratio"].get<double>(), 1.75 / 1.25, 1e-12);
  EXPECT_EQ(w["first_final"]["first_minute"], 1);
  EXPECT_EQ(w["first_final"]["final_minute"], 2);
  ASSERT_EQ(w["cheats"].size(), 2u) << w.dump(1);
  EXPECT_EQ(w["cheats_total"], 2);
  EXPECT_EQ(w["cheats"][0]["task"], "001_relu");  // oldest first
  EXPECT_EQ(w["cheats"][0]["reason"], relu_cheat);
  EXPECT_EQ(w["cheats"][1]["task"], "002_gelu");
  EXPECT_EQ(w["cheats"][1]["reason"], gelu_cheat);

  // Per task, first vs last visit (group = candidate / 4): 001_relu's groups 0 and 1 have
  // ok results (means 1.25 and 3.0; group 2 has none), 002_gelu's groups 2 and 3 (1.5 and
  // 1.375); 021_softmax and 061_conv_relu have one such visit each, so no row.
  ASSERT_EQ(w["task_trend"].size(), 2u) << w.dump(1);
  EXPECT_EQ(w["task_trend"][0]["task"], "001_relu");
  EXPECT_EQ(w["task_trend"][0]["visits"], 2);
  EXPECT_DOUBLE_EQ(w["task_trend"][0]["first_mean"].get<double>(), 1.25);
  EXPECT_DOUBLE_EQ(w["task_trend"][0]["last_mean"].get<double>(), 3.0);
  EXPECT_DOUBLE_EQ(w["task_trend"][0]["ratio"].get<double>(), 2.4);
  EXPECT_NEAR(w["task_trend"][0]["first_correct_pct"].get<double>(), 200.0 / 3, 1e-9);
  EXPECT_DOUBLE_EQ(w["task_trend"][0]["last_correct_pct"].get<double>(), 50.0);
  EXPECT_EQ(w["task_trend"][1]["task"], "002_gelu");
  EXPECT_NEAR(w["task_trend"][1]["ratio"].get<double>(), 1.375 / 1.5, 1e-12);
  EXPECT_NEAR(w["task_trend_geomean"].get<double>(), std::sqrt(2.4 * 1.375 / 1.5), 1e-12);

  // The text tables on stdout, as users paste them. Within task: run geomeans relu 3^(1/3),
  // gelu 2.25^(1/3), softmax 1.5^(1/2) (conv has one ok result); minute 1 holds relu 2.0, softmax
  // 1.0 and gelu 0.75, whose ratios to those have the geometric mean 0.865.
  for (const char* line : {"minute  verified  correct %  fast_1 %   mean  median   best  within task\n",
                           "     0         4       50.0      25.0  1.000   1.000  1.500        0.630  *\n",
                           "     1         5       60.0      20.0  1.250   1.000  2.000        0.865\n",
                           "     2         8       50.0      37.5  1.750   1.750  3.000        1.572\n",
                           "* fewer than 5 verified: not used for the first/final ratio\n",
                           "first window vs final window: mean speedup 1.250x (minute 1) -> 1.750x (minute 2), "
                           "ratio 1.400\n",
                           "level  tasks  verified  correct %  fast_1 %   mean  median   best\n",
                           "    1      2        10       60.0      40.0  1.625   1.750  3.000\n",
                           "    2      1         5       40.0      20.0  1.250   1.250  1.500\n",
                           "    3      1         2       50.0       0.0  0.500   0.500  0.500\n",
                           "per task, first vs last visit: geometric mean of the mean-speedup ratios 1.483 over "
                           "2 task(s)\n",
                           "rejected as cheats: 2"})
    EXPECT_TRUE(contains(r.out, line)) << "missing: " << line << "\nin:\n" << r.out;

  // The page: both tables, the plot, and the cheat reasons escaped.
  const std::string page = kf::test::read_file(out + "/index.html");
  EXPECT_TRUE(contains(page, "src=\"windows.png\"")) << page;
  EXPECT_TRUE(contains(page,
                       "<tr><td>1</td><td>5</td><td>60.0</td><td>20.0</td><td>1.250</td><td>1.000</td>"
                       "<td>2.000</td><td>0.865</td><td></td></tr>"))
      << page;
  EXPECT_TRUE(contains(page,
                       "<tr><td>1</td><td>2</td><td>10</td><td>60.0</td><td>40.0</td><td>1.625</td>"
                       "<td>1.750</td><td>3.000</td></tr>"))
      << page;
  EXPECT_TRUE(contains(page, "<td>001_relu</td><td>4</td><td>" + relu_cheat + "</td>")) << page;
  EXPECT_TRUE(contains(page,
                       "<td>002_gelu</td><td>16</td><td>output &lt;written&gt; before the timer &amp; "
                       "started</td>"))
      << page;
  EXPECT_FALSE(contains(page, "<written>")) << page;

  // A --min-window above every window: listed all the same, no ratio.
  const Result r9 = report({run, "--out", tmp.path + "/min9", "--min-window", "9"}, tmp.path);
  ASSERT_EQ(r9.rc, 0) << r9.err;
  const auto w9 = nlohmann::json::parse(kf::test::read_file(tmp.path + "/min9/windows.json"));
  EXPECT_EQ(w9["windows"].size(), 3u);
  EXPECT_TRUE(w9["first_final_ratio"].is_null()) << w9.dump(1);
  EXPECT_TRUE(contains(r9.out, "first window vs final window: n/a")) << r9.out;
}

// The verdicts by the policy version that sampled them: versions 0..13 in 6 ranges of 3
// (the last one shorter), whatever minute the evaluator scored them in.
TEST(ReportTest, VerdictsAreGroupedByPolicyVersion) {
  kf::test::TempDir tmp("report");
  const std::string run = run_folder(tmp);
  const double t0 = 1796300000.0;
  kf::test::write_file(run + "/metrics/run.jsonl", nlohmann::json({{"step", 1}, {"time", t0}}).dump() + "\n");
  std::string lines;
  for (int v = 0; v <= 13; ++v) {
    // Late versions scored first: the grouping must follow the version, not the time.
    const double t = t0 + 100 - v;
    lines += verdict_line(t, 0, 4 * v, "001_relu", 1, "ok", 0.5 + 0.25 * v, "", v);
    lines += verdict_line(t, 0, 4 * v + 1, "002_gelu", 1, v % 2 ? "ok" : "incorrect", 2.0, "", v);
  }
  kf::test::write_file(run + "/metrics/verdicts-0.jsonl", lines);
  const Result r = report({run}, tmp.path);
  expect_matplotlib(r);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "Per policy version")) << r.out;
  const auto w = nlohmann::json::parse(kf::test::read_file(run + "/report/windows.json"));
  ASSERT_EQ(w["versions"].size(), 5u) << w.dump(1);  // width ceil(14 / 6) = 3: 0-2 ... 12-13
  EXPECT_EQ(w["versions"][0]["first_version"], 0);
  EXPECT_EQ(w["versions"][0]["last_version"], 2);
  EXPECT_EQ(w["versions"][0]["n"], 6);
  EXPECT_EQ(w["versions"][0]["ok"], 4);  // relu 0, 1, 2 and gelu 1
  EXPECT_DOUBLE_EQ(w["versions"][0]["mean_speedup"].get<double>(), (0.5 + 0.75 + 1.0 + 2.0) / 4);
  EXPECT_EQ(w["versions"][4]["first_version"], 12);
  EXPECT_EQ(w["versions"][4]["last_version"], 13);
  EXPECT_EQ(w["versions"][4]["n"], 4);
  EXPECT_DOUBLE_EQ(w["versions"][4]["best_speedup"].get<double>(), 0.5 + 0.25 * 13);
}

// A run whose windows fall only because the task mix changes: minute 0 holds the fast task's
// first group, minute 3 the slow task's last one. Each task got 4x faster, so within the
// task the windows rise: 0.5, 0.5, 2, 2 of the task's geometric mean. Each task rose 4x in
// 2 minutes, so the within-task slope is ln 2 per minute, x2^10 per 10 minutes (a slope
// over minutes not centred per task would say 0.8 ln 2: the slow task is met later). A task
// with one ok result and a failed verdict add nothing to the within-task figures.
TEST(ReportTest, WithinTaskWindowsTakeOutTheTaskMix) {
  kf::test::TempDir tmp("report");
  const std::string run = run_folder(tmp);
  const double t0 = 1796300000.0;
  kf::test::write_file(run + "/metrics/run.jsonl", nlohmann::json({{"step", 1}, {"time", t0}}).dump() + "\n");
  const struct {
    int minute;
    const char* task;
    double speedup;
  } oks[] = {{0, "001_relu", 2.0}, {1, "002_gelu", 0.25}, {2, "001_relu", 8.0}, {3, "002_gelu", 1.0}};
  std::string lines;
  for (const auto& o : oks)  // two results of one group (candidate / 4) per window
    for (int i = 0; i < 2; ++i)
      lines += verdict_line(t0 + 30 + 60 * o.minute, 0, 4 * o.minute + i, o.task, 1, "ok", o.speedup);
  lines += verdict_line(t0 + 31, 0, 100, "003_tanh", 1, "ok", 5.0);
  lines += verdict_line(t0 + 32, 0, 3, "001_relu", 1, "incorrect");
  kf::test::write_file(run + "/metrics/verdicts-0.jsonl", lines);
  const Result r = report({run, "--min-window", "1"}, tmp.path);
  expect_matplotlib(r);
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto w = nlohmann::json::parse(kf::test::read_file(run + "/report/windows.json"));
  // The plain windows fall: (2 + 2 + 5) / 3 -> 1.
  EXPECT_NEAR(w["first_final_ratio"].get<double>(), 1.0 / 3, 1e-12) << w.dump(1);
  ASSERT_EQ(w["windows"].size(), 4u);
  const double expect_window[] = {0.5, 0.5, 2.0, 2.0};
  for (int m = 0; m < 4; ++m)
    EXPECT_NEAR(w["windows"][m]["within_task"].get<double>(), expect_window[m], 1e-12) << "minute " << m;
  const auto& wt = w["within_task"];
  EXPECT_EQ(wt["ok_results"], 8) << wt.dump(1);
  EXPECT_EQ(wt["tasks"], 2);
  EXPECT_EQ(wt["groups"], 5);  // 4 groups of two, and 003_tanh's (counted, but its task drops out)
  EXPECT_NEAR(wt["per_10_min"].get<double>(), 1024.0, 1e-6);
  EXPECT_NEAR(wt["first_final_ratio"].get<double>(), 4.0, 1e-12);
  ASSERT_TRUE(wt["low"].is_number() && wt["high"].is_number()) << wt.dump(1);
  EXPECT_LE(wt["low"].get<double>(), wt["high"].get<double>());
  EXPECT_TRUE(contains(r.out, "trend x1024.000 per 10 minutes")) << r.out;
  EXPECT_TRUE(contains(kf::test::read_file(run + "/report/index.html"), "within task")) << "index.html";
}

// --pool: two runs of one task, each 4x faster after 2 minutes, run B at 10x run A's level
// and a minute later on its own time axis, with the same group ids. Pooled, each run's task
// is its own (levels and times centred per run): x2^10 per 10 minutes, 4 groups. Mixing the
// runs' tasks would pass B's higher, later level off as a steeper rise.
TEST(ReportTest, PoolCombinesTheWithinTaskTrendOfSeveralRuns) {
  kf::test::TempDir tmp("report");
  const std::string run_a = run_folder(tmp);
  const std::string run_b = tmp.path + "/run-b";
  ::mkdir(run_b.c_str(), 0755);
  ::mkdir((run_b + "/metrics").c_str(), 0755);
  const double ta = 1796300000.0, tb = ta + 86400.0;
  auto write_run = [](const std::string& run, double t0, int first_minute, double base) {
    kf::test::write_file(run + "/metrics/run.jsonl", nlohmann::json({{"step", 1}, {"time", t0}}).dump() + "\n");
    std::string lines;
    for (int visit = 0; visit < 2; ++visit)
      for (int i = 0; i < 2; ++i)  // groups 0 and 2 (candidate / 4) in both runs
        lines += verdict_line(t0 + 30 + 60 * (first_minute + 2 * visit), 0, 8 * visit + i, "001_relu", 1, "ok",
                              base * (visit ? 4.0 : 1.0));
    kf::test::write_file(run + "/metrics/verdicts-0.jsonl", lines);
  };
  write_run(run_a, ta, 0, 1.0);
  write_run(run_b, tb, 1, 10.0);
  const Result r = report({run_a, "--min-window", "1", "--pool", run_b}, tmp.path);
  expect_matplotlib(r);
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto w = nlohmann::json::parse(kf::test::read_file(run_a + "/report/windows.json"));
  const auto& p = w["within_task_pooled"];
  ASSERT_TRUE(p.is_object()) << w.dump(1);
  EXPECT_EQ(p["runs"], 2);
  EXPECT_EQ(p["ok_results"], 8);
  EXPECT_EQ(p["tasks"], 2);   // 001_relu of each run
  EXPECT_EQ(p["groups"], 4);  // the same ids in both runs stay apart
  EXPECT_NEAR(p["per_10_min"].get<double>(), 1024.0, 1e-6);
  EXPECT_NEAR(w["within_task"]["per_10_min"].get<double>(), 1024.0, 1e-6);  // run A alone
  EXPECT_TRUE(contains(r.out, "within task, pooled over 2 runs")) << r.out;

  const Result bad = report({run_a, "--pool", tmp.path + "/no-such-run"}, tmp.path);
  EXPECT_EQ(bad.rc, 2);
  EXPECT_TRUE(contains(bad.err, "--pool " + tmp.path + "/no-such-run: not a directory")) << bad.err;
  // A RUN_DIR without verdicts has nothing to pool with: a usage error, not a silent skip.
  const std::string bare = tmp.path + "/bare";
  ::mkdir(bare.c_str(), 0755);
  ::mkdir((bare + "/metrics").c_str(), 0755);
  kf::test::write_file(bare + "/metrics/run.jsonl", nlohmann::json({{"step", 1}, {"time", ta}}).dump() + "\n");
  const Result none = report({bare, "--pool", run_b}, tmp.path);
  EXPECT_EQ(none.rc, 2);
  EXPECT_TRUE(contains(none.err, "--pool: " + bare + " has no usable verdict records")) << none.err;
}

// The actors' group lines (metrics/groups-*.jsonl) joined with the verdicts on the group:
// what prompts without exemplars, with exemplars in full and with a cut exemplar produced.
// A torn line is skipped with a warning naming the file.
TEST(ReportTest, PromptKindsAreJoinedWithTheVerdictsOnTheGroup) {
  kf::test::TempDir tmp("report");
  const std::string run = run_folder(tmp);
  const double t0 = 1796300000.0;
  kf::test::write_file(run + "/metrics/run.jsonl", nlohmann::json({{"step", 1}, {"time", t0}}).dump() + "\n");
  auto group = [&](int id, int shown, int cut, int failures) {
    return nlohmann::json({{"t", t0 + id},
                           {"actor", 0},
                           {"group", id},
                           {"task", "001_relu"},
                           {"policy_version", 1},
                           {"prompt_tokens", 900},
                           {"exemplars_offered", shown},
                           {"exemplars_shown", shown},
                           {"exemplars_cut", cut},
                           {"exemplars_dropped", 0},
                           {"completions", 2},
                           {"extraction_failures", failures},
                           {"extraction_codes", nlohmann::json::object()}})
               .dump() +
           "\n";
  };
  kf::test::write_file(run + "/metrics/groups-0.jsonl",
                       group(0, 0, 0, 0) + group(1, 2, 0, 1) + group(2, 2, 1, 2) + "{\"group\": 3, \"task");
  // group = candidate / 4: candidates 0, 1 -> group 0; 4 -> group 1; nothing of group 2
  // reached an evaluator (both completions had no kernel).
  kf::test::write_file(run + "/metrics/verdicts-0.jsonl",
                       verdict_line(t0 + 10, 0, 0, "001_relu", 1, "ok", 1.0) +
                           verdict_line(t0 + 11, 0, 1, "001_relu", 1, "ok", 2.0) +
                           verdict_line(t0 + 12, 0, 4, "001_relu", 1, "compile_error", 0, "compile error"));
  const Result r = report({run}, tmp.path);
  expect_matplotlib(r);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "groups-0.jsonl: 1 line(s) are not JSON objects with group, task and completions"))
      << r.err;
  const auto w = nlohmann::json::parse(kf::test::read_file(run + "/report/windows.json"));
  const auto& p = w["prompts"];
  ASSERT_EQ(p.size(), 6u) << p.dump(1);  // 3 kinds in all, then the same 3 for the one task
  const struct {
    const char* kind;
    double no_kernel, compile_error, ok;
  } want[] = {{"no exemplars", 0, 0, 100}, {"exemplars in full", 50, 50, 0}, {"an exemplar cut", 100, 0, 0}};
  for (int i = 0; i < 3; ++i) {
    for (int j : {i, i + 3}) {
      EXPECT_EQ(p[j]["kind"], want[i].kind) << j;
      EXPECT_EQ(p[j]["groups"], 1) << j;
      EXPECT_EQ(p[j]["completions"], 2) << j;
      EXPECT_DOUBLE_EQ(p[j]["no_kernel_pct"].get<double>(), want[i].no_kernel) << j;
      EXPECT_DOUBLE_EQ(p[j]["compile_error_pct"].get<double>(), want[i].compile_error) << j;
      EXPECT_DOUBLE_EQ(p[j]["ok_pct"].get<double>(), want[i].ok) << j;
    }
    EXPECT_TRUE(p[i]["task"].is_null());
    EXPECT_EQ(p[i + 3]["task"], "001_relu");
  }
  EXPECT_DOUBLE_EQ(p[0]["mean_ok_speedup"].get<double>(), 1.5);
  EXPECT_TRUE(p[1]["mean_ok_speedup"].is_null());
  EXPECT_TRUE(contains(r.out, "By prompt")) << r.out;
  // Group lines without a turn (a single-turn run): no per-turn tables.
  EXPECT_FALSE(w.contains("turns")) << w.dump(1);
  EXPECT_FALSE(contains(r.out, "Per turn")) << r.out;
  EXPECT_TRUE(contains(kf::test::read_file(run + "/report/index.html"), "By prompt")) << "index.html";
}

// Per turn: groups, members, verdict shares of the members, fast_1 and the ok speedups; per
// member from turn 1 to turn 2 (joined on the turn-1 group and index): what got better.
// Joining B2 on its own index instead (B2's member 0 is B's member 1) would pair ok 2.0 with
// ok 0.5 and ok 1.0 with incorrect: 1 broke, 1 still failing, median ratio 1.125.
TEST(ReportTest, MultiTurnRunsGetPerTurnTables) {
  kf::test::TempDir tmp("report");
  const std::string run = write_turn_run(tmp, "fields", true);
  const Result r = report({run}, tmp.path);
  expect_matplotlib(r);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(contains(r.err, run + "/metrics/groups-0.jsonl: 1 line(s) are not JSON objects with group, task and "
                                    "completions (line 6); skipped them"))
      << r.err;
  const auto w = nlohmann::json::parse(kf::test::read_file(run + "/report/windows.json"));
  ASSERT_TRUE(w.contains("turns")) << w.dump(1);
  const auto& turns = w["turns"]["turns"];
  ASSERT_EQ(turns.size(), 2u) << turns.dump(1);
  const auto& t1 = turns[0];
  EXPECT_EQ(t1["turn"], 1);
  EXPECT_EQ(t1["groups"], 3);
  EXPECT_EQ(t1["members"], 12);
  EXPECT_EQ(t1["verified"], 11);
  EXPECT_EQ(t1["no_kernel"], 1);
  EXPECT_EQ(t1["ok"], 5);
  EXPECT_EQ(t1["incorrect"], 2);
  EXPECT_EQ(t1["compile_error"], 1);
  EXPECT_EQ(t1["runtime_error"], 1);
  EXPECT_EQ(t1["timeout"], 1);
  EXPECT_EQ(t1["rejected_cheat"], 1);
  EXPECT_EQ(t1["unscored"], 0);
  EXPECT_EQ(t1["fast1"], 2);  // 2.0 and 1.2
  EXPECT_NEAR(t1["ok_pct"].get<double>(), 500.0 / 12, 1e-9);
  EXPECT_NEAR(t1["fast1_pct"].get<double>(), 200.0 / 12, 1e-9);
  EXPECT_NEAR(t1["no_kernel_pct"].get<double>(), 100.0 / 12, 1e-9);
  EXPECT_DOUBLE_EQ(t1["mean_speedup"].get<double>(), 1.2);  // 1.0 2.0 1.0 1.2 0.8
  EXPECT_DOUBLE_EQ(t1["median_speedup"].get<double>(), 1.0);
  const auto& t2 = turns[1];
  EXPECT_EQ(t2["turn"], 2);
  EXPECT_EQ(t2["groups"], 2);
  EXPECT_EQ(t2["members"], 7);
  EXPECT_EQ(t2["ok"], 5);
  EXPECT_EQ(t2["incorrect"], 1);
  EXPECT_EQ(t2["compile_error"], 1);
  EXPECT_EQ(t2["fast1"], 3);
  EXPECT_NEAR(t2["ok_pct"].get<double>(), 500.0 / 7, 1e-9);
  EXPECT_DOUBLE_EQ(t2["mean_speedup"].get<double>(), 1.5);  // 2.0 1.5 0.5 0.5 3.0
  EXPECT_DOUBLE_EQ(t2["median_speedup"].get<double>(), 1.5);

  const auto& pairs = w["turns"]["pairs"];
  ASSERT_EQ(pairs.size(), 1u) << pairs.dump(1);
  const auto& p = pairs[0];
  EXPECT_EQ(p["from_turn"], 1);
  EXPECT_EQ(p["to_turn"], 2);
  EXPECT_EQ(p["next_members"], 7);
  EXPECT_EQ(p["pairs"], 7);
  EXPECT_EQ(p["unpaired"], 0);
  EXPECT_EQ(p["fixed"], 3);  // A: incorrect -> ok, no kernel -> ok; B: runtime_error -> ok
  EXPECT_EQ(p["broke"], 0);
  EXPECT_EQ(p["faster"], 1);  // A member 0: 1.0 -> 2.0
  EXPECT_EQ(p["slower"], 1);  // B member 1: 1.0 -> 0.5
  EXPECT_EQ(p["still_failing"], 2);
  EXPECT_EQ(p["both_ok"], 2);
  EXPECT_EQ(p["improved"], 4);
  EXPECT_EQ(p["worse"], 1);
  EXPECT_EQ(p["stayed"], 2);
  EXPECT_DOUBLE_EQ(p["median_ratio"].get<double>(), 1.25);  // 2 and 0.5
  EXPECT_EQ(p["transitions"]["no kernel -> ok"], 1);
  EXPECT_EQ(p["transitions"]["incorrect -> ok"], 1);
  EXPECT_EQ(p["transitions"]["runtime_error -> ok"], 1);
  EXPECT_EQ(p["transitions"]["ok -> ok"], 2);
  EXPECT_EQ(p["transitions"]["incorrect -> incorrect"], 1);
  EXPECT_EQ(p["transitions"]["compile_error -> compile_error"], 1);

  for (const char* line :
       {"turn  groups  members  ok %  fast_1 %  incorrect %  compile error %  no kernel %  runtime error %  timeout %  "
        "cheat %  unscored %   mean  median\n",
        "   1       3       12  41.7      16.7         16.7              8.3          8.3              8.3        8.3  "
        "    8.3         0.0  1.200   1.000\n",
        "   2       2        7  71.4      42.9         14.3             14.3          0.0              0.0        0.0  "
        "    0.0         0.0  1.500   1.500\n",
        "turns  went on  paired  improved  worse  stayed  fixed  broke  faster  slower  still failing  both ok  "
        "median ratio\n",
        " 1->2        7       7         4      1       2      3      0       1       1              2        2         "
        "1.250\n"})
    EXPECT_TRUE(contains(r.out, line)) << "missing: " << line << "\nin:\n" << r.out;
  const std::string page = kf::test::read_file(run + "/report/index.html");
  EXPECT_TRUE(contains(page, "<h2>Per turn</h2>")) << page;
  EXPECT_TRUE(contains(page,
                       "<tr><td>1-&gt;2</td><td>7</td><td>7</td><td>4</td><td>1</td><td>2</td><td>3</td><td>0</td>"
                       "<td>1</td><td>1</td><td>2</td><td>2</td><td>1.250</td></tr>"))
      << page;

  // Verdict lines without turn, parent_group and parent_index: the turns come from the group
  // lines, the members from the candidate ids. A2 kept all of A's members, so its index is
  // A's; B2 did not, so its members cannot be paired (counted, said).
  const std::string bare = write_turn_run(tmp, "bare", false);
  const Result rb = report({bare}, tmp.path);
  ASSERT_EQ(rb.rc, 0) << rb.err;
  const auto wb = nlohmann::json::parse(kf::test::read_file(bare + "/report/windows.json"));
  ASSERT_EQ(wb["turns"]["turns"], w["turns"]["turns"]) << wb["turns"].dump(1);
  const auto& pb = wb["turns"]["pairs"][0];
  EXPECT_EQ(pb["pairs"], 4) << pb.dump(1);
  EXPECT_EQ(pb["unpaired"], 3);
  EXPECT_EQ(pb["fixed"], 2);
  EXPECT_EQ(pb["faster"], 1);
  EXPECT_EQ(pb["slower"], 0);
  EXPECT_EQ(pb["still_failing"], 1);
  EXPECT_DOUBLE_EQ(pb["median_ratio"].get<double>(), 2.0);
  EXPECT_TRUE(contains(rb.out, "1->2: 3 of the 7 turn-2 members could not be paired")) << rb.out;
}

// Compile errors counted by the compiler's first error line, its location dropped, in the
// early and late half of the policy versions; a line without a diagnostic (older verdict
// logs) is not counted.
TEST(ReportTest, CompileErrorsAreCountedByFirstErrorLine) {
  kf::test::TempDir tmp("report");
  const std::string run = run_folder(tmp);
  const double t0 = 1796300000.0;
  const struct {
    int version;
    const char* diagnostic;
  } errs[] = {{1, "a.cu(3): error: identifier \"x\" is undefined"},
              {3, "b.cu(9): error: identifier \"x\" is undefined"},
              {1, "c.cu(1): error: expected a \";\""},
              {2, "c.cu(2): error: expected a \";\""},
              {3, "k.cpp:7:2: error: expected a \";\""}};
  std::string lines;
  int cand = 0;
  for (const auto& e : errs) {
    auto j = nlohmann::json::parse(
        verdict_line(t0 + cand, 0, cand, "001_relu", 1, "compile_error", 0, "compile error", e.version));
    j["diagnostic"] = e.diagnostic;
    lines += j.dump() + "\n";
    ++cand;
  }
  lines += verdict_line(t0 + 10, 0, 10, "001_relu", 1, "compile_error", 0, "compile error", 9);
  kf::test::write_file(run + "/metrics/verdicts-0.jsonl", lines);
  const Result r = report({run}, tmp.path);
  expect_matplotlib(r);
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto w = nlohmann::json::parse(kf::test::read_file(run + "/report/windows.json"));
  const auto& ce = w["compile_errors"];
  ASSERT_EQ(ce.size(), 2u) << ce.dump(1);
  EXPECT_EQ(ce[0]["message"], "error: expected a \";\"");
  EXPECT_EQ(ce[0]["n"], 3);
  EXPECT_EQ(ce[0]["early"], 1);  // versions sorted 1 1 2 3 3: early is below version 2
  EXPECT_EQ(ce[0]["late"], 2);
  EXPECT_EQ(ce[1]["message"], "error: identifier \"x\" is undefined");
  EXPECT_EQ(ce[1]["early"], 1);
  EXPECT_EQ(ce[1]["late"], 1);
  EXPECT_EQ(ce[0]["total"], 5);
  EXPECT_EQ(ce[0]["split_version"], 2);
  EXPECT_TRUE(contains(r.out, "Compile errors by first error line (5 with a diagnostic, 2 kinds")) << r.out;
}

// Where the evaluators' time went, per kind of verdict: "timing unstable" apart from the
// other runtime errors, shares of verify_s from the lines that carry the parts (an old
// line without them counts in n and verify s only).
TEST(ReportTest, VerificationTimeIsSplitByVerdict) {
  kf::test::TempDir tmp("report");
  const std::string run = run_folder(tmp);
  const double t0 = 1796300000.0;
  auto timed = [&](int cand, const std::string& verdict, const std::string& reason, double verify, double claim,
                   double lock, double timing, int trials) {
    auto j = nlohmann::json::parse(
        verdict_line(t0 + cand, 0, cand, "001_relu", 1, verdict, verdict == "ok" ? 1.5 : 0, reason));
    j["verify_s"] = verify;
    j["claim_wait_s"] = claim;
    j["lock_wait_s"] = lock;
    j["timing_s"] = timing;
    j["timed_trials"] = trials;
    return j.dump() + "\n";
  };
  const std::string unstable = "timing unstable: spread (p90-p10)/median of 1.2 exceeds 0.5 after 30 trials";
  kf::test::write_file(run + "/metrics/verdicts-0.jsonl",
                       timed(1, "ok", "", 4.0, 1.0, 0.5, 2.0, 10) + timed(2, "ok", "", 6.0, 0.0, 1.5, 4.0, 14) +
                           timed(3, "runtime_error", unstable, 10.0, 0.0, 5.0, 9.0, 30) +
                           timed(4, "runtime_error", "worker crashed", 1.0, 0.0, 0.0, 0.0, 0) +
                           verdict_line(t0 + 5, 0, 5, "001_relu", 1, "ok", 2.0));  // verify_s 0.5, no parts
  const Result r = report({run}, tmp.path);
  expect_matplotlib(r);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "Verification time by verdict")) << r.out;
  const auto w = nlohmann::json::parse(kf::test::read_file(run + "/report/windows.json"));
  const auto& ts = w["time_split"];
  ASSERT_EQ(ts.size(), 3u) << ts.dump(1);
  // Most verification time first: ok 10.5 s, timing unstable 10 s, runtime_error 1 s.
  EXPECT_EQ(ts[0]["kind"], "ok");
  EXPECT_EQ(ts[0]["n"], 3);
  EXPECT_DOUBLE_EQ(ts[0]["verify_s"].get<double>(), 10.5);
  EXPECT_DOUBLE_EQ(ts[0]["median_verify_s"].get<double>(), 4.0);
  EXPECT_DOUBLE_EQ(ts[0]["claim_wait_s_pct"].get<double>(), 10.0);  // 1 of the 10 s that carry parts
  EXPECT_DOUBLE_EQ(ts[0]["lock_wait_s_pct"].get<double>(), 20.0);
  EXPECT_DOUBLE_EQ(ts[0]["timing_s_pct"].get<double>(), 60.0);
  EXPECT_DOUBLE_EQ(ts[0]["median_timed_trials"].get<double>(), 12.0);
  EXPECT_EQ(ts[1]["kind"], "timing unstable");
  EXPECT_DOUBLE_EQ(ts[1]["timing_s_pct"].get<double>(), 90.0);
  EXPECT_EQ(ts[2]["kind"], "runtime_error");
  EXPECT_TRUE(ts[2]["median_timed_trials"].is_null()) << ts.dump(1);
}

TEST(ReportTest, CorruptInputsAreSkippedWithWarnings) {
  kf::test::TempDir tmp("report");
  const std::string run = tmp.path + "/run";
  ::mkdir(run.c_str(), 0755);
  {
    kf::MetricsWriter learner(run + "/metrics", "learner");
    for (int s = 1; s <= 3; ++s) learner.write(s, {{"loss", 1.0 / s}});
  }
  // A torn last line (a process killed mid-write), a metrics file that is all garbage,
  // and a kernel database that is not JSON.
  kf::test::write_file(run + "/metrics/learner.jsonl", kf::test::read_file(run + "/metrics/learner.jsonl") + "{\"ste");
  kf::test::write_file(run + "/metrics/run.jsonl", "not json\n[1,2]\n");
  ::mkdir((run + "/kernels").c_str(), 0755);
  kf::test::write_file(run + "/kernels/kernel_db.json", "{\"format\": \"kf-kernel-db\", \"entries\": [");
  const std::string out = tmp.path + "/elsewhere";
  const Result r = report({run, "--out", out}, tmp.path);
  expect_matplotlib(r);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_FALSE(contains(r.err, "Traceback")) << r.err;
  EXPECT_TRUE(contains(r.err, run + "/metrics/learner.jsonl: 1 line(s) are not JSON objects (line 4)")) << r.err;
  EXPECT_TRUE(contains(r.err, run + "/metrics/run.jsonl: 2 line(s) are not JSON objects")) << r.err;
  EXPECT_TRUE(contains(r.err, run + "/kernels/kernel_db.json: not readable JSON")) << r.err;
  for (const char* png : kPlots) expect_png(out + "/" + png);
  const std::string page = kf::test::read_file(out + "/index.html");
  EXPECT_TRUE(contains(page, "No kernel database")) << page;
  struct stat st;
  EXPECT_NE(::stat((run + "/report").c_str(), &st), 0);  // --out was honoured
}

TEST(ReportTest, NoMetricsIsAUsageError) {
  kf::test::TempDir tmp("report");
  const std::string run = run_folder(tmp);
  kf::test::write_file(run + "/metrics/run.jsonl", "");  // present but empty
  Result r = report({run}, tmp.path);
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_TRUE(contains(r.err, run + ": no metrics at all")) << r.err;
  EXPECT_FALSE(contains(r.err, "Traceback")) << r.err;
  EXPECT_EQ(r.out, "");
  struct stat st;
  EXPECT_NE(::stat((run + "/report").c_str(), &st), 0);  // nothing written

  r = report({tmp.path + "/missing"}, tmp.path);
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_TRUE(contains(r.err, tmp.path + "/missing: not a directory")) << r.err;
  r = report({}, tmp.path);
  EXPECT_EQ(r.rc, 2) << r.err;
}

TEST(ReportTest, LearnerRunWritesStepMetrics) {
#ifndef KF_LEARNER_BIN_DEFAULT
  GTEST_SKIP() << "kf-learner is not part of this build (learner in KF_SKIP_COMPONENTS)";
#else
  // kf-learner on the synthetic stream with --run-dir: rank 0 writes metrics/learner.jsonl
  // and an event file, one line per trained step, and --print-steps still prints.
  kf::test::TempDir tmp("report");
  const std::string run = tmp.path + "/run", cfg = tmp.path + "/learner.yaml";
  kf::test::write_file(
      cfg, "run:\n  name: rep\n  root: " + tmp.path +
               "\n  seed: 5\nlearner:\n  groups_per_step: 4\n  micro_batch_tokens: 96\n"
               "  schedule:\n    warmup_steps: 0\n  snapshot:\n    every: 0\n  checkpoint:\n    every: 0\n");
  const std::string cmd = std::string("'") + KF_LEARNER_BIN_DEFAULT + "' '" + cfg +
                          "' --synthetic --print-steps --device cpu --steps 3 --run-dir '" + run + "' 2>'" + tmp.path +
                          "/learner.log'";
  std::string out;
  std::FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = ::pclose(p);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out << kf::test::read_file(tmp.path + "/learner.log");
  EXPECT_TRUE(contains(out, "STEP {")) << out;

  std::vector<nlohmann::json> lines;
  {
    std::istringstream in(kf::test::read_file(run + "/metrics/learner.jsonl"));
    for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  }
  ASSERT_EQ(lines.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const auto& l = lines[i];
    EXPECT_EQ(l["step"], i + 1) << l;
    EXPECT_EQ(l["updated"], 1) << l;
    for (const char* key : {"time", "loss", "grad_norm", "lr", "groups", "tokens", "seconds", "clip_fraction",
                            "publish_stall_ms", "kl_behaviour", "entropy", "response_length_mean",
                            "response_length_max", "kl_start", "groups_in", "skipped_equal", "probe_groups"})
      EXPECT_TRUE(l.contains(key) && l[key].is_number()) << key << " in " << l;
    EXPECT_GT(l["tokens"].get<int64_t>(), 0) << l;
    EXPECT_GT(l["grad_norm"].get<double>(), 0.0) << l;
    EXPECT_GE(l["groups_in"].get<int64_t>(), l["groups"].get<int64_t>()) << l;
    EXPECT_EQ(l["probe_groups"], 0) << l;  // the synthetic stream has no probe
  }
  // KL to the start policy (the tiny model is under learner.kl_start_max_params): none
  // before the first update, some once the weights moved (little at this learning rate).
  EXPECT_EQ(lines[0]["kl_start"].get<double>(), 0.0) << lines[0];
  EXPECT_GT(lines[2]["kl_start"].get<double>(), 0.0) << lines[2];
  bool events = false;
  for (const auto& e : std::filesystem::directory_iterator(run + "/metrics"))
    events |= e.path().filename().string().rfind("events.out.tfevents.", 0) == 0 &&
              e.path().filename().string().size() > 8 &&
              e.path().filename().string().substr(e.path().filename().string().size() - 8) == ".learner";
  EXPECT_TRUE(events) << "no learner event file in " << run << "/metrics";

  // The report reads it (no run.jsonl or kernel database: warned, not fatal).
  const Result r = report({run}, tmp.path);
  expect_matplotlib(r);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(contains(r.err, run + "/metrics/run.jsonl: not found")) << r.err;
  expect_png(run + "/report/reward.png");
  expect_png(run + "/report/learner.png");  // the per-step health plot from the real learner's lines
  EXPECT_TRUE(contains(kf::test::read_file(run + "/report/index.html"), "Latest learner step</h2><p>step 3,"));
#endif
}

// The learning curve: actor 0's probe lines (metrics/probe.jsonl, as MetricsWriter writes them)
// next to the learner's lines. learning.png is drawn; index.html and stdout get one row per
// probed version with the learner's figures of the last step at or before it; a version
// probed twice keeps its last line. A run without probe lines says so on the page.
TEST(ReportTest, LearningCurveFromProbeAndLearnerLines) {
  kf::test::TempDir tmp("report");
  const std::string run = tmp.path + "/run";
  ::mkdir(run.c_str(), 0755);
  {
    kf::MetricsWriter learner(run + "/metrics", "learner");
    for (int s = 1; s <= 12; ++s)
      learner.write(s, {{"updated", 1},
                        {"loss", 0.5},
                        {"groups", 3},
                        {"groups_in", s == 10 ? 5 : 4},
                        {"skipped_equal", 1},
                        {"probe_groups", s == 10 ? 1 : 0},
                        {"kl_start", 0.001 * s},
                        {"entropy", 2.0 - 0.05 * s},
                        {"clip_fraction", 0.01 * s},
                        {"response_length_mean", 100.0 + s},
                        {"response_length_max", 300}});
    kf::MetricsWriter probe(run + "/metrics", "probe");
    auto line = [&](int v, double reward, double pass) {
      probe.write(
          v,
          {{"policy_version", v},
           {"reward_mean", reward},
           {"pass_rate", pass},
           {"samples", 16},
           {"scored", 16},
           {"ok", pass * 16},
           {"lost_groups", 0}},
          nlohmann::json{{"tasks",
                          {{"001_relu", {{"samples", 8}, {"scored", 8}, {"ok", 2}, {"reward_mean", reward - 0.5}}},
                           {"002_gelu", {{"samples", 8}, {"scored", 8}, {"ok", 2}, {"reward_mean", reward + 0.5}}}}}});
    };
    line(0, -2.0, 0.25);
    line(10, -1.5, 0.375);  // superseded: actor 0 probed v10 twice
    line(10, -1.25, 0.5);
  }
  const Result r = report({run}, tmp.path);
  expect_matplotlib(r);
  ASSERT_EQ(r.rc, 0) << r.err;
  expect_png(run + "/report/learning.png");
  EXPECT_TRUE(contains(r.out, run + "/report/learning.png")) << r.out;
  // v0: before any learner step; v10: the learner's step-10 line (skipped equal 1 of 5 - 1).
  EXPECT_TRUE(contains(r.out, "Learning curve (metrics/probe.jsonl)")) << r.out;
  const std::string page = kf::test::read_file(run + "/report/index.html");
  EXPECT_TRUE(contains(page,
                       "<tr><td>0</td><td>16</td><td>16</td><td>-2.000</td><td>25.0</td><td>0</td>"
                       "<td>–</td><td>–</td><td>–</td><td>–</td><td>–</td></tr>"))
      << page;
  EXPECT_TRUE(contains(page,
                       "<tr><td>10</td><td>16</td><td>16</td><td>-1.250</td><td>50.0</td><td>0</td>"
                       "<td>0.01</td><td>1.5</td><td>0.1</td><td>110</td><td>25.0</td></tr>"))
      << page;
  EXPECT_FALSE(contains(page, "-1.500")) << "the superseded line of v10 is shown";
  EXPECT_TRUE(contains(r.out, "10       16      16       -1.250    50.0")) << r.out;

  // Without probe lines: the plot is still drawn, the page says why there is no table.
  ::unlink((run + "/metrics/probe.jsonl").c_str());
  const Result bare = report({run}, tmp.path);
  ASSERT_EQ(bare.rc, 0) << bare.err;
  expect_png(run + "/report/learning.png");
  EXPECT_TRUE(contains(kf::test::read_file(run + "/report/index.html"), "No learning-curve probe in this run"));
  EXPECT_FALSE(contains(bare.out, "Learning curve (metrics/probe.jsonl)")) << bare.out;
}
