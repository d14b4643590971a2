// kf/netqueue/netqueue.h: the netqueue component's one public header. Sections:
//   StreamQueue, RedisServer     the cross-node queue on Redis Streams (below)
//   StoreRendezvous              the learner ranks' rendezvous over the same server
//   KeyStore                     plain keys and hash counters on the same server
//   The work seam on the network stream_candidates, stream_groups, stream_ready_groups
//                                (picked by kf::transport), its streams, keys and counts
//
// kf::netqueue: the cross-node candidate/result queue on Redis Streams (hiredis), and a
// redis-server the launcher (or a test) can start. Inside a node the shared-memory
// ShmQueue (replay/) stays the transport; this carries the same byte records (payload +
// 64-bit tag, e.g. an encoded kf::replay::Candidate and its id) between nodes.
//
// Shape (docs/netqueue.md): one StreamQueue object = one connection to one stream with
// one consumer group. push() adds records in a Lua script that first checks XLEN against
// the bound (a full stream makes the producer wait, never trims). take() reads new records
// (XREADGROUP) and every claim_every claims records other consumers left pending longer
// than claim_idle (XAUTOCLAIM): a dead consumer's work is never lost. ack() is XACK + XDEL
// in one script, so XLEN is exactly the records not yet acknowledged; ack_forward() also
// appends outputs to another stream atomically, only for records still pending (of two
// consumers that scored the same record, one result goes in). A record delivered more
// than max_deliveries times, or one that does not parse, goes to "<stream>:dead".
//
// Failures: every error is a kf::Error naming "redis at HOST:PORT" and what failed
// (connect, AUTH, a command, a lost connection). Socket timeouts bound every call, so a
// dead server gives an error, never a hang. After a lost connection the next call
// reconnects. A push whose reply was lost may have gone in: delivery is at least once,
// and sinks keep results idempotent by tag (docs/netqueue.md).
//
// Threads: a StreamQueue is one connection; use one per thread (not shared). A
// RedisServer object belongs to the thread that started it (its process gets SIGKILL
// when that thread exits).
#pragma once
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kf/common/config.h"
#include "kf/replay/replay.h"

namespace kf::netqueue {

using Millis = std::chrono::milliseconds;

struct StreamConfig {
  std::string host = "127.0.0.1";
  int port = 6379;
  std::string user = "kf";  // ACL user; "" = the default user (requirepass)
  std::string password;     // "" = no AUTH
  std::string stream = "kf:candidates";
  std::string group = "evaluators";
  std::string consumer;   // unique per consumer; "" = "<hostname>:<pid>:<n>"
  uint64_t bound = 4096;  // most records not yet acknowledged (XLEN)
  Millis connect_timeout{2000};
  Millis io_timeout{5000};       // a reply must come within this (beyond a BLOCK)
  Millis claim_idle{30000};      // pending this long without keep_alive(): claimable
  Millis claim_every{0};         // 0 = claim_idle / 4 (at least 10 ms)
  uint32_t max_deliveries = 5;   // then the record goes to <stream>:dead
  uint32_t batch_records = 256;  // most records per script call (push/ack)
  // HINCRBY'd in the same script as the records: push()es, ack_forward() outputs ("": none).
  std::string count_hash;
  std::string push_count_field;
  std::string forward_count_field;
};

struct Message {
  std::string id;           // stream entry id "<ms>-<seq>": the ack handle, unique per push
  uint64_t tag = 0;         // the producer's id for the record (e.g. candidate id)
  std::string data;         // the bytes as pushed
  uint32_t deliveries = 1;  // 1 = first delivery; n = claimed n-1 times
};

struct Outgoing {  // a record for ack_forward()'s output stream
  uint64_t tag = 0;
  std::string data;
};

struct StreamStats {  // this object's counts
  uint64_t pushed = 0;
  uint64_t push_waits = 0;     // script calls refused for a full stream (the producer waited)
  uint64_t push_timeouts = 0;  // pushes that gave up on a full stream
  uint64_t taken = 0;          // messages returned by take() (new + claimed)
  uint64_t claimed = 0;        // of those, claimed from other (dead or slow) consumers
  uint64_t acked = 0;          // acknowledgements that removed a pending record
  uint64_t ack_late = 0;       // acknowledgements of records no longer pending (another consumer's)
  uint64_t forwarded = 0;      // outputs ack_forward() appended
  uint64_t dead_lettered = 0;  // moved to <stream>:dead (malformed or max_deliveries)
  uint64_t vanished = 0;       // pending ids whose entry was deleted by someone else
  uint64_t reconnects = 0;
};

struct StreamDepth {       // the server's view of the stream and group
  uint64_t length = 0;     // records not yet acknowledged (XLEN)
  uint64_t pending = 0;    // of those, delivered and not yet acknowledged
  uint64_t dead = 0;       // length of <stream>:dead
  uint64_t consumers = 0;  // consumers the group knows (dead ones included)
};

class StreamQueue {
 public:
  // Connects, AUTHs and creates the group if missing (XGROUP CREATE ... 0 MKSTREAM).
  // Throws kf::Error naming host:port on a refused connection, a wrong password or
  // missing ACL rights, and naming the config field on a bad config.
  static StreamQueue open(const StreamConfig& cfg);
  StreamQueue(StreamQueue&&) noexcept;
  StreamQueue& operator=(StreamQueue&&) noexcept;
  ~StreamQueue();

