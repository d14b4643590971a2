// kf/replay/replay.h: the replay component's one public header: the run's shared memory
// (ARCHITECTURE.md, "replay"). Sections, lowest layer first:
//   ShmSegment             one named POSIX segment with a header (creator, ready, heartbeat)
//   ControlBlock           run state, heartbeats, counters, rendezvous data
//   Candidate, Result, ... the records that travel between the processes
//   ShmQueue               bounded MPMC queue of records (the candidate queue's handles)
//   ReplayBuffer           scored groups waiting for the learner
//   KernelDb               verified kernels per task, exemplars, best-so-far
//   SnapshotStore          versioned policy weight blobs for the actors
//   RunShm                 all segments of one run; what the processes open
// Each section states its threading and process contract. Any process may die at any
// instruction: no structure here deadlocks its survivors or corrupts its data.
//
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kf/common/config.h"

namespace kf::replay {

// --- One named POSIX shared-memory segment (Boost.Interprocess shared_memory_object +
// mapped_region) with a fixed header: magic, layout version, component kind, size,
// the creator's identity (pid + start time), a run incarnation id and a ready flag.
//
// Why a header: workers attach by name only, so the segment itself must say what it
// is, who made it and whether it is finished; a later run with the same name uses the
// creator identity and heartbeat to tell a live segment from a stale one.
//
// Contract: create() is for the launcher (one process); attach() for any process.
// A ShmSegment object is used by one thread at a time; the memory it maps is shared
// and its users synchronise through the structures they place in it. The segment
// holds only plain data and integer offsets, never pointers.

using Timeout = std::chrono::nanoseconds;

enum class SegmentKind : uint32_t { Control = 1, Queue = 2, Replay = 3, KernelDb = 4, Snapshot = 5, Test = 99 };

// The first 512 bytes of every segment. Components place their own header after it
// (at ShmSegment::kHeaderBytes) and record their parameters in `params`.
struct SegmentHeader {
  uint64_t magic;           // kSegmentMagic
  uint32_t layout_version;  // kLayoutVersion
  uint32_t kind;            // SegmentKind
  uint64_t total_bytes;
  int32_t creator_pid;
  uint32_t pad0;
  uint64_t creator_start;  // creator's start time (clock ticks since boot)
  uint64_t incarnation;    // random per creation; ties a run's segments together
  uint64_t created_ns;     // CLOCK_MONOTONIC
  uint64_t heartbeat_ns;   // creator's last heartbeat (0: never beat); atomic access
  uint32_t ready;          // 1 once the creator finished initialising; atomic access
  uint32_t pad1;
  unsigned char params[384];  // component parameters (plain struct)
};

struct SegmentOptions {
  bool prefault = false;     // MAP_POPULATE: pay page faults at create/attach, not in use
  uint64_t incarnation = 0;  // 0: draw a random one
  // A segment whose creator is alive but whose heartbeat is older than this is stale
  // (a hung launcher). 0 disables the heartbeat rule (only a dead creator is stale).
  std::chrono::milliseconds stale_after{0};
};

enum class SegmentState { Absent, Live, Stale };

class ShmSegment {
 public:
  static constexpr std::size_t kHeaderBytes = 512;
  static constexpr uint64_t kSegmentMagic = 0x3130304D48534B46ULL;  // "KFSHM001"
  static constexpr uint32_t kLayoutVersion = 3;                     // 3: replay group slots carry a held flag

  // Creates `name` with `bytes` (header included), zero-filled. An existing segment
  // of that name that is stale is removed and replaced (logged); a live one makes
  // this throw kf::Error naming the segment and the live creator pid. Two creators
  // racing: exactly one wins (O_EXCL), the other throws.
  static ShmSegment create(const std::string& name, SegmentKind kind, std::size_t bytes,
                           const SegmentOptions& opt = {});
  // Maps an existing segment, waiting up to `wait_ready` for its creator to mark it
  // ready. Throws kf::Error if absent, not ready in time, or of the wrong kind/version.
  static ShmSegment attach(const std::string& name, SegmentKind kind, Timeout wait_ready, bool prefault = false);
  // Whether `name` exists and whether its creator still lives (see SegmentOptions).
  static SegmentState probe(const std::string& name, std::chrono::milliseconds stale_after = {});
  static bool remove(const std::string& name);  // unlinks; mappings stay valid until unmapped

  ShmSegment();
  ~ShmSegment();
  ShmSegment(ShmSegment&&) noexcept;
  ShmSegment& operator=(ShmSegment&&) noexcept;

  void* base() const;
  std::size_t size() const;
  SegmentHeader* header() const { return static_cast<SegmentHeader*>(base()); }
  void* body() const { return static_cast<char*>(base()) + kHeaderBytes; }
  const std::string& name() const;
  bool is_creator() const;
  uint64_t incarnation() const { return header()->incarnation; }

