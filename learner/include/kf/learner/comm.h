// Communicator: what data-parallel learner ranks need from each other. All-reduce (sum)
// of flat fp32/fp64 buffers, reduce-scatter and all-gather (sharded training state),
// broadcast and barrier, identical for every backend:
//  - local: one rank, every call a no-op (serial mode);
//  - shm:   ranks are processes of one host sharing a POSIX shared-memory segment; a
//           chunked reduce-scatter + all-gather, each element summed in rank order, so
//           every rank gets the same bits (CI and CPU-only runs);
//  - nccl:  one rank per GPU; rank 0 makes the unique id and hands it over through a
//           Rendezvous (the run's control block, or a file on a shared filesystem).
// Every rank must make the same calls in the same order (as with NCCL). A peer that
// dies or stops calling makes the others throw kf::Error naming the communicator, the
// operation and the rank(s) after `timeout` (shm), instead of hanging.
//
// all_reduce_async() may return before the reduction is done (NCCL: queued on the
// communicator's stream after the caller's stream reaches this point); synchronize()
// makes the caller's stream wait for everything queued. For shm and local it is
// synchronous. Threading: one thread per Communicator, except that all_reduce_async may
// be called from the autograd thread during backward while the caller waits in it.
#pragma once
#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <string>

namespace kf::replay {
class ControlBlock;
}

namespace kf::learner {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  virtual std::string name() const = 0;  // "shm:kf.learn.x rank 1/4", for logs and errors
  // In place; contiguous fp32 or fp64 on the communicator's device.
  virtual void all_reduce_sum(torch::Tensor& t) = 0;
  virtual void all_reduce_async(torch::Tensor t) { all_reduce_sum(t); }
  virtual void synchronize() {}
  virtual void broadcast(torch::Tensor& t, int root) = 0;
  virtual void barrier() = 0;

  // Reduce-scatter (sum), in place. t: contiguous fp32/fp64 (shm also bf16, summed in
  // fp32), numel a multiple of world(), seen as world() equal slices. Afterwards slice
  // rank() of t holds the sum over ranks of that slice; the other slices are unspecified.
  // shm sums each element in rank order exactly as all_reduce_sum does, so the owned
  // slice is bitwise what an all-reduce would have left there.
  // The defaults (all-reduce; one broadcast per rank) are correct for any backend.
  virtual void reduce_scatter_sum(torch::Tensor& t) { all_reduce_sum(t); }
  virtual void reduce_scatter_async(torch::Tensor t) { reduce_scatter_sum(t); }
  // All-gather, in place: t (contiguous, any dtype, numel a multiple of world()) is seen as
  // world() equal slices; afterwards slice r holds what rank r had in its slice r.
  virtual void all_gather(torch::Tensor& t);
  virtual void all_gather_async(torch::Tensor t) { all_gather(t); }

  // A marker of everything queued so far (NCCL: an event recorded on the communicator's
  // stream); wait_for(m) makes the caller's stream wait for that work only, not for what
  // was queued after it (synchronize() waits for all). Synchronous backends: nothing to wait for.
  virtual std::shared_ptr<void> mark() { return nullptr; }
  virtual void wait_for(const std::shared_ptr<void>& m) {
    if (m) synchronize();
  }
};

// Hand-over of small blobs (the NCCL unique id) from rank 0 to the others.
class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  virtual void put(const std::string& key, const std::string& bytes) = 0;
  // Waits up to timeout; throws kf::Error naming the key and where it looked.
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;
};
// <dir>/<key>, written atomically.
std::unique_ptr<Rendezvous> file_rendezvous(const std::string& dir);
// The run's control block (replay/control.h rendezvous slots).
std::unique_ptr<Rendezvous> control_rendezvous(replay::ControlBlock& ctl);

// Ranks on several nodes: the run's Redis server (cluster.redis.*; kf::netqueue
// StoreRendezvous). Keys kf:rdv:<scope>:<key>[:rank:<r>]. put() (rank 0) announces and
// waits up to `timeout` until every other rank has announced itself, then publishes;
// get() (rank r) announces and waits for the publication carrying its own token. A
// timeout throws kf::Error naming the server, the run and the ranks that never came.
struct RedisRendezvousOptions {
  std::string host = "127.0.0.1";
  int port = 6390;
  std::string user = "kf";
  std::string password;
  std::string scope;  // the run name
  int rank = 0, world = 1;
  std::chrono::milliseconds timeout{120000};
};
// True when this build has the Redis queue (hiredis found); redis_rendezvous throws otherwise.
bool redis_rendezvous_available();
std::unique_ptr<Rendezvous> redis_rendezvous(const RedisRendezvousOptions& opt);

std::unique_ptr<Communicator> make_local_comm();

// Rank 0 creates /dev/shm/<segment> (replacing a stale one), the others attach; it is
// unlinked once all ranks joined. chunk_bytes: staging per rank per round.
std::unique_ptr<Communicator> make_shm_comm(const std::string& segment, int rank, int world,
                                            std::chrono::milliseconds timeout = std::chrono::seconds(120),
                                            std::size_t chunk_bytes = 4u << 20);

// True when this build has NCCL (KF_HAVE_NCCL); make_nccl_comm throws kf::Error otherwise.
bool nccl_available();
// One rank per GPU (`device` is this rank's CUDA index). Rank 0 puts the unique id under
// `key`; the others get it (waiting up to timeout).
std::unique_ptr<Communicator> make_nccl_comm(int rank, int world, int device, Rendezvous& rdv,
                                             const std::string& key = "nccl_id",
                                             std::chrono::milliseconds timeout = std::chrono::seconds(120));

}  // namespace kf::learner
