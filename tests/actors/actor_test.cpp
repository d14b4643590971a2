// Group sampling, the weights blob, and an in-process Actor on a real RunShm: snapshot
// pickup, a mismatching snapshot, an empty kernel database, failed extractions as results,
// the per-group prompt log.
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

#include "group_sampler.h"
#include "kf/actors/actors.h"
#include "kf/common/config.h"
#include "kf/common/error.h"
#include "test_util.h"
#include "weights_blob.h"

using namespace kf::actors;
namespace rp = kf::replay;

TEST(GroupSamplerTest, SharedPrefillMatchesSeparatePrefills) {
  auto pol = test::tiny_policy(1);
  const auto prompt = pol.codec.encode("Write a relu kernel:\n```cpp kernel\n");
  kf::policy::SamplingParams sp;
  sp.temperature = 0;  // greedy: both paths must agree token for token
  sp.max_new_tokens = 24;
  sp.eos_ids = {};
  const auto shared = sample_group(pol.model, prompt, 3, sp, 256, true);
  const auto separate = sample_group(pol.model, prompt, 3, sp, 256, false);
  ASSERT_EQ(shared.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(shared[i].tokens, separate[i].tokens);
    ASSERT_EQ(shared[i].logprobs.size(), shared[i].tokens.size());
    for (std::size_t t = 0; t < shared[i].logprobs.size(); ++t)
      EXPECT_NEAR(shared[i].logprobs[t], separate[i].logprobs[t], 1e-4);
    EXPECT_EQ(shared[i].finish_reason, "length");
  }
  // Sampled rows differ from each other, and log-probs match a teacher-forced forward.
  sp.temperature = 1.0;
  sp.seed = 7;
  const auto g = sample_group(pol.model, prompt, 4, sp, 256, true);
  EXPECT_NE(g[0].tokens, g[1].tokens);
  std::vector<int64_t> full(prompt.begin(), prompt.end());
  full.insert(full.end(), g[2].tokens.begin(), g[2].tokens.end());
  torch::NoGradGuard ng;
  const auto lp = pol.model->token_logprobs(torch::tensor(full).unsqueeze(0));
  for (std::size_t t = 0; t < g[2].tokens.size(); ++t)
    EXPECT_NEAR(lp[0][static_cast<int64_t>(prompt.size() + t - 1)].item<float>(), g[2].logprobs[t], 1e-3);
}

TEST(WeightsBlobTest, RoundTripAndMismatchLeavesTheModelUntouched) {
  auto a = test::tiny_policy(1), b = test::tiny_policy(2);
  const auto blob = make_weights_blob(b.model, 42);
  EXPECT_EQ(load_weights_blob(a.model, blob.data(), blob.size(), "test blob"), 42);
  for (const auto& p : a.model->named_parameters())
    EXPECT_TRUE(torch::equal(p.value(), b.model->named_parameters()[p.key()])) << p.key();
  // A blob of another shape: rejected naming the tensor; nothing copied.
  auto wide = test::tiny_policy(3, 128);
  const auto bad = make_weights_blob(wide.model, 43);
  const auto before = a.model->named_parameters()["model.norm.weight"].clone();
  const auto c = check_weights_blob(a.model, bad.data(), bad.size(), "snapshot v43");
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.error.find("snapshot v43: tensor '"), std::string::npos) << c.error;
  EXPECT_THROW(load_weights_blob(a.model, bad.data(), bad.size(), "snapshot v43"), kf::Error);
  for (const auto& p : a.model->named_parameters())
    EXPECT_TRUE(torch::equal(p.value(), b.model->named_parameters()[p.key()])) << p.key();
  // bf16 blobs (the learner's default) load with a cast.
  const auto half = make_weights_blob(b.model, 44, torch::kBFloat16);
  EXPECT_EQ(load_weights_blob(a.model, half.data(), half.size(), "bf16"), 44);
  // Garbage is an error, not a crash.
  std::vector<unsigned char> junk(64, 0xAB);
  EXPECT_FALSE(check_weights_blob(a.model, junk.data(), junk.size(), "junk").ok);
}

