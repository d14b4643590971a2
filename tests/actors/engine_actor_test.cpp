// The actor on the rollout engine (actors.engine.max_sequences > 0): several groups in
// flight, each pushed whole with the behaviour log-probs of the weights that sampled it; a
// new snapshot is loaded only once the groups in flight have finished.
#include <gtest/gtest.h>

#include <map>

#include "kf/actors/actors.h"
#include "kf/common/config.h"
#include "kf/common/error.h"
#include "test_util.h"
#include "weights_blob.h"

using namespace kf::actors;
namespace rp = kf::replay;

namespace {

struct EngineRun : test::RunFixture {
  EngineRun() : test::RunFixture("e", 32) {}
};

ActorOptions engine_options() {
  ActorOptions o = test::small_options();
  o.max_new_tokens = 10;
  o.exemplars = 0;
  o.temperature = 0.9;
  o.top_k = 16;
  o.engine_max_sequences = 4;  // two groups decode together, a third waits
  o.engine_kv_budget_mb = 16;
  o.engine_block_size = 16;
  o.engine_check_every = 4;
  return o;
}

// Every candidate queued now, claimed by the test as the evaluators (never scored from here).
std::vector<rp::Candidate> drain(test::RunFixture& run) { return run.drain(); }

// Largest |behaviour log-prob - the log-prob of the distribution the actor sampled from
// (temperature, top-k, top-p of `o`)| over a candidate's tokens.
double logprob_gap(kf::policy::CausalLM& m, const rp::Candidate& c, const ActorOptions& o) {
  kf::policy::SamplingParams sp;
  sp.temperature = o.temperature;
  sp.top_k = o.top_k;
  sp.top_p = o.top_p;
  return test::sampler_logprob_gap(m, c.prompt_tokens, c.completion_tokens, c.behaviour_logprobs, sp);
}

}  // namespace

TEST(ActorEngineTest, GroupsInFlightArePushedWholeAndSnapshotsWaitForThemToFinish) {
  KF_NEED_TASKS();
  EngineRun run;
  const auto opts = engine_options();
  auto v0 = test::tiny_policy(0);
  auto v1 = test::tiny_policy(5);
  Actor actor(opts, test::tiny_policy(0), load_actor_tasks(opts), *run.shm);
  std::vector<rp::Candidate> all;
  for (int i = 0; i < 6 && all.size() < 6; ++i) {
    const auto r = actor.step();
    EXPECT_TRUE(r == StepResult::pushed || r == StepResult::no_task);
    for (auto& c : drain(run)) all.push_back(std::move(c));
  }
  ASSERT_GE(all.size(), 6u);
  std::map<uint64_t, int> per_group;
  for (const auto& c : all) {
    ++per_group[c.group_id];
    EXPECT_EQ(c.policy_version, 0);
    ASSERT_EQ(c.behaviour_logprobs.size(), c.completion_tokens.size());
  }
  // One full forward per checked candidate (long contrastive prompts): the first and last.
  for (const auto* c : {&all.front(), &all.back()})
    EXPECT_LT(logprob_gap(v0.model, *c, opts), 1e-4) << "behaviour log-probs are the sampling model's";
  for (const auto& [g, n] : per_group) EXPECT_EQ(n, 2) << "group " << g << " pushed whole";

  // The learner publishes v1 while groups are in flight: they finish under v0, then v1
  // loads and every later group is v1's.
  const auto blob = make_weights_blob(v1.model, 1);
  run.shm->snapshots().publish(1, blob.data(), blob.size());
  std::vector<rp::Candidate> after;
  for (int i = 0; i < 12; ++i) {
    actor.step();
    for (auto& c : drain(run)) after.push_back(std::move(c));
    if (!after.empty() && after.back().policy_version == 1 && after.size() >= 4) break;
  }
  ASSERT_FALSE(after.empty());
  EXPECT_EQ(actor.policy_version(), 1);
  bool seen_v1 = false;
  for (const auto& c : after) {
    if (c.policy_version == 1)
      seen_v1 = true;
    else
      EXPECT_FALSE(seen_v1) << "a v0 group was pushed after v1 loaded";
  }
  // Groups were in flight at the publish: the first pushed after it is v0's, sampled by
  // v0's weights to its end (the snapshot waited for it).
  ASSERT_EQ(after.front().policy_version, 0);
  EXPECT_LT(logprob_gap(v0.model, after.front(), opts), 1e-4) << "an in-flight group saw new weights";
  // The last candidate is v1's: its log-probs are v1's, not v0's (no mixed weights).
  ASSERT_EQ(after.back().policy_version, 1);
  EXPECT_LT(logprob_gap(v1.model, after.back(), opts), 1e-4);
  EXPECT_GT(logprob_gap(v0.model, after.back(), opts), 1e-2);
  EXPECT_TRUE(seen_v1);
  EXPECT_EQ(actor.metrics().candidates, actor.metrics().pushed);
  EXPECT_NE(actor.metrics_json().find("\"engine_kv_blocks_peak\""), std::string::npos) << actor.metrics_json();
}

