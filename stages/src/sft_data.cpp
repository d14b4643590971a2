#include "sft_data.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>

#include "kf/actors/actors.h"
#include "kf/common/error.h"
#include "kf/common/log.h"
#include "kf/common/run_dir.h"
#include "kf/tasks/tasks.h"

namespace kf::stages {
namespace {

std::string fmt2(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", x);
  return b;
}

// A technique sentence as a clause: trimmed, final period dropped.
std::string clause(const std::string& t) {
  std::string s = t;
  while (!s.empty() && (s.back() == '.' || s.back() == ' ' || s.back() == '\n')) s.pop_back();
  const auto b = s.find_first_not_of(" \n");
  return b == std::string::npos ? std::string("no description") : s.substr(b);
}

uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

uint64_t hash_str(const std::string& s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return h;
}

}  // namespace

std::vector<const CorpusKernel*> pick_exemplars(std::vector<const CorpusKernel*> pool, std::size_t k, uint64_t seed) {
  std::stable_sort(pool.begin(), pool.end(),
                   [](const CorpusKernel* a, const CorpusKernel* b) { return a->speedup < b->speedup; });
  if (k == 0) return {};
  if (pool.size() <= k) return pool;
  // KernelDb::exemplars: bucket b covers [b*n/k, (b+1)*n/k) of the sorted list.
  std::mt19937_64 rng(seed);
  std::vector<const CorpusKernel*> out;
  const std::size_t n = pool.size();
  for (std::size_t b = 0; b < k; ++b) {
    std::uniform_int_distribution<std::size_t> pick(b * n / k, (b + 1) * n / k - 1);
    out.push_back(pool[pick(rng)]);
  }
  return out;
}

std::string completion_text(const CorpusKernel& target, const std::vector<const CorpusKernel*>& shown,
                            const std::string& lang, const std::string& marker) {
  std::string s;
  if (shown.empty()) {
    s += "Analysis: task " + target.task + " on the " + target.backend +
         " backend; the time goes into reading the inputs and writing every output element once.\n";
  } else {
    s += "Analysis:\n";
    for (std::size_t i = 0; i < shown.size(); ++i)
      s += "- Kernel " + std::to_string(i + 1) + " (" + fmt2(shown[i]->speedup) + "x): " + clause(shown[i]->technique) +
           ".\n";
    if (shown.size() > 1) {
      const double lo = shown.front()->speedup, hi = shown.back()->speedup;
      s += "Kernel " + std::to_string(shown.size()) + " is the fastest shown (" + fmt2(hi) + "x against " + fmt2(lo) +
           "x for kernel 1): " + clause(shown.back()->technique) + ".\n";
    }
  }
  s += "Plan: " + clause(target.technique) + ".\n";
  std::string src = target.source;
  if (!src.empty() && src.back() != '\n') src += '\n';
  s += "```" + lang + " " + marker + "\n" + src + "```\n";
  return s;
}

SftExample make_example(const actors::Prompt& prompt, const std::string& completion, const actors::TextCodec& codec,
                        int32_t eos_id) {
  SftExample e;
  e.prompt = prompt.text;
  e.completion = completion;
  e.ids = prompt.tokens;
  e.prompt_len = static_cast<int64_t>(e.ids.size());
  const auto c = codec.encode(completion);
  e.ids.insert(e.ids.end(), c.begin(), c.end());
  e.ids.push_back(eos_id);
  e.exemplars_shown = static_cast<int64_t>(prompt.shown.size());
  return e;
}

actors::PromptTemplate load_template(const SftDataOptions& o) {
  return actors::PromptTemplate::load(
      actors::resolve_tree_path(o.template_path.empty() ? "configs/prompts/contrastive.txt" : o.template_path));
}

std::string load_abi(const SftDataOptions& o) {
  return actors::compact_abi(read_file(
      actors::resolve_tree_path(o.abi_header_path.empty() ? "evaluator/include/kf/kernel.h" : o.abi_header_path)));
}

TaskPrompt task_prompt(const actors::PromptTemplate& tpl, const std::string& abi, const actors::TextCodec& codec,
                       const actors::TaskInfo& task, const std::vector<const CorpusKernel*>& pool, int64_t k,
                       uint64_t seed, std::size_t max_tokens, const SftDataOptions& opts) {
  TaskPrompt tp;
  const auto ex = pick_exemplars(pool, static_cast<std::size_t>(std::max<int64_t>(0, k)), seed);
  std::vector<actors::ExemplarIn> in;
  for (const auto* e : ex) in.push_back({e->speedup, -1, "ok", e->source});  // -1: seeded from files
  actors::PromptOptions po;
  po.mode = actors::PromptMode::contrastive;
  po.max_tokens = max_tokens;
  po.min_exemplar_tokens = static_cast<std::size_t>(opts.min_exemplar_tokens);
  po.marker = opts.marker;
  po.abi = abi;
  po.chat = policy::ChatTemplate::for_model(opts.model_dir, opts.chat_vars);
  tp.prompt = actors::build_prompt(tpl, codec, task, in, po);
  // build_prompt keeps the order and drops from the middle: match the kept speedups in order.
  std::size_t j = 0;
  for (const auto& s : tp.prompt.shown) {
    while (j < ex.size() && ex[j]->speedup != s.speedup) ++j;
    if (j < ex.size()) tp.shown.push_back(ex[j++]);
  }
  return tp;
}

std::vector<SftExample> build_sft_examples(const Corpus& corpus, const actors::TextCodec& codec, int32_t eos_id,
                                           const SftDataOptions& opts, SftBuildStats* stats) {
  SftBuildStats st;
  const auto tpl = load_template(opts);
  const std::string abi = load_abi(opts);
  std::vector<SftExample> out;
  std::map<std::string, std::shared_ptr<const tasks::Task>> loaded;
  for (const auto& backend : opts.backends) {
    const auto b = tasks::parse_backend(backend);
    const std::string lang = b == tasks::Backend::CUDA ? "cuda" : "cpp";
    for (const auto& name : corpus.tasks(backend)) {
      std::shared_ptr<const tasks::Task> task;
      try {
        task = tasks::Task::load(opts.tasks_dir + "/" + name);
      } catch (const Error& e) {
        log_warn("sft: task ", name, " is not usable from ", opts.tasks_dir, " (", e.what(),
                 "); its corpus kernels are skipped");
      }
      std::vector<const CorpusKernel*> all;
      for (const auto& k : corpus.kernels)
        if (k.task == name && k.backend == backend) all.push_back(&k);
      if (task && !task->has_backend(b)) {
        log_warn("sft: task ", name, " has no ", backend, " artifact in ", opts.tasks_dir,
                 " (import it with --backends ", backend, "); its ", all.size(), " kernels are skipped");
        task = nullptr;
      }
      if (!task) {
        st.skipped_no_task += static_cast<int64_t>(all.size());
        continue;
      }
      const auto info = actors::task_info(*task, b);
      for (const auto* target : all) {
        if (!target->usable()) {
          ++st.skipped_unusable;
          continue;
        }
        std::vector<const CorpusKernel*> others;
        for (const auto* k : all)
          if (k != target && k->measured && k->verdict == "ok") others.push_back(k);
        const uint64_t seed = mix(opts.seed ^ hash_str(target->file));
        auto emit = [&](const std::vector<const CorpusKernel*>& pool, int64_t k) {
          // The completion is fixed by the exemplars shown, and the prompt must leave room
          // for it: fit with the budget left after a completion written for all K.
          const auto full = pick_exemplars(pool, static_cast<std::size_t>(std::max<int64_t>(0, k)), seed);
          const auto c_tokens =
              static_cast<int64_t>(codec.count(completion_text(*target, full, lang, opts.marker))) + 1;
          int64_t budget = opts.context_tokens - c_tokens - 16;  // slack: shown may shrink the analysis
          if (opts.max_prompt_tokens > 0) budget = std::min(budget, opts.max_prompt_tokens);
          if (budget <= 0) {
            ++st.skipped_too_long;
            return;
          }
          TaskPrompt tp;
          try {
            tp = task_prompt(tpl, abi, codec, info, pool, k, seed, static_cast<std::size_t>(budget), opts);
          } catch (const Error& e) {
            ++st.skipped_too_long;
            log_warn("sft: ", target->file, ": ", e.what(), "; example skipped");
            return;
          }
          auto ex = make_example(tp.prompt, completion_text(*target, tp.shown, lang, opts.marker), codec, eos_id);
          if (static_cast<int64_t>(ex.ids.size()) > opts.context_tokens) {
            ++st.skipped_too_long;
            return;
          }
          ex.task = name;
          ex.backend = backend;
          ex.file = target->file;
          out.push_back(std::move(ex));
        };
        if (!others.empty()) emit(others, opts.exemplars);
        if (others.empty() || opts.no_exemplar_copy) emit({}, 0);
      }
    }
  }
  st.examples = static_cast<int64_t>(out.size());
  if (stats) *stats = st;
  return out;
}

}  // namespace kf::stages