// LoRA snapshots carry only the adapters. An actor's model without adapters takes them on
// the first such blob and applies them unmerged, so its forward equals the learner's model;
// a blob of another rank is refused and changes nothing.
TEST(WeightsBlobTest, AdapterOnlyBlobAddsTheAdaptersAndMatchesTheSourceModel) {
  auto src = test::tiny_policy(5), dst = test::tiny_policy(5);  // same base weights
  kf::policy::LoraConfig lc;
  lc.rank = 4;
  lc.alpha = 8;
  lc.targets = {"q_proj", "v_proj"};
  src.model->enable_lora(lc, 9, torch::kFloat32);
  {
    torch::NoGradGuard g;
    for (auto& p : src.model->named_parameters())
      if (p.key().find(".lora_B.") != std::string::npos) p.value().uniform_(-0.5, 0.5);  // a trained adapter
  }
  const auto blob = make_weights_blob(src.model, 7);
  auto plain = test::tiny_policy(5);
  const auto full = make_weights_blob(plain.model, 7);
  EXPECT_LT(blob.size() * 4, full.size()) << "an adapter-only blob must be much smaller than the model";
  ASSERT_TRUE(check_weights_blob(dst.model, blob.data(), blob.size(), "lora v7").ok);
  const auto base_before = dst.model->named_parameters()["model.norm.weight"].clone();
  EXPECT_EQ(load_weights_blob(dst.model, blob.data(), blob.size(), "lora v7"), 7);
  EXPECT_TRUE(torch::equal(dst.model->named_parameters()["model.norm.weight"], base_before));
  int adapters = 0;
  for (const auto& p : dst.model->named_parameters()) adapters += kf::policy::is_lora_param(p.key());
  EXPECT_EQ(adapters, 2 * 2 * static_cast<int>(src.model->config().num_hidden_layers));
  torch::NoGradGuard g;
  const auto ids = torch::tensor(std::vector<int64_t>{'a', 'b', 'c', 'd'}).unsqueeze(0);
  EXPECT_TRUE(torch::allclose(src.model->forward(ids), dst.model->forward(ids), 1e-5, 1e-6));
  // Another rank: refused by check, the model unchanged.
  auto other = test::tiny_policy(5);
  lc.rank = 2;
  other.model->enable_lora(lc, 9, torch::kFloat32);
  const auto bad = make_weights_blob(other.model, 8);
  const auto c = check_weights_blob(dst.model, bad.data(), bad.size(), "lora v8");
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.error.find("lora v8"), std::string::npos) << c.error;
  EXPECT_TRUE(torch::allclose(src.model->forward(ids), dst.model->forward(ids), 1e-5, 1e-6));
}

namespace {

using test::RunFixture;
using test::small_options;

// Every candidate queued now, claimed by the test as the evaluators (never scored from here).
std::vector<rp::Candidate> drain(test::RunFixture& run) { return run.drain(); }

}  // namespace

TEST(ActorTest, PicksUpNewSnapshotsAndIgnoresAMismatchingOne) {
  KF_NEED_TASKS();
  RunFixture run;
  auto opts = small_options();
  Actor actor(opts, test::tiny_policy(0), load_actor_tasks(opts), *run.shm);
  ASSERT_EQ(actor.step(), StepResult::pushed);
  auto c = drain(run);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].policy_version, 0);
  EXPECT_EQ(c[0].group_id, c[1].group_id);
  EXPECT_NE(c[0].id, c[1].id);
  EXPECT_EQ(c[0].behaviour_logprobs.size(), c[0].completion_tokens.size());
  EXPECT_FALSE(c[0].prompt_tokens.empty());
  // Random weights write garbage: failed extractions with their reason.
  EXPECT_FALSE(c[0].extraction_error.empty());
  EXPECT_EQ(actor.metrics().no_exemplar_prompts, 1u);  // empty kernel database

  // Mid-run: the learner publishes v1.
  auto v1 = test::tiny_policy(5);
  const auto blob1 = make_weights_blob(v1.model, 1);
  run.shm->snapshots().publish(1, blob1.data(), blob1.size());
  ASSERT_EQ(actor.step(), StepResult::pushed);
  c = drain(run);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].policy_version, 1);
  EXPECT_EQ(actor.policy_version(), 1);

  // v2 has the wrong shape: logged, ignored, v1 weights stay.
  auto wide = test::tiny_policy(6, 128);
  const auto blob2 = make_weights_blob(wide.model, 2);
  run.shm->snapshots().publish(2, blob2.data(), blob2.size());
  ASSERT_EQ(actor.step(), StepResult::pushed);
  ASSERT_EQ(actor.step(), StepResult::pushed);
  c = drain(run);
  ASSERT_EQ(c.size(), 4u);
  for (const auto& x : c) EXPECT_EQ(x.policy_version, 1);
  EXPECT_EQ(actor.metrics().snapshots_rejected, 1u);  // once per version
  // Policy lag of what was pushed: v2 is newest, samples are v1.
  EXPECT_EQ(actor.metrics().lag_max, 1);

  // v3 is fine again.
  const auto blob3 = make_weights_blob(v1.model, 3);
  run.shm->snapshots().publish(3, blob3.data(), blob3.size());
  actor.step();
  c = drain(run);
  EXPECT_EQ(c.at(0).policy_version, 3);
  EXPECT_EQ(actor.metrics().snapshots_loaded, 2u);
  const auto j = actor.metrics_json();
  for (const char* k : {"samples_per_s", "tokens_per_s", "policy_lag_mean", "policy_lag_max", "finish_reasons"})
    EXPECT_NE(j.find(k), std::string::npos) << k;
  uint64_t finished = 0;  // every completion counted under its finish reason
  for (const auto& [reason, n] : actor.metrics().finish_reasons) {
    EXPECT_TRUE(reason == "eos" || reason == "loop" || reason == "length") << reason;
    finished += n;
  }
  EXPECT_EQ(finished, actor.metrics().candidates);
}

