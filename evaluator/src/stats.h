// Timing statistics of the verifier (stats.cpp): quantiles, the speedup of paired trials and
// its distribution-free interval. The summary type itself (TimeSummary, summarize) is public:
// a Result carries it. Pure functions; any thread. Torch-free.
#pragma once
#include <vector>

#include "kf/evaluator/evaluator.h"

namespace kf::evaluator {

// Linear-interpolated quantile q in [0,1] of unsorted values (empty: 0).
double quantile(std::vector<double> v, double q);

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
