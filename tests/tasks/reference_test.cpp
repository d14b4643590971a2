// The C++ reference runner against Python eager PyTorch, for every built-in task.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "kf/tasks/tasks.h"

using namespace kf::tasks;

namespace {

std::string tasks_dir() {
  const char* b = std::getenv("KF_BUILD_DIR");
  return std::string(b ? b : KF_BUILD_DIR_DEFAULT) + "/tasks";
}

std::vector<std::shared_ptr<const Task>> suite() {
  static auto tasks = Task::load_all(tasks_dir());
  return tasks;
}

TEST(ReferenceTest, SuiteHasAtLeastSixtyTasksOverThreeLevels) {
  auto tasks = suite();
  EXPECT_GE(tasks.size(), 60u);
  std::map<int, int> per_level;
  std::set<std::string> tags;
  for (const auto& t : tasks) {
    per_level[t->level()]++;
    for (const auto& tag : t->tags()) tags.insert(tag);
  }
  for (int level : {1, 2, 3}) EXPECT_GE(per_level[level], 5) << "level " << level;
  for (const char* tag : {"elementwise", "reduction", "normalization", "matmul", "conv", "attention", "loss"})
    EXPECT_TRUE(tags.count(tag)) << "no task tagged " << tag;
}

TEST(ReferenceTest, MatchesPythonEagerForEveryTask) {
  int checked = 0;
  for (const auto& t : suite()) {
    SCOPED_TRACE(t->name());
    GoldenResult g = check_golden(*t);
    EXPECT_TRUE(g.problem.empty()) << g.problem;
    EXPECT_TRUE(g.inputs_equal) << t->name() << ": C++ inputs differ from Python's get_inputs() for the same seed";
    EXPECT_LE(g.max_rel_error, 1e-5) << t->name();
    ++checked;
  }
  EXPECT_GE(checked, 60);
}

TEST(ReferenceTest, SameSeedSameInputsOtherSeedOtherInputs) {
  const at::Device cpu(at::kCPU);
  for (const auto& t : suite()) {
    SCOPED_TRACE(t->name());
    auto a = t->make_inputs(Backend::CPU, 7, cpu);
    auto b = t->make_inputs(Backend::CPU, 7, cpu);
    auto c = t->make_inputs(Backend::CPU, 8, cpu);
    ASSERT_EQ(a.size(), t->inputs(Backend::CPU).size());
    bool any_differs = false;
    for (std::size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(at::equal(a[i], b[i])) << "input " << i << " not reproducible";
      any_differs = any_differs || !at::equal(a[i], c[i]);
      EXPECT_EQ(a[i].sizes().vec(), t->inputs(Backend::CPU)[i].shape);
      EXPECT_EQ(a[i].scalar_type(), t->inputs(Backend::CPU)[i].dtype);
    }
    EXPECT_TRUE(any_differs) << "a different seed must give different inputs";
  }
}

TEST(ReferenceTest, TrainModeUpdatesBuffersLikeEager) {
  // A train-mode batch norm must update its running statistics on every call, as eager does.
  int found = 0;
  const at::Device cpu(at::kCPU);
  for (const auto& t : suite()) {
    if (t->mode() != "train") continue;
    bool has_running = false;
    for (const auto& p : t->params(Backend::CPU)) has_running |= p.name.find("running_mean") != std::string::npos;
    if (!has_running) continue;
    SCOPED_TRACE(t->name());
    auto ref = t->new_reference(Backend::CPU, cpu);
    std::vector<at::Tensor> before;
    for (const auto& p : ref->params()) before.push_back(p.clone());
    ref->forward(t->make_inputs(Backend::CPU, 0, cpu));
    bool changed = false;
    for (std::size_t i = 0; i < before.size(); ++i) changed |= !at::equal(before[i], ref->params()[i]);
    EXPECT_TRUE(changed);
    ++found;
  }
  EXPECT_GE(found, 1) << "the suite should have a train-mode batch norm task";
}

TEST(ReferenceTest, SetParamsChangesOutputsAndChecksShapes) {
  const at::Device cpu(at::kCPU);
  for (const auto& t : suite()) {
    if (t->params(Backend::CPU).empty() || t->mode() != "eval") continue;
    auto ref = t->new_reference(Backend::CPU, cpu);
    auto in = t->make_inputs(Backend::CPU, 0, cpu);
    auto y0 = ref->forward(in);
    std::vector<at::Tensor> redrawn;
    for (const auto& p : ref->params()) redrawn.push_back(p.is_floating_point() ? at::randn_like(p) : p.clone());
    ref->set_params(redrawn);
    auto y1 = ref->forward(in);
    EXPECT_FALSE(at::equal(y0[0], y1[0])) << t->name();
    std::vector<at::Tensor> wrong = redrawn;
    wrong[0] = at::zeros({1});
    EXPECT_THROW(ref->set_params(wrong), kf::Error);
    EXPECT_THROW(ref->forward({}), kf::Error);
    return;  // one task is enough for the contract
  }
  GTEST_SKIP() << "no eval-mode task with parameters in the suite";
}

// On the GPU machine (tools/gpu-check): every task's CPU-size graph runs on CUDA and agrees
// with the CPU reference within the task's tolerance; the GPU-size graph runs too.
TEST(ReferenceTest, CudaReferenceRunsEveryTask) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device visible; runs on the GPU machine via tools/gpu-check";
  const at::Device gpu(at::kCUDA, 0), cpu(at::kCPU);
  int gpu_size_ran = 0;
  for (const auto& t : suite()) {
    SCOPED_TRACE(t->name());
    auto in_cpu = t->make_inputs(Backend::CPU, 0, cpu);
    auto want = t->new_reference(Backend::CPU, cpu)->forward(in_cpu);
    std::vector<at::Tensor> in_gpu;
    for (auto& x : in_cpu) in_gpu.push_back(x.to(gpu));
    auto got = t->new_reference(Backend::CPU, gpu)->forward(in_gpu);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      const Tolerance tol = t->tolerance(Backend::CPU, i);
      at::Tensor g = got[i].cpu().to(at::kDouble), w = want[i].to(at::kDouble);
      // Eager CUDA differs from CPU in rounding and, for cuDNN convolutions, in precision
      // (torch's default allow_tf32 for cuDNN), so compare norm-wise: TF32 lands near 3e-4.
      const double denom = std::max(w.norm().item<double>(), 1e-30);
      const double rel = (g - w).norm().item<double>() / denom;
      EXPECT_LE(rel, std::max(10 * tol.rtol, 2e-3)) << "output " << i << " norm-wise relative error";
    }
    if (t->has_backend(Backend::CUDA)) {
      auto ref = t->new_reference(Backend::CUDA, gpu);
      auto outs = ref->forward(t->make_inputs(Backend::CUDA, 0, gpu));
      synchronize(gpu);
      for (std::size_t i = 0; i < outs.size(); ++i) {
        EXPECT_EQ(outs[i].sizes().vec(), t->outputs(Backend::CUDA)[i].shape);
        if (outs[i].is_floating_point()) EXPECT_TRUE(at::isfinite(outs[i]).all().item<bool>()) << "output " << i;
      }
      ++gpu_size_ran;
    }
  }
  RecordProperty("gpu_size_tasks", gpu_size_ran);
}

}  // namespace