  void mark_ready();  // creator: publish the initialised contents (release)
  void heartbeat();   // creator: refresh heartbeat_ns

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// --- ControlBlock: the run's small shared state: run state (running / draining /
// stopped), a table of registered processes with heartbeats and counters, and
// rendezvous slots for small blobs every rank must agree on (e.g. the 128-byte NCCL
// unique id).
//
// Liveness: a peer is alive while its pid + start time exist and its heartbeat is
// younger than the timeout the caller gives; a dead peer's table entry is reused by
// the next register_process(). Counters are per process, so a dead process's counts
// stay readable after it is gone.
//
// Contract: any thread of any attached process. Registration and rendezvous writes
// take a robust mutex (rare); heartbeats, counters and state are lock-free atomics.

enum class RunState : uint32_t { starting = 0, running = 1, draining = 2, stopped = 3 };
const char* run_state_name(RunState s);

struct PeerInfo {
  int slot = -1;
  int32_t pid = 0;
  std::string role;
  int32_t id = 0;
  int64_t heartbeat_age_ns = 0;
  bool alive = false;  // process exists (pid + start time)
  bool fresh = false;  // alive and heartbeat within the timeout
  std::vector<uint64_t> counters;
};

// Control-block counter ids, per role: the one place they are named. Writers add to them,
// the launcher's status and time split read them. 8-10 (ControlBlock::kWorkMs, ...) mean
// the same in every role.
namespace counter {
enum Actor : int {
  kActorPushed = 0,           // candidates handed to the evaluators
  kActorGroups = 1,           // groups published
  kActorTokens = 2,           // completion tokens sampled
  kActorExtractFail = 3,      // completions with no extractable kernel
  kActorSnapshotLoads = 4,    // policy snapshots loaded
  kActorSnapshotRejects = 5,  // snapshots refused (shape or checksum)
  kActorGroupsDropped = 6,    // groups dropped for a full replay
  kActorLagSum = 7,           // policy lag of the candidates handed over, summed
};
enum Evaluator : int {
  kEvalScored = 0,
  kEvalOk = 1,
  kEvalCheat = 2,
  kEvalCompileError = 3,
  kEvalKernelsInserted = 4,
  kEvalEnvironment = 5,  // verdicts the machine caused (Result::cause environment)
  kEvalLost = 6,         // candidates counted lost here (group gone, result not stored)
  kEvalDegenerate = 7,   // results of tasks flagged degenerate
};
enum Learner : int {
  kLearnerSteps = 0,
  kLearnerGroupsUsed = 1,
  kLearnerDroppedStale = 2,
  kLearnerSkippedEqual = 3,
  kLearnerTokens = 4,
  kLearnerEmptySteps = 5,
  kLearnerPublishes = 6,
  kLearnerCheckpoints = 7,
  kLearnerAbsoluteStep = 11,  // the absolute optimizer step (the launcher reads the live value)
};
}  // namespace counter

class ControlBlock {
 public:
  static constexpr int kMaxProcs = 128;
  static constexpr int kCounters = 12;  // 0-7: meaning chosen by each role (documented there)
  // 8-10 mean the same in every role, in milliseconds: working (actor: generating;
  // evaluator: verifying; learner: training steps, without waiting for groups), compiling
  // (evaluator), waiting for the GPU timing lock (actor, learner). 11 is free.
  static constexpr int kWorkMs = 8, kCompileMs = 9, kGpuWaitMs = 10;
  static constexpr int kRendezvous = 8;
  static constexpr int kRendezvousBytes = 256;

  static std::size_t segment_bytes();
  static ControlBlock create(const std::string& name, const SegmentOptions& opt = {});
  static ControlBlock attach(const std::string& name, Timeout wait_ready = std::chrono::seconds(10));

  RunState state() const;
  void set_state(RunState s);  // wakes wait_state()
  // Blocks until state() != `from` or the timeout passes; returns the state then.
  RunState wait_state_change(RunState from, Timeout timeout) const;

  // Claims a table entry for this process (reusing a dead one). Returns its slot.
  // Throws kf::Error if all kMaxProcs entries belong to live processes.
  int register_process(const std::string& role, int32_t id);
  void unregister_process(int slot);
  void heartbeat(int slot);
  void add_counter(int slot, int counter, uint64_t delta);
  std::vector<PeerInfo> peers(Timeout heartbeat_timeout) const;
  // The newest heartbeat of any live registered process (0: none).
  int64_t newest_heartbeat_ns() const;

  // Rendezvous: put() publishes bytes under a key (<= 31 chars, <= 256 bytes);
  // get() waits up to `timeout` for the key and returns a consistent copy.
  void rendezvous_put(const std::string& key, const void* data, std::size_t len);
  std::optional<std::string> rendezvous_get(const std::string& key, Timeout timeout) const;

  ShmSegment& segment() { return seg_; }
  struct Header;