  // --- producer
  // Appends records in order; waits while the stream holds `bound` unacknowledged
  // records. Returns how many went in before the timeout (the rest are counted in
  // push_timeouts; the caller decides: retry, drop and count, or stop).
  std::size_t push_batch(const std::vector<Outgoing>& records, Millis timeout);
  bool push(uint64_t tag, const std::string& data, Millis timeout);

  // --- consumer
  // Up to max messages: first claimable ones (due every claim_every), else new ones;
  // blocks up to timeout for the first. Empty on timeout.
  std::vector<Message> take(std::size_t max, Millis timeout);
  // Acknowledge messages whose outcome is stored. Returns how many were still pending
  // (first[i] = whether ids[i] was); a late ack (another consumer claimed and acked the
  // record first) returns false for it: its outcome is a duplicate.
  std::size_t ack(const std::vector<std::string>& ids, std::vector<bool>* first = nullptr);
  // ack() plus, atomically, appends outputs[i] to stream `out_stream` iff ids[i] was
  // still pending. outputs.size() must equal ids.size().
  std::size_t ack_forward(const std::vector<std::string>& ids, const std::vector<Outgoing>& outputs,
                          const std::string& out_stream, std::vector<bool>* first = nullptr);
  // Resets the idle time of messages this consumer still works on, so a slow but live
  // consumer keeps them (XCLAIM ... JUSTID). Returns how many it still owns.
  std::size_t keep_alive(const std::vector<std::string>& ids);
  // Hands entries this consumer holds back unprocessed: they look idle for claim_idle, so
  // the next claim of any consumer takes them (a delivery more). Returns how many it owned.
  std::size_t give_back(const std::vector<std::string>& ids);

  // --- supervision
  StreamDepth depth();
  // Consumers seen (read, claimed, kept alive) within claim_idle: XINFO CONSUMERS, whose
  // reply grows with the group (dead consumers stay listed), so callers read it sparingly.
  uint64_t live_consumers();
  // Up to max entries of <stream>:dead, oldest first: (field, value) pairs flattened,
  // starting with "id" (the original entry id) and "reason".
  std::vector<std::vector<std::string>> dead_letters(std::size_t max);
  const StreamStats& stats() const;
  const StreamConfig& config() const;
  std::string where() const;  // "redis at HOST:PORT stream S"

  struct Impl;

