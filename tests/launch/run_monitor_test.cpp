// The launcher's status view: the ETA against the step budget and the time cap, and the
// verdict mix read from the replay's result notes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <map>

#include "kf/replay/replay.h"
#include "run_monitor.h"

using kf::launch::RunMonitor;
using kf::launch::Status;

namespace {
Status at(int64_t step, int64_t budget, double time_budget_s) {
  Status s;
  s.step = step;
  s.step_budget = budget;
  s.time_budget_s = time_budget_s;
  return s;
}
}  // namespace

TEST(RunMonitorEtaTest, StepBudgetAtThePaceSinceTheFirstStepSeen) {
  RunMonitor m(100);
  auto s = at(0, 20, 0);
  m.fill_eta(30, s);  // start-up: no step yet, no pace
  EXPECT_LT(s.eta_s, 0);
  EXPECT_EQ(kf::launch::eta_text(s), "ETA n/a");
  s = at(1, 20, 0);
  m.fill_eta(100, s);  // the first step: the pace starts here, not at 0 s
  EXPECT_LT(s.eta_s, 0);
  s = at(5, 20, 0);
  m.fill_eta(140, s);  // 4 steps in 40 s: 10 s a step, 15 left
  EXPECT_NEAR(s.eta_s, 150.0, 1e-9);
  EXPECT_EQ(s.eta_reason, "step budget");
  EXPECT_EQ(kf::launch::eta_text(s), "ETA 2m30s (step budget)");
}

TEST(RunMonitorEtaTest, TheTimeCapWinsWhenItComesFirst) {
  RunMonitor m(100);
  auto s = at(1, 1000, 600);
  m.fill_eta(100, s);
  EXPECT_NEAR(s.eta_s, 500.0, 1e-9);  // no pace yet: the cap alone
  EXPECT_EQ(s.eta_reason, "time cap");
  s = at(3, 1000, 600);
  m.fill_eta(120, s);  // 10 s a step, 997 left: far beyond the cap
  EXPECT_NEAR(s.eta_s, 480.0, 1e-9);
  EXPECT_EQ(s.eta_reason, "time cap");
  s = at(3, 1000, 600);
  m.fill_eta(700, s);  // past the cap (draining): never negative
  EXPECT_EQ(s.eta_s, 0.0);
}

TEST(RunMonitorEtaTest, StatusViewsShowTheEta) {
  RunMonitor m(100);
  auto s = at(0, 0, 3900);
  m.sample_rates(0, s);
  EXPECT_NE(kf::launch::render_status(s).find("ETA 1h05m (time cap)"), std::string::npos)
      << kf::launch::render_status(s);
  EXPECT_NE(kf::launch::render_status_line(s).find("ETA 1h05m (time cap)"), std::string::npos);
  bool has = false;
  for (const auto& [k, v] : kf::launch::status_scalars(s)) has |= (k == "eta_s" && v == 3900.0);
  EXPECT_TRUE(has);
  EXPECT_EQ(kf::launch::format_duration(12.4), "12s");
  EXPECT_EQ(kf::launch::format_duration(247), "4m07s");
}

