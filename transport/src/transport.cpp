// The transport factory (kf/transport/transport.h): shared memory for one node, Redis
// Streams (netqueue/) for every process of a several-node run.
#include "kf/transport/transport.h"

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

}  // namespace kf::transport