 private:
  ControlBlock() = default;
  Header* hdr() const;
  ShmSegment seg_;
};

// --- The records that travel between actors, evaluators and the learner (ARCHITECTURE.md
// "Records"), and their compact binary encoding. replay/ owns this layout.
//
// Encoding: little-endian, a 4-byte tag and a format version, then the fields in the
// order declared; strings and arrays as u32 length + bytes. Decoding checks every
// length against the buffer and throws kf::Error naming the record and field, so a
// bad or truncated buffer is never half-read. Plain functions: any thread.

struct Candidate {
  uint64_t id = 0;
  std::string task;
  uint64_t group_id = 0;
  uint32_t index_in_group = 0;  // 0..G-1
  int64_t policy_version = 0;   // behaviour policy that sampled it
  std::vector<int32_t> prompt_tokens;
  std::vector<int32_t> completion_tokens;
  std::vector<float> behaviour_logprobs;  // one per completion token
  std::string source;                     // extracted kernel source (empty on error)
  std::string extraction_error;           // why no source could be extracted
  int32_t actor_id = 0;
  int64_t t_sampled_ns = 0;  // CLOCK_MONOTONIC
  int64_t t_pushed_ns = 0;
  // Multi-turn refinement (actors.turns, docs/actors.md): turn 1 is the first answer; turn
  // t > 1 revises the member's turn t-1 answer after the verifier's feedback, and its
  // prompt_tokens hold the whole conversation so far (its own, not the group's). turns:
  // the most turns the actor allows (1: single turn); parent_group_id: the turn-1 group
  // (0 at turn 1); parent_index: the member's index_in_group there.
  uint32_t turn = 1;
  uint32_t turns = 1;
  uint64_t parent_group_id = 0;
  uint32_t parent_index = 0;
  // A probe sample (actors.probe, docs/metrics.md "Learning curve"): drawn on a fixed prompt
  // with a fixed seed to measure the policy; verified like any other, never trained on.
  bool probe = false;
};

// What the candidate queue carries: a fixed-size handle of a candidate that lives in its
// replay group (the group is the one home of the candidate's tokens, log-probs and
// source). Consumers resolve it with ReplayBuffer::read_candidate after claiming it.
struct CandidateRef {
  uint64_t candidate_id = 0;
  uint64_t group_id = 0;
  uint32_t index_in_group = 0;
  int64_t t_pushed_ns = 0;  // CLOCK_MONOTONIC; copied into the resolved candidate
};
CandidateRef ref_of(const Candidate& c);  // id, group id and index of c; t_pushed_ns = c.t_pushed_ns
// Encoded size of every CandidateRef: tag, version, the four fields. A candidate queue
// slot holds exactly this many bytes.
constexpr std::size_t kCandidateRefBytes = 4 + 4 + 8 + 8 + 4 + 8;

// The one verdict type of the system: the evaluator produces it, the records carry it,
// the learner and the live status read it. Names as in ARCHITECTURE.md "Records".
enum class Verdict : uint8_t { compile_error, runtime_error, timeout, incorrect, rejected_cheat, ok };
const char* verdict_name(Verdict v);  // "compile_error", ..., "ok"

// Who caused a verdict. `kernel`: the candidate's own doing (every ok, and most failures).
// `environment`: the machine, not the kernel (still out of GPU memory after the
// evaluator's retries, the sandbox worker killed from outside, the compiler could not
// run, an unknown task, an evaluator-side error). The learner leaves environment verdicts
// out of the update, as if unscored: scored -3 like a crash, such results taught the
// policy noise (in H200 runs of 2026-12-03, 60 % of the rewards were out-of-memory
// verdicts of correct and incorrect kernels alike).
enum class Cause : uint8_t { kernel, environment };
const char* cause_name(Cause c);  // "kernel", "environment"

struct Result {
  uint64_t candidate_id = 0;
  uint64_t group_id = 0;        // routing: copied from the candidate
  uint32_t index_in_group = 0;  // routing: copied from the candidate
  Verdict verdict = Verdict::compile_error;
  Cause cause = Cause::kernel;
  std::string reason;  // human text; says what happened, never parsed
  double ref_time_median_us = 0, ref_time_spread_us = 0;
  double cand_time_median_us = 0, cand_time_spread_us = 0;
  double speedup = 0;
  double max_error = 0;
  uint32_t checks_passed = 0;
  double reward = 0;
  int32_t evaluator_id = 0;
  int64_t t_scored_ns = 0;
  // Interval of the speedup from paired timing trials (0 when not timed). When
  // timing_unstable, `speedup` is the conservative estimate speedup_lo.
  double speedup_lo = 0, speedup_hi = 0;
  bool timing_unstable = false;
  bool task_degenerate = false;  // the task's reference output is (nearly) input-independent
  // The learner leaves this result out of training (its group is dropped): set by the
  // evaluator for degenerate tasks unless evaluator.train_on_degenerate_tasks.
  bool exclude_from_training = false;
};

std::size_t encoded_size(const Candidate& c);
std::size_t encoded_size(const Result& r);
inline std::size_t encoded_size(const CandidateRef&) { return kCandidateRefBytes; }
// Write exactly encoded_size(x) bytes at dst.
void encode(const Candidate& c, unsigned char* dst);
void encode(const Result& r, unsigned char* dst);
void encode(const CandidateRef& r, unsigned char* dst);
// Throw kf::Error("<context>: candidate record: field <f>: ...") on malformed input.
Candidate decode_candidate(const unsigned char* src, std::size_t n, const std::string& context = "replay");
CandidateRef decode_candidate_ref(const unsigned char* src, std::size_t n, const std::string& context = "replay");
Result decode_result(const unsigned char* src, std::size_t n, const std::string& context = "replay");

// --- ShmQueue: a bounded many-producer many-consumer queue of variable-size records in
// one shared-memory segment; RecordQueue<T>: a typed queue over it; CandidateQueue: the
// run's candidate queue, of fixed-size handles (CandidateRef) of candidates that live in
// their replay groups.
//
// Shape (Sample Factory style): a slab of `capacity` fixed-size slots is allocated
// when the segment is created; the queue proper is a ring of 4-byte slot handles.
// Producers copy a record into a free slot outside any lock, then commit its handle;
// consumers take handles, read the slots in place (or copy out), then release them.
//
// Back-pressure: with no free slot, push blocks (futex) until a consumer releases one
// or the timeout passes; a timed-out push is counted in `dropped_full`, never silent.
//
// Robustness: every slot has an owner word (state + pid, one 64-bit store) that is
// the source of truth; the ring and the free stack are derived from it under a
// robust mutex. A process SIGKILLed anywhere loses at most the slots it owned
// (being written or being read): reap() finds slots whose owner is dead (pid + start
// time), frees them, counts them in lost_producer / lost_consumer and records their
// tags in the lost log, so upstream can account for exactly which items were lost.
// A record is only ever visible to consumers after its producer committed it, so a
// torn record cannot be delivered; a checksum over each record backs this up.
//
// Contract: any thread of any process that attached the segment may call any method;
// one ShmQueue object may be shared by threads. Item order is FIFO by commit.

class ReplayBuffer;

struct QueueConfig {
  uint32_t capacity = 4096;    // slots (also the most records in flight)
  uint32_t slot_bytes = 4096;  // largest record
  // How long a blocked push/pop waits before it looks for dead owners (reap()).
  std::chrono::milliseconds reap_after{100};
  uint32_t spin_us = 20;  // consumers spin this long on an empty queue before sleeping
  // Claims: a record a consumer took stays in its slot (READING, owner pid + start time)
  // until the consumer release()s it. If the consumer dies first, reap() puts the record
  // back in the queue, up to max_claims takes in all; after that (or with 0) the record
  // is counted lost (lost_consumer). A record that kills every consumer taking it is so
  // bounded to max_claims deaths.
  uint32_t max_claims = 0;
};

// Every record that entered the queue, read under the queue's lock so that it adds up
// exactly at any moment: created = scored + lost() + queued + in_flight.
struct QueueLedger {
  uint64_t created = 0;        // committed into the queue, plus lost_producer (died mid-write)
  uint64_t scored = 0;         // released (acknowledged) by a consumer
  uint64_t requeued = 0;       // events: claims of dead consumers put back, and give_back() calls
  uint64_t lost_producer = 0;  // producer died between acquire and commit
  uint64_t lost_consumer = 0;  // consumer died holding it and max_claims was used up (or 0)
  uint64_t dropped = 0;  // a consumer gave up on it (drop(): its group was gone, or its result could not be stored)
  uint64_t corrupt = 0;  // failed its checksum or decoding
  uint64_t lost_run_died = 0;  // still queued or claimed when the launcher died (salvage_or_count)
  uint64_t queued = 0;         // committed, waiting
  uint64_t in_flight = 0;      // claimed by a live (or not yet reaped) consumer
  uint64_t lost() const { return lost_producer + lost_consumer + dropped + corrupt + lost_run_died; }
  bool balanced() const { return created == scored + lost() + queued + in_flight; }
};

struct QueueStats {
  uint64_t pushed = 0, popped = 0;  // committed / released by consumers
  uint64_t queued = 0;              // committed, not yet taken
  uint64_t free_slots = 0;
  uint64_t dropped_full = 0;         // pushes that timed out on a full queue
  uint64_t dropped_too_large = 0;    // records larger than slot_bytes
  uint64_t dropped_abandoned = 0;    // slots a producer acquired and gave back unwritten
  uint64_t lost_producer = 0;        // reclaimed from dead producers (mid-write)
  uint64_t lost_consumer = 0;        // reclaimed from dead consumers (mid-read)
  uint64_t corrupt = 0;              // records failing their checksum (should stay 0)
  uint64_t recoveries = 0;           // locks recovered from a dead owner
  uint64_t requeued = 0;             // claims put back (dead consumer, give_back)
  uint64_t dropped_by_consumer = 0;  // drop(): taken, then given up by the consumer
};

class ShmQueue {
 public:
  struct Slot {  // a slot held by this process (writing or reading)
    uint32_t handle = 0;
    unsigned char* data = nullptr;
    uint32_t len = 0;  // reading: record length; writing: set before commit
    uint64_t tag = 0;  // caller's id for the record (e.g. candidate id)
  };

