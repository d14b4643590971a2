// bench_learner_scale: one learner step of a real model shape, phase by phase.
//
// The step is the learner's own components in the learner's order: the policy's
// log-probs of the completion tokens (selected_logprobs: the vocabulary projection only at
// completion positions, in chunks of --logit-chunk, as learner.logit_chunk_tokens; or
// --logprobs dense: token_logprobs over every position) and the GRPO loss (forward), backward into the gradient buckets
// (backward), the buckets' all-reduce or reduce-scatter (sync), the global-norm clip and AdamW, plus the all-gather
// when sharded (optimizer; not with --shard-params, whose forward and backward gather each layer). The device is
// synchronised between phases so each phase's time is its own (this removes the learner's overlap of sync with
// backward).
//
// Shape: a named one (tiny, qwen2.5-0.5b) or an HF config.json path (configs/shapes/*.json),
// random init, no download. Weights fp32 with bf16 autocast on CUDA (the learner's default),
// or --weights bf16 (bf16 parameters; needs --shard, whose optimizer keeps the fp32 master).
// --lora-rank R: the learner's LoRA (learner.lora.*): a frozen base (bf16 on CUDA) with fp32
// adapters on all seven projections; only the adapters are trained.
// --bare: a bare forward + backward of the same shape instead of a learner step: full
// logits over every position, mean cross-entropy, backward; no loss terms, buckets or
// optimizer (the reference a learner step is compared with).
//
// MFU = model FLOPs / time / peak. Model FLOPs per step, T = prompt + completion tokens per
// sequence: 6 x (matmul parameters of the decoder) x tokens; the vocabulary projection
// 6 x hidden x vocab x (completion tokens when chunked, every token when dense or bare);
// causal attention 6 x L x T^2 x heads x head_dim per sequence (half of the 12 x ... of
// full attention: forward QK^T and PV, backward twice that). With LoRA the frozen base
// needs no weight gradients: 4 instead of 6 for the base and the vocabulary projection,
// plus 6 x adapter parameters x tokens. Recomputation (--checkpointing) is not counted.
// Prints a table and "BENCH|learner_scale|<case>|<metric>|<value>|<unit>" rows.
#include <CLI/CLI.hpp>
#include <stdlib.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "comm.h"  // defines: Rendezvous, file_rendezvous, make_nccl_comm (learner/src)
#include "grad_buckets.h"
#include "kf/bench/util.h"
#include "kf/common/error.h"
#include "kf/learner/learner.h"
#include "kf/policy/policy.h"
#include "loss.h"
#include "optimizer.h"

#ifdef KF_HAVE_CUDA
#include <ATen/autocast_mode.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

using namespace kf::learner;

