// Several nodes: one Redis server on the head, and every process of every node moving its
// work through it with the network transport (kf/transport/transport.h; docs/architecture.md,
// "Several nodes"). The launchers here only supervise: they start and restart processes,
// start the server (head), write the run's state into it (kf:run:state), and read what it
// counts (stream depths and counters, the nodes' reports) for the status and the closing
// account. No launcher moves a candidate, a result, a group or a kernel.
//
//   cluster.role = all        one node, shared memory only (the default; nothing here runs)
//   cluster.role = head       the launcher starts redis-server (password, bound addresses),
//                             the learner ranks, cluster.head_evaluators evaluators and
//                             cluster.head_actors actors (-1: actors.count; 0: only actor
//                             nodes sample), every one on the network transport
//   cluster.role = evaluators the launcher starts N kf-evaluator processes that take
//                             candidates from the head's server (run_evaluator_node) and
//                             restarts them; no shared memory
//   cluster.role = learners   the launcher starts learner ranks whose groups come from the
//                             head's rank 0 through Redis (run_learner_node); NCCL only
//   cluster.role = actors     the launcher runs actors that publish to the head's server, on
//                             a run shared memory of this node for the weights and kernels
//                             they mirror from it (actor_nodes.h, run_actor_node)
//   tools/launch CONFIG --slurm  maps SLURM_NODEID to a role (slurm_plan) and, outside a job
//                             step, execs the srun line that starts one launcher per node
//
// Which source files hold the Redis side is chosen by launch/CMakeLists.txt: cluster_net.cpp
// when kf_netqueue was built, else cluster_none.cpp (the same functions, refusing the roles).
//
// Threading: ClusterOptions / slurm_* are plain functions (any thread). HeadServer,
// ClusterWatch, HeadWatch and NodeReporter each hold their own connection: one object per
// thread, called from a launcher's main loop. None of them starts a thread.
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

// --- head: what the server counts, for the live status and the closing account. Every
// candidate an actor (of any node) publishes goes into kf:candidates and leaves it once:
// with its result into kf:results (scored: one result per candidate, whichever evaluator of
// whichever node sent it), into kf:candidates:dead (it killed or hung cluster.redis max
// deliveries evaluators, or did not parse), or dropped by an evaluator that could not store
// its result. So, once the processes' counts are in (each adds its own to kf:counts at most
// a second late, and when it closes):
//   created = scored + lost + queued + in flight
// Results then wait in kf:results, and groups in kf:groups, until the head's learner rank 0
// joins them into the head's replay (results_waiting, groups_waiting).
struct NetworkAccount {
  bool read = false;             // the server answered at least once (else every figure is 0)
  uint64_t created = 0;          // candidates actors published into kf:candidates
  uint64_t scored = 0;           // results evaluators sent into kf:results
  uint64_t dead = 0;             // moved to kf:candidates:dead (the server's count)
  uint64_t dropped = 0;          // claims evaluators dropped
  uint64_t queued = 0;           // in kf:candidates, not taken by an evaluator yet
  uint64_t in_flight = 0;        // taken by an evaluator, no result yet
  uint64_t results_waiting = 0;  // in kf:results, not joined into the head's replay yet
  uint64_t groups_waiting = 0;   // in kf:groups, not opened in the head's replay yet
  // What the processes counted besides (netqueue::NetworkCounts): actors, evaluators, and
  // the head's learner rank 0 joining groups and results into the head's replay.
  uint64_t groups_published = 0, known_results = 0, unqueued = 0;
  uint64_t results_late = 0, claimed_again = 0, undecodable = 0;
  uint64_t groups_opened = 0, groups_dropped = 0, groups_duplicate = 0;
  uint64_t results_joined = 0, results_orphan = 0, results_duplicate = 0, kernels_inserted = 0;
  uint64_t members_lost = 0;  // unqueued members the head marked lost in their group
  uint64_t lost() const { return dead + dropped; }
  bool balanced() const { return created == scored + lost() + queued + in_flight; }
};