  static std::size_t segment_bytes(const QueueConfig& cfg);
  static ShmQueue create(const std::string& name, const QueueConfig& cfg, const SegmentOptions& opt = {});
  static ShmQueue attach(const std::string& name, Timeout wait_ready = std::chrono::seconds(10));

  ShmQueue(ShmQueue&&) noexcept = default;
  ShmQueue& operator=(ShmQueue&&) noexcept = default;

  // --- producers
  // Copies one record in; false if the queue stayed full for `timeout` (counted) or
  // the record exceeds slot_bytes (counted).
  bool push(const void* data, std::size_t len, uint64_t tag, Timeout timeout);
  // Pushes records in order; returns how many went in before the timeout.
  std::size_t push_batch(const std::vector<std::string>& records, const std::vector<uint64_t>& tags, Timeout timeout);
  // Zero-copy: take up to n free slots (at least 1 unless the timeout passes) tagged
  // tags[0..), write into slot.data, set slot.len, then commit() or abandon().
  std::size_t acquire(Slot* out, std::size_t n, const uint64_t* tags, Timeout timeout);
  void commit(Slot* slots, std::size_t n);
  void abandon(Slot* slots, std::size_t n);

  // --- consumers
  // Takes up to max records in FIFO order (at least 1 unless the timeout passes);
  // read them in place, then release(). Records failing the checksum are dropped
  // (counted) and not returned.
  // Each taken slot is a claim of this process (pid + start time): release() is the
  // acknowledgement (call it once the record's outcome is stored), give_back() puts
  // the records back at the tail of the queue (counted requeued), drop() frees them
  // as lost (counted dropped_by_consumer; log why).
  std::size_t take(Slot* out, std::size_t max, Timeout timeout);
  void release(Slot* slots, std::size_t n);
  void give_back(Slot* slots, std::size_t n);
  void drop(Slot* slots, std::size_t n);
  // Convenience: take + copy out + release.
  std::size_t pop_batch(std::vector<std::string>& out, std::size_t max, Timeout timeout);

  // --- supervision
  // Frees slots of dead owners; returns how many. Half-written records are counted
  // lost_producer; claims of dead consumers go back to the queue (max_claims) or are
  // counted lost_consumer. One log line per record names its tag, the dead pid and
  // what happens to it.
  std::size_t reap();
  QueueStats stats() const;
  QueueLedger ledger() const;  // under the lock: adds up exactly
  // Tags of the records still queued (claimed = false) or claimed by a consumer (true).
  std::vector<std::pair<uint64_t, bool>> pending_tags() const;
  // Tags of lost records with sequence number >= *cursor (advances *cursor). The log
  // keeps the newest kLostLog tags; older ones are counted but their tags are gone.
  std::vector<uint64_t> lost_tags(uint64_t* cursor) const;
  static constexpr uint32_t kLostLog = 4096;
  uint32_t slot_bytes() const;
  uint32_t capacity() const;
  const ShmSegment& segment() const { return seg_; }
  struct Header;  // the shared layout; defined in queue.cpp only

 private:
  template <typename T>
  friend class RecordQueue;
  ShmQueue() = default;
  Header* hdr() const;
  ShmSegment seg_;
};

// Typed queue over ShmQueue: encodes T straight into the slot (no temporary copy).
template <typename T>
class RecordQueue {
 public:
  explicit RecordQueue(ShmQueue q) : q_(std::move(q)) {}
  // Tag = the candidate id. False: full (timeout) or too large.
  bool push(const T& rec, Timeout timeout);
  // Pops up to max records (decoded); blocks up to timeout for the first.
  std::size_t pop_batch(std::vector<T>& out, std::size_t max, Timeout timeout);
  // Claims up to max records: appends the decoded copies to out and their slots to
  // claims (same order); the caller acknowledges each with raw().release() once its
  // outcome is stored, or raw().give_back() / raw().drop(). Records that do not decode
  // are freed and counted corrupt (logged).
  std::size_t claim(std::vector<T>& out, std::vector<ShmQueue::Slot>& claims, std::size_t max, Timeout timeout);
  ShmQueue& raw() { return q_; }

 private:
  T decode(const ShmQueue::Slot& s) const;
  ShmQueue q_;
};
extern template class RecordQueue<CandidateRef>;

// Handles CandidateQueue::claim could not turn into candidates (each already logged).
struct Unresolved {
  // The group was gone (evicted, or taken at its deadline) or its slot held another
  // candidate: the claim was dropped (ledger: dropped), nothing is scored.
  std::vector<CandidateRef> gone;
  // Its result was already in the group (an evaluator died between storing the result and
  // acknowledging the claim): the claim was released (ledger: scored), not scored again.
  std::vector<CandidateRef> scored;
};

// The run's candidate queue. Actors push the handle of each candidate after opening its
// group (push(ref_of(c), ...)); a slot holds one encoded handle (kCandidateRefBytes).
// Consumers claim handles and resolve them in the replay buffer given at construction.
class CandidateQueue : public RecordQueue<CandidateRef> {
 public:
  // `replay` (may be null: then only the handle methods of RecordQueue work) must outlive this.
  CandidateQueue(ShmQueue q, const ReplayBuffer* replay) : RecordQueue(std::move(q)), replay_(replay) {}
  using RecordQueue::claim;
  using RecordQueue::pop_batch;
  // Claims up to max handles (waits up to timeout for the first) and resolves each with
  // ReplayBuffer::read_candidate: the candidates are appended to out and their claims to
  // claims (same order), to be acknowledged as with RecordQueue::claim. A handle that does
  // not resolve is settled here (see Unresolved) with one log line naming `who` (e.g.
  // "evaluator 2"), the candidate, its group and what happens next, and appended to
  // *unresolved when given. Returns how many resolved; takes again (without waiting) while
  // every handle taken failed to resolve and the queue holds more.
  std::size_t claim(std::vector<Candidate>& out, std::vector<ShmQueue::Slot>& claims, std::size_t max, Timeout timeout,
                    const std::string& who, Unresolved* unresolved = nullptr);
  // Convenience for tools and tests acting as evaluators: claim() as "consumer", then
  // release every resolved claim.
  std::size_t pop_batch(std::vector<Candidate>& out, std::size_t max, Timeout timeout);

