// The evaluator's verdict on one candidate: plain data (no torch), with JSON and text
// renderings. The verdict and its cause are the record layer's own types (replay/
// records.h), so the shared-memory Result record carries them as they are.
#pragma once
#include <string>
#include <vector>

#include "kf/evaluator/stats.h"
#include "kf/replay/records.h"  // defines: Verdict, Cause, verdict_name, cause_name

namespace kf::evaluator {

using replay::Cause;
using replay::cause_name;
using replay::Verdict;
using replay::verdict_name;

// One named check and how it went, in the order the evaluator ran them.
struct Check {
  std::string name;  // e.g. "correct.distribution", "anti.timer_tamper"
  bool passed = true;
  std::string detail;
};

struct Result {
  std::string task, backend, candidate_key;
  Verdict verdict = Verdict::ok;
  Cause cause = Cause::kernel;  // environment: the machine caused the verdict (the learner leaves it out)
  std::string reason;           // empty when ok; names the trick for rejected_cheat
  std::string diagnostics;      // compiler errors or worker log tail (truncated)
  TimeSummary ref_ms, cand_ms;  // timed trials
  double speedup = 0;           // ref median / candidate median (ok only); speedup_lo when timing_unstable
  // The speedup's 95 % interval from the paired trials (stats.h: paired_speedup_interval).
  double speedup_lo = 0, speedup_hi = 0;
  // Correct, but its time could not be measured stably (spread over max_spread after
  // max_trials): still ok, and `speedup` is then the conservative estimate speedup_lo,
  // which the reward uses.
  bool timing_unstable = false;
  double max_abs_error = 0, max_rel_error = 0;  // over every checked call
  bool nondeterministic = false;  // identical calls gave different bits at the sampled positions (within tolerance)
  bool task_degenerate = false;   // reference output (nearly) constant / input-independent
  std::string degenerate_reason;
  std::vector<Check> checks;
  double reward = 0;
  double compile_s = 0, verify_s = 0;
  // CUDA: the GPU memory this verification claimed (0: no claim) and the most this process
  // held for it (caching allocator peak plus the sandbox's device arena); the worker's own
  // context and buffers are not in it. For fitting the claim's factors to what is used.
  double gpu_claim_gb = 0, gpu_peak_gb = 0;
  // Where verify_s went (CUDA, for the evaluators' throughput): waiting for the GPU memory
  // claim, waiting for the timing lock (exclusive and shared holds), and the timed trials
  // with their warm-ups, lock waits included; and how many timed trials ran.
  double claim_wait_s = 0, lock_wait_s = 0, timing_s = 0;
  int timed_trials = 0;
  bool ok() const { return verdict == Verdict::ok; }
  int checks_passed() const;
};

std::string to_json(const Result& r, int indent = -1);
std::string to_text(const Result& r);

}  // namespace kf::evaluator