namespace {

// Matmul parameters of the decoder layers (the vocabulary projection is counted apart).
double layer_matmul_params(const kf::policy::ModelConfig& c) {
  const double d = c.hidden_size, q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  return c.num_hidden_layers * (d * q + 2 * d * kv + q * d + 3 * d * c.intermediate_size);
}

kf::policy::ModelConfig shape_of(const std::string& s) {
  if (s.size() > 5 && s.compare(s.size() - 5, 5, ".json") == 0) return kf::policy::load_model_config(s);
  return kf::policy::named_model_shape(s);
}

using kf::bench::now;
using kf::bench::sync;

struct Autocast {
  bool on;
  explicit Autocast(bool enable) : on(enable) {
#ifdef KF_HAVE_CUDA
    if (!on) return;
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
    at::autocast::increment_nesting();
#endif
  }
  ~Autocast() {
#ifdef KF_HAVE_CUDA
    if (!on) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(at::kCUDA, false);
#endif
  }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_learner_scale: one learner step of a model shape, split into phases"};
  std::string shape = "tiny", device = "auto", weights = "fp32", comm_kind = "local", logprobs = "chunked";
  int64_t prompt = 32, completion = 64, seqs = 2, micro = 1, steps = 2, warmup = 1, logit_chunk = 1024, lora_rank = 0,
          recompute_layers = -1;
  double peak_tflops = 0, lora_alpha = 16.0;
  bool shard = false, shard_grads = false, shard_params = false, checkpointing = false, bare = false, pack = false;
  app.add_option("--shape", shape, "tiny, qwen2.5-0.5b or an HF config.json path");
  app.add_option("--prompt", prompt, "prompt tokens per sequence");
  app.add_option("--completion", completion, "completion tokens per sequence");
  app.add_option("--seqs", seqs, "sequences per step");
  app.add_option("--micro-seqs", micro, "sequences per micro-batch (gradient accumulation)");
  app.add_option("--steps", steps, "timed steps (the table shows their mean)");
  app.add_option("--warmup", warmup, "untimed steps first");
  app.add_option("--device", device, "auto, cpu, cuda or cuda:N");
  app.add_option("--weights", weights, "fp32 (bf16 autocast on CUDA) or bf16 (needs --shard)");
  app.add_option("--peak-tflops", peak_tflops, "peak dense TFLOP/s of the device for MFU (0: no MFU)");
  app.add_option("--comm", comm_kind, "local, or nccl (a 1-rank NCCL communicator: its collectives run for real)");
  app.add_flag("--shard", shard, "sharded optimizer state (learner.dist.shard: optimizer; 1 rank here)");
  app.add_flag("--shard-grads", shard_grads, "sharded gradients too (learner.dist.shard: gradients; implies --shard)");
  app.add_flag("--shard-params", shard_params,
               "sharded parameters too (learner.dist.shard: params, ZeRO-3: each layer gathered before its forward and "
               "backward, freed after; implies --shard-grads)");
  app.add_flag("--checkpointing", checkpointing, "recompute decoder layers in backward");
  app.add_option("--recompute-layers", recompute_layers,
                 "with --checkpointing, recompute only the first N decoder layers (learner.recompute_layers; -1: all)");
  app.add_flag("--pack", pack,
               "each micro-batch's sequences packed into one row (learner.pack: positions restart, causal attention "
               "per sequence)");
  app.add_option("--logprobs", logprobs,
                 "chunked (the learner's: completion positions only) or dense (every position)");
  app.add_option("--logit-chunk", logit_chunk,
                 "completion positions per vocabulary chunk (learner.logit_chunk_tokens)");
  app.add_option("--lora-rank", lora_rank, "LoRA adapters of this rank on a frozen base (0: full fine-tuning)");
  app.add_option("--lora-alpha", lora_alpha, "LoRA alpha (learner.lora.alpha)");
  app.add_flag("--bare", bare, "a bare forward + backward (dense logits, cross-entropy) instead of a learner step");
  CLI11_PARSE(app, argc, argv);
  try {
    torch::Device dev(torch::kCPU);
    if (device == "auto") {
      if (torch::cuda::is_available()) dev = torch::Device(torch::kCUDA, 0);
    } else {
      dev = torch::Device(device);
    }
    if (dev.is_cuda() && !dev.has_index()) dev = torch::Device(torch::kCUDA, 0);
    if (shard_params) shard_grads = true;
    if (shard_grads) shard = true;
    if (weights != "fp32" && weights != "bf16") throw kf::Error("--weights: '" + weights + "' (fp32 or bf16)");
    if (pack && (bare || logprobs == "dense"))
      throw kf::Error("--pack: the packed row goes through selected_logprobs (no --bare, no --logprobs dense)");
    if (bare && shard_params)
      throw kf::Error(
          "--bare times a plain forward + backward: no --shard-params (it has no gradient buckets to free)");
    if (weights == "bf16" && !shard)
      throw kf::Error("--weights bf16 needs --shard (the fp32 master lives in the sharded optimizer)");
    if (recompute_layers < -1) throw kf::Error("--recompute-layers must be >= -1 (-1: every layer)");
    if (seqs < 1 || micro < 1 || prompt < 1 || completion < 1 || steps < 1 || logit_chunk < 1 || lora_rank < 0)
      throw kf::Error(
          "--seqs, --micro-seqs, --prompt, --completion, --steps and --logit-chunk must be >= 1, --lora-rank >= 0");
    if (logprobs != "chunked" && logprobs != "dense")
      throw kf::Error("--logprobs: '" + logprobs + "' (chunked or dense)");
    if (lora_rank > 0 && (weights != "fp32" || shard))
      throw kf::Error(
          "--lora-rank: the base is frozen (bf16 on CUDA) and the adapters fp32; no --weights bf16 or --shard");
    const auto mc = shape_of(shape);
    // LoRA holds the frozen base in the compute dtype, as the learner does.
    const auto wdtype = weights == "bf16" || (lora_rank > 0 && dev.is_cuda()) ? torch::kBFloat16 : torch::kFloat32;
    const bool autocast = dev.is_cuda() && (wdtype == torch::kFloat32 || lora_rank > 0);
    torch::manual_seed(1);
    kf::policy::CausalLM model(mc, torch::TensorOptions().dtype(wdtype).device(dev));
    model->init_random(1);
    model->set_gradient_checkpointing(checkpointing);
    model->set_recompute_layers(recompute_layers);
    model->train();
    if (lora_rank > 0) {
      kf::policy::LoraConfig lc;
      lc.rank = lora_rank;
      lc.alpha = lora_alpha;
      lc.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
      model->enable_lora(lc, 2, torch::kFloat32);
    }
    std::vector<std::pair<std::string, torch::Tensor>> params;
    for (const auto& p : model->named_parameters())
      if (p.value().requires_grad()) params.emplace_back(p.key(), p.value());
    std::unique_ptr<Rendezvous> rdv;
    std::unique_ptr<Communicator> comm;
    if (comm_kind == "nccl") {
      if (!dev.is_cuda()) throw kf::Error("--comm nccl needs a CUDA device");
      char tmpl[] = "/tmp/kf-bench-nccl-XXXXXX";
      const char* dir = ::mkdtemp(tmpl);
      if (!dir) throw kf::Error("--comm nccl: mkdtemp for the rendezvous failed");
      rdv = file_rendezvous(dir);
      comm = make_nccl_comm(0, 1, dev.index(), *rdv);
    } else if (comm_kind == "local") {
      comm = make_local_comm();
    } else {
      throw kf::Error("--comm: '" + comm_kind + "' (local or nccl)");
    }
    GradBuckets buckets(params, 25u << 20, comm.get(),
                        shard_params  ? ShardMode::params
                        : shard_grads ? ShardMode::gradients
                        : shard       ? ShardMode::optimizer
                                      : ShardMode::none,
                        shard_params ? layer_groups(params) : std::vector<int64_t>{});
    std::unique_ptr<kf::policy::ParamHooks> gathers;
    if (shard_params) {
      gathers = layer_gathers(buckets, layer_groups(params), mc.num_hidden_layers);
      model->set_param_hooks(gathers.get());
    }
    OptimConfig oc;
    oc.lr = 1e-6;
    AdamW opt(params, oc, &buckets);
    GrpoConfig gc;

    const int64_t T = prompt + completion;
    const auto ids = torch::randint(0, mc.vocab_size, {seqs, T}, torch::TensorOptions().dtype(torch::kInt64)).to(dev);
    auto comp = torch::zeros({seqs, T - 1}, torch::TensorOptions().dtype(torch::kFloat32));
    comp.narrow(1, prompt - 1, completion).fill_(1.0);
    comp = comp.to(dev);
    const auto adv = torch::randn({seqs}, torch::kFloat32).to(dev);
    const double n_tok = static_cast<double>(seqs * completion);

    double t_fwd = 0, t_bwd = 0, t_sync = 0, t_opt = 0;
    for (int64_t s = 0; s < warmup + steps; ++s) {
      const bool timed = s >= warmup;
      buckets.zero();
      for (int64_t m0 = 0; m0 < seqs; m0 += micro) {
        const int64_t n = std::min(micro, seqs - m0);
        if (m0 + n >= seqs) buckets.arm();
        sync(dev);
        double t0 = now();
        torch::Tensor loss;
        {
          Autocast ac(autocast);
          const auto x = ids.narrow(0, m0, n);
          if (bare) {
            const auto logits = model->forward(x).narrow(1, 0, T - 1);
            loss = torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(2)}).to(torch::kFloat32),
                                                        x.narrow(1, 1, T - 1).reshape({-1}));
          } else if (pack) {
            // One row [1, n T]; the position that would predict the next sequence's first
            // token is not a completion position.
            const auto row = x.reshape({1, n * T});
            auto cp = torch::zeros({1, n * T - 1}, comp.options());
            auto ap = torch::zeros({1, n * T - 1}, comp.options());
            for (int64_t q = 0; q < n; ++q) {
              cp.narrow(1, q * T, T - 1).copy_(comp[m0 + q].unsqueeze(0));
              ap.narrow(1, q * T, T - 1).copy_(comp[m0 + q].unsqueeze(0) * adv[m0 + q]);
            }
            const std::vector<int64_t> segments(n, T);
            const auto logp = model->selected_logprobs(row, torch::Tensor(), cp, 1.0, logit_chunk, segments).logp;
            loss = grpo_loss(logp, logp.detach(), torch::Tensor(), ap, cp / n_tok, gc).loss;
          } else {
            const auto w = comp.narrow(0, m0, n) / n_tok;
            const auto logp =
                logprobs == "dense"
                    ? model->token_logprobs(x)
                    : model->selected_logprobs(x, torch::Tensor(), comp.narrow(0, m0, n), 1.0, logit_chunk).logp;
            loss = grpo_loss(logp, logp.detach(), torch::Tensor(), adv.narrow(0, m0, n), w, gc).loss;
          }
        }
        sync(dev);
        double t1 = now();
        loss.backward();
        sync(dev);
        double t2 = now();
        if (timed) {
          t_fwd += t1 - t0;
          t_bwd += t2 - t1;
        }
      }
      double t2 = now();
      if (!bare) buckets.finish();
      buckets.release_all();  // --shard-params: nothing whole between steps
      sync(dev);
      double t3 = now();
      if (!bare) {
        opt.clip_grad_norm(1.0);
        opt.step(oc.lr);
      }
      sync(dev);
      double t4 = now();
      if (timed) {
        t_sync += t3 - t2;
        t_opt += t4 - t3;
      }
    }
    t_fwd /= steps;
    t_bwd /= steps;
    t_sync /= steps;
    t_opt /= steps;
    const double step_s = t_fwd + t_bwd + t_sync + t_opt;
    const double tokens = static_cast<double>(seqs * T);
    int64_t n_adapter = 0;
    for (const auto& p : params)
      if (kf::policy::is_lora_param(p.first)) n_adapter += p.second.numel();
    const double base_factor = lora_rank > 0 ? 4.0 : 6.0;  // a frozen base needs no weight gradients
    const double head_tokens = bare || logprobs == "dense" ? tokens : static_cast<double>(seqs * completion);
    const double flops =
        base_factor * layer_matmul_params(mc) * tokens +
        base_factor * static_cast<double>(mc.hidden_size) * mc.vocab_size * head_tokens + 6.0 * n_adapter * tokens +
        seqs * 6.0 * mc.num_hidden_layers * static_cast<double>(T) * T * mc.num_attention_heads * mc.head_dim;
    double peak_mem = 0;