 private:
  const ReplayBuffer* replay_;
};

// --- ReplayBuffer: scored groups waiting for the learner.
//
// A group is one prompt plus G candidates sampled together (G <= 64), and the one home of
// those candidates: the actor opens it with all G candidates, then pushes only their
// handles (CandidateRef) into the candidate queue; a consumer resolves a handle with
// read_candidate. Each evaluator (and the head's bridge, for evaluator
// nodes) joins its result to it by group id and index (add_result), into an empty result
// slot only: a second result for the same candidate is counted duplicate and dropped. A group is READY when all G are
// scored, or when its deadline passes or its missing candidates were reported lost (those are marked missing). The
// learner takes ready groups in batches, oldest policy version first. Groups whose policy version lags the learner's by
// more than max_lag are dropped at take time and counted.
//
// Capacity and eviction: `capacity` group slots of `group_bytes` each, allocated at
// start-up. When open_group() finds no free slot it evicts the open group with the
// oldest policy version (ties: the oldest opened), ready or not, and counts it in
// `evicted`: the newest data is the most on-policy. Slots being filled or taken are
// never evicted.
//
// Robustness: slot owner words (state + pid) under a robust mutex; a result is
// committed by setting its bit after its bytes are written. A process killed while
// filling a group (actor) or copying one out (learner) loses that group only:
// reap() frees it and counts it in lost_filling / lost_taking.
//
// Held groups (multi-turn refinement, docs/actors.md): an actor that needs a group's results
// to write the next turn opens it held. A held group is not ready when its last result
// arrives, only once the actor has read it (peek_group with release, or release_group), or
// when its deadline passes (an actor that died or gave up never stalls the learner).
//
// Result notes: every result add_result() sees (joined or orphan, not duplicate) leaves a
// short note (verdict, cause, speedup, reward, evaluator) in a ring of kResultNotes in
// the segment, read with a cursor (recent_results) by the live status: results travel
// from the evaluator into the group and nowhere else.
//
// Contract: any thread of any attached process.

struct ReplayConfig {
  uint32_t capacity = 256;          // groups
  uint32_t group_bytes = 1u << 20;  // encoded prompt + G candidates + G results
  uint32_t result_bytes = 2048;     // per result (reason text is truncated to fit)
};

struct ScoredGroup {
  uint64_t group_id = 0;
  std::string task;
  int64_t policy_version = 0;
  std::vector<int32_t> prompt_tokens;
  std::vector<Candidate> candidates;  // prompt_tokens empty when the member's prompt is the group's
                                      // (always at turn 1); a later turn's member keeps its own
  std::vector<Result> results;        // results[i] belongs to candidates[i]
  std::vector<uint8_t> missing;       // 1: no result (deadline passed or candidate lost)
  bool deadline_hit = false;
};

// True when a scored (not missing) result of the group says exclude_from_training (its
// task is degenerate and the evaluator was not told to train on such tasks): the learner
// drops the whole group, since every candidate of a group shares its task.
bool excluded_from_training(const ScoredGroup& g);
// True when the group's candidates are probe samples (Candidate::probe): the learner
// never trains on them.
bool is_probe(const ScoredGroup& g);

// What peek_group found.
enum class GroupPeek {
  absent,   // no open group of that id: evicted, dropped stale, or taken after its deadline
  pending,  // results still missing and the deadline not passed
  ready,    // every result in or marked lost, or the deadline passed (deadline_hit)
};

// What the live status learns of one result (ReplayBuffer::recent_results).
struct ResultNote {
  uint64_t candidate_id = 0;
  Verdict verdict = Verdict::compile_error;
  Cause cause = Cause::kernel;
  bool joined = false;       // false: its group was gone (evicted, or taken at its deadline)
  int32_t evaluator_id = 0;  // negative: scored by an actor (extraction failure)
  double speedup = 0, reward = 0;
};

struct ReplayStats {
  uint64_t opened = 0, taken = 0, open_now = 0, ready_now = 0;
  uint64_t results_joined = 0, results_orphan = 0, results_duplicate = 0;
  uint64_t dropped_stale = 0, evicted = 0, dropped_full = 0;
  uint64_t lost_filling = 0, lost_taking = 0, candidates_lost = 0, recoveries = 0;
  uint64_t refs_unresolved = 0;  // read_candidate found no such candidate (its group was gone)
};

class ReplayBuffer {
 public:
  static std::size_t segment_bytes(const ReplayConfig& cfg);
  static ReplayBuffer create(const std::string& name, const ReplayConfig& cfg, const SegmentOptions& opt = {});
  static ReplayBuffer attach(const std::string& name, Timeout wait_ready = std::chrono::seconds(10));

