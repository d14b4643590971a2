// Timing statistics of the evaluator: robust summaries of repeated trials.
// Pure functions; any thread.
#pragma once
#include <vector>

namespace kf::evaluator {

struct TimeSummary {
  int n = 0;
  double median = 0, p10 = 0, p90 = 0, min = 0, max = 0, mean = 0;
  // (p90 - p10) / median: the relative spread the give-up rule looks at.
  double spread() const { return median > 0 ? (p90 - p10) / median : 0; }
};

// Linear-interpolated quantile q in [0,1] of unsorted values (empty: 0).
double quantile(std::vector<double> v, double q);
TimeSummary summarize(const std::vector<double>& v);

// Speedup from paired trials: median over i of ref[i] / cand[i] would be noisy, so it
// is the ratio of medians (what is reported), see docs/evaluator.md.
double speedup_of(const TimeSummary& ref, const TimeSummary& cand);

// A distribution-free confidence interval for the speedup from paired trials: the
// per-trial ratios ref[i] / cand[i] (each pair ran side by side), and the order
// statistics that bracket their median with at least `confidence` (binomial, no
// normality assumed). mid is the ratio of medians (speedup_of). With too few pairs for
// the confidence asked, lo and hi are the smallest and largest ratio.
struct SpeedupInterval {
  double lo = 0, mid = 0, hi = 0;
};
SpeedupInterval paired_speedup_interval(const std::vector<double>& ref_ms, const std::vector<double>& cand_ms,
                                        double confidence = 0.95);

}  // namespace kf::evaluator
