// kf-selfsup (tools/selfsup): stage 2. R rounds of: sample N completions per corpus task
// with the current policy, verify them with the real evaluator, keep the correct ones,
// retrain on corpus + kept. Writes the policy and <out>/selfsup.jsonl (one line a round).
// Exit codes: 0 done, 1 error (logged with the reason), 2 bad arguments.
#include <sys/stat.h>

#include "kf/common/cli.h"
#include <cstdio>

#include "kf/common/error.h"
#include "kf/common/log.h"
#include "kf/stages/stages.h"
#include "kf/tasks/tasks.h"

using namespace kf;
using namespace kf::stages;

int main(int argc, char** argv) {
  CLI::App app{"KernelForge stage 2: sample, verify, keep correct kernels, retrain"};
  std::string model_dir, corpus_dir, backends = "cpu,cuda", device = "cpu", heldout;
  SelfsupOptions o;
  o.data.tasks_dir = "build/tasks";
  o.data.context_tokens = 0;
  int eval_trials = 5, threads = 2;
  app.add_option("--model", model_dir, "HF policy folder to start from (tools/sft output)")->required();
  app.add_option("--corpus", corpus_dir, "corpus folder")->required();
  app.add_option("--out", o.out_dir, "output folder (policy, selfsup.jsonl)")->required();
  app.add_option("--rounds", o.rounds, "rounds R");
  app.add_option("--samples", o.samples, "completions per task per round N");
  app.add_option("--backend", o.backend, "backend the kernels are written and verified for");
  app.add_option("--tasks", o.data.tasks_dir, "imported tasks folder");
  app.add_option("--max-tasks", o.max_tasks, "use only the first N corpus tasks (0: all)");
  app.add_option("--include", o.include, "sample only these tasks (comma-separated); retraining uses the whole corpus")
      ->delimiter(',');
  app.add_option("--max-new-tokens", o.max_new_tokens, "completion budget per sample");
  app.add_option("--loop-repeats", o.loop_repeats, "stop a sample once a block repeats this often (0: off)");
  app.add_option("--temperature", o.temperature, "sampling temperature");
  app.add_option("--top-p", o.top_p, "nucleus sampling p");
  app.add_option("--top-k", o.top_k, "sample from the k most likely tokens (0: off)");
  app.add_option("--exemplars", o.data.exemplars, "K exemplars per prompt");
  app.add_option("--min-exemplar-tokens", o.data.min_exemplar_tokens,
                 "an exemplar is dropped rather than cut below this many tokens (actors.prompt.min_exemplar_tokens; "
                 "above every exemplar's length: never cut)");
  app.add_option("--seed", o.seed, "seed");
  app.add_option("--steps", o.train.steps, "retraining steps per round");
  app.add_option("--batch", o.train.batch, "sequences per retraining step");
  app.add_option("--lr", o.train.lr, "retraining peak learning rate");
  app.add_option("--train-backends", backends, "corpus backends whose SFT examples the retraining includes");
  app.add_option("--eval-trials", eval_trials, "timed trials per verified kernel");
  app.add_option("--time-limit", o.time_limit_s,
                 "seconds after which no task is sampled and no sample verified "
                 "(the round retrains on what it kept; 0: none)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--device", device, "where the policy samples and retrains: cpu, cuda or cuda:N (fp32)");
  app.add_option("--threads", threads, "torch and evaluator CPU threads");
  app.add_option("--heldout", heldout, "file of held-out task names (tasks/heldout.txt): never sampled nor trained on");
  KF_CLI_PARSE(app, argc, argv);
  o.train.lr = app.count("--lr") ? o.train.lr : 3e-4;
  o.train.warmup_steps = std::min<int64_t>(10, o.train.steps / 5);
  o.train.threads = threads;

  ::mkdir(o.out_dir.c_str(), 0755);
  log_init("selfsup", 0, o.out_dir + "/selfsup.log");
  torch::Device dev = torch::kCPU;
  try {
    dev = parse_device_option(device);
    if (o.data.min_exemplar_tokens < 1)
      throw Error("--min-exemplar-tokens " + std::to_string(o.data.min_exemplar_tokens) + ": must be >= 1");
  } catch (const Error& e) {
    log_error("selfsup: bad arguments: ", e.what(), "; exiting (code 2)");
    return 2;
  }
  try {
    at::set_num_threads(threads);
    if (dev.is_cuda()) at::globalContext().setAllowTF32CuBLAS(true);
    auto pol = policy::load_policy(model_dir, dev, torch::kFloat32);
    o.data.model_dir = model_dir;  // its chat template (if any) renders the prompts
    if (!pol.tokenizer) throw Error(model_dir + ": no tokenizer.json");
    auto corpus = load_corpus(corpus_dir);
    if (!heldout.empty())
      log_info("selfsup: held-out tasks of ", heldout, ": ", drop_tasks(corpus, tasks::read_task_list(heldout)),
               " corpus kernels left out");
    o.data.context_tokens = pol.config.max_position_embeddings;
    // The retraining corpus examples get the prompt budget the samples have (as tools/sft's
    // do); a --max-new-tokens that leaves none is run_selfsup's error.
    if (o.max_new_tokens < o.data.context_tokens) o.data.max_prompt_tokens = o.data.context_tokens - o.max_new_tokens;
    auto base_opt = o.data;
    base_opt.backends.clear();
    for (std::size_t p = 0; p <= backends.size();) {
      const auto q = backends.find(',', p);
      const auto b = backends.substr(p, q == std::string::npos ? std::string::npos : q - p);
      if (!b.empty()) base_opt.backends.push_back(b);
      if (q == std::string::npos) break;
      p = q + 1;
    }
    const auto eos = static_cast<int32_t>(pol.config.eos_token_ids.at(0));
    const auto base = build_sft_examples(corpus, actors::TextCodec::bpe(*pol.tokenizer), eos, base_opt);
    log_info("selfsup: ", base.size(), " corpus SFT examples for retraining");

    evaluator::EvalOptions eo;
    // eo.compile.cache_dir stays empty: $KF_EVAL_CACHE or /tmp/kf-eval-cache-<uid>, outside
    // the policy folder (which may be committed).
    eo.correctness_sets = 2;
    eo.stress_sets = 2;
    eo.warmup = 1;
    eo.trials = eval_trials;
    eo.max_trials = eval_trials;
    eo.max_spread = 100;  // a shared 2-core machine: record the time, never give up on spread
    eo.cpu_threads = threads;
    evaluator::Evaluator ev(eo);
    const auto rounds = run_selfsup(pol, corpus, base, ev, o);
    std::printf("%6s %8s %10s %10s %10s %14s\n", "round", "samples", "extracted", "compiled", "correct", "speedup(ok)");
    for (const auto& r : rounds) {
      auto pct = [&](int64_t x) { return r.samples ? 100.0 * double(x) / double(r.samples) : 0.0; };
      std::printf("%6lld %8lld %9.1f%% %9.1f%% %9.1f%% %14.2f\n", (long long)r.round, (long long)r.samples,
                  pct(r.extracted), pct(r.compiled), pct(r.correct), r.mean_speedup_correct);
    }
    // Per task: the prompt's exemplars (shown of offered, cut) beside what the samples gave.
    std::printf("\n%6s %-28s %-18s %6s %8s %10s %9s %8s %12s\n", "round", "task", "prompt", "shown", "samples",
                "extracted", "compiled", "correct", "speedup(ok)");
    for (const auto& r : rounds)
      for (const auto& t : r.per_task)
        std::printf("%6lld %-28s %-18s %3zu/%-2zu %8lld %10lld %9lld %8lld %12.2f\n", (long long)r.round,
                    t.task.c_str(), t.prompt_kind().c_str(), t.exemplars_shown, t.exemplars_offered,
                    (long long)t.samples, (long long)t.extracted, (long long)t.compiled, (long long)t.correct,
                    t.mean_speedup_correct);
    return 0;
  } catch (const std::exception& e) {
    log_error("selfsup: failed: ", kf::message_of(e), "; the rounds finished so far are in ", o.out_dir,
              "/selfsup.jsonl (exit 1)");
    return 1;
  }
}
