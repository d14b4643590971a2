// Runs kf-learner ranks on the synthetic group stream over the shared-memory
// communicator (one process per rank) and collects what the sharded-state tests compare:
// every rank's WEIGHTS_CHECKSUM, rank 0's STEP lines and final weights, every rank's log.
#pragma once
#include <nlohmann/json.hpp>

#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "kf/learner/learner.h"
#include "test_util.h"

namespace kf::learner::test {

struct ShardRun {
  std::vector<std::string> checksums;            // per rank
  std::vector<int> codes;                        // exit codes per rank
  std::vector<std::string> logs;                 // per rank
  std::vector<nlohmann::json> steps;             // rank 0's STEP lines
  std::map<std::string, torch::Tensor> weights;  // rank 0's final weights
};

// A run folder <dir>/<tag> with config <dir>/<tag>.yaml (weight decay on, and a gradient clip
// of 0.1 that binds: the norms are ~0.5); `learner_yaml` is appended to
// the learner section (two-space indented keys). args: extra kf-learner arguments;
// groups: learner.groups_per_step over all ranks.
inline ShardRun run_shard_ranks(const std::string& dir, const std::string& tag, int ranks, int steps,
                                const std::string& learner_yaml, const std::vector<std::string>& args = {},
                                const std::string& run_dir = "", int groups = 8) {
  const std::string cfg = dir + "/" + tag + ".yaml";
  write_text(cfg, "run:\n  name: " + tag + "\n  root: " + dir +
                      "\n  seed: 5\nlearner:\n  groups_per_step: " + std::to_string(groups) +
                      "\n"
                      "  micro_batch_tokens: 96\n  deterministic: true\n  optim:\n    lr: 1.0e-3\n    weight_decay: "
                      "0.01\n    grad_clip: 0.1\n"
                      "  schedule:\n    warmup_steps: 0\n  snapshot:\n    every: 0\n  checkpoint:\n    every: 0\n" +
                      learner_yaml + "  dist:\n    ranks: " + std::to_string(ranks) + "\n");
  const std::string dump = dir + "/" + tag + ".weights.safetensors";
  std::vector<pid_t> pids;
  for (int r = 0; r < ranks; ++r) {
    std::vector<std::string> a = {learner_bin(), cfg,
                                  "--synthetic", "--print-steps",
                                  "--device",    "cpu",
                                  "--steps",     std::to_string(steps),
                                  "--rank",      std::to_string(r),
                                  "--comm-name", "kf.test.shard." + tag + "." + std::to_string(::getpid())};
    if (!run_dir.empty()) a.insert(a.end(), {"--run-dir", run_dir});
    a.insert(a.end(), args.begin(), args.end());
    if (r == 0) a.insert(a.end(), {"--dump-weights", dump});
    pids.push_back(spawn(a, dir + "/" + tag + "-" + std::to_string(r) + ".log"));
  }
  ShardRun out;
  for (int r = 0; r < ranks; ++r) {
    out.codes.push_back(wait_exit(pids[r]));
    out.logs.push_back(read_text(dir + "/" + tag + "-" + std::to_string(r) + ".log"));
    std::smatch m;
    if (std::regex_search(out.logs[r], m, std::regex("WEIGHTS_CHECKSUM ([0-9a-f]+)"))) out.checksums.push_back(m[1]);
    if (r == 0) {
      std::istringstream lines(out.logs[r]);
      for (std::string line; std::getline(lines, line);)
        if (line.rfind("STEP ", 0) == 0) out.steps.push_back(nlohmann::json::parse(line.substr(5)));
    }
  }
  if (out.codes[0] == 0 && std::ifstream(dump).good()) out.weights = read_tensors(dump);
  return out;
}

// Largest |a - b| / max(|a|, 1e-3) over every tensor; -1 when the names differ.
inline double max_rel_diff(const std::map<std::string, torch::Tensor>& a,
                           const std::map<std::string, torch::Tensor>& b) {
  if (a.size() != b.size()) return -1;
  double worst = 0;
  for (const auto& [name, t] : a) {
    auto it = b.find(name);
    if (it == b.end() || it->second.sizes() != t.sizes()) return -1;
    const auto d = (t - it->second).abs() / t.abs().clamp_min(1e-3);
    worst = std::max(worst, d.max().item<double>());
  }
  return worst;
}

inline bool bitwise_equal(const std::map<std::string, torch::Tensor>& a,
                          const std::map<std::string, torch::Tensor>& b) {
  if (a.size() != b.size() || a.empty()) return false;
  for (const auto& [name, t] : a) {
    auto it = b.find(name);
    if (it == b.end() || !torch::equal(t, it->second)) return false;
  }
  return true;
}

// The optimizer-state bytes of a rank's log line "AdamW state <x> MiB (<n> bytes)"; -1 when missing.
inline double logged_state_bytes(const std::string& log) {
  std::smatch m;
  if (!std::regex_search(log, m, std::regex("AdamW state [0-9.]+ MiB \\(([0-9]+) bytes\\)"))) return -1;
  return std::stod(m[1]);
}

}  // namespace kf::learner::test
