// GpuShare (policy/gpu_share.h): the actors' and the learner's shared hold of a GPU under
// the evaluator's exclusive timing lock. Real flock files, a real model, a real GPU.
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <atomic>
#include <chrono>
#include <regex>
#include <thread>

#include "group_sampler.h"
#include "kf/evaluator/evaluator.h"
#include "kf/policy/policy.h"
#include "test_util.h"

using namespace kf::actors;
using kf::GpuTimingLock;
using kf::policy::GpuShare;
using Clock = std::chrono::steady_clock;

namespace {
double secs_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

TEST(GpuShareTest, CpuDeviceTakesNoLock) {
  test::TempDir tmp;
  GpuShare share(torch::Device(torch::kCPU), tmp.path);
  EXPECT_FALSE(share.active());
  { GpuShare::Scope s(&share); }
  share.pause_point();
  EXPECT_EQ(share.wait_seconds(), 0.0);
  // Sampling on the CPU with the (inactive) share set behaves as without it.
  auto pol = test::tiny_policy(3);
  kf::policy::SamplingParams p;
  p.max_new_tokens = 12;
  p.temperature = 0;
  const auto plain = sample_group(pol.model, {1, 2, 3}, 2, p, pol.valid_vocab, true);
  p.gpu_share = &share;
  const auto shared = sample_group(pol.model, {1, 2, 3}, 2, p, pol.valid_vocab, true);
  ASSERT_EQ(plain.size(), shared.size());
  for (std::size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(plain[i].tokens, shared[i].tokens);
  // Nothing was created in the lock folder: a CPU process never contends for a GPU.
  EXPECT_FALSE(test::exists(tmp.path + "/kf-gpu0.lock"));
}

TEST(GpuShareTest, LockKeyIsTheEvaluatorsPciKey) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const std::string key = kf::policy::cuda_gpu_lock_key(0);
  EXPECT_EQ(key, kf::evaluator::gpu_lock_key(0));
  EXPECT_TRUE(std::regex_match(key, std::regex("[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\\.0"))) << key;
}

TEST(GpuShareTest, SamplingWaitsForATimedTrialAndReleasesBetweenChunks) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  test::TempDir tmp;
  const torch::Device dev(torch::kCUDA, 0);
  GpuShare share(dev, tmp.path);
  ASSERT_TRUE(share.active());
  GpuTimingLock timer(tmp.path, kf::policy::cuda_gpu_lock_key(0));  // what the evaluator opens

  // Built on the GPU: a CausalLM keeps the device it was made with (options()).
  auto c = init_shape_config("tiny");
  kf::policy::CausalLM model(c, torch::TensorOptions().dtype(torch::kFloat32).device(dev));
  model->init_random(5);
  auto pol = make_actor_policy(model, nullptr);
  kf::policy::SamplingParams p;
  p.max_new_tokens = 256;
  p.check_every = 8;
  p.eos_ids = {-1};  // never stops early: 32 chunks
  p.gpu_share = &share;

  // 1. A trial holds the lock: sampling cannot start until it ends (300 ms).
  ASSERT_TRUE(timer.lock_exclusive(std::chrono::milliseconds(100)));
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    timer.unlock();
  });
  const auto t0 = Clock::now();
  const auto out = sample_group(pol.model, {1, 2, 3}, 4, p, pol.valid_vocab, true);
  release.join();
  EXPECT_GE(secs_since(t0), 0.28);
  EXPECT_GE(share.wait_seconds(), 0.25);
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0].tokens.size(), 256u);

  // 2. While sampling runs, a timer asking for the lock gets it between chunks, long
  // before the generation ends.
  p.max_new_tokens = 4096 - 8;
  std::atomic<bool> done{false};
  double got_after = -1;
  std::thread sampler([&] {
    sample_group(pol.model, {1, 2, 3}, 4, p, pol.valid_vocab, true);
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto t1 = Clock::now();
  GpuTimingLock timer2(tmp.path, kf::policy::cuda_gpu_lock_key(0));
  const bool got = timer2.lock_exclusive(std::chrono::seconds(30));
  got_after = secs_since(t1);
  const bool sampler_done_when_got = done.load();
  timer2.unlock();
  sampler.join();
  EXPECT_TRUE(got);
  EXPECT_FALSE(sampler_done_when_got) << "the timer only got the GPU after the whole generation";
  EXPECT_LT(got_after, 1.0);

  // 3. Afterwards nothing is held: a timer gets the lock at once.
  EXPECT_TRUE(timer.lock_exclusive(std::chrono::milliseconds(10)));
  timer.unlock();
}
