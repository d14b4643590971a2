// Actor nodes (cluster.role actors) and the head's side of them (docs/cluster.md, "Actor nodes").
//
//   actor node                                   head
//   kf-actor x actors.count                      ActorNodeLink (a thread of the launcher)
//     | open groups in the node's own replay       publishes the newest policy snapshot
//     | push candidates to the node's queue          (kf:weights, kf:weights:version) and the
//   run_actor_node's loop                            kernel database (kf:kernels) to the store
//     claims each candidate, marks it forwarded    takes groups from kf:groups (consumer group
//     in the node's replay; a group is complete      "head"), opens each in the head's replay,
//     once all its candidates are (its extraction    joins the actor-scored results, queues its
//     failures are already scored by the actor)      candidates to the evaluators like a local
//     -> takes it and pushes it to kf:groups         actor, then acknowledges the entry
//     pulls kf:weights into the node's snapshot
//     store, kf:kernels into its kernel database
//
// The node's replay segment only gathers a group's G candidates: the head's replay is the
// one the learner trains from. Back-pressure: kf:groups holds at most cluster.redis.bound
// groups; while it is full the node stops claiming, its candidate queue fills and its actors
// wait before sampling, as on one node.
//
// Threading: ActorNodeLink owns one thread; construct/stop/counters from the launcher's
// main thread. run_actor_node runs on the launcher's main thread.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "cluster.h"
#include "kf/common/config.h"
#include "kf/common/run_dir.h"

namespace kf::replay {
class RunShm;
}

namespace kf::launch {

// Store keys and stream (all under the ACL prefix kf:). The head's server serves one run.
inline constexpr const char* kGroupsStream = "kf:groups";
inline constexpr const char* kWeightsKey = "kf:weights";  // "KFW1" + version (i64) + size (u64) + blob
inline constexpr const char* kWeightsVersionKey = "kf:weights:version";
inline constexpr const char* kKernelsKey = "kf:kernels";  // JSON: [{task, speedup, policy_version, source}]
inline constexpr const char* kKernelsVersionKey = "kf:kernels:version";
inline constexpr const char* kRunStateKey = "kf:run:state";      // running | draining
inline constexpr const char* kActorNodesKey = "kf:actor_nodes";  // set by actor nodes: the head publishes
// evaluator_id of the placeholder result an actor node writes into its own replay for a
// candidate it forwarded (never leaves the node).
inline constexpr int32_t kForwardedEvaluatorId = 0x7fffffff;

struct ActorLinkCounters {
  uint64_t groups = 0;             // groups from actor nodes opened in the head's replay
  uint64_t candidates_queued = 0;  // their candidates pushed to the head's candidate queue
  uint64_t actor_scored = 0;       // their extraction failures, scored by the remote actor
  uint64_t lost = 0;               // candidates the node reported lost (marked lost here)
  uint64_t groups_dropped = 0;     // the head's replay stayed full: not opened
  uint64_t duplicates = 0;         // a group delivered twice: the second dropped
  uint64_t undecodable = 0;        // entries that did not decode: dropped, logged
  int64_t weights_version = -1;    // newest snapshot published to the store
  uint64_t kernels_published = 0;  // kernel database publishes
  uint64_t errors = 0;             // Redis errors (each logged; the link retries)
  uint64_t lag_sum = 0;            // policy lag of the queued candidates, summed (head's version - theirs)
  bool nodes_seen = false;         // an actor node has announced itself (kActorNodesKey)
};

class ActorNodeLink {
 public:
  // Opens kf:groups and the store on the head's server (throws kf::Error naming it) and
  // starts the thread. group_deadline_s: actors.group_deadline_s (the head's own groups'
  // deadline, given to remote groups when they are opened here).
  // group_size: actors.group_size (the queue room a group needs before it is taken).
  ActorNodeLink(replay::RunShm& shm, const ClusterOptions& co, double group_deadline_s, int group_size);
  ~ActorNodeLink();  // stop()
  void stop();
  ActorLinkCounters counters() const;
  // Groups still in kf:groups (sent by actor nodes, not yet opened here).
  uint64_t waiting() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// What an actor node needs before it starts (actor keys, tasks, the policy, the password).
void preflight_actor_node(const Config& cfg);

// --- actor node: its own run shared memory (replay segment, snapshot store, kernel
// database) named after `run` (<run.name>.<node>), actors.count kf-actor processes on it
// (restarted like on one node), and the forwarding loop above. Ends when the head's run
// drains (kf:run:state), when the head's server has not answered for
// cluster.redis.gone_after_s, or on a stop signal. Exit 0, or 1 when an actor kept dying.
// worker_config: the config file the kf-actor processes read.
int run_actor_node(const Config& cfg, const RunDir& run, const std::string& worker_config,
                   const std::string& binary_dir, const std::atomic<int>* signals);

}  // namespace kf::launch
