// RunMonitor: what tools/launch knows about a running run, for the status display,
// metrics/run.jsonl and the resume state.
//
// Two sources:
//  - every result joined into the replay (by an evaluator on one node, by the learner's rank 0
//    on a head), read from the replay's result notes (read_results; serial mode passes its
//    results to add_result): verdict mix, speedups, rewards, over the last `window` results
//    and in total;
//  - the control block's per-process counters, summed per role over every process
//    the run ever had: a worker that exits or is restarted keeps its counts (the
//    monitor remembers the last value seen per (slot, pid));
//  - on a head (several nodes): the server's counts of candidates and results
//    (set_network_counts) and the figures other nodes reported (merge_node_seconds).
// Rates (samples/s, verified/min) are taken over the last ~10 s of samples.
//
// Threading: add_result() may run on another thread than the rest; everything else is
// called by one thread (the launcher's main loop).
#pragma once
#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "kf/replay/replay.h"

namespace kf::launch {

struct ResultSummary {
  uint64_t total = 0;                                             // results ever seen (resume included)
  std::map<std::string, uint64_t> verdicts;                       // cumulative, by verdict name
  std::size_t window_n = 0;                                       // results in the window
  std::map<std::string, double> window_frac;                      // verdict name -> share of the window
  double mean_speedup = 0, median_speedup = 0, best_speedup = 0;  // ok results in the window (0: none)
  double fast1_frac = 0;                                          // ok and speedup > 1, share of the window
  double mean_reward = 0;
  double best_speedup_ever = 0;
  double frac(const char* verdict) const;  // share of the window with that verdict (0 if none)
};

// Seconds of work (and the actors' counts) one launcher session of an evaluator or actor
// node reported to the head (cluster.h, kNodeSecondsStream): cumulative over that session.
struct NodeSeconds {
  double generate_s = 0, compile_s = 0, verify_s = 0, gpu_wait_s = 0;
  uint64_t verdicts = 0;  // verdict lines summed (evaluator nodes)
  // Actor nodes: their actors' counters (replay::counter kActorPushed, kActorExtractFail,
  // kActorLagSum), for the head's extraction failures and policy lag.
  uint64_t pushed = 0, extraction_failures = 0, lag_sum = 0;
  // Reports of one session only grow: keep each figure's largest, so one delivered late
  // never takes a figure back.
  void raise_to(const NodeSeconds& o) {
    generate_s = std::max(generate_s, o.generate_s);
    compile_s = std::max(compile_s, o.compile_s);
    verify_s = std::max(verify_s, o.verify_s);
    gpu_wait_s = std::max(gpu_wait_s, o.gpu_wait_s);
    verdicts = std::max(verdicts, o.verdicts);
    pushed = std::max(pushed, o.pushed);
    extraction_failures = std::max(extraction_failures, o.extraction_failures);
    lag_sum = std::max(lag_sum, o.lag_sum);
  }
  bool operator==(const NodeSeconds& o) const {
    return generate_s == o.generate_s && compile_s == o.compile_s && verify_s == o.verify_s &&
           gpu_wait_s == o.gpu_wait_s && verdicts == o.verdicts && pushed == o.pushed &&
           extraction_failures == o.extraction_failures && lag_sum == o.lag_sum;
  }
};

// Per-role sums of control-block counters over all processes ever seen.
class CounterTotals {
 public:
  void update(const std::vector<replay::PeerInfo>& peers);
  uint64_t sum(const std::string& role, int counter) const;
  nlohmann::json to_json() const;
  void from_json(const nlohmann::json& j);  // adds saved totals as a base (resume)

