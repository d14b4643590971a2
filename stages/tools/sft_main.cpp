// kf-sft (tools/sft): stage 1. Trains the byte-level BPE tokenizer on the corpus (unless
// --init names a policy folder to continue from), builds the SFT examples in the actors'
// prompt format, trains the policy on the completions and writes an HF folder to --out.
// Exit codes: 0 done, 1 error (logged with the reason), 2 bad arguments.
#include <sys/stat.h>

#include "kf/common/cli.h"
#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kf/actors/actors.h"
#include "kf/common/config.h"
#include "kf/common/error.h"
#include "kf/common/log.h"
#include "kf/common/run_dir.h"
#include "kf/stages/stages.h"
#include "kf/tasks/tasks.h"

using namespace kf;
using namespace kf::stages;

namespace {

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::size_t p = 0;
  while (p <= s.size()) {
    const auto q = s.find(',', p);
    const auto item = s.substr(p, q == std::string::npos ? std::string::npos : q - p);
    if (!item.empty()) out.push_back(item);
    if (q == std::string::npos) break;
    p = q + 1;
  }
  return out;
}

int64_t percentile(std::vector<int64_t> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * double(v.size() - 1))];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"KernelForge stage 1: tokenizer training and SFT of the policy on the corpus"};
  std::string corpus_dir, out, shape = "small", init, config_file, tasks_dir, backends = "cpu,cuda", device = "cpu",
                               heldout;
  int64_t vocab = 4096, context = 4096;
  int64_t max_new_tokens = 2048;  // configs/default.yaml's and configs/h200.yaml's
  SftOptions so;
  SftDataOptions dopt;
  app.add_option("--corpus", corpus_dir, "corpus folder (manifest.json, kernels/, verified_<backend>.json)")
      ->required();
  app.add_option("--out", out, "output HF folder")->required();
  app.add_option("--shape", shape, "model shape for a fresh policy: tiny, small, medium");
  app.add_option("--vocab", vocab, "tokenizer vocabulary size (specials + 256 bytes + merges)");
  app.add_option("--steps", so.steps, "optimizer steps");
  app.add_option("--batch", so.batch, "sequences per optimizer step");
  app.add_option("--lr", so.lr, "peak learning rate (cosine decay to lr * 0.1)");
  app.add_option("--warmup", so.warmup_steps, "warm-up steps");
  app.add_option("--seed", so.seed, "seed (init, data order, exemplar draws)");
  app.add_option("--init", init, "continue from this HF policy folder (its tokenizer is kept)");
  app.add_option("--config", config_file, "run config whose actors.prompt.* and tasks.dir keys to use");
  app.add_option("--tasks", tasks_dir, "imported tasks folder (default: tasks.dir of --config, else build/tasks)");
  app.add_option("--backends", backends, "corpus backends to train on, comma-separated");
  app.add_option("--exemplars", dopt.exemplars, "K exemplars per contrastive prompt");
  app.add_option("--context", context, "context tokens (prompt + completion); the model's max positions");
  app.add_option("--max-new-tokens", max_new_tokens,
                 "the runs' actors.sampling.max_new_tokens (default: --config's, else 2048): prompts are fitted to "
                 "context minus this, as the actors fit them; 0: only to context minus the completion");
  app.add_option("--threads", so.threads, "torch threads (0: torch's default)");
  app.add_option("--device", device, "where to train: cpu, cuda or cuda:N (fp32 weights, TF32 matmuls on a GPU)");
  app.add_option("--time-limit", so.time_limit_s, "stop training after this many seconds (0: off)");
  app.add_option("--heldout", heldout, "file of held-out task names (tasks/heldout.txt) left out of training");
  KF_CLI_PARSE(app, argc, argv);

  ::mkdir(out.c_str(), 0755);
  log_init("sft", 0, out + "/sft.log");
  torch::Device dev = torch::kCPU;
  try {
    dev = parse_device_option(device);
    dopt.tasks_dir = "build/tasks";
    if (!config_file.empty()) {
      const auto ao = actors::actor_options(Config::load(config_file), 0);
      dopt.tasks_dir = ao.tasks_dir;
      dopt.template_path = ao.template_path;
      dopt.abi_header_path = ao.abi_header_path;
      dopt.exemplars = ao.exemplars;
      dopt.min_exemplar_tokens = ao.min_exemplar_tokens;
      dopt.marker = ao.extract.marker;
      dopt.chat_vars = ao.chat_vars;
      if (ao.context_tokens > 0 && !app.count("--context")) context = ao.context_tokens;
      if (!app.count("--max-new-tokens")) max_new_tokens = ao.max_new_tokens;
    }
    if (max_new_tokens < 0 || (max_new_tokens > 0 && max_new_tokens >= context))
      throw Error("--max-new-tokens " + std::to_string(max_new_tokens) + ": must be 0 or below the context (" +
                  std::to_string(context) + " tokens), which the prompt shares with the completion");
    if (!tasks_dir.empty()) dopt.tasks_dir = tasks_dir;
    dopt.model_dir = init;  // continuing from a folder: its chat template (if any) renders the prompts
    dopt.backends = split_commas(backends);
    dopt.context_tokens = context;
    dopt.max_prompt_tokens = max_new_tokens > 0 ? context - max_new_tokens : 0;
    dopt.seed = so.seed;
  } catch (const Error& e) {
    log_error("sft: bad configuration: ", e.what(), "; exiting (code 2)");
    return 2;
  }
  try {
    const auto t_start = std::chrono::steady_clock::now();
    if (dev.is_cuda()) at::globalContext().setAllowTF32CuBLAS(true);
    auto corpus = load_corpus(corpus_dir);
    std::size_t held_out_kernels = 0;
    if (!heldout.empty()) {
      held_out_kernels = drop_tasks(corpus, tasks::read_task_list(heldout));
      log_info("sft: held-out tasks of ", heldout, ": ", held_out_kernels, " corpus kernels left out");
    }
    log_info("sft: corpus ", corpus_dir, ": ", corpus.kernels.size(), " kernels, ", corpus.tasks("cpu").size(),
             " cpu tasks, ", corpus.tasks("cuda").size(), " cuda tasks");
    policy::Policy pol;
    BpeTrainStats bstats;
    if (!init.empty()) {
      pol = policy::load_policy(init, dev, torch::kFloat32);
      if (!pol.tokenizer) throw Error(init + ": no tokenizer.json (--init needs a policy with its tokenizer)");
      log_info("sft: continuing from ", init);
    } else {
      // Tokenizer text: the examples themselves, built with the byte codec and no
      // budget pressure, so prompts, analyses and kernels are all represented.
      auto raw_opt = dopt;
      raw_opt.context_tokens = int64_t(1) << 40;
      raw_opt.max_prompt_tokens = 0;  // a byte budget would cut the texts the tokenizer must see
      const auto raw = build_sft_examples(corpus, actors::TextCodec::bytes(), 0, raw_opt);
      std::vector<std::string> texts;
      for (const auto& e : raw) texts.push_back(e.prompt + e.completion);
      texts.push_back(read_file(actors::resolve_tree_path(dopt.template_path.empty() ? "configs/prompts/contrastive.txt"
                                                                                     : dopt.template_path)));
      BpeTrainOptions bo;
      bo.vocab_size = vocab;
      const auto t0 = std::chrono::steady_clock::now();
      const auto json = train_bpe_tokenizer(texts, bo, &bstats);
      pol.tokenizer = policy::Tokenizer::from_json(json, out + "/tokenizer.json");
      log_info("sft: tokenizer: ", bstats.vocab, " tokens (", bstats.merges, " merges) from ", texts.size(), " texts, ",
               bstats.unique_words, " distinct words, ",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), " s");
    }
    const auto eos = pol.tokenizer->token_to_id("<|endoftext|>");
    if (!eos) throw Error("tokenizer.json: no <|endoftext|> token (the EOS the actors stop at)");
    const auto codec = actors::TextCodec::bpe(*pol.tokenizer);
    SftBuildStats st;
    const auto examples = build_sft_examples(corpus, codec, *eos, dopt, &st);
    std::vector<int64_t> plen, clen;
    for (const auto& e : examples) {
      plen.push_back(e.prompt_len);
      clen.push_back(static_cast<int64_t>(e.ids.size()) - e.prompt_len);
    }
    log_info("sft: ", st.examples, " examples (skipped: ", st.skipped_unusable, " not ok, ", st.skipped_no_task,
             " without the task, ", st.skipped_too_long, " over ", context, " tokens); prompts fitted to ",
             dopt.max_prompt_tokens > 0 ? std::to_string(dopt.max_prompt_tokens) : std::string("context - completion"),
             " tokens; prompt tokens p50 ", percentile(plen, 0.5), " max ", percentile(plen, 1.0),
             "; completion tokens p50 ", percentile(clen, 0.5), " max ", percentile(clen, 1.0));
    if (examples.empty()) throw Error("no SFT example could be built from " + corpus_dir);
    if (init.empty()) {
      const auto cfg = sft_shape(shape, pol.tokenizer->vocab_size(), context, *eos);
      pol.config = cfg;
      // Built where it trains: the model keeps its device (CausalLM::options()).
      pol.model = policy::CausalLM(cfg, torch::TensorOptions().dtype(torch::kFloat32).device(dev));
      torch::manual_seed(so.seed);
      pol.model->init_random(so.seed);
    }
    const int64_t params = parameter_count(pol.model);
    log_info("sft: model ", init.empty() ? shape : init, ": ", params, " parameters, context ",
             pol.config.max_position_embeddings);
    std::ofstream steps_log(out + "/sft_log.jsonl", std::ios::trunc);
    const auto rep = train_sft(pol.model, examples, so, [&](const SftStepLog& l) {
      nlohmann::json j = {{"step", l.step},           {"loss", l.loss},     {"lr", l.lr},
                          {"grad_norm", l.grad_norm}, {"tokens", l.tokens}, {"seconds", l.seconds}};
      steps_log << j.dump() << "\n" << std::flush;
      log_info("sft: step ", l.step + 1, "/", so.steps, " loss ", l.loss, " lr ", l.lr, " |g| ", l.grad_norm, " ",
               l.seconds, " s");
    });
    save_hf_policy(pol, out);
    nlohmann::json sum = {
        {"corpus", corpus_dir},
        {"corpus_kernels", corpus.kernels.size()},
        {"heldout", heldout},
        {"heldout_kernels_dropped", held_out_kernels},
        {"corpus_tasks_cpu", corpus.tasks("cpu").size()},
        {"corpus_tasks_cuda", corpus.tasks("cuda").size()},
        {"examples", st.examples},
        {"skipped",
         {{"not_ok", st.skipped_unusable}, {"no_task", st.skipped_no_task}, {"too_long", st.skipped_too_long}}},
        {"prompt_budget", dopt.max_prompt_tokens},
        {"prompt_tokens_p50", percentile(plen, 0.5)},
        {"prompt_tokens_max", percentile(plen, 1.0)},
        {"completion_tokens_p50", percentile(clen, 0.5)},
        {"completion_tokens_max", percentile(clen, 1.0)},
        {"shape", init.empty() ? shape : "init:" + init},
        {"parameters", params},
        {"vocab", pol.tokenizer->vocab_size()},
        {"context", pol.config.max_position_embeddings},
        {"steps", rep.steps},
        {"batch", so.batch},
        {"lr", so.lr},
        {"seed", so.seed},
        {"device", device},
        {"first_loss", rep.first_loss},
        {"final_loss", rep.final_loss},
        {"train_seconds", rep.seconds},
        {"total_seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count()},
        {"stopped_by_time", rep.stopped_by_time}};
    write_file_atomic(out + "/sft_summary.json", sum.dump(2) + "\n");
    log_info("sft: wrote ", out, ": loss ", rep.first_loss, " -> ", rep.final_loss, " in ", rep.steps, " steps, ",
             rep.seconds, " s");
    return 0;
  } catch (const std::exception& e) {
    log_error("sft: failed: ", kf::message_of(e), "; nothing more is written (exit 1)");
    return 1;
  }
}
