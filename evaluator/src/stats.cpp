// Timing statistics of the verifier (stats.h; TimeSummary and summarize are public).
#include "stats.h"

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

SpeedupInterval paired_speedup_interval(const std::vector<double>& ref_ms, const std::vector<double>& cand_ms,
                                        double confidence) {
  SpeedupInterval out;
  out.mid = speedup_of(summarize(ref_ms), summarize(cand_ms));
  std::vector<double> r;
  for (std::size_t i = 0; i < std::min(ref_ms.size(), cand_ms.size()); ++i)
    if (cand_ms[i] > 0) r.push_back(ref_ms[i] / cand_ms[i]);
  if (r.empty()) return out;
  std::sort(r.begin(), r.end());
  const int n = int(r.size());
  // The largest k with P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2: then
  // [r_(k), r_(n-k+1)] (1-based) covers the median of the ratios with >= confidence.
  const double alpha = (1 - std::clamp(confidence, 0.0, 0.999999)) / 2;
  double cdf = 0, pk = std::pow(0.5, n);  // P(X = 0)
  int k = 0;
  for (int j = 0; j < n; ++j) {
    if (cdf + pk > alpha) break;
    cdf += pk;
    k = j + 1;  // P(X < k) = cdf <= alpha
    pk = pk * double(n - j) / double(j + 1);
  }
  const int lo = std::max(k, 1), hi = std::min(n - k + 1, n);
  out.lo = r[std::size_t(lo - 1)];
  out.hi = r[std::size_t(hi - 1)];
  return out;
}

}  // namespace kf::evaluator
