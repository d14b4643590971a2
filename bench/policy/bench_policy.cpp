// bench_policy: the policy model's speed with random weights.
//  decode: Sampler::generate tokens/s (prefill + decode, sampling, log-probs) per batch size
//  train:  forward + backward of token_logprobs at a given sequence length, with MFU
// Prints "BENCH|policy|<case>|<metric>|<value>|<unit>" rows (bench/run_all). Defaults: a
// Qwen2.5-0.5B-shaped model in bf16 on CUDA; a tiny model on CPU so run_all stays quick.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <sstream>

#include "kf/bench/util.h"
#include "kf/policy/policy.h"

using namespace kf::policy;

namespace {

ModelConfig qwen25_05b() { return named_model_shape("qwen2.5-0.5b"); }

ModelConfig tiny() {
  ModelConfig c = qwen25_05b();
  c.vocab_size = 4096;
  c.hidden_size = 256;
  c.intermediate_size = 768;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  return c;
}

using kf::bench::now;
using kf::bench::parse_list;
using kf::bench::sync;

// Matmul FLOPs per token (forward) and causal attention FLOPs per sequence (forward).
double matmul_flops_per_token(const ModelConfig& c) {
  const double d = c.hidden_size, q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  const double per_layer = 2 * (d * q + d * kv * 2 + q * d + 3 * d * c.intermediate_size);
  return c.num_hidden_layers * per_layer + 2 * d * c.vocab_size;
}
double attn_flops_per_seq(const ModelConfig& c, double T) {
  return c.num_hidden_layers * 2.0 * 2.0 * T * T * c.num_attention_heads * c.head_dim / 2.0;  // causal half
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"policy model benchmark"};
  std::string device = "auto", model = "auto", batches, mode = "all";
  int64_t prompt = 0, new_tokens = 0, train_seq = 0, train_batch = 0, iters = 3;
  bool ckpt = false, no_graph = false;
  double peak_tflops = 989.4;  // H200 dense bf16
  app.add_option("--device", device, "auto, cuda or cpu");
  app.add_option("--model", model, "auto, qwen2.5-0.5b or tiny");
  app.add_option("--batches", batches, "decode batch sizes, e.g. 1,16,64");
  app.add_option("--prompt", prompt, "prompt tokens");
  app.add_option("--new", new_tokens, "generated tokens per sequence");
  app.add_option("--train-seq", train_seq, "training sequence length");
  app.add_option("--train-batch", train_batch, "training batch");
  app.add_option("--iters", iters, "timed iterations");
  app.add_option("--mode", mode, "decode, train or all");
  app.add_option("--peak-tflops", peak_tflops, "peak bf16 TFLOP/s for MFU");
  app.add_flag("--checkpointing", ckpt, "gradient checkpointing in the train step");
  app.add_flag("--no-cuda-graph", no_graph, "eager decode steps instead of a captured CUDA graph");
  CLI11_PARSE(app, argc, argv);

  const bool cuda = device == "cuda" || (device == "auto" && torch::cuda::is_available());
  const torch::Device dev = cuda ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
  if (model == "auto") model = cuda ? "qwen2.5-0.5b" : "tiny";
  const ModelConfig cfg = model == "tiny" ? tiny() : qwen25_05b();
  if (batches.empty()) batches = cuda ? "1,16,64" : "1,4";
  if (!prompt) prompt = cuda ? 128 : 32;
  if (!new_tokens) new_tokens = cuda ? 256 : 32;
  if (!train_seq) train_seq = cuda ? 2048 : 256;
  if (!train_batch) train_batch = cuda ? 8 : 1;
  const auto opts = torch::TensorOptions().dtype(cuda ? torch::kBFloat16 : torch::kFloat32).device(dev);
  std::fprintf(stderr, "bench_policy: %s on %s, %lld layers, hidden %lld\n", model.c_str(), cuda ? "cuda" : "cpu",
               static_cast<long long>(cfg.num_hidden_layers), static_cast<long long>(cfg.hidden_size));

  CausalLM m(cfg, opts);
  m->init_random(1);
  const std::string tag = model + (cuda ? "_bf16" : "_fp32") + (cuda && no_graph ? "_eager" : "");

  if (mode == "decode" || mode == "all") {
    m->eval();
    Sampler sampler(m, nullptr);
    for (int64_t B : parse_list(batches)) {
      std::vector<std::vector<int32_t>> prompts(B);
      auto gen = torch::randint(0, cfg.vocab_size - 1000, {B, prompt}, torch::TensorOptions().dtype(torch::kInt64));
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < prompt; ++i) prompts[b].push_back(static_cast<int32_t>(gen[b][i].item<int64_t>()));
      SamplingParams sp;
      sp.max_new_tokens = new_tokens;
      sp.check_every = new_tokens;  // no EOS/stop strings here: no host syncs mid-run
      sp.seed = 1;
      sp.cuda_graph = !no_graph;
      SamplingParams warm = sp;
      warm.max_new_tokens = 8;
      sampler.generate(prompts, warm);
      sync(dev);
      double best = 1e30;
      for (int64_t it = 0; it < std::max<int64_t>(1, iters - 1); ++it) {
        const double t0 = now();
        sampler.generate(prompts, sp);
        sync(dev);
        best = std::min(best, now() - t0);
      }
      const double tps = B * new_tokens / best;
      std::printf("BENCH|policy|decode_%s_b%lld_p%lld_n%lld|tok_per_s|%.1f|tok/s\n", tag.c_str(),
                  static_cast<long long>(B), static_cast<long long>(prompt), static_cast<long long>(new_tokens), tps);
      std::fflush(stdout);
    }
  }

  if (mode == "train" || mode == "all") {
    m->train();
    m->set_gradient_checkpointing(ckpt);
    const auto ids =
        torch::randint(0, cfg.vocab_size, {train_batch, train_seq}, torch::TensorOptions().dtype(torch::kInt64))
            .to(dev);
    auto step = [&] {
      for (auto& p : m->parameters()) p.mutable_grad() = torch::Tensor();
      auto loss = -m->token_logprobs(ids).mean();
      loss.backward();
    };
    step();
    sync(dev);
    double best = 1e30;
    for (int64_t it = 0; it < iters; ++it) {
      const double t0 = now();
      step();
      sync(dev);
      best = std::min(best, now() - t0);
    }
    const double tokens = static_cast<double>(train_batch) * train_seq;
    const double flops =
        3.0 * (matmul_flops_per_token(cfg) * tokens + attn_flops_per_seq(cfg, train_seq) * train_batch);
    const std::string c =
        "train_" + tag + "_b" + std::to_string(train_batch) + "_s" + std::to_string(train_seq) + (ckpt ? "_ckpt" : "");
    std::printf("BENCH|policy|%s|step_time|%.4f|s\n", c.c_str(), best);
    std::printf("BENCH|policy|%s|tok_per_s|%.0f|tok/s\n", c.c_str(), tokens / best);
    std::printf("BENCH|policy|%s|tflops|%.1f|TFLOP/s\n", c.c_str(), flops / best / 1e12);
    if (cuda) std::printf("BENCH|policy|%s|mfu|%.1f|%%\n", c.c_str(), 100.0 * flops / best / (peak_tflops * 1e12));
  }
  return 0;
}
