#include "kf/stages/stages.h"

#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <random>
#include <torch/cuda.h>

#include "kf/common/error.h"
#include "kf/common/log.h"
#include "kf/common/run_dir.h"

namespace kf::stages {

policy::ModelConfig sft_shape(const std::string& name, int64_t vocab, int64_t max_positions, int64_t eos_id) {
  policy::ModelConfig c;
  c.model_type = "qwen2";
  c.qkv_bias = true;
  c.rope.theta = 1e6;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = true;  // the embedding is a large share of a small model
  c.vocab_size = vocab;
  c.max_position_embeddings = max_positions;
  c.eos_token_ids = {eos_id};
  c.dtype = "float32";
  auto set = [&](int64_t hidden, int64_t inter, int64_t layers, int64_t heads, int64_t kv) {
    c.hidden_size = hidden;
    c.intermediate_size = inter;
    c.num_hidden_layers = layers;
    c.num_attention_heads = heads;
    c.num_key_value_heads = kv;
    c.head_dim = hidden / heads;
  };
  if (name == "tiny")
    set(64, 128, 2, 4, 2);
  else if (name == "small")
    set(256, 768, 6, 4, 2);
  else if (name == "medium")
    set(384, 1024, 8, 6, 2);
  else
    throw Error("--shape: unknown model shape '" + name + "' (tiny, small, medium)");
  c.validate("--shape " + name);
  return c;
}

int64_t parameter_count(policy::CausalLM& model) {
  int64_t n = 0;
  for (const auto& p : model->parameters()) n += p.numel();
  return n;
}

torch::Device parse_device_option(const std::string& value) {
  std::optional<torch::Device> dev;
  try {
    dev.emplace(value);
  } catch (const c10::Error&) {
    throw Error("--device " + value + ": not a device (cpu, cuda or cuda:N)");
  }
  if (dev->is_cuda()) {
    const int64_t n = torch::cuda::is_available() ? static_cast<int64_t>(torch::cuda::device_count()) : 0;
    if (n == 0) throw Error("--device " + value + ": no CUDA device is visible");
    if (dev->has_index() && dev->index() >= n)
      throw Error("--device " + value + ": only " + std::to_string(n) + " CUDA device(s) visible");
  } else if (!dev->is_cpu()) {
    throw Error("--device " + value + ": only cpu and cuda are supported");
  }
  return *dev;
}

namespace {

// Sum of completion-token cross-entropies of one example, and the count. The lm_head
// runs only over the positions that predict completion tokens.
std::pair<torch::Tensor, int64_t> completion_nll(policy::CausalLM& model, const SftExample& ex) {
  const int64_t T = static_cast<int64_t>(ex.ids.size()), P = ex.prompt_len;
  if (P < 1 || P >= T)
    throw Error("sft: example " + ex.file + " has no completion tokens (prompt " + std::to_string(P) + " of " +
                std::to_string(T) + ")");
  // The ids go where the model's weights are (the CPU, or a GPU for tools/sft --device cuda).
  const auto device = model->parameters().front().device();
  const auto ids =
      torch::tensor(std::vector<int64_t>(ex.ids.begin(), ex.ids.end()), torch::kInt64).unsqueeze(0).to(device);
  const auto h = model->hidden(ids, {}, nullptr).narrow(1, P - 1, T - P);
  const auto logits = model->logits(h).to(torch::kFloat32).reshape({T - P, -1});
  const auto target = ids.narrow(1, P, T - P).reshape({-1}).to(logits.device());
  return {torch::nn::functional::cross_entropy(logits, target,
                                               torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum)),
          T - P};
}

}  // namespace

double example_loss(policy::CausalLM& model, const SftExample& ex) {
  torch::NoGradGuard g;
  const auto [sum, n] = completion_nll(model, ex);
  return sum.item<double>() / static_cast<double>(n);
}

