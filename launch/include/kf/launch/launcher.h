// Launcher: one run of the training cluster, supervised (docs/operations.md).
//
//   preflight(cfg);                 // everything checkable before anything starts
//   Launcher l(cfg, run_dir, opts); // creates the run's shared memory (loads it on resume)
//   int code = l.run();             // spawns, supervises, stops in order, saves
//
// Placement: on CUDA one evaluator per visible GPU (CUDA_VISIBLE_DEVICES=<that GPU>,
// its own CPU cores); on CPU `launch.evaluators` (default 1) CPU evaluators on half of the
// cores; actors and learner ranks share the remaining cores. On a single GPU the
// learner, actors and evaluator share it; the evaluator's exclusive timing lock keeps
// their work out of its timed trials.
//
// Stop order (Ctrl-C / SIGTERM, the learner's step budget, launch.max_minutes, or a
// worker that keeps dying): run state `draining` -> actors stop sampling, evaluators
// score what is queued and exit -> state `stopped` -> learner ranks take a final
// checkpoint and exit -> the replay, kernel database, best kernels and launcher state
// are saved. A second Ctrl-C kills every worker at once (exit 130).
//
// Data: the launcher carries none, in any mode. On one node evaluators write their results
// into the replay groups themselves; on a head (cluster.role head) every worker moves its
// work through the head's Redis server (docs/architecture.md), and the launcher only starts
// that server, writes the run's state into it and reads its counts. The live status reads
// the replay's result notes, the control block and, on a head, those counts.
//
// Threading: run() is called once, from the main thread; the launcher starts no thread.
#pragma once
#include <atomic>
#include <memory>
#include <string>

#include "kf/common/config.h"
#include "kf/common/run_dir.h"

namespace kf::launch {

struct LaunchOptions {
  std::string binary_dir;  // the build folder holding evaluator/, actors/, learner/
  bool resumed = false;
  const std::atomic<int>* signals = nullptr;  // SIGINT/SIGTERM count, set by the signal handler
};

// Throws kf::Error naming the key or file for anything that would make the run fail at
// start: every section's keys (evaluator, replay, actors, learner), the task selection
// for the backend, the run name, the policy folder (weights and tokenizer read), the
// prompt template, learner.checkpoint.every >= 1, a CUDA backend without a GPU.
void preflight(const Config& cfg);
// The policy folder's config.json, weight files (every tensor inside its file) and
// tokenizer.json (when present) are read; throws kf::Error naming learner.policy and the file.
void check_policy_folder(const std::string& dir);

// The build folder of this binary (<build>/launch/kf-launch -> <build>).
std::string binary_dir(const char* argv0);

class Launcher {
 public:
  Launcher(const Config& cfg, const RunDir& run, const LaunchOptions& opts);
  ~Launcher();
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;
  int run();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// launch.mode: serial — actor, evaluator, replay and learner in this one process, over the
// same shared memory (debugging; Sample Factory's serial runner). Same stop rules and outputs.
int run_serial(const Config& cfg, const RunDir& run, const LaunchOptions& opts);

}  // namespace kf::launch
