// Helpers shared by the actor tests: paths, temp dirs, tiny models, the imported task.
#pragma once
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "../test_support.h"
#include "kf/actors/actors.h"
#include "kf/common/error.h"
#include "kf/replay/replay.h"
#include "kf/tasks/tasks.h"

namespace kf::actors::test {

using kf::test::build_dir;
using kf::test::env_or;
using kf::test::read_file;
using kf::test::remove_tree;
using kf::test::source_dir;
using kf::test::write_file;
inline bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}
// The imported suite: $KF_TASKS_DIR, else <build>/tasks, else the tree's build/tasks.
inline std::string tasks_dir() {
  for (const std::string& d : {env_or("KF_TASKS_DIR", ""), build_dir() + "/tasks", source_dir() + "/build/tasks"})
    if (!d.empty() && exists(d + "/001_relu/task.json")) return d;
  return "";
}
inline std::shared_ptr<const tasks::Task> relu_task() {
  const auto d = tasks_dir();
  return d.empty() ? nullptr : tasks::Task::load(d + "/001_relu");
}
#define KF_NEED_TASKS()                                                                   \
  do {                                                                                    \
    if (::kf::actors::test::tasks_dir().empty())                                          \
      GTEST_SKIP() << "task 001_relu is not imported (run setup.sh or set KF_TASKS_DIR)"; \
  } while (0)

struct TempDir : kf::test::TempDir {
  TempDir() : kf::test::TempDir("actors-test") {}
};
inline std::string read_text(const std::string& path) { return read_file(path); }

// A short contrastive template (template files are data; a test may bring its own): the
// prompt stays short, so a tiny model memorises a completion in seconds.
inline constexpr const char* kShortTemplate =
    "=== header ===\nTask {{task}} ({{backend}}):\n"
    "=== exemplars_intro ===\n{{count}} earlier kernels\n"
    "=== exemplar ===\n#{{index}} {{speedup}}x\n{{source}}\n"
    "=== truncated ===\n(cut {{omitted_lines}})\n"
    "=== contrastive_instruction ===\nBeat them: one ```{{lang}} {{marker}} block.\n"
    "=== no_exemplar_instruction ===\nWrite one ```{{lang}} {{marker}} block.\n";

// A tiny byte-level model (the "tiny" init shape), seeded.
inline ActorPolicy tiny_policy(uint64_t seed, int64_t hidden = 64) {
  auto c = init_shape_config("tiny");
  c.hidden_size = hidden;
  c.head_dim = hidden / c.num_attention_heads;
  policy::CausalLM m(c, torch::TensorOptions().dtype(torch::kFloat32));
  m->init_random(seed);
  return make_actor_policy(m, nullptr);
}

// Trains `model` (Adam, lr 3e-3) until teacher-forced argmax reproduces the bytes of
// `completion` then EOS (id 0) after `prompt`, with every top-1 logit ahead of the
// runner-up by more than `margin` (sampling then stays on the memorised text).
// Returns the Adam steps taken, or -1 if `max_steps` were not enough.
inline int memorise(policy::CausalLM model, const std::vector<int32_t>& prompt, const std::string& completion,
                    float margin, int max_steps = 2000) {
  std::vector<int64_t> seq(prompt.begin(), prompt.end());
  for (unsigned char ch : completion) seq.push_back(ch);
  seq.push_back(0);
  const auto ids = torch::tensor(seq).unsqueeze(0);
  const int64_t P = static_cast<int64_t>(prompt.size()), T = static_cast<int64_t>(seq.size());
  const auto target = ids.narrow(1, P, T - P);
  model->train();
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(3e-3));
  for (int step = 0; step < max_steps; ++step) {
    const auto logits = model->forward(ids).narrow(1, P - 1, T - P);
    {
      torch::NoGradGuard ng;
      const auto top2 = logits.topk(2, -1);
      const auto gap = std::get<0>(top2).select(-1, 0) - std::get<0>(top2).select(-1, 1);
      if (std::get<1>(top2).select(-1, 0).eq(target).all().item<bool>() && gap.min().item<float>() > margin) {
        model->eval();
        return step;
      }
    }
    const auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), target.reshape({-1}));
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  model->eval();
  return -1;
}

