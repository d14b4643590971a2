// Task scheduling: uniform, cycle, room-to-improve and curriculum policies; every task keeps a share.
#include <gtest/gtest.h>

#include <numeric>

#include "kf/actors/actors.h"
#include "kf/common/error.h"
#include "scheduler.h"  // actors/src: TaskScheduler

using namespace kf::actors;

namespace {
std::vector<TaskEntry> tasks() { return {{"a", 1}, {"b", 1}, {"c", 2}, {"d", 2}, {"e", 3}}; }
}  // namespace

TEST(SchedulerTest, UniformIsUniform) {
  TaskScheduler s(tasks(), {SchedulePolicy::uniform, 0.2, 1.0, 0.5}, 1);
  for (double p : s.probabilities()) EXPECT_NEAR(p, 0.2, 1e-12);
  std::vector<int> n(5);
  for (int i = 0; i < 5000; ++i) ++n[s.next()];
  for (int c : n) EXPECT_NEAR(c, 1000, 150);
}

// Every pass visits each task once, in a new seeded order: any 5 consecutive picks that
// start a pass are the 5 tasks, and the counts after 20 passes are exactly 20 each.
TEST(SchedulerTest, CycleVisitsEveryTaskOncePerPassInChangingOrder) {
  TaskScheduler s(tasks(), {SchedulePolicy::cycle, 0.2, 1.0, 0.5}, 5);
  for (double p : s.probabilities()) EXPECT_NEAR(p, 0.2, 1e-12);
  std::vector<int> n(5);
  std::vector<std::vector<std::size_t>> orders;
  for (int pass = 0; pass < 20; ++pass) {
    std::vector<std::size_t> order;
    for (int k = 0; k < 5; ++k) {
      const auto p = s.probabilities();
      EXPECT_NEAR(std::accumulate(p.begin(), p.end(), 0.0), 1.0, 1e-12);
      const std::size_t i = s.next();
      EXPECT_NEAR(p[i], 1.0 / (5 - k), 1e-12) << "pass " << pass << " pick " << k;
      for (std::size_t j : order) EXPECT_EQ(p[j], 0.0) << "already picked this pass";
      order.push_back(i);
      ++n[i];
    }
    orders.push_back(order);
  }
  for (int c : n) EXPECT_EQ(c, 20);
  int distinct = 0;
  for (std::size_t k = 1; k < orders.size(); ++k) distinct += orders[k] != orders[0];
  EXPECT_GT(distinct, 10) << "each pass shuffles anew";
  TaskScheduler a(tasks(), {SchedulePolicy::cycle, 0.2, 1.0, 0.5}, 7),
      b(tasks(), {SchedulePolicy::cycle, 0.2, 1.0, 0.5}, 7);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.next(), b.next());
  EXPECT_EQ(parse_schedule_policy("cycle", "cfg"), SchedulePolicy::cycle);
}

TEST(SchedulerTest, RoomFavoursTasksWithRoomToImproveAndKeepsAShareForAll) {
  TaskScheduler s(tasks(), {SchedulePolicy::room, 0.2, 1.0, 0.5}, 2);
  s.update("a", {true, 8.0});  // solved, 8x: little room
  s.update("b", {true, 1.0});  // solved at parity: full room
  const auto p = s.probabilities();
  EXPECT_NEAR(std::accumulate(p.begin(), p.end(), 0.0), 1.0, 1e-12);
  EXPECT_LT(p[0], p[1]);
  EXPECT_NEAR(p[1], p[2], 1e-12);    // parity = unsolved
  EXPECT_GE(p[0], 0.2 / 5 - 1e-12);  // the floor
  // Even a task with zero weight keeps min_share / N.
  TaskScheduler z(tasks(), {SchedulePolicy::room, 0.2, 50.0, 0.5}, 3);
  z.update("a", {true, 100.0});
  EXPECT_GE(z.probabilities()[0], 0.04 - 1e-12);
}

TEST(SchedulerTest, CurriculumUnlocksLevelsInOrder) {
  TaskScheduler s(tasks(), {SchedulePolicy::curriculum, 0.1, 1.0, 0.5}, 4);
  EXPECT_EQ(s.open_level(), 1);
  auto p = s.probabilities();
  EXPECT_NEAR(p[2], 0.1 / 5, 1e-12);  // locked: the floor only
  EXPECT_GT(p[0], 0.4);
  s.update("a", {true, 1.2});  // 1 of 2 level-1 tasks: 50% -> level 2 opens
  EXPECT_EQ(s.open_level(), 2);
  EXPECT_GT(s.probabilities()[2], 0.1);
  EXPECT_NEAR(s.probabilities()[4], 0.02, 1e-12);
  s.update("c", {true, 1.1});  // 2 of 4 -> level 3 opens
  EXPECT_EQ(s.open_level(), 3);
}

TEST(SchedulerTest, SeededAndChecked) {
  TaskScheduler a(tasks(), {}, 9), b(tasks(), {}, 9);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.next(), b.next());
  EXPECT_THROW(TaskScheduler({}, {}, 0), kf::Error);
  EXPECT_THROW(parse_schedule_policy("greedy", "cfg: actors.schedule.policy"), kf::Error);
}