TEST(ActorEngineTest, EngineKeysAreReadAndCheckedFromTheConfig) {
  auto cfg = kf::Config::parse("actors:\n  group_size: 4\n  engine:\n    max_sequences: 2\n", "engine.yaml");
  try {
    actor_options(cfg, 0);
    FAIL() << "max_sequences below the group size was accepted";
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("actors.engine.max_sequences"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("engine.yaml"), std::string::npos) << e.what();
  }
  cfg = kf::Config::parse("actors:\n  engine:\n    max_sequences: 64\n    kv_budget_mb: 512\n    block_size: 32\n",
                          "engine.yaml");
  const auto o = actor_options(cfg, 0);
  EXPECT_EQ(o.engine_max_sequences, 64);
  EXPECT_EQ(o.engine_kv_budget_mb, 512);
  EXPECT_EQ(o.engine_block_size, 32);
  EXPECT_EQ(actor_options(kf::Config::parse("run:\n  seed: 1\n", "d.yaml"), 0).engine_max_sequences, 0)
      << "off by default: one group at a time";
}

// The learning-curve probe with the rollout engine (docs/metrics.md, "Learning curve"): it
// runs while the engine is idle (at the start, and once a new snapshot drained the engine),
// through rollout_group with its fixed seed, so the same weights published again as a later
// version write the same probe completions, whatever the engine decoded in between.
TEST(ActorEngineTest, ProbeRunsWhileTheEngineIsIdleWithItsFixedSeed) {
  KF_NEED_TASKS();
  EngineRun run;
  auto opts = engine_options();
  opts.probe_every = 1;
  opts.probe_samples = 3;
  auto v0 = test::tiny_policy(0);
  Actor actor(opts, test::tiny_policy(0), load_actor_tasks(opts), *run.shm);
  ASSERT_EQ(actor.step(), StepResult::pushed);
  const auto first = drain(run);
  ASSERT_EQ(first.size(), 3u);
  for (const auto& c : first) {
    EXPECT_TRUE(c.probe);
    EXPECT_EQ(c.policy_version, 0);
  }
  // The engine's groups, then v1 (the same weights): the engine drains, loads it, probes.
  std::size_t trained = 0;
  for (int i = 0; i < 8 && trained < 4; ++i) {
    actor.step();
    for (const auto& c : drain(run)) {
      EXPECT_FALSE(c.probe);
      ++trained;
    }
  }
  EXPECT_GE(trained, 4u);
  const auto blob = make_weights_blob(v0.model, 1);
  run.shm->snapshots().publish(1, blob.data(), blob.size());
  std::vector<rp::Candidate> second;
  for (int i = 0; i < 20 && second.size() < 3; ++i) {
    actor.step();
    for (auto& c : drain(run))
      if (c.probe) second.push_back(std::move(c));
  }
  ASSERT_EQ(second.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(second[i].policy_version, 1);
    EXPECT_EQ(second[i].prompt_tokens, first[i].prompt_tokens);
    EXPECT_EQ(second[i].completion_tokens, first[i].completion_tokens) << "sample " << i;
  }
}
