// bench_rollout_engine: decode throughput of the rollout engine against group-at-a-time
// decoding, at N concurrent sequences (N / G groups of G samples), prompt P, completion M
// (every sequence runs to M: random weights, no EOS).
//   engine:   all N / G groups submitted at once; continuous batching, paged KV, CUDA graphs
//   group:    today's actor without the engine: one group after another (policy::Sampler,
//             shared prefill, CUDA graph on GPU); --baseline-groups of them are timed and
//             the figures are per group (tokens/s does not depend on how many run)
// Reports tokens/s (completion tokens over wall time, prefill included), the time to finish
// a group of G, and KV memory (engine: peak blocks in use, and the pool; group: the cache
// of one group). Prints a table and "BENCH|rollout_engine|<case>|<metric>|<value>|<unit>".
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <sstream>

#include "kf/bench/util.h"
#include "kf/policy/policy.h"

using namespace kf::policy;

namespace {

using kf::bench::now;
using kf::bench::parse_list;
using kf::bench::sync;

std::vector<int32_t> random_prompt(int64_t len, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> p(static_cast<std::size_t>(len));
  uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
  for (auto& t : p) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    t = static_cast<int32_t>(x % static_cast<uint64_t>(vocab));
  }
  return p;
}

void row(const std::string& c, const std::string& metric, double v, const std::string& unit) {
  std::printf("BENCH|rollout_engine|%s|%s|%.6g|%s\n", c.c_str(), metric.c_str(), v, unit.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"rollout engine benchmark"};
  // Defaults (bench/run_all runs it without flags): a quick smoke run of the tiny shape,
  // larger on CUDA. The figures of docs/actors.md come from gpu_rollout_engine.sh.
  std::string shape = "tiny", device = "auto", conc, name;
  int64_t prompt = 0, completion = 0, group = 8, block = 16, kv_mb = 0, check_every = 8, baseline_groups = 2;
  int64_t baseline_completion = 0;
  bool no_baseline = false, no_graph = false;
  app.add_option("--shape", shape, "tiny, qwen2.5-0.5b or an HF config.json (configs/shapes/)");
  app.add_option("--device", device, "cpu, cuda (auto: cuda when available)");
  app.add_option("--prompt", prompt, "prompt tokens (default: 64 on CPU, 2048 on CUDA)");
  app.add_option("--completion", completion, "completion tokens per sequence (default: 32 on CPU, 512 on CUDA)");
  app.add_option("--concurrency", conc,
                 "concurrent sequences, comma-separated (default: 16,32 on CPU, 64,128,256 on CUDA)");
  app.add_option("--group", group, "samples per prompt (G)");
  app.add_option("--block-size", block, "KV block size, tokens");
  app.add_option("--kv-budget-mb", kv_mb, "engine KV pool (0: every sequence at full length, + 5%)");
  app.add_option("--check-every", check_every, "engine decode steps between host checks");
  app.add_option("--baseline-groups", baseline_groups, "groups timed group-at-a-time");
  app.add_option("--baseline-completion", baseline_completion, "group-at-a-time completion (0: --completion)");
  app.add_flag("--no-baseline", no_baseline, "engine only");
  app.add_flag("--no-graph", no_graph, "engine: eager decode steps on CUDA");
  app.add_option("--name", name, "case name prefix (default: the shape's file name)");
  CLI11_PARSE(app, argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // rows survive a time limit's kill

  const torch::Device dev(device == "auto" ? (torch::cuda::is_available() ? "cuda" : "cpu") : device);
  if (prompt <= 0) prompt = dev.is_cuda() ? 2048 : 64;
  if (completion <= 0) completion = dev.is_cuda() ? 512 : 32;
  if (conc.empty()) conc = dev.is_cuda() ? "64,128,256" : "16,32";
  const auto cfg = named_model_shape(shape);
  if (name.empty()) {
    name = shape.substr(shape.find_last_of('/') + 1);
    if (name.size() > 5 && name.substr(name.size() - 5) == ".json") name.resize(name.size() - 5);
  }
  const auto dtype = dev.is_cuda() ? torch::kBFloat16 : torch::kFloat32;
  CausalLM model(cfg, torch::TensorOptions().dtype(dtype).device(dev));
  model->init_random(1);
  model->eval();
  torch::NoGradGuard ng;
  const int64_t elem = dev.is_cuda() ? 2 : 4;
  const double kv_per_token = double(cfg.num_hidden_layers) * 2 * cfg.num_key_value_heads * cfg.head_dim * elem;
  if (baseline_completion <= 0) baseline_completion = completion;

  SamplingParams sp;
  sp.temperature = 1.0;
  sp.max_new_tokens = completion;
  sp.valid_vocab = cfg.vocab_size;

  std::printf("rollout engine: %s on %s, prompt %ld, completion %ld, G %ld, block %ld\n", name.c_str(),
              dev.str().c_str(), long(prompt), long(completion), long(group), long(block));
  std::printf("%-22s %6s %12s %14s %14s %12s\n", "system", "seqs", "tokens/s", "group done s", "KV used MB",
              "KV pool MB");

  // Group-at-a-time: per-group figures, the same at any concurrency.
  double g_tps = 0, g_group_s = 0, g_kv_mb = 0;
  if (!no_baseline) {
    Sampler s(model, nullptr);
    SamplingParams q = sp;
    q.shared_prefill = true;
    q.max_new_tokens = baseline_completion;
    q.check_every = check_every;
    q.seed = 3;
    (void)s.generate(std::vector<std::vector<int32_t>>(group, random_prompt(prompt, cfg.vocab_size, 99)), [&] {
      auto w = q;
      w.max_new_tokens = std::min<int64_t>(16, baseline_completion);
      return w;
    }());  // warm-up (allocator, cuBLAS)
    sync(dev);
    const double t0 = now();
    int64_t tokens = 0;
    for (int64_t g = 0; g < baseline_groups; ++g) {
      const auto out =
          s.generate(std::vector<std::vector<int32_t>>(group, random_prompt(prompt, cfg.vocab_size, g)), q);
      for (const auto& c : out) tokens += static_cast<int64_t>(c.tokens.size());
    }
    sync(dev);
    const double dt = now() - t0;
    g_tps = tokens / dt;
    g_group_s = dt / double(baseline_groups);
    g_kv_mb = group * double(prompt + baseline_completion) * kv_per_token / 1048576.0;
    std::printf("%-22s %6s %12.1f %14.3f %14.1f %12s\n", "group-at-a-time", "any", g_tps, g_group_s, g_kv_mb, "-");
    row(name + "_group", "tokens_per_s", g_tps, "tok/s");
    row(name + "_group", "group_done_s", g_group_s, "s");
    row(name + "_group", "kv_mb", g_kv_mb, "MB");
    row(name + "_group", "completion_tokens", double(baseline_completion), "tokens");
  }

  for (int64_t N : parse_list(conc)) {
    const int64_t groups = std::max<int64_t>(1, N / group);
    EngineOptions eo;
    eo.max_sequences = groups * group;
    eo.block_size = block;
    eo.check_every = check_every;
    eo.cuda_graph = !no_graph;
    eo.seed = 7;
    const int64_t per_seq_blocks = (prompt + completion + block - 1) / block + 1;
    const double need_mb = double(groups * group * per_seq_blocks * block) * kv_per_token / 1048576.0;
    eo.kv_budget_mb = kv_mb > 0 ? kv_mb : static_cast<int64_t>(need_mb * 1.05) + 16;
    Engine e(model, eo);
    // Warm-up: one short request per batch size the run will use is not needed; a short
    // run compiles the graphs of the smallest shapes only. Time the whole thing honestly.
    sync(dev);
    const double t0 = now();
    for (int64_t g = 0; g < groups; ++g) {
      EngineRequest r;
      r.id = static_cast<uint64_t>(g);
      r.prompt = random_prompt(prompt, cfg.vocab_size, 1000 + g);
      r.n = group;
      r.sampling = sp;
      e.submit(std::move(r));
    }
    int64_t tokens = 0;
    double first_done = 0, sum_done = 0;
    int64_t finished = 0;
    while (!e.idle()) {
      for (const auto& r : e.step()) {
        for (const auto& c : r.completions) tokens += static_cast<int64_t>(c.tokens.size());
        if (finished == 0) first_done = r.latency_s;
        sum_done += r.latency_s;
        ++finished;
      }
    }
    sync(dev);
    const double dt = now() - t0;
    const auto st = e.stats();
    const double tps = tokens / dt;
    const double used_mb = double(st.blocks_peak_used) * st.block_bytes / 1048576.0;
    const double pool_mb = double(st.blocks_total) * st.block_bytes / 1048576.0;
    std::printf("%-22s %6ld %12.1f %14.3f %14.1f %12.1f   (first group %.3f s, %ld graphs, %.1f%% padded rows)\n",
                "engine", long(groups * group), tps, sum_done / double(finished), used_mb, pool_mb, first_done,
                long(st.graphs_captured),
                100.0 * double(st.padded_rows) / double(std::max<int64_t>(1, st.decode_rows + st.padded_rows)));
    const std::string c = name + "_c" + std::to_string(groups * group);
    row(c + "_engine", "tokens_per_s", tps, "tok/s");
    row(c + "_engine", "group_done_s", sum_done / double(finished), "s");
    row(c + "_engine", "first_group_done_s", first_done, "s");
    row(c + "_engine", "kv_used_mb", used_mb, "MB");
    row(c + "_engine", "kv_pool_mb", pool_mb, "MB");
    row(c + "_engine", "completion_tokens", double(completion), "tokens");
    if (g_tps > 0) {
      row(c + "_engine", "speedup_vs_group", tps / g_tps, "x");
      // Group-at-a-time for these N sequences: groups one after another.
      row(c + "_group", "all_groups_done_s",
          g_group_s * double(groups) * double(completion) / double(baseline_completion), "s");
    }
  }
  return 0;
}
