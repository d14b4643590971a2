// The check plan of one verification (verify.cpp, Session::run): where each call that is
// not a timed trial goes, before, among or after the timed trials, drawn from the
// evaluation's secret seed. Header-only, so that CheckPlanTest draws plans without a
// sandbox. Not thread-safe state: plain functions of their arguments.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace kf::evaluator {

// Kinds of calls besides the timed trials (docs/evaluator.md, "The protocol").
enum class Step {
  Dist,          // a distribution set (arg: its index; set 0 always comes first, outside the plan)
  Repeat,        // set 0 again with the other poison pattern
  NearDup,       // the previous call's inputs with a few elements in a few rows changed
  Params,        // every float parameter re-drawn
  ParamsPart,    // a few elements of each float parameter re-drawn
  ParamOne,      // one float parameter re-drawn whole, the others unchanged
  ParamLargest,  // a few elements of only the largest float parameter re-drawn
  Global,        // global stress (arg: the transform)
  LocalRow,      // three large values of different magnitudes per row
  LocalScatter,  // 8 large values of halving magnitudes scattered (arg: the input, -1 drawn)
  Edge           // numeric edges (exp overflow and underflow, square overflow and underflow)
};
struct Item {
  Step step;
  int arg = 0;
};
struct Plan {
  std::vector<Item> before, after;
  std::vector<std::vector<Item>> among;  // among[k]: before timed trial k
  int count() const {
    std::size_t n = before.size() + after.size();
    for (const auto& a : among) n += a.size();
    return int(n);
  }
};
inline bool is_stress(Step s) {
  return s == Step::Global || s == Step::LocalRow || s == Step::LocalScatter || s == Step::Edge;
}
inline bool is_param(Step s) {
  return s == Step::Params || s == Step::ParamsPart || s == Step::ParamOne || s == Step::ParamLargest;
}

// What the plan holds (EvalOptions and the task).
struct PlanSpec {
  int correctness_sets = 3, stress_sets = 2, warmup = 2, trials = 10;
  bool local_stress = true, near_duplicate = true, redraw_params = true;
  int float_params = 0;             // float parameter tensors of the task
  std::vector<int> scatter_inputs;  // a scattered set per input named here (empty: one, input drawn)
};

// The call index of the repeat of set 0 under plan `pl` (set 0 is call 0), without extra
// trials or skipped checks; -1 when the plan has none.
inline int repeat_call(const Plan& pl, int warmup) {
  int n = 1;
  for (const auto& it : pl.before) {
    if (it.step == Step::Repeat) return n;
    ++n;
  }
  n += warmup;
  for (const auto& a : pl.among) {
    for (const auto& it : a) {
      if (it.step == Step::Repeat) return n;
      ++n;
    }
    ++n;  // the timed trial
  }
  for (const auto& it : pl.after) {
    if (it.step == Step::Repeat) return n;
    ++n;
  }
  return -1;
}

