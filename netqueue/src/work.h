// What the network implementations of the work seam share (stream_candidates.cpp,
// stream_groups.cpp, stream_ready.cpp): their settings from the run's config, the counts
// they add to kf:counts, and the "is the head's server still there" watch. Private to
// netqueue. Each object here belongs to one thread.
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "kf/common/config.h"
#include "kf/netqueue/netqueue.h"

namespace kf::netqueue::detail {

using Clock = std::chrono::steady_clock;

struct NetSettings {
  StreamConfig server;   // server_config(cfg): host, port, user, password, bound, claim_idle
  Millis gone_after{0};  // cluster.redis.gone_after_s
  std::string role;      // cluster.role
  std::string node;      // cluster.node_name, else the host name
  std::string run;       // run.name (scopes the learner relay's keys)
};
NetSettings net_settings(const Config& cfg);
// settings.server on `stream` with consumer group `group` and consumer name `consumer`
// ("" = StreamQueue's default).
StreamConfig stream_config(const NetSettings& s, const char* stream, const char* group,
                           const std::string& consumer = "");

// Deltas to kf:counts, sent at most once a second (flush) and when the owner closes
// (flush(true)). A failed send keeps them for the next one: counts are supervision data,
// never a reason to fail the work.
class Counts {
 public:
  Counts(StreamConfig server, std::string who) : server_(std::move(server)), who_(std::move(who)) {}
  void add(const char* field, uint64_t n) {
    if (n) pending_[field] += static_cast<int64_t>(n);
  }
  // dead-lettered entries of a StreamQueue: what its stats gained since the last call.
  void add_dead(const StreamQueue& q, uint64_t* seen);
  void flush(bool force = false);

 private:
  StreamConfig server_;
  std::string who_;
  std::map<std::string, int64_t> pending_;
  std::unique_ptr<KeyStore> store_;
  Clock::time_point next_ = Clock::now();
  bool failing_ = false;
};

// Tracks how long the head's server has not answered. From the start the clock runs: the
// head may come up later, and a server never seen is as gone as one that went away.
class Reachability {
 public:
  Reachability(std::string who, std::string where, Millis gone_after)
      : who_(std::move(who)), where_(std::move(where)), gone_after_(gone_after) {}
  void ok();  // logs "<who>: <where> answers" after a failure (and at the first answer)
  // After a Redis error: logs it (the first of a streak, and during its first 1.5 s), or
  // throws kf::Error "... has not answered for N s (cluster.redis.gone_after_s): the run
  // has ended or its head is gone" once the server has been silent for gone_after.
  void failed(const std::exception& e);
  bool failing() const { return failing_; }

 private:
  std::string who_, where_;
  Millis gone_after_;
  Clock::time_point quiet_since_ = Clock::now();
  bool failing_ = true;
};

}  // namespace kf::netqueue::detail