TEST(ActorTest, FailedExtractionsAreScoredIntoTheGroupAndExemplarsAreUsed) {
  KF_NEED_TASKS();
  RunFixture run;
  // A kernel in the database: the prompt shows it.
  run.shm->kernels().insert({"001_relu", 1.25, -1, "extern \"C\" int kf_forward() { return 0; }\n", 0});
  auto opts = small_options();
  opts.score_extraction_failures = true;
  Actor actor(opts, test::tiny_policy(0), load_actor_tasks(opts), *run.shm);
  const auto p = actor.build_task_prompt(*test::relu_task(), 1);
  EXPECT_NE(p.text.find("speedup 1.25x"), std::string::npos);
  ASSERT_EQ(actor.step(), StepResult::pushed);
  EXPECT_TRUE(drain(run).empty());  // nothing for the evaluators
  std::vector<rp::ScoredGroup> groups;
  ASSERT_EQ(run.shm->replay().take_ready(groups, 4, 0, 100, std::chrono::seconds(2)), 1u);
  ASSERT_EQ(groups[0].results.size(), 2u);
  for (const auto& r : groups[0].results) {
    EXPECT_EQ(r.verdict, rp::Verdict::compile_error);
    EXPECT_EQ(r.reason.rfind("extract: ", 0), 0u) << r.reason;
    EXPECT_DOUBLE_EQ(r.reward, opts.extraction_failure_reward);
  }
  EXPECT_FALSE(groups[0].deadline_hit);
}

namespace {
std::vector<nlohmann::json> read_json_lines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::istringstream in(kf::test::read_file(path));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}
}  // namespace

