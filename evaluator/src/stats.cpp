#include "kf/evaluator/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace kf::evaluator {

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = std::clamp(q, 0.0, 1.0) * double(v.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(pos));
  const auto hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - double(lo));
}

TimeSummary summarize(const std::vector<double>& v) {
  TimeSummary s;
  s.n = int(v.size());
  if (v.empty()) return s;
  s.median = quantile(v, 0.5);
  s.p10 = quantile(v, 0.1);
  s.p90 = quantile(v, 0.9);
  s.min = *std::min_element(v.begin(), v.end());
  s.max = *std::max_element(v.begin(), v.end());
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
  return s;
}

double speedup_of(const TimeSummary& ref, const TimeSummary& cand) {
  return cand.median > 0 ? ref.median / cand.median : 0;
}

}  // namespace kf::evaluator