  // Actor: opens a group of candidates (same group_id, indices 0..G-1, group prompt
  // = candidates[0].prompt_tokens; a candidate whose prompt differs keeps its own). Scoring
  // must finish within `deadline`. `hold`: the group waits for the actor's peek_group
  // (release) before the learner may take it, until its deadline. Returns false (counted
  // dropped_full) if every slot stayed in use for `timeout`. Throws kf::Error for a
  // malformed group or one larger than group_bytes.
  bool open_group(const std::vector<Candidate>& candidates, Timeout deadline, Timeout timeout = Timeout(0),
                  bool hold = false);
  // Actor: the group's state without taking it; when ready, *out (if given) gets its
  // candidates and results (missing ones marked) and `release` lets the learner take it.
  GroupPeek peek_group(uint64_t group_id, ScoredGroup* out, bool release);
  // Actor: lets the learner take a held group without reading it; false if no such held group.
  bool release_group(uint64_t group_id);
  // Joins one result to its group (into its empty slot; the group is ready once all G
  // are in) and leaves a result note. False: no such open group (orphan, noted) or the
  // slot already holds a result (duplicate, not noted).
  bool add_result(const Result& r);
  // Evaluator (after claiming a handle): copies candidate ref.index_in_group of group
  // ref.group_id, with the group's prompt tokens and ref.t_pushed_ns, into out, under
  // the replay lock. False (counted refs_unresolved; the caller logs and counts the
  // candidate lost) when no open group has that id (evicted, or taken at its deadline)
  // or its slot holds another candidate id. *scored (when given): its result is already
  // in the group.
  bool read_candidate(const CandidateRef& ref, Candidate& out, bool* scored = nullptr) const;
  // Marks candidates (by id, e.g. ShmQueue::lost_tags of the candidate queue) as lost,
  // so their groups need not wait for the deadline.
  std::size_t mark_lost(const std::vector<uint64_t>& candidate_ids);

  // Learner: takes up to max ready groups (blocks up to timeout for the first), first
  // dropping groups with current_version - policy_version > max_lag (counted).
  std::size_t take_ready(std::vector<ScoredGroup>& out, std::size_t max, int64_t current_version, int64_t max_lag,
                         Timeout timeout);

  // Result notes with sequence number >= *cursor (advances *cursor), oldest first. The
  // ring keeps the newest kResultNotes; notes overwritten before they were read are
  // counted in *missed (when given).
  std::vector<ResultNote> recent_results(uint64_t* cursor, uint64_t* missed = nullptr) const;
  static constexpr uint32_t kResultNotes = 4096;

  std::size_t reap();  // frees groups held by dead fillers/takers
  ReplayStats stats() const;

  // Persistence (binary, see docs/replay.md): save() writes every open group
  // atomically (temp + fsync + rename); load() validates the whole file first, then
  // adds its groups. Bad file -> kf::Error naming the file and field; nothing stored
  // is changed then. Deadlines are saved as time remaining.
  void save(const std::string& path) const;
  std::size_t load(const std::string& path);

  const ShmSegment& segment() const { return seg_; }
  struct Header;

 private:
  ReplayBuffer() = default;
  Header* hdr() const;
  ShmSegment seg_;
};

// --- KernelDb: per task, the verified kernels found so far, with speedup, policy
// version and source, in shared memory so actors (prompts) and evaluators (inserts)
// of all processes see one database.
//
// Queries: best(task) for export; exemplars(task, k) for contrastive prompts, using
// CUDA-L1's bucketed sampling: the task's kernels sorted by speedup are cut into k
// equal-count buckets and one kernel is drawn from each, so a prompt shows slow,
// middling and fast solutions side by side (returned in ascending speedup).
// Dedup: a source identical to one already stored for the task (64-bit content hash,
// then a byte compare) is not stored again; the duplicate is counted.
//
// Capacity and eviction: `capacity` entries of up to `source_bytes` of source. A task
// holds at most `max_per_task`; a full task replaces its slowest kernel only with a
// faster one. A full table evicts the slowest kernel of the task that holds the most
// (never a task's only kernel; if every task holds one, the insert is rejected_full).
// Every rejection and eviction is counted.
//
// Robustness: all access under a robust mutex; an entry becomes visible by one store
// of its state word after its fields and source are written, so a process killed
// mid-insert leaves no half entry. Contract: any thread of any attached process.

struct KernelDbConfig {
  uint32_t capacity = 2048;
  uint32_t source_bytes = 64 * 1024;
  uint32_t max_per_task = 64;
};

struct KernelEntry {
  std::string task;
  double speedup = 0;
  int64_t policy_version = -1;  // -1: seeded from files
  std::string source;
  uint64_t source_hash = 0;
};

struct KernelDbStats {
  uint64_t entries = 0, inserted = 0, duplicates = 0, rejected_slower = 0, rejected_full = 0, evicted = 0;
  uint64_t too_large = 0, recoveries = 0;
};

enum class InsertOutcome { inserted, duplicate, rejected_slower, rejected_full, too_large };

class KernelDb {
 public:
  static std::size_t segment_bytes(const KernelDbConfig& cfg);
  static KernelDb create(const std::string& name, const KernelDbConfig& cfg, const SegmentOptions& opt = {});
  static KernelDb attach(const std::string& name, Timeout wait_ready = std::chrono::seconds(10));

  // Evaluator: adds a verified kernel. Throws kf::Error for an empty task/source or a
  // task name over 127 chars.
  InsertOutcome insert(const KernelEntry& e);
  std::optional<KernelEntry> best(const std::string& task) const;
  std::vector<KernelEntry> exemplars(const std::string& task, std::size_t k, uint64_t seed) const;
  std::vector<KernelEntry> entries(const std::string& task) const;  // ascending speedup
  std::vector<std::string> tasks() const;
  KernelDbStats stats() const;

  // Seeding: <dir>/<task>/<name>.{cu,cpp,c} with an optional <name>.json
  // {"speedup": 1.3, "policy_version": -1}. Returns how many files were read.
  std::size_t seed_from_dir(const std::string& dir);
  // Persistence: JSON {"format": "kf-kernel-db", "version": 1, "entries": [...]}
  // written atomically. load() validates every entry (including its hash) before
  // inserting any; bad input -> kf::Error naming the file, entry and field.
  void save(const std::string& path) const;
  std::size_t load(const std::string& path);

  const ShmSegment& segment() const { return seg_; }
  struct Header;