// The evaluators write their results into the replay; the status reads each once from the
// replay's result notes. Actor-scored extraction failures are the actors' count, not here.
TEST(RunMonitorResultsTest, VerdictMixComesFromTheReplaysResultNotesEachOnce) {
  namespace rp = kf::replay;
  const std::string name = "kft" + std::to_string(getpid()) + ".monitor";
  rp::ReplayBuffer rb = rp::ReplayBuffer::create(name, rp::ReplayConfig{4, 64 * 1024, 512});
  std::vector<rp::Candidate> g(3);
  for (uint32_t i = 0; i < 3; ++i) {
    g[i].id = 50 + i;
    g[i].task = "t";
    g[i].group_id = 9;
    g[i].index_in_group = i;
  }
  ASSERT_TRUE(rb.open_group(g, std::chrono::seconds(60)));
  auto result = [&](uint32_t i, rp::Verdict v, double speedup, int32_t evaluator) {
    rp::Result r;
    r.candidate_id = g[i].id;
    r.group_id = 9;
    r.index_in_group = i;
    r.verdict = v;
    r.speedup = speedup;
    r.reward = v == rp::Verdict::ok ? 1.0 : -1.0;
    r.evaluator_id = evaluator;
    return r;
  };
  ASSERT_TRUE(rb.add_result(result(0, rp::Verdict::ok, 2.0, 0)));
  ASSERT_TRUE(rb.add_result(result(1, rp::Verdict::incorrect, 0, 1)));
  ASSERT_TRUE(rb.add_result(result(2, rp::Verdict::compile_error, 0, -1)));  // the actor's
  RunMonitor m(100);
  EXPECT_EQ(m.read_results(rb), 0u);
  EXPECT_EQ(m.read_results(rb), 0u);  // nothing new: nothing counted twice
  const auto s = m.results();
  EXPECT_EQ(s.total, 2u);
  EXPECT_EQ(s.window_n, 2u);
  EXPECT_DOUBLE_EQ(s.frac("ok"), 0.5);
  EXPECT_DOUBLE_EQ(s.frac("incorrect"), 0.5);
  EXPECT_DOUBLE_EQ(s.frac("compile_error"), 0.0);
  EXPECT_DOUBLE_EQ(s.best_speedup_ever, 2.0);
  EXPECT_DOUBLE_EQ(s.mean_reward, 0.0);
  rp::ShmSegment::remove(name);
}

// On a head, the seconds evaluator and actor nodes report join the time split: the newest
// report of each node session counts once (a late, smaller one takes nothing back), sessions
// add up, and a resumed launcher keeps them (its launch state) without counting any twice.
// The candidates of actor nodes carry their policy lag into the status's lag and their
// extraction failures into its count; samples and verified are the server's counts.
TEST(RunMonitorNodeSecondsTest, NodeReportsJoinTheTimeSplitOnceAndSurviveAResume) {
  using kf::launch::NodeSeconds;
  RunMonitor m(100);
  Status s;
  m.sample_rates(0, s);
  EXPECT_EQ(s.compile_s, 0.0);
  m.merge_node_seconds({{"n1/10/1", NodeSeconds{0, 2.0, 3.0, 0, 4}}, {"a1/11/1", NodeSeconds{5.0, 0, 0, 0.5, 0}}});
  m.merge_node_seconds({{"n1/10/1", NodeSeconds{0, 1.0, 1.0, 0, 2}}});  // an older report, delivered late
  m.merge_node_seconds({{"n1/10/1", NodeSeconds{0, 2.5, 3.5, 0, 5}}});  // the newest
  // The actor node handed over 4 candidates, lag 6 in all, and scored 1 extraction failure.
  m.merge_node_seconds({{"a1/11/1", NodeSeconds{5.0, 0, 0, 0.5, 0, 4, 1, 6}}});
  m.set_network_counts(5, 3);  // the server: 5 candidates published, 3 results back
  m.sample_rates(1, s);
  EXPECT_DOUBLE_EQ(s.compile_s, 2.5);
  EXPECT_DOUBLE_EQ(s.verify_s, 3.5);
  EXPECT_DOUBLE_EQ(s.generate_s, 5.0);
  EXPECT_DOUBLE_EQ(s.gpu_wait_s, 0.5);
  EXPECT_DOUBLE_EQ(s.policy_lag, 1.5);
  EXPECT_EQ(s.samples, 5u);
  EXPECT_EQ(s.verified, 3u);
  EXPECT_EQ(s.extraction_failures, 1u);
  EXPECT_NE(kf::launch::render_status(s).find("time: generate 5 s  compile 2 s  verify 4 s"), std::string::npos)
      << kf::launch::render_status(s);
  bool has = false;
  for (const auto& [k, v] : kf::launch::status_scalars(s)) has |= (k == "verify_s" && v == 3.5);
  EXPECT_TRUE(has);
  // A resumed launcher: the saved totals, then the same sessions report again (a node that
  // kept running) and a new session of a restarted node adds its own.
  RunMonitor r(100);
  r.from_json(nlohmann::json::parse(m.to_json().dump()));
  r.merge_node_seconds({{"n1/10/1", NodeSeconds{0, 2.5, 3.5, 0, 5}}, {"n1/20/9", NodeSeconds{0, 1.0, 0.5, 0, 1}}});
  Status t;
  r.sample_rates(0, t);
  EXPECT_DOUBLE_EQ(t.compile_s, 3.5);
  EXPECT_DOUBLE_EQ(t.verify_s, 4.0);
  EXPECT_DOUBLE_EQ(t.generate_s, 5.0);
  EXPECT_EQ(r.node_seconds().verdicts, 6u);
  // The resumed head's server counts from zero: the earlier session's counts are its base.
  r.set_network_counts(2, 1);
  r.sample_rates(1, t);
  EXPECT_EQ(t.samples, 7u);
  EXPECT_EQ(t.verified, 4u);
}

