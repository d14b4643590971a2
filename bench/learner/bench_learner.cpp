// bench_learner: the learner's training step on a synthetic group stream.
//  throughput: tokens/s and MFU of Learner::step() (forward + backward + all-reduce +
//              AdamW) for a model shape (default: Qwen2.5-0.5B-shaped in bf16 autocast on
//              CUDA, tiny on CPU), and the snapshot publish stall/total time.
//  --nccl-check: the same steps through a 1-rank NCCL communicator and through the local
//              one from the same seed; the weights must agree (prints PASS/FAIL).
// Prints "BENCH|learner|<case>|<metric>|<value>|<unit>" rows (bench/run_all).
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <optional>

#include "kf/common/log.h"
#include "kf/learner/learner.h"
#include "comm.h"  // defines: Rendezvous, file_rendezvous, make_nccl_comm (learner/src)
#include "kf/replay/replay.h"

#ifdef KF_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

using namespace kf::learner;

namespace {

double matmul_flops_per_token(const kf::policy::ModelConfig& c) {
  const double d = c.hidden_size, q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  const double per_layer = 2 * (d * q + d * kv * 2 + q * d + 3 * d * c.intermediate_size);
  return c.num_hidden_layers * per_layer + 2 * d * c.vocab_size;
}
double attn_flops_per_seq(const kf::policy::ModelConfig& c, double T) {
  return c.num_hidden_layers * 2.0 * 2.0 * T * T * c.num_attention_heads * c.head_dim / 2.0;
}

struct Run {
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<Rendezvous> rdv;
  std::unique_ptr<SyntheticSource> source;
  std::unique_ptr<Learner> learner;
};

Run make_run(const LearnerConfig& cfg, const SyntheticConfig& sc, torch::Device dev, const std::string& comm,
             kf::replay::SnapshotStore* store) {
  Run r;
  if (comm == "nccl") {
    char tmpl[] = "/tmp/kf-nccl-XXXXXX";
    r.rdv = file_rendezvous(::mkdtemp(tmpl));
    r.comm = make_nccl_comm(0, 1, dev.index(), *r.rdv);
  } else {
    r.comm = make_local_comm();
  }
  r.source = std::make_unique<SyntheticSource>(sc);
  r.source->groups_per_step_total = cfg.groups_per_step;
  LearnerDeps d;
  d.comm = r.comm.get();
  d.source = r.source.get();
  d.snapshots = store;
  d.device = dev;
  r.learner = std::make_unique<Learner>(cfg, d);
  return r;
}

void sync(const torch::Device& d) {
  if (d.is_cuda()) torch::cuda::synchronize();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"learner benchmark"};
  std::string device = "auto", shape = "auto", comm = "local";
  int64_t groups = 0, group_size = 8, prompt = 0, completion = 0, mb_tokens = 0, steps = 3;
  double peak_tflops = 989.4;  // H200 dense bf16
  bool nccl_check = false, ckpt = false, no_snapshot = false;
  app.add_option("--device", device, "auto, cpu or cuda");
  app.add_option("--shape", shape, "tiny or qwen2.5-0.5b (auto: 0.5b on CUDA, tiny on CPU)");
  app.add_option("--comm", comm, "local or nccl (1 rank)");
  app.add_option("--groups", groups, "groups per step");
  app.add_option("--group-size", group_size, "completions per group");
  app.add_option("--prompt", prompt, "prompt tokens");
  app.add_option("--completion", completion, "completion tokens");
  app.add_option("--micro-batch-tokens", mb_tokens, "padded tokens per micro-batch");
  app.add_option("--steps", steps, "timed steps (after one warm-up step)");
  app.add_option("--peak-tflops", peak_tflops, "peak bf16 TFLOP/s for MFU");
  app.add_flag("--nccl-check", nccl_check, "1-rank NCCL vs local communicator on a tiny model");
  app.add_flag("--checkpointing", ckpt, "gradient checkpointing");
  app.add_flag("--no-snapshot", no_snapshot, "do not publish snapshots (small /dev/shm)");
  CLI11_PARSE(app, argc, argv);
  kf::log_init("bench_learner", 0);
  kf::log_set_level(kf::LogLevel::Warn);
  const bool cuda = device == "cuda" || (device == "auto" && torch::cuda::is_available());
  const torch::Device dev = cuda ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);

  if (nccl_check) {
    LearnerConfig cfg;
    cfg.init_shape = "tiny";
    cfg.groups_per_step = 4;
    cfg.optim.lr = 1e-3;
    cfg.schedule.warmup_steps = 0;
    cfg.snapshot_every = 0;
    SyntheticConfig sc;
    auto a = make_run(cfg, sc, dev, "nccl", nullptr);
    auto b = make_run(cfg, sc, dev, "local", nullptr);
    std::map<std::string, torch::Tensor> init;
    for (const auto& p : b.learner->model()->named_parameters()) init[p.key()] = p.value().detach().clone();
    double worst = 0, moved = 0;
    for (int s = 0; s < 3; ++s) {
      const auto sa = a.learner->step();
      b.learner->step();
      std::printf("BENCH|learner|nccl_1rank|step%d_buckets_in_backward|%lld|buckets\n", s,
                  static_cast<long long>(sa.buckets_in_backward));
    }
    auto pa = a.learner->model()->named_parameters(), pb = b.learner->model()->named_parameters();
    bool finite = true;
    for (const auto& p : pa) {
      worst = std::max(worst, (p.value() - pb[p.key()]).abs().max().item<double>());
      moved = std::max(moved, (pb[p.key()] - init[p.key()]).abs().max().item<double>());
      finite = finite && torch::isfinite(p.value()).all().item<bool>();
    }
    // CUDA backward kernels with atomics (embedding, attention) are not bitwise
    // reproducible, so the two runs may differ by rounding, which Adam can turn into a
    // fraction of one step on near-zero gradients.
    const bool ok = finite && moved > 0 && worst <= 0.05 * moved && a.learner->steps_done() == 3;
    std::printf("BENCH|learner|nccl_1rank|max_weight_diff_vs_local|%g|abs\n", worst);
    std::printf("BENCH|learner|nccl_1rank|max_update|%g|abs\n", moved);
    std::printf("BENCH|learner|nccl_1rank|result|%s|-\n", ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
  }

  if (shape == "auto") shape = cuda ? "qwen2.5-0.5b" : "tiny";
  const auto mc = model_shape(shape);
  if (!groups) groups = cuda ? 8 : 2;
  if (!prompt) prompt = cuda ? 512 : 32;
  if (!completion) completion = cuda ? 512 : 32;
  if (!mb_tokens) mb_tokens = cuda ? 16384 : 1024;
  LearnerConfig cfg;
  cfg.init_shape = shape;
  cfg.groups_per_step = groups;
  cfg.micro_batch_tokens = mb_tokens;
  cfg.gradient_checkpointing = ckpt;
  cfg.optim.lr = 1e-6;
  cfg.snapshot_every = 1;
  cfg.snapshot_dtype = "bf16";
  SyntheticConfig sc;
  sc.vocab = mc.vocab_size;
  sc.group_size = group_size;
  sc.prompt_min = sc.prompt_max = prompt;
  sc.completion_min = sc.completion_max = completion;
  sc.behaviour_logprob = -std::log(static_cast<double>(mc.vocab_size));
  sc.equal_reward_every = 0;
  const std::string seg = "kf.bench.learner." + std::to_string(::getpid());
  kf::replay::SnapshotConfig snap;
  snap.max_bytes = 0;
  for (const auto& p :
       kf::policy::CausalLM(mc, torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kMeta))->parameters())
    snap.max_bytes += p.numel() * 2;
  snap.max_bytes += 1 << 20;
  snap.prefault = true;
  std::optional<kf::replay::SnapshotStore> store;
  if (!no_snapshot) {
    store.emplace(kf::replay::SnapshotStore::create(seg, snap));
    kf::replay::ShmSegment::remove(seg);  // mapped; nothing to leak if we die
  }
  auto run = make_run(cfg, sc, dev, comm, store ? &*store : nullptr);
  const std::string tag = shape + (cuda ? "_bf16_cuda" : "_fp32_cpu") + "_g" + std::to_string(groups) + "x" +
                          std::to_string(group_size) + "_s" + std::to_string(prompt + completion);
  run.learner->step();  // warm-up (allocator, autotuning, first-touch of the snapshot pages)
  sync(dev);
  double total = 0, stall = 0, stall_max = 0;
  int64_t tokens = 0, mbs = 0;
  for (int64_t s = 0; s < steps; ++s) {
    const auto st = run.learner->step();
    sync(dev);
    total += st.seconds;
    tokens += st.sequences * (prompt + completion);
    mbs = st.micro_batches;
    stall += st.publish_stall_ms;
    stall_max = std::max(stall_max, st.publish_stall_ms);
  }
  const double seqs = static_cast<double>(groups * group_size * steps);
  const double T = static_cast<double>(prompt + completion);
  const double flops = 3.0 * (matmul_flops_per_token(mc) * tokens + attn_flops_per_seq(mc, T) * seqs);
  std::printf("BENCH|learner|%s|tokens_per_s|%.0f|tok/s\n", tag.c_str(), tokens / total);
  std::printf("BENCH|learner|%s|step_time|%.3f|s\n", tag.c_str(), total / steps);
  std::printf("BENCH|learner|%s|micro_batches|%lld|per step\n", tag.c_str(), static_cast<long long>(mbs));
  std::printf("BENCH|learner|%s|tflops|%.1f|TFLOP/s\n", tag.c_str(), flops / total / 1e12);
  if (cuda) std::printf("BENCH|learner|%s|mfu|%.1f|%%\n", tag.c_str(), 100.0 * flops / total / (peak_tflops * 1e12));
  std::printf("BENCH|learner|%s|publish_stall_mean|%.2f|ms\n", tag.c_str(), stall / steps);
  std::printf("BENCH|learner|%s|publish_stall_max|%.2f|ms\n", tag.c_str(), stall_max);
  const auto ps = run.learner->publish_stats();
  std::printf("BENCH|learner|%s|publish_total_last|%.1f|ms\n", tag.c_str(), ps.last_total_ms);
#ifdef KF_HAVE_CUDA
  if (cuda)
    std::printf(
        "BENCH|learner|%s|peak_mem|%.1f|GiB\n", tag.c_str(),
        static_cast<double>(c10::cuda::CUDACachingAllocator::getDeviceStats(0).reserved_bytes[0].peak) / (1 << 30));
#endif
  run.learner.reset();
  std::printf("BENCH|learner|%s|snapshot_bytes|%.0f|MB\n", tag.c_str(), snap.max_bytes / 1e6);
  return 0;
}