 private:
  KernelDb() = default;
  Header* hdr() const;
  ShmSegment seg_;
};

uint64_t kernel_source_hash(const std::string& source);

// --- SnapshotStore: the learner publishes flat policy weight blobs with a version;
// actors read a consistent copy of the newest one.
//
// Double buffer + per-buffer seqlock: publish() writes the buffer that is NOT the
// current one (its seq odd while writing), then flips `current`. Readers copy the
// current buffer and accept the copy only if its seq did not change, so they never
// see a torn blob and never block the writer; a reader retries only if two publishes
// land during one copy. A writer SIGKILLed mid-publish leaves the other (current)
// buffer intact; the next publisher fixes the odd seq and carries on.
//
// GPU readers: read_into() takes the copy function (e.g. a synchronous
// cudaMemcpy from this host mapping, after cudaHostRegister), and validates the seq
// after it returns, so the same protocol covers device copies.
//
// Contract: one publisher at a time (a robust mutex serialises publishers); any
// number of reader threads/processes. Copies use `threads` threads for big blobs.

struct SnapshotConfig {
  uint64_t max_bytes = 64ull << 20;  // largest blob
  bool prefault = false;             // MAP_POPULATE at create/attach (no first-touch faults later)
};

struct SnapshotInfo {
  int64_t version = -1;  // -1: nothing published yet
  uint64_t bytes = 0;
};

class SnapshotStore {
 public:
  using CopyFn = std::function<void(void* dst, const void* src, std::size_t n)>;

  static std::size_t segment_bytes(const SnapshotConfig& cfg);
  static SnapshotStore create(const std::string& name, const SnapshotConfig& cfg, const SegmentOptions& opt = {});
  static SnapshotStore attach(const std::string& name, Timeout wait_ready = std::chrono::seconds(10),
                              bool prefault = false);

  // Publishes `bytes` of `data` as `version` (versions should increase). Throws
  // kf::Error if bytes > max_bytes.
  void publish(int64_t version, const void* data, std::size_t bytes, int threads = 1);
  SnapshotInfo latest() const;  // cheap: version and size of the current buffer
  // Copies the newest blob into `out` (resized). Returns its info; version -1 if none.
  // Throws kf::Error if no consistent copy was obtained within `timeout`.
  SnapshotInfo read(std::vector<unsigned char>& out, int threads = 1, Timeout timeout = std::chrono::seconds(30)) const;
  // Same into caller memory of `capacity` bytes with a custom copy (GPU readers).
  SnapshotInfo read_into(void* dst, std::size_t capacity, const CopyFn& copy, Timeout timeout) const;
  uint64_t max_bytes() const;
  uint64_t publishes() const;
  uint64_t read_retries() const;

  const ShmSegment& segment() const { return seg_; }
  struct Header;

