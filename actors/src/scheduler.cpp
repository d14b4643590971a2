// TaskScheduler (scheduler.h): which task the next group is for.
#include "kf/actors/actors.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "kf/common/error.h"
#include "scheduler.h"

namespace kf::actors {

SchedulePolicy parse_schedule_policy(const std::string& s, const std::string& context) {
  if (s == "uniform") return SchedulePolicy::uniform;
  if (s == "cycle") return SchedulePolicy::cycle;
  if (s == "room") return SchedulePolicy::room;
  if (s == "curriculum") return SchedulePolicy::curriculum;
  throw error_at(context, "unknown schedule policy '" + s + "' (uniform, cycle, room, curriculum)");
}

TaskScheduler::TaskScheduler(std::vector<TaskEntry> tasks, ScheduleOptions opts, uint64_t seed)
    : tasks_(std::move(tasks)), stats_(tasks_.size()), opts_(opts), rng_(seed) {
  if (tasks_.empty())
    throw Error("task scheduler: no tasks to schedule (check tasks.dir, tasks.levels, tasks.include)");
  if (opts_.min_share < 0 || opts_.min_share > 1) throw Error("actors.schedule.min_share: must be in [0, 1]");
}

void TaskScheduler::update(const std::string& task, const TaskStats& s) {
  for (std::size_t i = 0; i < tasks_.size(); ++i)
    if (tasks_[i].name == task) stats_[i] = s;
}

double TaskScheduler::room(std::size_t i) const {
  if (!stats_[i].solved) return 1.0;
  return 1.0 / std::pow(std::max(1.0, stats_[i].best_speedup), opts_.alpha);
}

int TaskScheduler::open_level() const {
  std::set<int> levels;
  for (const auto& t : tasks_) levels.insert(t.level);
  int open = *levels.begin();
  for (int lv : levels) {
    if (lv == open) continue;
    std::size_t n = 0, solved = 0;
    for (std::size_t i = 0; i < tasks_.size(); ++i)
      if (tasks_[i].level <= open) ++n, solved += stats_[i].solved ? 1 : 0;
    if (n == 0 || static_cast<double>(solved) < opts_.unlock_fraction * static_cast<double>(n)) break;
    open = lv;
  }
  return open;
}

std::vector<double> TaskScheduler::probabilities() const {
  const std::size_t n = tasks_.size();
  if (opts_.policy == SchedulePolicy::cycle) {
    // The next pick is one of the tasks this pass has not reached yet (a new pass: any).
    std::vector<double> p(n, pass_pos_ < pass_.size() ? 0.0 : 1.0 / static_cast<double>(n));
    for (std::size_t k = pass_pos_; k < pass_.size(); ++k)
      p[pass_[k]] = 1.0 / static_cast<double>(pass_.size() - pass_pos_);
    return p;
  }
  std::vector<double> w(n, 0.0);
  const int open = opts_.policy == SchedulePolicy::curriculum ? open_level() : 0;
  for (std::size_t i = 0; i < n; ++i) {
    switch (opts_.policy) {
      case SchedulePolicy::uniform:
        w[i] = 1.0;
        break;
      case SchedulePolicy::cycle:
        break;  // returned above: its next pick depends on the pass
      case SchedulePolicy::room:
        w[i] = room(i);
        break;
      case SchedulePolicy::curriculum:
        w[i] = tasks_[i].level <= open ? room(i) : 0.0;
        break;
    }
  }
  double sum = 0;
  for (double x : w) sum += x;
  std::vector<double> p(n);
  const double share = sum > 0 ? opts_.min_share : 1.0;  // nothing weighted: all uniform
  for (std::size_t i = 0; i < n; ++i)
    p[i] = share / static_cast<double>(n) + (sum > 0 ? (1.0 - share) * w[i] / sum : 0.0);
  return p;
}

std::size_t TaskScheduler::next() {
  if (opts_.policy == SchedulePolicy::cycle) {
    if (pass_pos_ == pass_.size()) {
      pass_.resize(tasks_.size());
      std::iota(pass_.begin(), pass_.end(), std::size_t{0});
      std::shuffle(pass_.begin(), pass_.end(), rng_);
      pass_pos_ = 0;
    }
    return pass_[pass_pos_++];
  }
  const auto p = probabilities();
  std::discrete_distribution<std::size_t> d(p.begin(), p.end());
  return d(rng_);
}

}  // namespace kf::actors
