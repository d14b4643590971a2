// GroupRelay: scored groups for learner ranks off the replay's node. Private to netqueue:
// stream_ready_groups (stream_ready.cpp) is its one user. A learner rank on another node
// cannot map the head's replay; rank 0 (on the head) takes that rank's share for it and
// hands it over through the run's Redis server, one request and one reply per learner step
// (docs/netqueue.md, "Groups for learner ranks on other nodes").
//
//   kf:lrn:<run>:req:<r>   rank r's requests (a Redis list): step, groups wanted, version, max lag
//   kf:lrn:<run>:rep:<r>   rank 0's replies: the step and the encoded groups (records.h)
//
// Every rank calls take() once per learner step (the steps are in lockstep: each ends in
// an all-reduce), so rank 0 serves each remote rank exactly once per step, in order; a
// reply for another step is an error, never silently used.
//
// Failures: kf::Error naming the server, the run, the rank and the step ("no request
// from rank 2 for step 14 within 300000 ms"). Threads: one object per thread.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "kf/netqueue/netqueue.h"

namespace kf::netqueue {

struct GroupRequest {
  int64_t step = 0;
  int64_t groups = 0;
  int64_t version = 0;
  int64_t max_lag = 0;
};

class GroupRelay {
 public:
  // Connects (kf::Error naming the server on failure). scope: the run name.
  GroupRelay(const StreamConfig& server, std::string scope);
  ~GroupRelay();
  GroupRelay(const GroupRelay&) = delete;
  GroupRelay& operator=(const GroupRelay&) = delete;

  // --- a remote rank r: send its request, wait up to timeout for rank 0's reply.
  std::vector<replay::ScoredGroup> request(int rank, const GroupRequest& req, Millis timeout);
  // --- rank 0: the next request of rank r (waits up to timeout), then the reply to it.
  GroupRequest next_request(int rank, Millis timeout);
  void reply(int rank, int64_t step, const std::vector<replay::ScoredGroup>& groups);
  std::string where() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kf::netqueue