// Gaps: before the timed trials, before each timed trial k (among[k]) and after them.
// Stress sets: one before the timed trials (a later failure can then be shown to be a
// switch of behaviour: that set is asked again), one after them (a kernel that switches to
// a shortcut after N calls meets it), both drawn from the kinds that put values far outside
// the task's range (local, numeric edges, x*8), the others among them, one in each of as many equal
// strata of the trials (no run of timed trials longer than a stratum is free of stress).
// A parameter set after the timed trials. Everything else (the other distribution sets,
// the repeat, the other parameter sets, the near-duplicate) lands in any gap, uniformly.
// Which stress or parameter set fills which place is drawn too, so every kind of check
// can land at every position. The near-duplicate follows its base call directly: a
// distribution set or the repeat (it moves with it), or a warm-up or timed trial (it opens
// the next gap). The repeat lands on an odd call (the other poison than set 0's) when one
// of 64 draws allows it.
inline Plan draw_plan(const PlanSpec& sp, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto pick = [&](std::size_t n) { return std::size_t(rng() % std::max<std::size_t>(n, 1)); };
  const int T = std::max(0, sp.trials), K = std::max(2, sp.correctness_sets);
  std::vector<Item> stressy, par;
  std::vector<int> others = {1, 2, 3, 4};
  std::shuffle(others.begin(), others.end(), rng);
  for (int s = 0; s < std::min(sp.stress_sets, 5); ++s)
    stressy.push_back({Step::Global, s == 0 ? 0 : others[std::size_t(s - 1)]});
  if (sp.local_stress) {
    stressy.push_back({Step::LocalRow, -1});
    if (sp.scatter_inputs.empty()) stressy.push_back({Step::LocalScatter, -1});
    for (int i : sp.scatter_inputs) stressy.push_back({Step::LocalScatter, i});
    stressy.push_back({Step::Edge, 0});
    stressy.push_back({Step::Edge, 1});
  }
  if (sp.redraw_params && sp.float_params > 0) {
    par = {{Step::Params}, {Step::ParamsPart}};
    if (sp.float_params > 1) par.insert(par.end(), {{Step::ParamOne}, {Step::ParamLargest}});
  }
  const std::size_t gaps_n = std::size_t(T) + 2;
  // The stress sets before and after the timed trials put values far outside the task's
  // range (every kind but the drawn global transforms, which may stay inside it).
  auto strong = [](const Item& it) { return it.step != Step::Global || it.arg == 0; };
  Plan pl;
  for (int attempt = 0; attempt < 64; ++attempt) {
    pl = Plan{};
    pl.among.resize(std::size_t(T));
    std::vector<Item> s = stressy, p = par;
    std::shuffle(s.begin(), s.end(), rng);
    std::shuffle(p.begin(), p.end(), rng);
    // gaps[0]: before; gaps[1 + k]: among[k]; gaps[T + 1]: after. Units move as a whole.
    std::vector<std::vector<std::vector<Item>>> gaps(gaps_n);
    auto put = [&](std::size_t g, std::vector<Item> u) { gaps[g].push_back(std::move(u)); };
    for (const std::size_t g : {std::size_t(0), gaps_n - 1}) {
      const auto it = std::find_if(s.begin(), s.end(), strong);
      if (it == s.end()) continue;
      put(g, {*it});
      s.erase(it);
    }
    if (!p.empty()) {
      put(gaps_n - 1, {p.back()});
      p.pop_back();
    }
    const std::size_t strata = s.size();
    for (std::size_t j = 0; j < strata; ++j) {
      if (T == 0) {
        put(pick(gaps_n), {s[j]});
        continue;
      }
      const std::size_t lo = j * std::size_t(T) / strata, hi = std::max(lo + 1, (j + 1) * std::size_t(T) / strata);
      put(1 + lo + pick(hi - lo), {s[j]});
    }
    std::vector<std::vector<Item>> dist_units;
    for (int i = 1; i < K; ++i) dist_units.push_back({{Step::Dist, i}});
    dist_units.push_back({{Step::Repeat}});
    int near_after_trial = -1;  // k: at the front of among[k] (after trial k-1, or the last warm-up), T: of after
    if (sp.near_duplicate) {
      const std::size_t choice = pick(dist_units.size() + std::size_t(T) + 1);
      const int k = int(choice) - int(dist_units.size());
      if (k < 0)
        dist_units[choice].push_back({Step::NearDup});
      else if (k > 0 || sp.warmup > 0)
        near_after_trial = k;
      else
        dist_units[pick(dist_units.size())].push_back({Step::NearDup});
    }
    for (auto& u : dist_units) put(pick(gaps_n), std::move(u));
    for (const auto& it : p) put(pick(gaps_n), {it});
    auto flatten = [&](std::size_t g) {
      std::shuffle(gaps[g].begin(), gaps[g].end(), rng);
      std::vector<Item> v;
      for (const auto& u : gaps[g]) v.insert(v.end(), u.begin(), u.end());
      return v;
    };
    pl.before = flatten(0);
    for (int k = 0; k < T; ++k) pl.among[std::size_t(k)] = flatten(1 + std::size_t(k));
    pl.after = flatten(gaps_n - 1);
    if (near_after_trial >= 0) {
      auto& v = near_after_trial < T ? pl.among[std::size_t(near_after_trial)] : pl.after;
      v.insert(v.begin(), Item{Step::NearDup});
    }
    if (repeat_call(pl, sp.warmup) % 2 == 1) break;
  }
  return pl;
}

}  // namespace kf::evaluator
