// kf/transport/transport.h: the one factory that picks how work moves in a process
// (docs/architecture.md, "Seams"). Callers get the seam's interfaces (kf/replay/replay.h:
// CandidateSource, GroupSink, ReadyGroups) and never name a transport:
//   cluster.role all    shared memory of this node's run (replay/)
//   any other role      Redis Streams on the head's server (netqueue/), for every process
//                       of every node: one path, whichever node a process runs on
// A build without hiredis has only shared memory; asking it for the network throws
// kf::Error naming cluster.role.
//
// Threading: plain functions, any thread; each object they return follows its interface's
// contract (one object per thread that uses it).
#pragma once
#include <chrono>
#include <memory>
#include <string>

#include "kf/common/config.h"
#include "kf/replay/replay.h"

namespace kf::transport {

enum class Kind { shm, network };
// Which transport the config picks (cluster.role), and whether this build has the network one.
Kind kind_of(const Config& cfg);
bool network_supported();

// Evaluator `who` (its log name, e.g. "evaluator 2"): candidates to score. shm: the run's
// candidate queue (needs shm). network: the head's candidate stream; shm may be null.
std::unique_ptr<replay::CandidateSource> open_candidates(const Config& cfg, replay::RunShm* shm,
                                                         const std::string& who);
// Actor `who`: where its groups go.
std::unique_ptr<replay::GroupSink> open_groups(const Config& cfg, replay::RunShm* shm, const std::string& who);
// Learner rank `rank` of `world`: ready groups, waiting up to `wait` for the first of a take.
// shm: the run's replay. network: rank 0 on the head gathers what the nodes published into
// the head's replay first (so shm must be given there).
std::unique_ptr<replay::ReadyGroups> open_ready_groups(const Config& cfg, replay::RunShm* shm, int rank, int world,
                                                       std::chrono::milliseconds wait);

// Learner ranks on several nodes: rank 0's small blob (the NCCL unique id) reaches the
// other ranks through the head's server (keys under kf:rdv:<scope>:). put() is rank 0's
// (it waits until every other rank announced itself), get() the others'. Errors throw
// kf::Error naming the server, the run and the ranks that never came.
struct ServerAddress {
  std::string host = "127.0.0.1";
  int port = 6390;
  std::string user = "kf";
  std::string password;
};
class BlobRendezvous {
 public:
  virtual ~BlobRendezvous() = default;
  virtual void put(const std::string& key, const std::string& bytes) = 0;
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;
};
std::unique_ptr<BlobRendezvous> network_rendezvous(const ServerAddress& server, const std::string& scope, int rank,
                                                   int world, std::chrono::milliseconds timeout);

}  // namespace kf::transport
