// The communicator and rendezvous factories only kf-learner and the learner's tests call
// (the public ones, local and NCCL, are in kf/learner/learner.h, "Communicator"):
//  - make_shm_comm: ranks that are processes of one host, over a POSIX shared-memory
//    segment; a chunked reduce-scatter + all-gather, each element summed in rank order, so
//    every rank gets the same bits (CI and CPU-only runs);
//  - control_rendezvous: the NCCL unique id through the run's control block (one node);
//  - redis_rendezvous: through the head's Redis server, for ranks on several nodes (a thin
//    wrapper over kf::transport::network_rendezvous).
// Threading: as Communicator and Rendezvous (one thread per object).
#pragma once
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "kf/learner/learner.h"
#include "kf/replay/replay.h"

namespace kf::learner {

// Hand-over of small blobs (the NCCL unique id) from rank 0 to the others: a folder here,
// the run's control block or the head's Redis server (learner/src/comm.h).
class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  virtual void put(const std::string& key, const std::string& bytes) = 0;
  // Waits up to timeout; throws kf::Error naming the key and where it looked.
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;
};
// <dir>/<key>, written atomically.
std::unique_ptr<Rendezvous> file_rendezvous(const std::string& dir);

// One rank per GPU (`device` is this rank's CUDA index). Rank 0 puts the unique id under
// `key`; the others get it (waiting up to timeout).
std::unique_ptr<Communicator> make_nccl_comm(int rank, int world, int device, Rendezvous& rdv,
                                             const std::string& key = "nccl_id",
                                             std::chrono::milliseconds timeout = std::chrono::seconds(120));

// Rank 0 creates /dev/shm/<segment> (replacing a stale one), the others attach; it is
// unlinked once all ranks joined. chunk_bytes: staging per rank per round. A peer that
// stops calling makes the others throw after `timeout`.
std::unique_ptr<Communicator> make_shm_comm(const std::string& segment, int rank, int world,
                                            std::chrono::milliseconds timeout = std::chrono::seconds(120),
                                            std::size_t chunk_bytes = 4u << 20);

// The run's control block (replay/control.h rendezvous slots).
std::unique_ptr<Rendezvous> control_rendezvous(replay::ControlBlock& ctl);

// Ranks on several nodes: the run's Redis server (cluster.redis.*). Keys
// kf:rdv:<scope>:<key>[:rank:<r>]. put() (rank 0) announces and waits up to `timeout`
// until every other rank has announced itself, then publishes; get() (rank r) announces
// and waits for the publication carrying its own token. A timeout throws kf::Error naming
// the server, the run and the ranks that never came.
struct RedisRendezvousOptions {
  std::string host = "127.0.0.1";
  int port = 6390;
  std::string user = "kf";
  std::string password;
  std::string scope;  // the run name
  int rank = 0, world = 1;
  std::chrono::milliseconds timeout{120000};
};
// True when this build has the network transport (kf::transport::network_supported());
// redis_rendezvous throws kf::Error otherwise.
bool redis_rendezvous_available();
std::unique_ptr<Rendezvous> redis_rendezvous(const RedisRendezvousOptions& opt);

}  // namespace kf::learner