// metrics/groups-<id>.jsonl: one line per opened group, naming the prompt it was sampled
// from (exemplars shown and cut) and the group's extraction failures, keyed by the group id
// the verdicts carry.
TEST(ActorTest, EachGroupIsLoggedWithItsPromptAndExtractionFailures) {
  KF_NEED_TASKS();
  RunFixture run;
  std::string body;  // a long exemplar, so a tight context must cut it
  for (int i = 0; i < 40; ++i) body += "  out[" + std::to_string(i) + "] = in[" + std::to_string(i) + "] * 2.0f;\n";
  run.shm->kernels().insert({"001_relu", 1.25, -1, "extern \"C\" int kf_forward() {\n" + body + "  return 0;\n}\n", 0});
  kf::test::TempDir tmp("actor-groups");
  auto opts = small_options();
  opts.score_extraction_failures = true;
  opts.metrics_dir = tmp.path + "/metrics";
  std::size_t full_tokens = 0;
  {
    Actor actor(opts, test::tiny_policy(0), load_actor_tasks(opts), *run.shm);
    full_tokens = actor.build_task_prompt(*test::relu_task(), 1).tokens.size();
    ASSERT_EQ(actor.step(), StepResult::pushed);
  }
  std::vector<rp::ScoredGroup> groups;
  ASSERT_EQ(run.shm->replay().take_ready(groups, 4, 0, 100, std::chrono::seconds(2)), 1u);
  auto lines = read_json_lines(opts.metrics_dir + "/groups-0.jsonl");
  ASSERT_EQ(lines.size(), 1u);
  const auto& g = lines[0];
  EXPECT_EQ(g["group"].get<uint64_t>(), groups[0].group_id);
  EXPECT_EQ(g["task"], "001_relu");
  EXPECT_EQ(g["actor"], 0);
  EXPECT_EQ(g["policy_version"], 0);
  EXPECT_EQ(g["prompt_tokens"].get<std::size_t>(), full_tokens);
  EXPECT_EQ(g["exemplars_offered"], 1);
  EXPECT_EQ(g["exemplars_shown"], 1);
  EXPECT_EQ(g["exemplars_cut"], 0);
  EXPECT_EQ(g["exemplars_dropped"], 0);
  EXPECT_EQ(g["completions"], 2);
  EXPECT_EQ(g["extraction_failures"], 2);  // random weights write no kernel
  uint64_t by_code = 0;
  for (const auto& [code, n] : g["extraction_codes"].items()) by_code += n.get<uint64_t>();
  EXPECT_EQ(by_code, 2u);
  EXPECT_GT(g["t"].get<double>(), 1.7e9);

  // A context 100 tokens short of that prompt: the exemplar is shown cut.
  opts.id = 1;
  opts.context_tokens = static_cast<int64_t>(full_tokens) + opts.max_new_tokens - 100;
  {
    Actor actor(opts, test::tiny_policy(0), load_actor_tasks(opts), *run.shm);
    ASSERT_EQ(actor.step(), StepResult::pushed);
  }
  lines = read_json_lines(opts.metrics_dir + "/groups-1.jsonl");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["exemplars_shown"], 1);
  EXPECT_EQ(lines[0]["exemplars_cut"], 1);
  EXPECT_LE(lines[0]["prompt_tokens"].get<std::size_t>(), full_tokens - 100);
}

TEST(ActorTest, HeldOutTasksAreNeverScheduledAndABadListIsAnError) {
  KF_NEED_TASKS();
  test::TempDir tmp;
  const std::string list = tmp.path + "/heldout.txt";
  test::write_file(list, "# held out\n001_relu   # trailing comment\n\n002_gelu\n001_relu\n");
  auto cfg = [&](const std::string& heldout, const std::string& include) {
    std::vector<std::string> sets = {"tasks.dir=" + test::tasks_dir(), "tasks.levels=[1]", "run.backend=cpu",
                                     "tasks.heldout=" + heldout};
    if (!include.empty()) sets.push_back("tasks.include=[" + include + "]");
    return kf::Config::parse("", "heldout_test", sets);
  };
  auto o = actor_options(cfg(list, ""), 0);
  EXPECT_EQ(o.heldout, (std::vector<std::string>{"001_relu", "002_gelu"}));
  // actors.prompt.enable_thinking: the chat template's own default, or a variable for it.
  EXPECT_EQ(o.chat_vars, "");
  auto think = [&](const std::string& v) {
    return actor_options(kf::Config::parse("", "think_test",
                                           {"tasks.dir=" + test::tasks_dir(), "actors.prompt.enable_thinking=" + v}),
                         0)
        .chat_vars;
  };
  EXPECT_EQ(think("false"), R"({"enable_thinking": false})");
  EXPECT_EQ(think("true"), R"({"enable_thinking": true})");
  EXPECT_THROW(think("maybe"), kf::Error);
  auto names = [](const std::vector<std::shared_ptr<const kf::tasks::Task>>& ts) {
    std::set<std::string> n;
    for (const auto& t : ts) n.insert(t->name());
    return n;
  };
  auto without = names(load_actor_tasks(o, true));
  o.heldout.clear();
  auto with = names(load_actor_tasks(o, true));
  EXPECT_EQ(with.size(), without.size() + 2);
  EXPECT_TRUE(with.count("001_relu") && with.count("002_gelu"));
  EXPECT_FALSE(without.count("001_relu") || without.count("002_gelu"));
  // tasks.include naming a held-out task: the preflight refuses; an actor leaves it out.
  o = actor_options(cfg(list, "001_relu, 004_sigmoid"), 0);
  try {
    load_actor_tasks(o, /*strict=*/true);
    ADD_FAILURE() << "strict selection accepted a held-out tasks.include name";
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'001_relu' is in the held-out list"), std::string::npos) << e.what();
  }
  ASSERT_EQ(load_actor_tasks(o).size(), 1u);
  EXPECT_EQ(load_actor_tasks(o)[0]->name(), "004_sigmoid");
  // A missing file and a line that is not a task name: errors naming key, file and line.
  try {
    actor_options(cfg(tmp.path + "/nope.txt", ""), 0);
    ADD_FAILURE() << "a missing held-out file was accepted";
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tasks.heldout"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("nope.txt"), std::string::npos) << e.what();
  }
  test::write_file(list, "001_relu\n002_gelu 004_sigmoid\n");
  try {
    actor_options(cfg(list, ""), 0);
    ADD_FAILURE() << "a line with two names was accepted";
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find(list + ":2:"), std::string::npos) << e.what();
  }
}