// --- Nodes' reports, for the head's time split and its drain. Each evaluator or actor
// node's launcher sums its processes' figures (evaluator nodes: compile_s and verify_s of
// their evaluators' verdict lines; actor nodes: their actors' control-block counters) and
// pushes the cumulative figures of its session, as JSON, to this stream at most every
// 0.5 s when they changed, and a last one marked done when its processes have all exited.
// The head's ClusterWatch takes them (consumer group "head") and keeps the newest per
// session. A session is one launcher of one node ("<node>/<pid>/<start ms>").
inline constexpr const char* kNodeSecondsStream = "kf:node_seconds";

struct NodeReport {
  std::string session;
  std::string role;  // evaluators | actors
  NodeSeconds figures;
  bool done = false;  // the node's processes have all exited (its last report)
};

class NodeReporter {
 public:
  NodeReporter(const ClusterOptions& co, std::string role);
  ~NodeReporter();
  // Sends s when it changed since the last send and 0.5 s have passed (or force). A Redis
  // error is logged once per episode and the next call tries again (nothing is queued up:
  // the figures are cumulative).
  void report(const NodeSeconds& s, bool force = false);
  // The last report (done): sent even when s did not change. False when it did not get through.
  bool finish(const NodeSeconds& s);
  const std::string& session() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};
// One report as JSON, and back (throws kf::Error naming `context` on a malformed report).
std::string encode_node_report(const NodeReport& r);
NodeReport decode_node_report(const std::string& text, const std::string& context);
// Adds the complete lines appended to an evaluator's verdict log since *offset (compile_s,
// verify_s, one verdict each) and moves *offset past them; a torn last line waits for the
// next call. A missing file adds nothing.
void add_verdict_seconds(const std::string& path, uint64_t* offset, NodeSeconds* s);

// --- head: the launcher's view of its server (supervision only). It writes the run's
// state (kf:run:state: running | draining; actor nodes stop their actors on draining) and
// reads the nodes' reports, the account above and whether an actor node has announced
// itself (kf:actor_nodes, set by actor nodes' actors). Errors are logged once per episode
// and counted; the figures keep their last values.
class ClusterWatch {
 public:
  // Reaches the head's own server where it listens (co.bind, else co.host). Connects lazily.
  explicit ClusterWatch(const ClusterOptions& co);
  ~ClusterWatch();
  // Remembers the state and writes it at the next poll (and again every second, so a node
  // that connects late reads it).
  void set_run_state(const std::string& state);
  // One round (writes the state, takes reports, reads the account), at most every 250 ms
  // unless `now`. False when the server did not answer.
  bool poll(bool now = false);
  NetworkAccount account() const;
  std::map<std::string, NodeSeconds> node_seconds() const;  // newest figures per session
  uint64_t reported_verdicts() const;                       // verdict lines, over the sessions
  bool actor_nodes_seen() const;
  // Actor-node sessions whose actors still run: reported, not done, heard from within
  // cluster.redis.gone_after_s.
  int actor_nodes_running() const;
  uint64_t errors() const;
  std::string where() const;  // "redis at HOST:PORT"

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// --- actor or evaluator node: the head's run state, read from its server at most every
// 0.5 s. gone(): the server has not answered for cluster.redis.gone_after_s.
class HeadWatch {
 public:
  explicit HeadWatch(const ClusterOptions& co);
  ~HeadWatch();
  // "running", "draining", or "" before the head wrote one; errors are logged once per
  // episode (the last state read stays).
  std::string run_state();
  bool gone() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

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

// --- evaluator node: supervise kf-evaluator processes (network transport: candidates from
// the head's server, results back to it) until they have all exited 0 (the head's server
// gone for cluster.redis.gone_after_s) or a stop signal.
int run_evaluator_node(const Config& cfg, const RunDir& run, const std::string& binary_dir,
                       const std::atomic<int>* signals);

}  // namespace kf::launch
