// Several nodes: the head node (replay, learner, actors, a Redis server) and evaluator
// nodes fed from it over Redis Streams (kf::netqueue; docs/operations.md, "Several nodes").
//
//   cluster.role = all        one node, shared memory only (the default; nothing here runs)
//   cluster.role = head       the launcher starts redis-server (password, bound addresses)
//                             and a RemoteBridge thread; cluster.head_evaluators local evaluators,
//                             cluster.head_actors local actors (-1: actors.count; 0: only
//                             actor nodes sample)
//   cluster.role = evaluators the launcher starts N `kf-evaluator --remote` processes
//                             (run_evaluator_node) and restarts them; no shared memory
//   cluster.role = learners   the launcher starts learner ranks whose groups come from the
//                             head's rank 0 through Redis (run_learner_node); NCCL only
//   cluster.role = actors     the launcher runs actors on a replay segment of its own and
//                             sends their groups to the head (actor_nodes.h, run_actor_node)
//   tools/launch CONFIG --slurm  maps SLURM_NODEID to a role (slurm_plan) and, outside a job
//                             step, execs the srun line that starts one launcher per node
//
// Threading: ClusterOptions / slurm_* are plain functions (any thread). A RemoteBridge
// owns one thread; start/stop/counters from the launcher's main thread.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kf/common/config.h"
#include "kf/common/run_dir.h"
#include "run_monitor.h"

namespace kf::replay {
class RunShm;
}

