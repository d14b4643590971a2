// kf/netqueue/netqueue.h: the netqueue component's one public header. Sections:
//   StreamQueue, RedisServer     the cross-node queue on Redis Streams (below)
//   StoreRendezvous              the learner ranks' rendezvous over the same server
//   GroupRelay                   scored groups for learner ranks on other nodes
//   KeyStore                     plain keys: snapshot and kernel database for actor nodes
//
// kf::netqueue: the cross-node candidate/result queue on Redis Streams (hiredis), and a
// redis-server the launcher (or a test) can start. Inside a node the shared-memory
// ShmQueue (replay/) stays the transport; this carries the same byte records (payload +
// 64-bit tag, e.g. an encoded kf::replay::Candidate and its id) between nodes.
//
// Shape: one StreamQueue object = one connection to one stream with one consumer group.
//   producer: push()/push_batch() add records with XADD (MAXLEN = bound) inside a Lua
//     script that first checks XLEN, so a full stream makes the producer wait (poll with
//     back-off) up to its timeout instead of trimming or filling memory.
//   consumer: take() reads new records with XREADGROUP (COUNT, BLOCK) and, every
//     claim_every, claims records other consumers left pending longer than claim_idle
//     (XAUTOCLAIM) - a dead consumer's work is never lost. ack() acknowledges records
//     after the caller has stored their outcome: XACK + XDEL in one script, so the
//     stream length is exactly the records not yet acknowledged (that is what the bound
//     limits). ack_forward() also appends outputs (results) to another stream in the
//     same atomic step, only for records still pending: of two consumers that scored the
//     same claimed record, exactly one result goes in.
//   A record delivered more than max_deliveries times (it kills its consumers), or one
//   that does not parse, is moved to "<stream>:dead" with a reason, counted and logged.
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

  // --- supervision
  StreamDepth depth();
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

// --- Scored groups for learner ranks off the replay's node. A learner rank on another node
// cannot map the head's replay; rank 0 (on the head) takes that rank's share for it and
// hands it over through the run's Redis server, one request and one reply per learner
// step (kf-learner --remote-from; docs/netqueue.md, "Groups for learner ranks on other
// nodes").
//
//   kf:lrn:<run>:req:<r>   rank r's requests (a Redis list): step, groups wanted, version, max lag
//   kf:lrn:<run>:rep:<r>   rank 0's replies: the step and the encoded groups
//
// Every rank calls take() once per learner step (the steps are in lockstep: each ends in
// an all-reduce), so rank 0 serves each remote rank exactly once per step, in order; a
// reply for another step is an error, never silently used.
//
// Failures: kf::Error naming the server, the run, the rank and the step ("no request
// from rank 2 for step 14 within 300000 ms"). Threads: one object per thread.

// Byte form of a list of scored groups (candidates and results in the replay's record
// encoding). decode throws kf::Error naming `context` and the field on malformed input.
std::string encode_groups(const std::vector<replay::ScoredGroup>& groups);
std::vector<replay::ScoredGroup> decode_groups(const std::string& bytes, const std::string& context);

struct GroupRequest {
  int64_t step = 0;
  int64_t groups = 0;
  int64_t version = 0;
  int64_t max_lag = 0;
};

class GroupRelay {
 public:
  // Connects (kf::Error naming the server on failure). scope: the run name.
  GroupRelay(const StreamConfig& server, std::string scope);
  ~GroupRelay();
  GroupRelay(const GroupRelay&) = delete;
  GroupRelay& operator=(const GroupRelay&) = delete;

  // --- a remote rank r: send its request, wait up to timeout for rank 0's reply.
  std::vector<replay::ScoredGroup> request(int rank, const GroupRequest& req, Millis timeout);
  // --- rank 0: the next request of rank r (waits up to timeout), then the reply to it.
  GroupRequest next_request(int rank, Millis timeout);
  void reply(int rank, int64_t step, const std::vector<replay::ScoredGroup>& groups);
  std::string where() const;

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
  std::string where() const;  // "redis at HOST:PORT"

  struct Impl;

 private:
  explicit KeyStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kf::netqueue
