// Actor nodes (cluster.role actors): a node whose actors sample for the head's run
// (docs/cluster.md, "Actor nodes"). The launcher here supervises only:
//
//   actor node launcher                          its kf-actor processes (network transport)
//     creates the node's run shared memory         publish each group to the head's server
//       (snapshot store, kernel database, control    (kf:groups, then its members to
//       block; the replay segment stays unused)      kf:candidates), mirror the head's
//     starts actors.count kf-actor, restarts them    weights (kf:weights) and kernel database
//     reads kf:run:state: draining -> the actors     (kf:kernels) into this node's snapshot
//       stop; the server gone for                    store and kernel database, and announce
//       cluster.redis.gone_after_s -> they stop      the node (kf:actor_nodes)
//     reports the actors' seconds and counts to
//       the head (kf:node_seconds), a last one
//       marked done when they have all exited
//
// No group, candidate, weight or kernel passes through this launcher.
//
// Threading: run_actor_node runs on the launcher's main thread.
#pragma once
#include <atomic>
#include <string>

#include "cluster.h"
#include "kf/common/config.h"
#include "kf/common/run_dir.h"

namespace kf::launch {

// What an actor node needs before it starts (actor keys, tasks, the policy, the password).
void preflight_actor_node(const Config& cfg);

// --- actor node: its own run shared memory named after `run` (<run.name>.<node>),
// actors.count kf-actor processes on it (restarted like on one node). Ends when the head's
// run drains (kf:run:state), when the head's server has not answered for
// cluster.redis.gone_after_s, or on a stop signal, once its actors have exited. Exit 0, or 1
// when an actor kept dying. worker_config: the config file the kf-actor processes read.
int run_actor_node(const Config& cfg, const RunDir& run, const std::string& worker_config,
                   const std::string& binary_dir, const std::atomic<int>* signals);

}  // namespace kf::launch
