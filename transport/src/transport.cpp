// The transport factory (kf/transport/transport.h): shared memory for one node, Redis
// Streams (netqueue/) for every process of a several-node run.
#include "kf/transport/transport.h"

#include <utility>

#include "kf/common/error.h"

#ifdef KF_HAVE_NETQUEUE
#include "kf/netqueue/netqueue.h"
#endif

namespace kf::transport {
namespace {

replay::RunShm& need_shm(replay::RunShm* shm, const char* what) {
  if (!shm) throw Error(std::string("transport: ") + what + " on shared memory needs this node's run segments");
  return *shm;
}

[[noreturn]] void no_network(const Config& cfg) {
  throw error_at(cfg.source(), "cluster.role: '" + cfg.get_string("cluster.role") +
                                   "' needs the network transport (Redis), which this build left out (hiredis "
                                   "was not found; run ./setup.sh and rebuild)");
}

}  // namespace

Kind kind_of(const Config& cfg) { return cfg.get_string("cluster.role") == "all" ? Kind::shm : Kind::network; }

bool network_supported() {
#ifdef KF_HAVE_NETQUEUE
  return true;
#else
  return false;
#endif
}

std::unique_ptr<replay::CandidateSource> open_candidates(const Config& cfg, replay::RunShm* shm,
                                                         const std::string& who) {
  if (kind_of(cfg) == Kind::shm) return replay::shm_candidates(need_shm(shm, "an evaluator"), who);
#ifdef KF_HAVE_NETQUEUE
  return netqueue::stream_candidates(cfg, who);
#else
  no_network(cfg);
#endif
}

std::unique_ptr<replay::GroupSink> open_groups(const Config& cfg, replay::RunShm* shm, const std::string& who) {
  if (kind_of(cfg) == Kind::shm) return replay::shm_groups(need_shm(shm, "an actor"), who);
#ifdef KF_HAVE_NETQUEUE
  return netqueue::stream_groups(cfg, shm, who);
#else
  no_network(cfg);
#endif
}

std::unique_ptr<replay::ReadyGroups> open_ready_groups(const Config& cfg, replay::RunShm* shm, int rank, int world,
                                                       std::chrono::milliseconds wait) {
  if (kind_of(cfg) == Kind::shm) return replay::shm_ready_groups(need_shm(shm, "the learner").replay(), wait);
#ifdef KF_HAVE_NETQUEUE
  return netqueue::stream_ready_groups(cfg, shm, rank, world, wait);
#else
  (void)rank, (void)world;
  no_network(cfg);
#endif
}

#ifdef KF_HAVE_NETQUEUE
namespace {
// The learner ranks' blob through the head's server (netqueue::StoreRendezvous).
class StoreBlobRendezvous : public BlobRendezvous {
 public:
  explicit StoreBlobRendezvous(netqueue::RendezvousConfig c) : rdv_(std::move(c)) {}
  void put(const std::string& key, const std::string& bytes) override { rdv_.publish(key, bytes); }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    return rdv_.fetch(key, timeout);
  }

 private:
  netqueue::StoreRendezvous rdv_;
};
}  // namespace
#endif

std::unique_ptr<BlobRendezvous> network_rendezvous(const ServerAddress& server, const std::string& scope, int rank,
                                                   int world, std::chrono::milliseconds timeout) {
#ifdef KF_HAVE_NETQUEUE
  netqueue::RendezvousConfig c;
  c.server.host = server.host;
  c.server.port = server.port;
  c.server.user = server.user;
  c.server.password = server.password;
  c.scope = scope;
  c.rank = rank;
  c.world = world;
  c.timeout = timeout;
  return std::make_unique<StoreBlobRendezvous>(std::move(c));
#else
  (void)server, (void)scope, (void)rank, (void)world, (void)timeout;
  throw Error(
      "transport: a rendezvous through Redis (learner ranks on several nodes) needs the network transport, "
      "which this build left out (hiredis was not found; run ./setup.sh and rebuild)");
#endif
}

}  // namespace kf::transport
