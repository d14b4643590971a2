// Settings, counts and the server watch of the network work seam (work.h), and the public
// server_config / network_counts (kf/netqueue/netqueue.h).
#include "work.h"

#include <unistd.h>

#include <cstdlib>

#include "kf/common/error.h"
#include "kf/common/log.h"

namespace kf::netqueue {

StreamConfig server_config(const Config& cfg) {
  StreamConfig s;
  s.host = cfg.get_string("cluster.redis.host");
  // The head reaches its own server where it listens (cluster.redis.bind, when given).
  if (cfg.get_string("cluster.role") == "head") {
    const auto bind = cfg.get_strings("cluster.redis.bind");
    if (!bind.empty()) s.host = bind.front() == "0.0.0.0" || bind.front() == "::" ? "127.0.0.1" : bind.front();
  }
  if (s.host.empty()) throw error_at(cfg.source(), "cluster.redis.host: empty");
  s.port = static_cast<int>(cfg.get_int("cluster.redis.port"));
  const std::string env = cfg.get_string("cluster.redis.password_env");
  const char* pw = env.empty() ? nullptr : std::getenv(env.c_str());
  if (!pw || !*pw)
    throw error_at(cfg.source(), "cluster.redis.password_env: $" + env +
                                     " is unset or empty; every process of a run of several nodes needs the run's "
                                     "Redis password there");
  s.password = pw;
  s.bound = static_cast<uint64_t>(cfg.get_int("cluster.redis.bound"));
  s.claim_idle = Millis(static_cast<long long>(cfg.get_float("cluster.redis.claim_idle_s") * 1000));
  return s;
}

NetworkCounts network_counts(const StreamConfig& server) {
  auto ks = KeyStore::open(server);
  return network_counts(ks);
}

NetworkCounts network_counts(KeyStore& ks) {
  NetworkCounts c;
  const std::map<std::string, uint64_t*> fields = {{"groups_published", &c.groups_published},
                                                   {"candidates_published", &c.candidates_published},
                                                   {"known_results", &c.known_results},
                                                   {"unqueued", &c.unqueued},
                                                   {"results_sent", &c.results_sent},
                                                   {"results_late", &c.results_late},
                                                   {"claimed_again", &c.claimed_again},
                                                   {"undecodable", &c.undecodable},
                                                   {"dropped", &c.dropped},
                                                   {"dead_lettered", &c.dead_lettered},
                                                   {"groups_opened", &c.groups_opened},
                                                   {"groups_dropped", &c.groups_dropped},
                                                   {"groups_duplicate", &c.groups_duplicate},
                                                   {"results_joined", &c.results_joined},
                                                   {"results_orphan", &c.results_orphan},
                                                   {"results_duplicate", &c.results_duplicate},
                                                   {"members_lost", &c.members_lost},
                                                   {"kernels_inserted", &c.kernels_inserted}};
  for (const auto& [f, v] : ks.counts(kCountsKey)) {
    const auto it = fields.find(f);
    if (it != fields.end() && v > 0) *it->second = static_cast<uint64_t>(v);
  }
  return c;
}

namespace detail {

NetSettings net_settings(const Config& cfg) {
  NetSettings s;
  s.server = server_config(cfg);
  s.gone_after = Millis(static_cast<long long>(cfg.get_float("cluster.redis.gone_after_s") * 1000));
  s.role = cfg.get_string("cluster.role");
  s.node = cfg.get_string("cluster.node_name");
  if (s.node.empty()) {
    char h[256] = {0};
    s.node = ::gethostname(h, sizeof h - 1) == 0 && h[0] ? h : "node";
  }
  s.run = cfg.get_string("run.name");
  return s;
}

StreamConfig stream_config(const NetSettings& s, const char* stream, const char* group, const std::string& consumer) {
  StreamConfig c = s.server;
  c.stream = stream;
  c.group = group;
  c.consumer = consumer;
  return c;
}

void Counts::add_dead(const StreamQueue& q, uint64_t* seen) {
  const uint64_t now = q.stats().dead_lettered;
  if (now > *seen) add("dead_lettered", now - *seen);
  *seen = now;
}

void Counts::flush(bool force) {
  if (pending_.empty() || (!force && Clock::now() < next_)) return;
  next_ = Clock::now() + std::chrono::seconds(1);
  try {
    if (!store_) store_ = std::make_unique<KeyStore>(KeyStore::open(server_));
    store_->add(kCountsKey, {pending_.begin(), pending_.end()});
    pending_.clear();
    failing_ = false;
  } catch (const std::exception& e) {
    // A lost reply may have added them already: at most one flush is counted twice.
    if (!failing_) log_warn(who_, ": adding to ", kCountsKey, " failed (", e.what(), "); kept for the next try");
    failing_ = true;
    store_.reset();
  }
}

void Reachability::ok() {
  if (failing_) log_info(who_, ": ", where_, " answers");
  failing_ = false;
}

void Reachability::failed(const std::exception& e) {
  const auto now = Clock::now();
  if (!failing_) quiet_since_ = now;
  const double quiet = std::chrono::duration<double>(now - quiet_since_).count();
  if (now - quiet_since_ > gone_after_)
    throw Error(who_ + ": " + where_ + " has not answered for " + std::to_string(static_cast<long long>(quiet)) +
                " s (cluster.redis.gone_after_s): the run has ended or its head is gone");
  if (!failing_ || quiet < 1.5)
    log_warn(who_, ": ", message_of(e), "; retrying every 1 s (gives up after cluster.redis.gone_after_s)");
  failing_ = true;
}

}  // namespace detail
}  // namespace kf::netqueue
