#include "kf/stages/stages.h"
#include "sft_data.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "kf/actors/actors.h"
#include "kf/common/error.h"
#include "kf/common/log.h"
#include "kf/evaluator/evaluator.h"
#include "kf/policy/policy.h"
#include "kf/tasks/tasks.h"

namespace kf::stages {
namespace {

using Clock = std::chrono::steady_clock;
double secs(Clock::time_point a) { return std::chrono::duration<double>(Clock::now() - a).count(); }

uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

double pct(int64_t a, int64_t b) { return b ? 100.0 * double(a) / double(b) : 0.0; }

}  // namespace

std::string TaskRoundStats::prompt_kind() const {
  if (exemplars_shown == 0) return "no exemplars";
  return exemplars_cut > 0 ? "an exemplar cut" : "exemplars in full";
}

std::string RoundStats::json() const {
  nlohmann::json tasks_json = nlohmann::json::array();
  for (const auto& t : per_task)
    tasks_json.push_back({{"task", t.task},
                          {"prompt", t.prompt_kind()},
                          {"exemplars_offered", t.exemplars_offered},
                          {"exemplars_shown", t.exemplars_shown},
                          {"exemplars_cut", t.exemplars_cut},
                          {"samples", t.samples},
                          {"extracted", t.extracted},
                          {"compiled", t.compiled},
                          {"correct", t.correct},
                          {"mean_speedup_correct", t.mean_speedup_correct}});
  nlohmann::json j = {{"round", round},
                      {"tasks", tasks},
                      {"samples", samples},
                      {"extracted", extracted},
                      {"compiled", compiled},
                      {"correct", correct},
                      {"extracted_pct", pct(extracted, samples)},
                      {"compiled_pct", pct(compiled, samples)},
                      {"correct_pct", pct(correct, samples)},
                      {"mean_speedup_correct", mean_speedup_correct},
                      {"kept_new", kept},
                      {"unexamined", unexamined},
                      {"out_of_memory", out_of_memory},
                      {"sample_s", sample_s},
                      {"eval_s", eval_s},
                      {"train_s", train_s},
                      {"final_loss", final_loss},
                      {"extract_failures", extract_failures},
                      {"per_task", tasks_json}};
  return j.dump();
}

std::vector<RoundStats> run_selfsup(policy::Policy& pol, const Corpus& corpus, const std::vector<SftExample>& base,
                                    evaluator::Evaluator& ev, const SelfsupOptions& o) {
  if (!pol.tokenizer) throw Error("selfsup: the policy has no tokenizer.json");
  if (o.rounds <= 0 || o.samples <= 0) throw Error("selfsup: --rounds and --samples must be positive");
  if (pol.config.eos_token_ids.empty()) throw Error("selfsup: the policy's config.json has no eos_token_id");
  const auto backend = tasks::parse_backend(o.backend);
  const std::string lang = backend == tasks::Backend::CUDA ? "cuda" : "cpp";
  const auto codec = actors::TextCodec::bpe(*pol.tokenizer);
  const int32_t eos = static_cast<int32_t>(pol.config.eos_token_ids[0]);
  const auto tpl = load_template(o.data);
  const std::string abi = load_abi(o.data);
  const int64_t context = o.data.context_tokens > 0 ? o.data.context_tokens : pol.config.max_position_embeddings;
  if (context <= o.max_new_tokens)
    throw Error("selfsup: context " + std::to_string(context) + " tokens must exceed --max-new-tokens " +
                std::to_string(o.max_new_tokens));

  struct TaskState {
    std::shared_ptr<const tasks::Task> task;
    actors::TaskInfo info;
    std::vector<const CorpusKernel*> pool;  // measured ok kernels: the exemplars
  };
  std::deque<CorpusKernel> kept_kernels;  // stable addresses for the pools
  std::vector<TaskState> states;
  std::set<std::string> seen;  // sources already known (corpus and kept)
  for (const auto& k : corpus.kernels) seen.insert(k.source);
  const auto names = corpus.tasks(o.backend);
  for (const auto& name : o.include)
    if (std::find(names.begin(), names.end(), name) == names.end())
      throw Error("selfsup: --include: task '" + name + "' has no " + o.backend +
                  " kernel in the corpus (misspelt, held out, or not a corpus task)");
  for (const auto& name : names) {
    if (!o.include.empty() && std::find(o.include.begin(), o.include.end(), name) == o.include.end()) continue;
    if (o.max_tasks > 0 && static_cast<int64_t>(states.size()) >= o.max_tasks) break;
    TaskState s;
    try {
      s.task = tasks::Task::load(o.data.tasks_dir + "/" + name);
    } catch (const Error& e) {
      log_warn("selfsup: task ", name, " cannot be loaded (", e.what(), "); skipped");
      continue;
    }
    if (!s.task->has_backend(backend)) {
      log_warn("selfsup: task ", name, " has no ", o.backend, " artifact; skipped");
      continue;
    }
    s.info = actors::task_info(*s.task, backend);
    for (const auto& k : corpus.kernels)
      if (k.task == name && k.backend == o.backend && k.measured && k.verdict == "ok") s.pool.push_back(&k);
    states.push_back(std::move(s));
  }
  if (states.empty())
    throw Error("selfsup: no corpus task usable for backend " + o.backend + " in " + o.data.tasks_dir);

  std::vector<SftExample> kept_examples;
  std::vector<RoundStats> rounds;
  // On a GPU that evaluators share (a run beside this, scoring), sampling and retraining
  // hold the timing lock shared like an actor and a learner: no trial is timed while
  // this process's kernels run. Inactive on the CPU.
  policy::GpuShare gpu_share(pol.model->options().device());
  std::ofstream jsonl(o.out_dir + "/selfsup.jsonl", std::ios::app);
  if (!jsonl) throw Error("selfsup: cannot write " + o.out_dir + "/selfsup.jsonl");
  const auto start = Clock::now();
  auto out_of_time = [&] { return o.time_limit_s > 0 && secs(start) >= o.time_limit_s; };
  for (int64_t r = 1; r <= o.rounds && !(r > 1 && out_of_time()); ++r) {
    RoundStats rs;
    rs.round = r;
    double speedup_sum = 0;
    std::vector<SftExample> new_examples;
    for (std::size_t ti = 0; ti < states.size(); ++ti) {
      auto& st = states[ti];
      if (ti > 0 && out_of_time()) {
        log_info("selfsup: round ", r, ": time limit of ", o.time_limit_s, " s reached; ", states.size() - ti,
                 " tasks not sampled, retraining on what was kept");
        break;
      }
      const uint64_t seed = mix(o.seed ^ mix(uint64_t(r) * 1000003ULL + ti));
      TaskPrompt tp;
      try {
        tp = task_prompt(tpl, abi, codec, st.info, st.pool, o.data.exemplars, seed,
                         static_cast<std::size_t>(context - o.max_new_tokens), o.data);
      } catch (const Error& e) {
        log_warn("selfsup: round ", r, ": ", e.what(), "; task skipped this round");
        continue;
      }
      ++rs.tasks;
      TaskRoundStats ts;
      ts.task = st.task->name();
      ts.exemplars_offered = tp.prompt.offered;
      ts.exemplars_shown = tp.prompt.shown.size();
      ts.exemplars_cut = tp.prompt.truncated;
      // The task's counts are what the round's counters gain while it is sampled.
      const int64_t samples0 = rs.samples, extracted0 = rs.extracted, compiled0 = rs.compiled, correct0 = rs.correct;
      const double speedup0 = speedup_sum;
      policy::SamplingParams sp = actors::sampling_params_of(o, pol.config.eos_token_ids, seed);
      sp.gpu_share = &gpu_share;
      const int64_t valid = std::min<int64_t>(pol.tokenizer->vocab_size(), pol.config.vocab_size);
      auto t0 = Clock::now();
      actors::ExtractOptions extract;
      extract.marker = o.data.marker;  // the fence the SFT examples taught
      auto comps = actors::rollout_group(pol.model, codec, tp.prompt.tokens, o.samples, sp, valid, extract);
      rs.sample_s += secs(t0);
      t0 = Clock::now();
      std::map<std::string, evaluator::Result> evaluated;  // identical samples are verified once
      for (const auto& c : comps) {
        if (out_of_time()) {
          ++rs.unexamined;
          continue;
        }
        ++rs.samples;
        const std::string& text = c.text;
        const auto& ex = c.kernel;
        if (!ex.ok) {
          ++rs.extract_failures[ex.code];
          continue;
        }
        ++rs.extracted;
        auto it = evaluated.find(ex.source);
        const bool first = it == evaluated.end();
        if (first) {
          bool gave_up = false;
          auto res = evaluator::evaluate_retrying_oom(ev, *st.task, backend, ex.source, seed, o.oom_attempts,
                                                      o.oom_retry_delay, &gave_up);
          if (gave_up) {  // the machine's verdict, not the policy's: outside the rates
            --rs.samples, --rs.extracted;
            ++rs.out_of_memory;
            continue;
          }
          it = evaluated.emplace(ex.source, std::move(res)).first;
        }
        const auto& res = it->second;
        if (res.verdict != evaluator::Verdict::compile_error) ++rs.compiled;
        if (!res.ok()) continue;
        ++rs.correct;
        speedup_sum += res.speedup;
        if (!first || seen.count(ex.source)) continue;
        seen.insert(ex.source);
        CorpusKernel k;
        k.task = st.task->name();
        k.backend = o.backend;
        k.file = "selfsup/round-" + std::to_string(r) + "/" + k.task + "-" + std::to_string(rs.kept);
        k.technique = "a kernel the policy wrote in self-supervised round " + std::to_string(r);
        k.source = ex.source;
        k.measured = true;
        k.verdict = "ok";
        k.speedup = res.speedup;
        kept_kernels.push_back(k);
        st.pool.push_back(&kept_kernels.back());
        auto sft = make_example(tp.prompt, text, codec, eos);
        sft.task = k.task;
        sft.backend = k.backend;
        sft.file = k.file;
        if (static_cast<int64_t>(sft.ids.size()) <= context) new_examples.push_back(std::move(sft));
        ++rs.kept;
      }
      rs.eval_s += secs(t0);
      ts.samples = rs.samples - samples0;
      ts.extracted = rs.extracted - extracted0;
      ts.compiled = rs.compiled - compiled0;
      ts.correct = rs.correct - correct0;
      ts.mean_speedup_correct = ts.correct ? (speedup_sum - speedup0) / double(ts.correct) : 0.0;
      log_info("selfsup: round ", r, " task ", ts.task, " (", ts.prompt_kind(), ": ", ts.exemplars_shown, " of ",
               ts.exemplars_offered, " shown, ", ts.exemplars_cut, " cut): ", comps.size(), " samples, ", ts.correct,
               " correct; ", rs.correct, " correct so far this round");
      rs.per_task.push_back(std::move(ts));
    }
    rs.mean_speedup_correct = rs.correct ? speedup_sum / double(rs.correct) : 0.0;
    kept_examples.insert(kept_examples.end(), new_examples.begin(), new_examples.end());
    std::vector<SftExample> all = base;
    all.insert(all.end(), kept_examples.begin(), kept_examples.end());
    const auto t0 = Clock::now();
    auto train = o.train;
    train.seed = o.train.seed ^ mix(uint64_t(r));
    SftReport rep;
    {
      // Held through the retraining, let go between steps so a waiting trial runs.
      policy::GpuShare::Scope share(&gpu_share);
      rep = train_sft(pol.model, all, train, [&](const SftStepLog&) { gpu_share.pause_point(); });
    }
    rs.train_s = secs(t0);
    rs.final_loss = rep.final_loss;
    save_hf_policy(pol, o.out_dir, o.max_new_tokens);
    log_info("selfsup: ", rs.json());
    jsonl << rs.json() << "\n" << std::flush;
    rounds.push_back(rs);
  }
  return rounds;
}

}  // namespace kf::stages