// Largest |behaviour log-prob - the log-prob of the distribution the sampler draws from| over
// a completion after `prompt`: one full forward of `m`, cut as policy::sampling_logits cuts
// (temperature, top-k, top-p), renormalised. Without a cut it is the learner's recompute.
inline double sampler_logprob_gap(policy::CausalLM& m, const std::vector<int32_t>& prompt,
                                  const std::vector<int32_t>& completion, const std::vector<float>& behaviour,
                                  const policy::SamplingParams& sp, int64_t valid_vocab = 0) {
  std::vector<int64_t> ids(prompt.begin(), prompt.end());
  ids.insert(ids.end(), completion.begin(), completion.end());
  const int64_t T = static_cast<int64_t>(ids.size()), P = static_cast<int64_t>(prompt.size());
  torch::NoGradGuard g;
  const auto dev = m->parameters().front().device();
  const auto logits = m->forward(torch::tensor(ids).unsqueeze(0).to(dev)).narrow(1, P - 1, T - P).squeeze(0);
  const auto lp = torch::log_softmax(policy::sampling_logits(logits, sp, valid_vocab), -1)
                      .gather(-1, torch::tensor(std::vector<int64_t>(ids.begin() + P, ids.end())).to(dev).unsqueeze(-1))
                      .squeeze(-1)
                      .to(torch::kCPU, torch::kFloat64);
  double worst = 0;
  for (int64_t t = 0; t < T - P; ++t)
    worst = std::max(worst, std::abs(lp[t].item<double>() - behaviour[static_cast<std::size_t>(t)]));
  return worst;
}

// A unique run name for shared memory.
inline std::string run_name(const std::string& tag) { return "kfat" + tag + std::to_string(::getpid()); }

// The test as the run's evaluators, through the work seam (replay::shm_candidates).
struct Evaluators {
  std::unique_ptr<replay::CandidateSource> source;
  std::vector<replay::Claim> held;  // claimed by drain(), never completed (still "verifying")
  explicit Evaluators(replay::RunShm& shm) : source(replay::shm_candidates(shm, "test evaluator")) {}

  // Every candidate queued now. Their claims stay open in `held`: the groups get no result
  // from here (a test adds its own), and each open claim keeps its queue slot.
  std::vector<replay::Candidate> drain() {
    std::vector<replay::Candidate> out;
    std::vector<replay::Claim> batch;
    while (source->claim(batch, 64, std::chrono::milliseconds(0)) > 0) {
      for (auto& c : batch) out.push_back(c.candidate);
      held.insert(held.end(), batch.begin(), batch.end());
      batch.clear();
    }
    return out;
  }
  // Completes `c` as an evaluator that found no kernel (compile_error, reward -1); a result
  // that cannot be stored drops the claim, as the evaluator loop does.
  void complete(const replay::Claim& c) {
    replay::Result r;
    r.candidate_id = c.candidate.id;
    r.group_id = c.candidate.group_id;
    r.index_in_group = c.candidate.index_in_group;
    r.verdict = replay::Verdict::compile_error;
    r.reason = "scored by the test";
    r.reward = -1;
    try {
      source->complete(c, r);
    } catch (const Error&) {
      source->drop(c);
    }
  }
  // Claims up to `max` candidates (waiting up to `wait` for the first) and completes each.
  std::vector<replay::Candidate> score(std::size_t max, std::chrono::milliseconds wait) {
    std::vector<replay::Claim> batch;
    source->claim(batch, max, wait);
    std::vector<replay::Candidate> out;
    for (const auto& c : batch) {
      complete(c);
      out.push_back(c.candidate);
    }
    return out;
  }
};

// A run's shared memory for actor tests (room for a few groups of small candidates), in
// state running, with the test as its evaluators; shut down at the end.
struct RunFixture {
  std::string name;
  std::unique_ptr<replay::RunShm> shm;
  std::unique_ptr<Evaluators> evaluators;
  explicit RunFixture(const std::string& tag = "a", uint32_t replay_groups = 16) : name(run_name(tag)) {
    replay::RunShmConfig c;
    c.candidates = {256, 256 * 1024};  // room for the claims drain() keeps open
    c.replay.capacity = replay_groups;
    c.replay.group_bytes = 4u << 20;
    c.kernels = {64, 64 * 1024, 16};
    c.snapshot.max_bytes = 8u << 20;
    shm = replay::RunShm::create(name, c);
    shm->control().set_state(replay::RunState::running);
    evaluators = std::make_unique<Evaluators>(*shm);
  }
  ~RunFixture() {
    evaluators.reset();
    shm->shutdown();
  }
  std::vector<replay::Candidate> drain() { return evaluators->drain(); }
};

// One task (001_relu), groups of 2, 12 new tokens, the shipped contrastive template; every
// candidate goes through the queue.
inline ActorOptions small_options() {
  ActorOptions o;
  o.tasks_dir = tasks_dir();
  o.include = {"001_relu"};
  o.group_size = 2;
  o.max_new_tokens = 12;
  o.context_tokens = 8192;
  o.exemplars = 2;
  o.template_path = source_dir() + "/configs/prompts/contrastive.txt";
  o.abi_header_path = source_dir() + "/evaluator/include/kf/kernel.h";
  o.score_extraction_failures = false;
  return o;
}

}  // namespace kf::actors::test