#ifdef KF_HAVE_CUDA
    if (dev.is_cuda()) {
      const auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(dev.index());
      peak_mem = static_cast<double>(st.allocated_bytes[0].peak);
    }
#endif
    if (!dev.is_cuda()) {
      rusage ru{};
      ::getrusage(RUSAGE_SELF, &ru);
      peak_mem = ru.ru_maxrss * 1024.0;  // host peak RSS
    }
    int64_t n_params = 0, n_trainable = 0;
    for (const auto& p : model->parameters()) n_params += p.numel();
    for (const auto& p : params) n_trainable += p.second.numel();
    const std::string cs =
        shape.substr(shape.rfind('/') + 1) + "/p" + std::to_string(prompt) + "c" + std::to_string(completion) + "x" +
        std::to_string(seqs) +
        (shard_params  ? "/shardparams"
         : shard_grads ? "/shardgrads"
         : shard       ? "/shard"
                       : "") +
        "/" + weights + (comm_kind == "nccl" ? "/nccl" : "") +
        (lora_rank > 0 ? "/lora" + std::to_string(lora_rank) : "") +
        (checkpointing ? "/recompute" + (recompute_layers >= 0 ? std::to_string(recompute_layers) : "") : "") +
        (pack ? "/packed" : "") + (bare ? "/bare" : "/" + logprobs);
    std::printf(
        "bench_learner_scale: %s on %s, %lld parameters (%lld trained), %s%s%s%s, %lld seqs x %lld tokens "
        "(micro-batch %lld seqs)\n",
        shape.c_str(), dev.str().c_str(), static_cast<long long>(n_params), static_cast<long long>(n_trainable),
        lora_rank > 0 ? "frozen base + fp32 LoRA adapters" : (weights + " weights").c_str(),
        autocast ? " + bf16 autocast" : "", checkpointing ? ", recompute" : "",
        bare ? ", bare forward + backward" : (", " + logprobs + " log-probs").c_str(), static_cast<long long>(seqs),
        static_cast<long long>(T), static_cast<long long>(micro));
    std::printf("%-26s %12s\n", "metric", "value");
    std::vector<std::string> bench_rows;
    auto row = [&](const char* metric, double v, const char* unit) {
      std::printf("%-26s %12.4g %s\n", metric, v, unit);
      char line[512];
      std::snprintf(line, sizeof line, "BENCH|learner_scale|%s|%s|%.6g|%s", cs.c_str(), metric, v, unit);
      bench_rows.push_back(line);
    };
    row("forward", t_fwd, "s");
    row("backward", t_bwd, "s");
    row("sync", t_sync, "s");
    row("optimizer", t_opt, "s");
    row("step", step_s, "s");
    row("tokens_per_s", tokens / step_s, "tok/s");
    row("fwd_bwd_tokens_per_s", tokens / (t_fwd + t_bwd), "tok/s");
    row("model_tflop_per_step", flops / 1e12, "TFLOP");
    if (peak_tflops > 0) {
      row("mfu_step", 100.0 * flops / step_s / (peak_tflops * 1e12), "%");
      row("mfu_fwd_bwd", 100.0 * flops / (t_fwd + t_bwd) / (peak_tflops * 1e12), "%");
    }
    row("peak_memory", peak_mem / (1 << 30), dev.is_cuda() ? "GiB (device)" : "GiB (host RSS)");
    row("optimizer_state", static_cast<double>(opt.state_bytes()) / (1 << 30), "GiB");
    row("gradient_buffers", static_cast<double>(buckets.gradient_bytes()) / (1 << 30), "GiB");
    // Parameter storage held between steps (--shard-params: this rank's slices only; at one
    // rank that is every weight, so only the time of the per-layer gathers is informative).
    int64_t param_bytes = 0;
    if (shard) {
      param_bytes = buckets.param_storage_bytes();
    } else {
      for (const auto& p : model->parameters()) param_bytes += p.numel() * p.element_size();
    }
    row("parameters_between_steps", static_cast<double>(param_bytes) / (1 << 30), "GiB");
    for (const auto& l : bench_rows) std::printf("%s\n", l.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_learner_scale: %s\n", kf::message_of(e).c_str());
    return 1;
  }
}