TEST(ActorTest, MissingTasksAreLeftOutAndNoneLeftIsAnError) {
  KF_NEED_TASKS();
  auto opts = small_options();
  opts.include = {"001_relu", "999_not_a_task"};
  EXPECT_EQ(load_actor_tasks(opts).size(), 1u);
  // Strict (the launcher's preflight): the unknown name is an error naming the key.
  try {
    load_actor_tasks(opts, /*strict=*/true);
    ADD_FAILURE() << "strict selection accepted an unknown tasks.include name";
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tasks.include: no task '999_not_a_task'"), std::string::npos) << e.what();
  }
  // tasks.include overrides tasks.levels (config_schema: "empty: all of the chosen levels").
  opts.include = {"001_relu"};
  opts.levels = {2};
  ASSERT_EQ(load_actor_tasks(opts, true).size(), 1u);
  EXPECT_EQ(load_actor_tasks(opts, true)[0]->name(), "001_relu");
  opts.include = {"999_not_a_task"};
  EXPECT_THROW(load_actor_tasks(opts), kf::Error);
  // A context too small for the prompt: the task leaves the schedule; none left -> error.
  RunFixture run;
  opts = small_options();
  opts.context_tokens = 200;
  Actor actor(opts, test::tiny_policy(0), load_actor_tasks(opts), *run.shm);
  EXPECT_EQ(actor.step(), StepResult::no_task);
  EXPECT_THROW(actor.step(), kf::Error);
}

namespace {
void publish(rp::RunShm& shm, ActorPolicy& p, int64_t version) {
  const auto blob = make_weights_blob(p.model, version);
  shm.snapshots().publish(version, blob.data(), blob.size());
}
void score_all(rp::RunShm& shm, const std::vector<rp::Candidate>& cands, const std::vector<double>& rewards) {
  for (std::size_t i = 0; i < cands.size(); ++i) {
    rp::Result r;
    r.candidate_id = cands[i].id;
    r.group_id = cands[i].group_id;
    r.index_in_group = cands[i].index_in_group;
    r.verdict = rewards[i] > 0 ? rp::Verdict::ok : rp::Verdict::compile_error;
    r.reward = rewards[i];
    ASSERT_TRUE(shm.replay().add_result(r));
  }
}
}  // namespace