namespace kf::launch {

struct ClusterOptions {
  std::string role = "all";  // all | head | evaluators | learners | actors
  std::string node_name;     // cluster.node_name, else the host name
  int head_evaluators = 0;
  int head_actors = -1;            // cluster.head_actors (-1: actors.count)
  std::string host = "127.0.0.1";  // where evaluator nodes reach the head's server
  int port = 6390;
  std::vector<std::string> bind;  // head: listen addresses (numeric)
  std::string password_env;
  std::string password;  // read from $password_env (never from the config file)
  uint64_t bound = 512;
  std::chrono::milliseconds claim_idle{120000};
  std::chrono::milliseconds gone_after{60000};
  // Learner ranks on several nodes: the head runs ranks [0, head_learner_ranks) (0: all of
  // learner.dist.ranks), learners node i runs learner_ranks ranks from first_learner_rank().
  int learner_world = 1;  // learner.dist.ranks
  int head_learner_ranks = 0;
  int learner_ranks = 1;
  int learner_node_index = 0;
  bool remote() const { return role != "all"; }
  int head_ranks() const { return head_learner_ranks > 0 ? head_learner_ranks : learner_world; }
  bool learners_split() const { return head_ranks() < learner_world; }
  int first_learner_rank() const { return head_ranks() + learner_node_index * learner_ranks; }
  // The actors this node's launcher runs itself: on a head cluster.head_actors unless -1,
  // else actors.count (one node, actor nodes).
  int local_actors(int actors_count) const { return role == "head" && head_actors >= 0 ? head_actors : actors_count; }
};

// From cluster.* (throws kf::Error naming the key, or the environment variable of
// cluster.redis.password_env when a head or evaluator node finds it unset or empty).
ClusterOptions cluster_options(const Config& cfg);
// Whether this build can run role head/evaluators (kf_netqueue was built: hiredis found).
bool cluster_supported();
// A head with cluster.head_actors 0 needs actor nodes: throws kf::Error naming the key when
// the node roles (cluster.nodes, or the Slurm plan's) hold no `actors` node, or when the
// role is `all` (one node: nothing would sample). Empty roles: unknown here (a head started
// by hand; the launcher then waits cluster.redis.gone_after_s for the first actor node).
void check_head_actors(const Config& cfg, const std::vector<std::string>& roles);

// --- Slurm
// "node[01-03,07],gpu5,x[1-2]" -> node01 node02 node03 node07 gpu5 x1 x2 (zero padding kept).
// Throws kf::Error on a malformed list.
std::vector<std::string> expand_nodelist(const std::string& list);

struct SlurmPlan {
  bool in_step = false;  // SLURM_STEP_ID set: this process is one srun task
  std::string job_id;
  int node_id = 0;                 // SLURM_NODEID
  int nodes = 1;                   // entries of SLURM_JOB_NODELIST
  std::vector<std::string> hosts;  // the expanded node list
  std::string role;                // this node's role (in_step), from cluster.nodes or 0 = head
  std::vector<std::string> roles;  // every node's role, in node order
  std::string head_host;           // the node whose role is head
  std::vector<std::string> sets;   // --set overrides a node's launcher gets (role, host, node name)
};
// env: the variable's value or "" (tests pass a map; tools/launch passes getenv).
SlurmPlan slurm_plan(const std::function<std::string(const std::string&)>& env,
                     const std::vector<std::string>& node_roles);
// The srun command line that starts one `kf-launch ARGS --slurm` per node of the
// allocation (argv[0] = "srun"). launch_argv: this launcher's own argv (binary first).
std::vector<std::string> srun_argv(const SlurmPlan& plan, const std::vector<std::string>& launch_argv);

// --- head: the Redis server, a child of the thread that constructs this (it gets SIGKILL
// when that thread exits). Binds co.bind on co.port, ACL user kf with co.password, its
// config and log in <run>/redis/. Throws kf::Error with the server's log tail.
class HeadServer {
 public:
  HeadServer(const ClusterOptions& co, const RunDir& run);
  ~HeadServer();  // stop()
  void stop();
  bool alive() const;         // the process still runs
  std::string where() const;  // "redis-server pid N on ADDR:PORT"

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// --- head: candidates to the network, results back
struct BridgeCounters {
  uint64_t sent = 0;        // candidates pushed to kf:candidates
  uint64_t on_network = 0;  // sent, result not yet back (their shm claims are held)
  uint64_t results = 0;     // results written into the replay (add_result)
  uint64_t duplicates = 0;  // a second result for a candidate: dropped
  uint64_t unstored = 0;    // the replay could not store it: dropped, candidate counted lost
  uint64_t dead = 0;        // dead-lettered (killed or hung max_deliveries evaluators): counted lost
  uint64_t errors = 0;      // Redis errors (each logged; the bridge retries)
  uint64_t reports = 0;     // node reports taken from kf:node_seconds
};

class RemoteBridge {
 public:
  // Opens both streams (throws kf::Error naming the server on failure) and starts the thread.
  RemoteBridge(replay::RunShm& shm, const ClusterOptions& co, bool train_on_degenerate_tasks);
  ~RemoteBridge();  // stop()
  // Stops the thread; candidates still on the network keep their claims (counted in
  // flight by the candidate ledger).
  void stop();
  BridgeCounters counters() const;
  // No candidate queued in shared memory and none on the network.
  bool idle() const;
  // The newest seconds each node launcher session reported (kNodeSecondsStream), and the
  // verdict lines they summed, over the sessions this bridge heard from.
  std::map<std::string, NodeSeconds> node_seconds() const;
  uint64_t reported_verdicts() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// --- Seconds of work on other nodes, for the head's time split. Each evaluator or actor
// node's launcher sums its processes' seconds (evaluator nodes: compile_s and verify_s of
// their evaluators' verdict lines; actor nodes: their actors' control-block counters) and
// pushes the cumulative figures of its session, as JSON, to this stream at most every
// 0.5 s when they changed; the head's bridge takes them (consumer group "head") and keeps
// the newest per session. A session is one launcher of one node ("<node>/<pid>/<start ms>").
inline constexpr const char* kNodeSecondsStream = "kf:node_seconds";

class NodeReporter {
 public:
  explicit NodeReporter(const ClusterOptions& co);
  ~NodeReporter();
  // Sends s when it changed since the last send and `every` has passed (or force). A Redis
  // error is logged once per episode and the next call tries again (nothing is queued up:
  // the figures are cumulative).
  void report(const NodeSeconds& s, bool force = false);
  const std::string& session() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};
// One report as JSON, and back (throws kf::Error naming `context` on a malformed report).
std::string encode_node_report(const std::string& session, const NodeSeconds& s);
std::pair<std::string, NodeSeconds> decode_node_report(const std::string& text, const std::string& context);
// Adds the complete lines appended to an evaluator's verdict log since *offset (compile_s,
// verify_s, one verdict each) and moves *offset past them; a torn last line waits for the
// next call. A missing file adds nothing.
void add_verdict_seconds(const std::string& path, uint64_t* offset, NodeSeconds* s);

// What an evaluator node needs before it starts (evaluator keys, tasks.dir, run name,
// cluster keys and the password); throws kf::Error naming the key.
void preflight_evaluator_node(const Config& cfg);

// What a learners node needs before it starts (the layout of ranks, NCCL on CUDA, the
// password); throws kf::Error naming the key.
void preflight_learner_node(const Config& cfg);

// --- learners node: run its learner ranks (`kf-learner --rendezvous redis --remote-from K`,
// checkpoints in the head's run folder <run.root>/<run.name>, which must be shared) until
// they have all exited (the head's run stopped) or a stop signal. A rank that dies is not
// restarted: the other ranks cannot go on without it (the head stops the run; resume
// every node with --resume). Exit 0 when every rank exited 0, else 1.
int run_learner_node(const Config& cfg, const RunDir& run, const std::string& binary_dir, bool resumed,
                     const std::atomic<int>* signals);

// --- evaluator node: supervise `kf-evaluator --remote` processes until they have all
// exited 0 (the head's server gone for cluster.redis.gone_after_s) or a stop signal.
int run_evaluator_node(const Config& cfg, const RunDir& run, const std::string& binary_dir,
                       const std::atomic<int>* signals);

}  // namespace kf::launch