SftReport train_sft(policy::CausalLM& model, const std::vector<SftExample>& examples, const SftOptions& o,
                    const std::function<void(const SftStepLog&)>& on_step) {
  if (examples.empty()) throw Error("sft: no training examples");
  if (o.steps <= 0 || o.batch <= 0) throw Error("sft: --steps and --batch must be positive");
  if (o.threads > 0) at::set_num_threads(o.threads);
  model->train();
  std::vector<torch::Tensor> params;
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& p : model->named_parameters()) {
    params.push_back(p.value());
    // Norm weights and biases are not decayed (the usual transformer recipe).
    (p.value().dim() >= 2 ? decay : no_decay).push_back(p.value());
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(
                                 torch::optim::AdamWOptions(o.lr).betas({0.9, 0.95}).weight_decay(o.weight_decay)));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(
                                    torch::optim::AdamWOptions(o.lr).betas({0.9, 0.95}).weight_decay(0.0)));
  torch::optim::AdamW opt(groups);
  std::mt19937_64 rng(o.seed);
  std::vector<std::size_t> order(examples.size());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::size_t cursor = 0;
  SftReport rep;
  std::vector<double> losses;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t step = 0; step < o.steps; ++step) {
    const auto ts = std::chrono::steady_clock::now();
    double lr = o.lr;
    if (step < o.warmup_steps) {
      lr = o.lr * double(step + 1) / double(o.warmup_steps);
    } else {
      double t = double(step - o.warmup_steps) / double(std::max<int64_t>(1, o.steps - o.warmup_steps));
      // With a time limit the decay follows whichever budget runs out first, so a
      // time-bounded run (GPU sessions) still ends at the low learning rate.
      if (o.time_limit_s > 0) t = std::max(t, std::chrono::duration<double>(ts - t0).count() / o.time_limit_s);
      lr = o.lr * (o.min_lr_ratio + (1 - o.min_lr_ratio) * 0.5 * (1 + std::cos(M_PI * std::min(1.0, t))));
    }
    for (auto& g : opt.param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
    std::vector<const SftExample*> batch;
    int64_t tokens = 0;
    for (int64_t b = 0; b < o.batch; ++b) {
      if (cursor == order.size()) {
        std::shuffle(order.begin(), order.end(), rng);
        cursor = 0;
      }
      batch.push_back(&examples[order[cursor++]]);
      tokens += static_cast<int64_t>(batch.back()->ids.size()) - batch.back()->prompt_len;
    }
    opt.zero_grad();
    double loss_sum = 0;
    for (const auto* ex : batch) {
      auto [sum, n] = completion_nll(model, *ex);
      (sum / static_cast<double>(tokens)).backward();
      loss_sum += sum.item<double>();
    }
    const double norm = torch::nn::utils::clip_grad_norm_(params, o.grad_clip > 0 ? o.grad_clip : 1e30);
    opt.step();
    SftStepLog log;
    log.step = step;
    log.loss = loss_sum / static_cast<double>(tokens);
    log.lr = lr;
    log.grad_norm = norm;
    log.tokens = tokens;
    log.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count();
    if (!std::isfinite(log.loss))
      throw Error("sft: the loss is not finite at step " + std::to_string(step) + " (lower --lr)");
    losses.push_back(log.loss);
    if (step == 0) rep.first_loss = log.loss;
    rep.steps = step + 1;
    if (on_step) on_step(log);
    rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (o.time_limit_s > 0 && rep.seconds > o.time_limit_s && step + 1 < o.steps) {
      log_warn("sft: time limit ", o.time_limit_s, " s reached after ", step + 1, " of ", o.steps,
               " steps; stopping there");
      rep.stopped_by_time = true;
      break;
    }
  }
  const std::size_t tail = std::min<std::size_t>(10, losses.size());
  rep.final_loss = std::accumulate(losses.end() - static_cast<std::ptrdiff_t>(tail), losses.end(), 0.0) / double(tail);
  model->eval();
  return rep;
}

void save_hf_policy(const policy::Policy& p, const std::string& dir, int64_t max_new_tokens) {
  ::mkdir(dir.c_str(), 0755);
  policy::save_policy(p, dir);
  nlohmann::json gen = {{"_from_model_config", false},
                        {"do_sample", true},
                        {"temperature", 1.0},
                        {"top_p", 1.0},
                        {"max_new_tokens", max_new_tokens}};
  if (!p.config.eos_token_ids.empty()) {
    gen["eos_token_id"] = p.config.eos_token_ids[0];
    gen["pad_token_id"] = p.config.eos_token_ids[0];
  }
  write_file_atomic(dir + "/generation_config.json", gen.dump(2) + "\n");
  if (p.tokenizer) {
    nlohmann::json tc = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                         {"model_max_length", p.config.max_position_embeddings},
                         {"eos_token", "<|endoftext|>"},
                         {"pad_token", "<|endoftext|>"}};
    write_file_atomic(dir + "/tokenizer_config.json", tc.dump(2) + "\n");
  }
}

}  // namespace kf::stages
