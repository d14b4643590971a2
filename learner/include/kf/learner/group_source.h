// GroupSource: where a learner rank gets its scored groups each step.
//  - ReplaySource: the run's ReplayBuffer (shared memory); each rank takes its share
//    (groups_per_step / ranks) of the ready groups, oldest policy version first; the
//    buffer drops groups older than the staleness bound at take time (counted).
//  - SyntheticSource: a deterministic stream for tests and benchmarks: group k of step s
//    depends only on (seed, s, k), and rank r of R gets groups k with k % R == r, so
//    R ranks together see exactly the batch one rank sees, and a resumed learner sees
//    exactly the data it would have seen.
// Threading: the learner thread.
#pragma once
#include <cstdint>
#include <vector>

#include "kf/replay/replay.h"

namespace kf::learner {

struct TakeRequest {
  int64_t step = 0;  // the optimizer step being built
  int rank = 0, world = 1;
  int64_t groups = 0;   // this rank's share
  int64_t version = 0;  // the learner's current policy version
  int64_t max_lag = 0;
};

class GroupSource {
 public:
  virtual ~GroupSource() = default;
  virtual std::vector<replay::ScoredGroup> take(const TakeRequest& r) = 0;
  virtual uint64_t dropped_stale() const { return 0; }  // dropped before they reached the learner
};

class ReplaySource : public GroupSource {
 public:
  // Waits up to timeout_ms for the first ready group of a take.
  ReplaySource(replay::ReplayBuffer& buffer, int64_t timeout_ms) : buffer_(buffer), timeout_ms_(timeout_ms) {}
  std::vector<replay::ScoredGroup> take(const TakeRequest& r) override;
  uint64_t dropped_stale() const override;

 private:
  replay::ReplayBuffer& buffer_;
  int64_t timeout_ms_;
};

struct SyntheticConfig {
  uint64_t seed = 1;
  int64_t vocab = 256;
  int64_t group_size = 4;
  int64_t prompt_min = 4, prompt_max = 12;
  int64_t completion_min = 3, completion_max = 10;
  double behaviour_logprob = -5.5;  // about -log(vocab) for a random-init model
  double behaviour_noise = 0.2;
  int64_t equal_reward_every = 5;  // every Nth group has all-equal rewards (0: never)
  int64_t stale_every = 0;         // every Nth group is max_lag + 1 versions old (0: never)
};

class SyntheticSource : public GroupSource {
 public:
  explicit SyntheticSource(SyntheticConfig cfg) : cfg_(cfg) {}
  std::vector<replay::ScoredGroup> take(const TakeRequest& r) override;
  // Group k of step `step` when the whole step has `total` groups (exposed for tests).
  replay::ScoredGroup make_group(int64_t step, int64_t k, int64_t version, int64_t max_lag) const;
  int64_t groups_per_step_total = 8;  // what all ranks together take per step

 private:
  SyntheticConfig cfg_;
};

}  // namespace kf::learner