// The learning-curve probe (actors.probe, docs/metrics.md): actor 0 samples it at version 0
// and then at the first version at or past each multiple of probe_every, before any new
// group; the prompt is fixed at the first probe (a kernel added to the database later
// changes the training prompts, not the probe's) and so is each sample's seed, so the same
// weights write the same completions at every probe, and a restarted actor keeps the prompt.
// Its groups are held until the actor read their results, then recorded and released.
TEST(ActorTest, ProbeDrawsTheSamePromptsAndSeedsAtItsVersionsAndIsRecorded) {
  KF_NEED_TASKS();
  RunFixture run;
  kf::test::TempDir tmp("actor-probe");
  auto opts = small_options();
  opts.metrics_dir = tmp.path + "/metrics";
  opts.template_path = tmp.path + "/template.txt";  // a short prompt: a fast prefill
  kf::test::write_file(opts.template_path, test::kShortTemplate);
  opts.probe_every = 2;
  opts.probe_samples = 3;
  auto weights = test::tiny_policy(0);
  std::vector<std::vector<rp::Candidate>> probes;  // by probe, in index order
  {
    Actor actor(opts, test::tiny_policy(0), load_actor_tasks(opts), *run.shm);
    EXPECT_EQ(actor.probe_task_names(), std::vector<std::string>{"001_relu"});  // the first 4 tasks by name
    auto expect_probe = [&](int64_t version) {
      ASSERT_EQ(actor.step(), StepResult::pushed) << "v" << version;
      auto c = drain(run);
      ASSERT_EQ(c.size(), 3u) << "v" << version;
      for (uint32_t i = 0; i < 3; ++i) {
        EXPECT_TRUE(c[i].probe);
        EXPECT_EQ(c[i].policy_version, version);
        EXPECT_EQ(c[i].index_in_group, i);
        EXPECT_EQ(c[i].turns, 1u);
        EXPECT_EQ(c[i].group_id, c[0].group_id);
      }
      probes.push_back(c);
    };
    auto expect_training = [&](int64_t version, std::vector<rp::Candidate>* out = nullptr) {
      ASSERT_EQ(actor.step(), StepResult::pushed) << "v" << version;
      const auto c = drain(run);
      ASSERT_EQ(c.size(), 2u) << "v" << version;
      for (const auto& x : c) {
        EXPECT_FALSE(x.probe);
        EXPECT_EQ(x.policy_version, version);
      }
      if (out) *out = c;
    };
    expect_probe(0);
    ASSERT_EQ(probes.size(), 1u);
    // Each sample has its own noise: the three completions are not all the same.
    EXPECT_FALSE(probes[0][0].completion_tokens == probes[0][1].completion_tokens &&
                 probes[0][1].completion_tokens == probes[0][2].completion_tokens);
    std::vector<rp::Candidate> t0, t1;
    expect_training(0, &t0);
    ASSERT_EQ(t0.size(), 2u);
    EXPECT_EQ(t0[0].prompt_tokens, probes[0][0].prompt_tokens);  // the database is still empty
    run.shm->kernels().insert({"001_relu", 1.25, -1, "extern \"C\" int kf_forward() { return 0; }\n", 0});
    publish(*run.shm, weights, 1);
    expect_training(1, &t1);  // v1: not a probe version
    ASSERT_EQ(t1.size(), 2u);
    EXPECT_NE(t1[0].prompt_tokens, probes[0][0].prompt_tokens) << "the training prompt shows the new exemplar";
    publish(*run.shm, weights, 2);  // the same weights as v0
    expect_probe(2);
    ASSERT_EQ(probes.size(), 2u);
    for (uint32_t i = 0; i < 3; ++i) {
      EXPECT_EQ(probes[1][i].prompt_tokens, probes[0][i].prompt_tokens) << "the probe prompt is fixed";
      EXPECT_EQ(probes[1][i].completion_tokens, probes[0][i].completion_tokens) << "sample " << i << "'s seed";
      EXPECT_EQ(probes[1][i].behaviour_logprobs, probes[0][i].behaviour_logprobs);
    }
    expect_training(2);
    publish(*run.shm, weights, 3);
    expect_training(3);
    publish(*run.shm, weights, 5);  // past 4: probed at 5, the first version at or past it
    expect_probe(5);
    ASSERT_EQ(probes.size(), 3u);
    expect_training(5);
    EXPECT_TRUE(actor.probe_records().empty()) << "no probe group is scored yet";

    // The evaluators score the probes; the actor reads them at its next step.
    std::vector<rp::ScoredGroup> ready;
    EXPECT_EQ(run.shm->replay().take_ready(ready, 64, 5, 100, std::chrono::milliseconds(0)), 0u)
        << "no group is ready: the training groups and the held probe groups wait for results";
    score_all(*run.shm, probes[0], {-3.0, 1.0, 0.5});
    score_all(*run.shm, probes[1], {1.0, 1.0, 1.0});
    score_all(*run.shm, probes[2], {-3.0, -3.0, 2.0});
    EXPECT_EQ(run.shm->replay().take_ready(ready, 64, 5, 100, std::chrono::milliseconds(0)), 0u)
        << "a scored probe group waits until the actor read it";
    publish(*run.shm, weights, 6);
    expect_probe(6);  // polled at the start of the step
    ASSERT_EQ(actor.probe_records().size(), 3u);
    std::map<int64_t, ProbeRecord> rec;
    for (const auto& r : actor.probe_records()) rec[r.version] = r;
    ASSERT_EQ(rec.count(0) + rec.count(2) + rec.count(5), 3u);
    EXPECT_EQ(rec[0].all.samples, 3u);
    EXPECT_EQ(rec[0].all.scored, 3u);
    EXPECT_EQ(rec[0].all.ok, 2u);
    EXPECT_DOUBLE_EQ(rec[0].reward_mean(), (-3.0 + 1.0 + 0.5) / 3);
    EXPECT_DOUBLE_EQ(rec[0].pass_rate(), 2.0 / 3);
    EXPECT_DOUBLE_EQ(rec[2].reward_mean(), 1.0);
    EXPECT_DOUBLE_EQ(rec[5].pass_rate(), 1.0 / 3);
    EXPECT_EQ(rec[5].tasks.at("001_relu").ok, 1u);
    // Read, then released: the learner takes the three probe groups (and leaves them out).
    ready.clear();
    run.shm->replay().take_ready(ready, 64, 6, 100, std::chrono::milliseconds(0));
    std::size_t probe_groups = 0;
    for (const auto& g : ready) probe_groups += rp::is_probe(g) ? 1 : 0;
    EXPECT_EQ(probe_groups, 3u);
    // The status line's brief: the last probe finished.
    const auto brief = run.shm->control().rendezvous_get("probe", std::chrono::nanoseconds(0));
    ASSERT_TRUE(brief.has_value());
    const auto b = nlohmann::json::parse(*brief);
    EXPECT_EQ(b["version"].get<int64_t>(), actor.probe_records().back().version);
    EXPECT_DOUBLE_EQ(b["reward"].get<double>(), actor.probe_records().back().reward_mean());
  }
  // metrics/probe.jsonl: one line per probe; the group log marks the probe groups.
  const auto lines = read_json_lines(opts.metrics_dir + "/probe.jsonl");
  ASSERT_EQ(lines.size(), 3u);
  for (const auto& l : lines) {
    EXPECT_EQ(l["step"], l["policy_version"]);
    EXPECT_EQ(l["samples"], 3);
    EXPECT_EQ(l["tasks"]["001_relu"]["samples"], 3) << l;
    if (l["policy_version"] == 0) {
      EXPECT_DOUBLE_EQ(l["reward_mean"].get<double>(), (-3.0 + 1.0 + 0.5) / 3);
      EXPECT_DOUBLE_EQ(l["pass_rate"].get<double>(), 2.0 / 3);
    }
  }
  std::size_t probe_lines = 0, group_lines = 0;
  for (const auto& g : read_json_lines(opts.metrics_dir + "/groups-0.jsonl")) {
    ++group_lines;
    probe_lines += g.value("probe", false) ? 1 : 0;
  }
  EXPECT_EQ(probe_lines, 4u);  // v0, v2, v5, v6
  EXPECT_EQ(group_lines, 9u);  // and five training groups

  // A restarted actor 0 keeps the probe prompt (probe-prompts.json), though the database
  // now holds a kernel, and draws the same completions from the same weights.
  {
    Actor again(opts, test::tiny_policy(0), load_actor_tasks(opts), *run.shm);
    ASSERT_EQ(again.step(), StepResult::pushed);
    const auto c = drain(run);
    ASSERT_EQ(c.size(), 3u);
    for (uint32_t i = 0; i < 3; ++i) {
      EXPECT_TRUE(c[i].probe);
      EXPECT_EQ(c[i].policy_version, 6);
      EXPECT_EQ(c[i].prompt_tokens, probes[0][i].prompt_tokens);
      EXPECT_EQ(c[i].completion_tokens, probes[0][i].completion_tokens);
    }
  }
  // Only actor 0 probes; a probe task that does not exist is named.
  opts.id = 1;
  EXPECT_TRUE(Actor(opts, test::tiny_policy(0), load_actor_tasks(opts), *run.shm).probe_task_names().empty());
  opts.id = 0;
  opts.probe_tasks = {"no_such_task"};
  try {
    Actor bad(opts, test::tiny_policy(0), load_actor_tasks(opts), *run.shm);
    FAIL() << "a missing probe task was accepted";
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("actors.probe.tasks"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("no_such_task"), std::string::npos) << e.what();
  }
}