 private:
  explicit StreamQueue(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A redis-server child process: ACL user with a password (the default user is off),
// bound to the given addresses, no persistence (the queues live in its memory only).
// Its config file (0600, so the password is not on a command line) and log live in `dir`.
struct ServerOptions {
  std::string executable = "redis-server";
  std::vector<std::string> bind = {"127.0.0.1"};
  int port = 0;  // 0 = a free port
  std::string user = "kf";
  std::string password;            // required; no whitespace
  std::string key_prefix = "kf:";  // the ACL user may touch only these keys
  std::string dir;                 // "" = a fresh /tmp/kf-redis-XXXXXX, removed on stop
  uint64_t max_memory_mb = 0;      // 0 = no limit
  Millis start_timeout{10000};
};

class RedisServer {
 public:
  // Starts and waits until it answers PING after AUTH. Throws kf::Error with the
  // server's log tail if it exits or does not answer in time.
  static RedisServer start(const ServerOptions& opt);
  RedisServer(RedisServer&&) noexcept;
  RedisServer& operator=(RedisServer&&) noexcept;
  ~RedisServer();  // stop()
  void stop();     // SIGTERM, then SIGKILL after 2 s; idempotent
  void kill();     // SIGKILL now (fault tests)
  pid_t pid() const { return pid_; }
  int port() const { return port_; }
  const std::string& dir() const { return dir_; }
  std::string log_path() const { return dir_ + "/redis.log"; }
  // A StreamConfig pointing at this server (first bind address) with its user/password.
  StreamConfig client_config() const;

 private:
  RedisServer() = default;
  ServerOptions opt_;
  pid_t pid_ = -1;
  int port_ = 0;
  std::string dir_;
  bool own_dir_ = false;
};

// --- StoreRendezvous: hands one small blob (the NCCL unique id) from rank 0 to ranks
// 1..world-1 of a job through the run's Redis server, when the ranks sit on several nodes
// (kf::transport::network_rendezvous wraps it). Keys kf:rdv:<scope>:<key>[:rank:<r>]
// (docs/netqueue.md): every rank announces a random token; rank 0 waits for all world-1
// others, then publishes their tokens and the blob; rank r accepts only a publication that
// carries its own token (never a value an earlier attempt left). Keys expire.
// Failures: a timeout throws kf::Error naming the rendezvous, the server and the ranks that
// never announced themselves; until then an unreachable server is retried every 200 ms.
// Threads: one object per thread (one connection).

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

// --- KeyStore: plain keys on the run's Redis server (binary-safe values), for what several
// nodes read and one node writes: the policy snapshot and the kernel database that the
// head publishes to actor nodes, and the head's run state (docs/cluster.md, "Actor nodes").
//
// Every call reconnects first if the connection broke; errors throw kf::Error naming the
// server ("redis at HOST:PORT: ..."). Keys must lie under the ACL user's prefix (kf:).
// Threading: one object per thread.

class KeyStore {
 public:
  // Connects and AUTHs (throws kf::Error naming the server). Uses host, port, user,
  // password, connect_timeout and io_timeout of `cfg`.
  static KeyStore open(const StreamConfig& cfg);
  KeyStore(KeyStore&&) noexcept;
  KeyStore& operator=(KeyStore&&) noexcept;
  ~KeyStore();

  void set(const std::string& key, const std::string& value);
  // Sets several keys in one atomic step (MSET): readers never see one without the other.
  void set_many(const std::vector<std::pair<std::string, std::string>>& kv);
  std::optional<std::string> get(const std::string& key);
  // Hash counters: adds each (field, delta) to hash `key` (HINCRBY, pipelined); counts()
  // reads them all (fields that are not integers are left out).
  void add(const std::string& key, const std::vector<std::pair<std::string, int64_t>>& deltas);
  std::vector<std::pair<std::string, int64_t>> counts(const std::string& key);
  std::string where() const;  // "redis at HOST:PORT"

  struct Impl;

 private:
  explicit KeyStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// --- The work seam on the network (kf/replay/replay.h, "The work seam"; docs/netqueue.md).
// With cluster.role other than "all", every process of every node moves work through the
// head's server:
//   actor      GroupSink: the group record (candidates, known results, deadline, hold) to
//              kf:groups, then each member still to be scored to kf:candidates (bound
//              cluster.redis.bound: publish waits while full; if stopped, marks the rest
//              lost in kf:results).
//   evaluator  CandidateSource: takes kf:candidates; complete = result into kf:results and
//              acknowledgement in one atomic step. No shared memory.
//   learner    ReadyGroups, rank 0 on the head: each take drains kf:groups into the head's
//              replay, then kf:results (add_result; kernel_entry_of -> the head's KernelDb),
//              then takes ready groups; it serves the ranks on learners nodes and publishes
//              the kernel DB and newest snapshot for actor nodes. Other head ranks take
//              from the head's replay.
//   actor node GroupSink also mirrors kf:weights / kf:kernels into the node's run (at most
//              once a second, on a version change) and announces the node (kf:actor_nodes).
// A result is routed by its candidate id through the group records the head opened.
// Delivery is at least once: a second group record or result is counted duplicate.
// Threads: each object follows its interface's contract; CandidateSource::keep_alive may
// be called from another thread (it has its own connection).

// Streams (entries: t = tag, d = bytes) and keys, all under the ACL prefix kf:.
inline constexpr const char* kCandidatesStream =
    "kf:candidates";                                         // group "evaluators": candidate id, encode(Candidate)
inline constexpr const char* kResultsStream = "kf:results";  // group "head": candidate id, encode(Result)
inline constexpr const char* kGroupsStream = "kf:groups";    // group "head": group id, the group record
inline constexpr const char* kEvaluatorsGroup = "evaluators";
inline constexpr const char* kHeadGroup = "head";
inline constexpr const char* kWeightsKey = "kf:weights";                 // "KFW1" + version (i64) + size (u64) + blob
inline constexpr const char* kWeightsVersionKey = "kf:weights:version";  // decimal; set after kf:weights
inline constexpr const char* kKernelsKey = "kf:kernels";  // JSON: [{task, speedup, policy_version, source}]
inline constexpr const char* kKernelsVersionKey = "kf:kernels:version";  // decimal, grows by 1 per publish
inline constexpr const char* kRunStateKey = "kf:run:state";              // running | draining (the head's launcher)
inline constexpr const char* kActorNodesKey = "kf:actor_nodes";          // an actor node's name: the head publishes
inline constexpr const char* kCountsKey = "kf:counts";                   // hash of NetworkCounts' fields

// The head's server as cluster.redis.* name it (on the head: where it listens), the
// password from $cluster.redis.password_env. Stream and group are left as defaults.
// Throws kf::Error naming the key (an unset or empty password variable included).
StreamConfig server_config(const Config& cfg);

// Evaluator `who` (its log name, e.g. "evaluator 2"): consumer "<node>:<who>:<pid>" of
// kf:candidates (node: cluster.node_name, else the host name). A candidate record that does
// not decode is settled inside: its result runtime_error (environment) goes to kf:results,
// logged and counted undecodable; it is never returned. An unreachable server is retried
// (logged); after cluster.redis.gone_after_s without an answer, claim() and complete()
// throw kf::Error whose text holds "the run has ended or its head is gone" (an evaluator
// node then exits 0). give_back() makes the entry claimable by any evaluator at once.
// claim(max) takes one, then at most its share of the unclaimed rest (waiting / live).
std::unique_ptr<replay::CandidateSource> stream_candidates(const Config& cfg, const std::string& who);
// Actor `who`. shm: the head's run (actors on the head: peek/release read its replay, where
// the head's rank 0 opens the group), an actor node's own run (cluster.role actors: the
// mirror above; peek finds nothing), or null (peek finds nothing). Multi-turn groups need
// the head. publish throws kf::Error after cluster.redis.gone_after_s without an answer.
std::unique_ptr<replay::GroupSink> stream_groups(const Config& cfg, replay::RunShm* shm, const std::string& who);
// Learner rank `rank` of `world`. shm: the head's run (rank 0 must have it); null on a
// learners node (the share comes from rank 0). Ranks [cluster.head_learner_ranks, world)
// are on learners nodes when cluster.head_learner_ranks > 0. wait: how long a take waits
// for the first ready group.
std::unique_ptr<replay::ReadyGroups> stream_ready_groups(const Config& cfg, replay::RunShm* shm, int rank, int world,
                                                         std::chrono::milliseconds wait);

// What went over the network, summed over every process of the run (hash kf:counts, field
// names as below; each process adds its own at most once a second and when it closes).
struct NetworkCounts {
  uint64_t groups_published = 0;      // actors: group records into kf:groups
  uint64_t candidates_published = 0;  // actors: members into kf:candidates
  uint64_t known_results = 0;         // actors: results in the group records (extraction failures)
  uint64_t unqueued = 0;              // actors: members never handed over (publish stopped)
  uint64_t results_sent = 0;          // evaluators: results into kf:results
  uint64_t results_late = 0;          // evaluators: results of entries claimed away meanwhile (dropped)
  uint64_t claimed_again = 0;         // evaluators: candidates taken over from a dead or stalled one
  uint64_t undecodable = 0;           // records that did not decode (candidates, results, group records)
  uint64_t dropped = 0;               // evaluators: claims dropped (their result could not be stored)
  uint64_t dead_lettered = 0;         // entries moved to <stream>:dead (malformed, or max_deliveries)
  uint64_t groups_opened = 0;         // head: group records opened in the head's replay
  uint64_t groups_dropped = 0;        // head: group records that did not fit (their results become orphans)
  uint64_t groups_duplicate = 0;      // head: group records delivered again (dropped)
  uint64_t results_joined = 0;        // head: results joined to their group
  uint64_t results_orphan = 0;        // head: results whose group was not open (dropped, acknowledged)
  uint64_t results_duplicate = 0;     // head: second results for a scored candidate (dropped)
  uint64_t members_lost = 0;          // head: unqueued members marked lost in their group
  uint64_t kernels_inserted = 0;      // head: verified kernels that entered the head's KernelDb
};
// Reads kf:counts (throws kf::Error naming the server when it does not answer); the second
// form over a connection the caller keeps (a status loop).
NetworkCounts network_counts(const StreamConfig& server);
NetworkCounts network_counts(KeyStore& store);

}  // namespace kf::netqueue
