// AdamW against torch::optim::AdamW, the learning-rate schedule and gradient clipping.
#include <gtest/gtest.h>

#include <cmath>

#include "kf/learner/optimizer.h"

using namespace kf::learner;

TEST(LearnerOptimTest, AdamWMatchesTorchAdamW) {
  torch::manual_seed(3);
  auto a = torch::randn({5, 4}).requires_grad_(true);
  auto b = a.detach().clone().requires_grad_(true);
  OptimConfig oc;
  oc.lr = 1e-2;
  oc.weight_decay = 0.1;
  oc.eps = 1e-8;
  AdamW ours({{"w", a}}, oc);
  torch::optim::AdamW ref({b}, torch::optim::AdamWOptions(1e-2).weight_decay(0.1).eps(1e-8).betas({0.9, 0.999}));
  for (int s = 0; s < 5; ++s) {
    const auto g = torch::randn({5, 4});
    a.mutable_grad() = g.clone();
    b.mutable_grad() = g.clone();
    ours.step(1e-2);
    ref.step();
  }
  EXPECT_LT((a - b).abs().max().item<double>(), 1e-6);
  EXPECT_EQ(ours.steps(), 5);
  EXPECT_EQ(ours.state().size(), 2u);
}

TEST(LearnerOptimTest, ScheduleWarmsUpThenDecays) {
  OptimConfig o;
  o.lr = 1.0;
  ScheduleConfig s;
  s.warmup_steps = 4;
  s.total_steps = 14;
  s.min_lr_ratio = 0.1;
  s.kind = ScheduleKind::constant;
  EXPECT_DOUBLE_EQ(schedule_lr(o, s, 0), 0.25);
  EXPECT_DOUBLE_EQ(schedule_lr(o, s, 3), 1.0);
  EXPECT_DOUBLE_EQ(schedule_lr(o, s, 100), 1.0);
  s.kind = ScheduleKind::linear;
  EXPECT_DOUBLE_EQ(schedule_lr(o, s, 4), 1.0);
  EXPECT_NEAR(schedule_lr(o, s, 9), 0.55, 1e-12);
  EXPECT_NEAR(schedule_lr(o, s, 14), 0.1, 1e-12);
  EXPECT_NEAR(schedule_lr(o, s, 99), 0.1, 1e-12);
  s.kind = ScheduleKind::cosine;
  EXPECT_NEAR(schedule_lr(o, s, 9), 0.55, 1e-12);  // cosine midpoint
  EXPECT_NEAR(schedule_lr(o, s, 14), 0.1, 1e-12);
}

TEST(LearnerOptimTest, ClipScalesToTheMaxNorm) {
  auto p = torch::zeros({2}).requires_grad_(true);
  p.mutable_grad() = torch::tensor({3.0f, 4.0f});
  EXPECT_NEAR(clip_grad_norm({p}, 1.0), 5.0, 1e-9);
  EXPECT_NEAR(p.grad().norm().item<double>(), 1.0, 1e-5);
  p.mutable_grad() = torch::tensor({0.3f, 0.4f});
  clip_grad_norm({p}, 1.0);
  EXPECT_NEAR(p.grad()[0].item<double>(), 0.3, 1e-7);  // under the bound: untouched
}
