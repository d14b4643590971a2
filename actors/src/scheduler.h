// TaskScheduler: which task an actor's next group is for (actors.schedule.*; the policy
// names and ScheduleOptions are in kf/actors/actors.h, since ActorOptions carries them).
//
// Policies:
//   uniform     every task equally often (each pick independent)
//   cycle       passes over all tasks, each in a new random order: within a pass every task
//               comes once, so any stretch of picks holds nearly the same task mix (the
//               per-minute windows of an evidence run compare like with like)
//   room        weighted toward tasks with room to improve: a task with no verified kernel
//               has room 1; one whose best kernel is s times faster than the reference has
//               room 1 / max(1, s)^alpha. Tasks tried many times without a kernel keep room 1.
//   curriculum  levels unlock in order: level L+1 opens once `unlock_fraction` of the tasks
//               of the open levels have a verified kernel; open tasks are weighted by room.
// Every task keeps a share: with probability min_share the pick is uniform over all tasks
// (locked curriculum levels included), so no task starves and none is forgotten (cycle
// needs no share: it visits every task each pass).
// The weights come from TaskStats the caller refreshes (the actor reads the KernelDb).
// Seeded and deterministic. One thread at a time.
#pragma once
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kf/actors/actors.h"

namespace kf::actors {

SchedulePolicy parse_schedule_policy(const std::string& s, const std::string& context);  // throws kf::Error

struct TaskEntry {
  std::string name;
  int level = 1;
};

struct TaskStats {
  bool solved = false;      // has a verified kernel
  double best_speedup = 0;  // of the best verified kernel
};

class TaskScheduler {
 public:
  TaskScheduler(std::vector<TaskEntry> tasks, ScheduleOptions opts, uint64_t seed);
  void update(const std::string& task, const TaskStats& s);
  std::size_t next();  // index into tasks()
  const std::vector<TaskEntry>& tasks() const { return tasks_; }
  // The probability of each task on the next pick (tests, metrics).
  std::vector<double> probabilities() const;
  int open_level() const;  // curriculum: highest unlocked level

 private:
  double room(std::size_t i) const;
  std::vector<TaskEntry> tasks_;
  std::vector<TaskStats> stats_;
  ScheduleOptions opts_;
  std::mt19937_64 rng_;
  std::vector<std::size_t> pass_;  // cycle: this pass's order; pass_pos_ picks made from it
  std::size_t pass_pos_ = 0;
};

}  // namespace kf::actors