// Actor 0's learning-curve probe reaches the status through the control block's rendezvous
// key "probe" (docs/metrics.md, "Learning curve"): both views and run.jsonl show the last one.
TEST(RunMonitorProbeTest, StatusViewsShowTheLastProbe) {
  namespace rp = kf::replay;
  const std::string name = "kfmonprobe" + std::to_string(::getpid());
  auto ctl = rp::ControlBlock::create(name);
  RunMonitor m(100);
  auto s = at(12, 0, 0);
  m.sample_rates(0, s);
  // No probe yet: nothing in the line, "none yet" in the full view, no scalars.
  EXPECT_FALSE(ctl.rendezvous_get("probe", std::chrono::nanoseconds(0)).has_value());
  EXPECT_EQ(kf::launch::render_status_line(s).find("probe"), std::string::npos);
  EXPECT_NE(kf::launch::render_status(s).find("probe: none yet"), std::string::npos) << kf::launch::render_status(s);
  for (const auto& [k, v] : kf::launch::status_scalars(s)) EXPECT_NE(k.rfind("probe_", 0), 0u) << k;

  // The brief as the actor writes it, twice: the newer one wins.
  const std::string older = R"({"version":0,"reward":-2.5,"pass":0.125,"scored":16,"samples":16})";
  const std::string newer = R"({"version":10,"reward":-0.53125,"pass":0.4375,"scored":32,"samples":32})";
  ctl.rendezvous_put("probe", older.data(), older.size());
  ctl.rendezvous_put("probe", newer.data(), newer.size());
  const auto brief = ctl.rendezvous_get("probe", std::chrono::nanoseconds(0));
  ASSERT_TRUE(brief.has_value());
  kf::launch::apply_probe_brief(*brief, s);
  EXPECT_EQ(s.probe_version, 10);
  EXPECT_DOUBLE_EQ(s.probe_reward, -0.53125);
  EXPECT_DOUBLE_EQ(s.probe_pass, 0.4375);
  EXPECT_EQ(s.probe_scored, 32u);
  const std::string line = kf::launch::render_status_line(s);
  EXPECT_NE(line.find("probe v10: reward -0.53, pass 44% (32 scored)"), std::string::npos) << line;
  EXPECT_NE(kf::launch::render_status(s).find("probe v10: reward -0.53, pass 44% (32 scored)"), std::string::npos);
  std::map<std::string, double> sc;
  for (const auto& [k, v] : kf::launch::status_scalars(s)) sc[k] = v;
  EXPECT_EQ(sc.at("probe_version"), 10.0);
  EXPECT_EQ(sc.at("probe_reward"), -0.53125);
  EXPECT_EQ(sc.at("probe_pass_rate"), 0.4375);

  // A brief that does not parse, or lacks the version, changes nothing.
  kf::launch::apply_probe_brief("{\"version\": 1", s);
  kf::launch::apply_probe_brief(R"({"reward": 5})", s);
  EXPECT_EQ(s.probe_version, 10);
  EXPECT_DOUBLE_EQ(s.probe_reward, -0.53125);
  rp::ShmSegment::remove(name);
}
