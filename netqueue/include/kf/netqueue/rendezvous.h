// StoreRendezvous: hands one small blob (the NCCL unique id) from rank 0 to ranks
// 1..world-1 of a job through the run's Redis server, when the ranks sit on several
// nodes and share no memory or file system. kf::learner::redis_rendezvous wraps it.
//
// Keys (all under the ACL user's `kf:` prefix, scoped by the run name):
//   kf:rdv:<scope>:<key>:rank:<r>   rank r's announcement: a random token of this process
//   kf:rdv:<scope>:<key>            rank 0's publication: the tokens of ranks 1..world-1
//                                   it saw, then the blob
// Every rank first announces itself. Rank 0 waits until all world-1 others have, then
// publishes; rank r accepts only a publication that carries its own token, so a value
// left by an earlier attempt of the same run on the same server is never taken for the
// current one. Keys expire (timeout + 60 s) and are not persisted.
//
// Failures: a timeout throws kf::Error naming the rendezvous, the server and the ranks
// that never announced themselves (rank 0: the others; rank r: rank 0's publication and
// whoever is missing). Until the deadline, an unreachable server (the head not up yet)
// is retried every 200 ms; the last Redis error is in the timeout's message.
//
// Threads: one object per thread (one connection).
#pragma once
#include <chrono>
#include <memory>
#include <string>

#include "kf/netqueue/stream_queue.h"

namespace kf::netqueue {

struct RendezvousConfig {
  StreamConfig server;  // host, port, user, password, connect/io timeouts (stream unused)
  std::string scope;    // the run name; no ':' or whitespace
  int rank = 0;
  int world = 1;
  Millis timeout{120000};  // rank 0's wait for the others (publish)
};

class StoreRendezvous {
 public:
  // Checks the config (kf::Error naming the field); connects lazily.
  explicit StoreRendezvous(RendezvousConfig cfg);
  ~StoreRendezvous();
  StoreRendezvous(const StoreRendezvous&) = delete;
  StoreRendezvous& operator=(const StoreRendezvous&) = delete;

  // Rank 0: announce, wait for ranks 1..world-1 (up to cfg.timeout), publish bytes.
  void publish(const std::string& key, const std::string& bytes);
  // Rank r > 0: announce, wait up to timeout for rank 0's publication for this attempt.
  std::string fetch(const std::string& key, Millis timeout);
  std::string where() const;  // "rendezvous 'KEY' of run 'SCOPE' at redis at HOST:PORT"

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kf::netqueue