 private:
  struct Seen {
    int32_t pid = 0;
    std::string role;
    std::vector<uint64_t> last;
  };
  std::map<int, Seen> seen_;                              // by control-block slot
  std::map<std::string, std::vector<uint64_t>> retired_;  // counts of slots reused by a new pid
  std::map<std::string, std::vector<uint64_t>> base_;     // from a resumed run
};

struct Status {
  double elapsed_s = 0;
  int64_t step = 0, step_budget = 0;  // learner steps (budget 0: none)
  double time_budget_s = 0;           // launch.max_minutes in seconds (0: none)
  // Seconds until the run stops: the earlier of the step budget at the learner's pace since
  // this launcher saw its first step, and the time cap. -1: unknown (no budget, or no pace yet).
  double eta_s = -1;
  std::string eta_reason;  // "step budget" or "time cap"
  double samples_per_s = 0, verified_per_min = 0;
  uint64_t samples = 0, verified = 0, extraction_failures = 0;
  ResultSummary results;
  uint64_t candidate_queue = 0, ready_groups = 0, open_groups = 0;
  double policy_lag = 0;  // mean over the candidates pushed in the rate window
  int64_t policy_version = -1;
  double gpu_busy = -1;  // 0..1, -1: unknown
  // Where the time went, summed over the processes of a role since the start (seconds):
  // actors generating, evaluators compiling and verifying, learner ranks training, and
  // actors + learners waiting for the GPU while an evaluator timed. On a head, the seconds
  // evaluator and actor nodes reported are included (merge_node_seconds).
  double generate_s = 0, compile_s = 0, verify_s = 0, learn_s = 0, gpu_wait_s = 0;
  std::string phase;                 // running / draining / stopping
  std::vector<std::string> workers;  // "actor 0 up", "evaluator 0 restarting (2)", ...
  // The last learning-curve probe (actors.probe): policy version (-1: none yet), mean reward
  // and pass rate over its scored samples, how many were scored.
  int64_t probe_version = -1;
  double probe_reward = 0, probe_pass = 0;
  uint64_t probe_scored = 0;
};

// Fills the probe fields of `s` from actor 0's brief (control-block rendezvous key "probe",
// {"version", "reward", "pass", "scored", "samples"}); a brief that does not parse is ignored.
void apply_probe_brief(const std::string& brief, Status& s);

class RunMonitor {
 public:
  explicit RunMonitor(std::size_t window) : window_(window) {}

  void add_result(const replay::Result& r);
  // Adds the result notes the replay gained since the last call (the evaluators' results;
  // actor-scored extraction failures are left out, as the actors count them). Returns how
  // many notes were overwritten before this call could read them (0 when called often
  // enough: the ring holds ReplayBuffer::kResultNotes).
  uint64_t read_results(const replay::ReplayBuffer& replay);
  ResultSummary results() const;
  CounterTotals& counters() { return counters_; }

  // Records one sample of the cumulative counts (call about once a second) and fills
  // the rates of `s` over the last ~10 s.
  void sample_rates(double elapsed_s, Status& s);
  // Several nodes (a head): every candidate of every node passes the head's server, so
  // `samples` and `verified` are its counts of this launcher session (candidates published,
  // results sent back; cluster.h, NetworkAccount) plus what earlier sessions of the run
  // counted (the resume state), instead of this node's actors' and evaluators' counters.
  void set_network_counts(uint64_t created, uint64_t scored) {
    network_ = true;
    net_created_ = created;
    net_scored_ = scored;
  }
  // Seconds other nodes reported, per launcher session: each field of a session keeps the
  // largest value seen (reports are cumulative; a resumed head merges what it saved).
  void merge_node_seconds(const std::map<std::string, NodeSeconds>& by_session);
  NodeSeconds node_seconds() const;  // summed over sessions

  nlohmann::json to_json() const;  // the resume state (totals, not windows)
  // Fills s.eta_s / s.eta_reason from s.step, s.step_budget and s.time_budget_s (sample_rates
  // calls it; public for tests).
  void fill_eta(double elapsed_s, Status& s);
  void from_json(const nlohmann::json& j);

 private:
  mutable std::mutex mu_;
  std::size_t window_;
  struct Lite {
    replay::Verdict verdict;
    double speedup, reward;
  };
  void add(replay::Verdict v, double speedup, double reward);  // under mu_
  std::deque<Lite> recent_;
  uint64_t note_cursor_ = 0;  // next replay result note to read
  uint64_t total_ = 0;
  std::map<std::string, uint64_t> verdicts_;
  double best_ever_ = 0;
  CounterTotals counters_;
  struct RateSample {
    double t;
    uint64_t samples, verified;
    uint64_t lag_n, lag_sum;  // candidates whose lag is counted, and that lag summed
  };
  std::deque<RateSample> rate_;
  bool network_ = false;                                 // set_network_counts was called
  uint64_t net_created_ = 0, net_scored_ = 0;            // this session's (set_network_counts)
  uint64_t net_created_base_ = 0, net_scored_base_ = 0;  // earlier sessions' (from_json)
  std::map<std::string, NodeSeconds> node_seconds_;      // merge_node_seconds
  double first_step_t_ = -1;                             // when this launcher first saw a learner step
  int64_t first_step_ = 0;
};

// The terminal view (several lines, fixed width) and the one-line log view.
std::string render_status(const Status& s);
std::string render_status_line(const Status& s);
// "1h05m", "4m07s", "12s"; and "ETA 4m07s (step budget)" / "ETA n/a" for a status.
std::string format_duration(double seconds);
std::string eta_text(const Status& s);
// The numeric fields of a status for metrics/run.jsonl and TensorBoard.
std::vector<std::pair<std::string, double>> status_scalars(const Status& s);

}  // namespace kf::launch
