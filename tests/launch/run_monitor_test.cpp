// The launcher's status view: the ETA against the step budget and the time cap.
#include <gtest/gtest.h>

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
  EXPECT_NE(kf::launch::render_status(s).find("ETA 1h05m (time cap)"), std::string::npos) << kf::launch::render_status(s);
  EXPECT_NE(kf::launch::render_status_line(s).find("ETA 1h05m (time cap)"), std::string::npos);
  bool has = false;
  for (const auto& [k, v] : kf::launch::status_scalars(s)) has |= (k == "eta_s" && v == 3900.0);
  EXPECT_TRUE(has);
  EXPECT_EQ(kf::launch::format_duration(12.4), "12s");
  EXPECT_EQ(kf::launch::format_duration(247), "4m07s");
}