 private:
  SnapshotStore() = default;
  Header* hdr() const;
  unsigned char* buffer(int i) const;
  ShmSegment seg_;
};

// Multi-threaded memcpy used by publish/read (exposed for the benchmark).
void parallel_copy(void* dst, const void* src, std::size_t n, int threads);

// --- The work seam (docs/architecture.md, "Seams"): the only way actors, evaluators and the
// learner move work. Three small interfaces; shared memory implements them here
// (shm_candidates, shm_groups, shm_ready_groups below), Redis Streams in netqueue/, and
// kf::transport::open_* (transport/) picks one from the config. The loops that call them
// (the actor's group step, the evaluator's scoring step, the learner's take) exist once
// and run unchanged on every node.

// One candidate an evaluator claimed. `ticket` is the transport's handle for it (the shm
// queue slot, the stream entry id): only the source that made the claim reads it.
struct Claim {
  Candidate candidate;
  uint64_t ticket = 0;
  std::string entry;        // the stream entry id (network transports; empty in shm)
  uint32_t deliveries = 1;  // > 1: taken over from a dead or stalled evaluator
};

// What complete() did with a result.
struct Completion {
  bool first = true;            // false: another evaluator's result for it counts (a late duplicate)
  bool joined = true;           // false: its group is gone (evicted or taken at its deadline) or scored already
  bool kernel_inserted = false; // a verified kernel entered the kernel database here
};

// Evaluators: claim candidates, complete each with its result (or give it back).
// Contract: one object per evaluator thread; a claim is completed, given back or dropped by
// the object that made it. A process that dies holding claims loses none: they go to
// another evaluator (shm: reap; Redis: claim after the idle time).
class CandidateSource {
 public:
  virtual ~CandidateSource() = default;
  // Up to max claims appended to out, waiting up to timeout for the first. Claims that do
  // not resolve (the group gone, already scored) are settled inside with a log line naming
  // `who` and counted in unresolved_gone() / unresolved_scored(); they are not returned.
  virtual std::size_t claim(std::vector<Claim>& out, std::size_t max, Timeout timeout) = 0;
  // Stores r as the result of c and acknowledges c (the result first: a kill in between
  // scores it twice, never zero times). Verified kernels go to the kernel database by
  // kernel_entry_of. Throws kf::Error when it could not be stored; then call drop(c).
  virtual Completion complete(const Claim& c, const Result& r) = 0;
  virtual void give_back(const Claim& c) = 0;  // unscored, to another evaluator
  virtual void drop(const Claim& c) = 0;       // counted lost (the caller logged why)
  // Keeps claims being verified for a long time from looking abandoned. Any thread.
  virtual void keep_alive(const std::vector<Claim>& held) { (void)held; }
  virtual uint64_t unresolved_gone() const { return 0; }
  virtual uint64_t unresolved_scored() const { return 0; }
  virtual std::string where() const = 0;  // for log lines: "candidate queue of run R", "redis at H:P"
};

// The kernel-database rule, once: the entry a verified result adds, or none. A degenerate
// task's speedup measures nothing, so its correct kernels enter with speedup 1.0.
std::optional<KernelEntry> kernel_entry_of(const Candidate& c, const Result& r);

// Actors: publish a group of G candidates, with the results the actor already knows
// (extraction failures it scores itself; index_in_group names the member). The other
// members go to the evaluators. Contract: one object per actor thread.
struct GroupPublish {
  std::vector<Candidate> candidates;  // the group: same group_id, indices 0..G-1
  std::vector<Result> known;          // results known at publish time
  Timeout deadline{};                 // scoring must finish within this
  bool hold = false;                  // the actor reads the results before the learner takes it
};
enum class PublishOutcome { published, full, stopped };
class GroupSink {
 public:
  virtual ~GroupSink() = default;
  // Publishes g. full: no room for `room_wait` (nothing published; the caller counts the
  // drop). stopped: keep_going() turned false while the evaluators' queue was full;
  // the members not handed over are counted lost and in *unqueued. keep_going is called
  // while it waits (heartbeats, other work).
  virtual PublishOutcome publish(const GroupPublish& g, Timeout room_wait, const std::function<bool()>& keep_going,
                                 std::size_t* unqueued = nullptr) = 0;
  // Multi-turn and probes: a held group's state; when ready, *out gets its candidates and
  // results and `release` hands it to the learner. release(): hand over without reading.
  virtual GroupPeek peek(uint64_t group_id, ScoredGroup* out, bool release) = 0;
  virtual bool release(uint64_t group_id) = 0;
  virtual std::string where() const = 0;
};

// The learner: ready groups (all scored, or past their deadline), this rank's share.
struct TakeRequest {
  int64_t step = 0;  // the optimizer step being built
  int rank = 0, world = 1;
  int64_t groups = 0;   // this rank's share
  int64_t version = 0;  // the learner's current policy version
  int64_t max_lag = 0;  // older groups are dropped (counted) before they reach the learner
};
class ReadyGroups {
 public:
  virtual ~ReadyGroups() = default;
  virtual std::vector<ScoredGroup> take(const TakeRequest& r) = 0;
  virtual uint64_t dropped_stale() const { return 0; }
};

class RunShm;
// The shared-memory implementations (this node's run). Callers use the interfaces.
std::unique_ptr<CandidateSource> shm_candidates(RunShm& shm, const std::string& who);
std::unique_ptr<GroupSink> shm_groups(RunShm& shm, const std::string& who);
std::unique_ptr<ReadyGroups> shm_ready_groups(ReplayBuffer& replay, std::chrono::milliseconds wait);

// --- RunShm: all shared-memory segments of one run, named "kf.<run>.<part>"
// (ctl, cand, replay, kdb, snap). A candidate lives in its replay group; the candidate
// queue ("cand") carries handles of candidates (CandidateQueue), and evaluators write
// results into the groups (ReplayBuffer::add_result): no queue carries a payload. The launcher creates them; workers
// attach by run name. Parts share one random incarnation id, so a worker never mixes a stale segment with a fresh one.
//
// Stale runs: create() finds an existing run of the same name stale if its creator
// is dead (pid + start time), or if neither the creator (heartbeat()) nor any process
// registered in the control block has beaten within stale_after (a hung run), or if
// it is half made. It then removes and replaces every part (logged). A live run makes
// create() throw. So a launcher must call heartbeat() more often than stale_after.
// Concurrent creators are serialised by an flock on /dev/shm/kf.<run>.lock.
//
// Clean shutdown: the creator's shutdown() (also run by its destructor) sets the run
// state to stopped and unlinks every part; attached processes keep their mappings
// until they exit.
//
// Contract: create/attach/shutdown from one thread; the parts' own contracts apply
// to their use.

struct RunShmConfig {
  // Candidate handles; claims: an evaluator that dies holding one puts it back (3 tries).
  // create() sizes the slots to one handle (kCandidateRefBytes), whatever slot_bytes says.
  QueueConfig candidates{1024, kCandidateRefBytes, std::chrono::milliseconds(100), 20, 3};
  ReplayConfig replay{};
  KernelDbConfig kernels{};
  SnapshotConfig snapshot{};
  std::chrono::milliseconds stale_after{30000};
};

// From the run's config (replay.* keys); throws kf::Error naming the file and key for
// an out-of-range value.
RunShmConfig run_shm_config(const Config& cfg);

// What salvage_or_count found in a run's old shared memory.
struct Salvage {
  bool found = false;              // old segments existed (and their creator is dead)
  QueueLedger ledger;              // the old candidate ledger, with the salvaged ones counted lost
  std::vector<uint64_t> lost_ids;  // candidates still queued or claimed there
};

// Before RunShm::create() of a run whose launcher died: if the run's old shared memory
// still exists and is stale, every candidate still queued or claimed by an evaluator in
// it is counted lost (reason launcher_died): one log line per candidate naming it, and a
// JSON line per candidate appended to <run_dir>/metrics/lost_candidates.jsonl. Their
// groups died with the old replay, so they are not re-queued. The returned ledger (old
// counts + these losses, adding up: created = scored + lost) is what the launcher adds
// to its saved totals. A live run throws kf::Error; no old memory: found = false. Does
// not remove anything (create() replaces the stale parts).
Salvage salvage_or_count(const std::string& run, const std::string& run_dir);

class RunShm {
 public:
  static std::string segment_name(const std::string& run, const char* part);  // "kf.<run>.<part>"
  static std::unique_ptr<RunShm> create(const std::string& run, const RunShmConfig& cfg = {});
  static std::unique_ptr<RunShm> attach(const std::string& run, Timeout wait_ready = std::chrono::seconds(10));
  static SegmentState probe(const std::string& run, std::chrono::milliseconds stale_after = {});
  static void remove(const std::string& run);  // unlinks every part (whoever created them)
  ~RunShm();

  ControlBlock& control() { return *control_; }
  CandidateQueue& candidates() { return *candidates_; }
  ReplayBuffer& replay() { return *replay_; }
  KernelDb& kernels() { return *kernels_; }
  SnapshotStore& snapshots() { return *snapshots_; }
  const std::string& run() const { return run_; }
  bool is_creator() const { return creator_; }

  // Every candidate that entered the candidate queue, exactly: created = scored +
  // lost (by reason) + queued + in flight (claimed by an evaluator). See QueueLedger.
  QueueLedger candidate_ledger() const { return candidates_->raw().ledger(); }

  void heartbeat();  // creator: keeps the run from looking stale
  void shutdown();   // creator: state stopped + unlink all parts (idempotent)

  // Checkpoint into a run directory: <dir>/checkpoints/replay.bin and
  // <dir>/kernels/kernel_db.json, each written atomically. load() reads whichever
  // exist (returns how many files were loaded).
  void save(const std::string& run_dir) const;
  int load(const std::string& run_dir);

 private:
  RunShm() = default;
  std::string run_;
  bool creator_ = false;
  bool shut_ = false;
  std::unique_ptr<ControlBlock> control_;
  std::unique_ptr<ReplayBuffer> replay_;  // before candidates_: the queue resolves in it
  std::unique_ptr<CandidateQueue> candidates_;
  std::unique_ptr<KernelDb> kernels_;
  std::unique_ptr<SnapshotStore> snapshots_;
};

}  // namespace kf::replay
