// kf/replay/replay.h: the run's shared memory on one node and the work seam (docs/replay.md).
// Internals (queues, layouts): replay/src/. Any process may die at any instruction: nothing
// here deadlocks its survivors or corrupts its data.
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

using Timeout = std::chrono::nanoseconds;  // 0: try once

// --- ShmSegment: one named POSIX segment (replay/src/segment.h). Stale: its creator is dead,
// or its heartbeat older than stale_after (> 0). One object per thread.

enum class SegmentState { Absent, Live, Stale };
struct SegmentOptions;  // replay/src/segment.h

class ShmSegment {
 public:
  static SegmentState probe(const std::string& name, std::chrono::milliseconds stale_after = {});
  static bool remove(const std::string& name);
  ShmSegment();
  ~ShmSegment();
  ShmSegment(ShmSegment&&) noexcept;
  ShmSegment& operator=(ShmSegment&&) noexcept;
  const std::string& name() const;
  uint64_t incarnation() const;
  int32_t creator_pid() const;

 private:
  friend struct SegmentAccess;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// --- ControlBlock: run state, processes (heartbeats, counters), rendezvous blobs. Any thread
// of any attached process.

enum class RunState : uint32_t { starting = 0, running = 1, draining = 2, stopped = 3 };
const char* run_state_name(RunState s);

struct PeerInfo {
  int slot = -1;
  int32_t pid = 0;
  std::string role;
  int32_t id = 0;
  int64_t heartbeat_age_ns = 0;
  bool alive = false;  // pid + start time exist
  bool fresh = false;  // alive, heartbeat within the timeout
  std::vector<uint64_t> counters;
};

// Control-block counter ids per role, named once here (8-10: ControlBlock::kWorkMs, ...).
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
  kEvalEnvironment = 5,  // Cause::environment
  kEvalLost = 6,         // group gone, result not stored
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
  kLearnerAbsoluteStep = 11,  // the absolute optimizer step
};
}  // namespace counter

class ControlBlock {
 public:
  static constexpr int kCounters = 12;
  // ms, every role: working, compiling, waiting for the GPU lock
  static constexpr int kWorkMs = 8, kCompileMs = 9, kGpuWaitMs = 10;

  static ControlBlock create(const std::string& name, const SegmentOptions* opt = nullptr);
  static ControlBlock attach(const std::string& name, Timeout wait_ready = std::chrono::seconds(10));

  RunState state() const;
  void set_state(RunState s);
  RunState wait_state_change(RunState from, Timeout timeout) const;

  int register_process(const std::string& role, int32_t id);
  void unregister_process(int slot);
  void heartbeat(int slot);
  void add_counter(int slot, int counter, uint64_t delta);
  std::vector<PeerInfo> peers(Timeout heartbeat_timeout) const;
  int64_t newest_heartbeat_ns() const;
  // Keys <= 31 chars, values <= 256 bytes.
  void rendezvous_put(const std::string& key, const void* data, std::size_t len);
  std::optional<std::string> rendezvous_get(const std::string& key, Timeout timeout) const;

  ShmSegment& segment() { return seg_; }
  struct Header;

 private:
  ControlBlock() = default;
  Header* hdr() const;
  ShmSegment seg_;
};

// --- Records (docs/architecture.md, "Records"). decode_* throw kf::Error naming record and field. Any thread.

struct Candidate {
  uint64_t id = 0;
  std::string task;
  uint64_t group_id = 0;
  uint32_t index_in_group = 0;  // 0..G-1
  int64_t policy_version = 0;   // behaviour policy
  std::vector<int32_t> prompt_tokens;
  std::vector<int32_t> completion_tokens;
  std::vector<float> behaviour_logprobs;  // one per completion token
  std::string source;                     // extracted kernel (empty on error)
  std::string extraction_error;
  int32_t actor_id = 0;
  int64_t t_sampled_ns = 0;  // CLOCK_MONOTONIC
  int64_t t_pushed_ns = 0;
  // Multi-turn (docs/actors.md)
  uint32_t turn = 1;
  uint32_t turns = 1;
  uint64_t parent_group_id = 0;
  uint32_t parent_index = 0;
  bool probe = false;  // never trained on
};

// A candidate-queue handle of a candidate living in its replay group.
struct CandidateRef {
  uint64_t candidate_id = 0;
  uint64_t group_id = 0;
  uint32_t index_in_group = 0;
  int64_t t_pushed_ns = 0;
};
CandidateRef ref_of(const Candidate& c);
constexpr std::size_t kCandidateRefBytes = 4 + 4 + 8 + 8 + 4 + 8;  // encoded

enum class Verdict : uint8_t { compile_error, runtime_error, timeout, incorrect, rejected_cheat, ok };
const char* verdict_name(Verdict v);  // "compile_error", ..., "ok"

// environment: the machine caused the verdict; the learner leaves it out.
enum class Cause : uint8_t { kernel, environment };
const char* cause_name(Cause c);  // "kernel", "environment"

struct Result {
  uint64_t candidate_id = 0;
  uint64_t group_id = 0;  // from the candidate
  uint32_t index_in_group = 0;
  Verdict verdict = Verdict::compile_error;
  Cause cause = Cause::kernel;
  std::string reason;  // never parsed
  double ref_time_median_us = 0, ref_time_spread_us = 0;
  double cand_time_median_us = 0, cand_time_spread_us = 0;
  double speedup = 0;
  double max_error = 0;
  uint32_t checks_passed = 0;
  double reward = 0;
  int32_t evaluator_id = 0;  // < 0: scored by an actor
  int64_t t_scored_ns = 0;
  double speedup_lo = 0, speedup_hi = 0;
  bool timing_unstable = false;  // then speedup = speedup_lo
  bool task_degenerate = false;
  bool exclude_from_training = false;  // the learner drops its group
};

std::size_t encoded_size(const Candidate& c);
std::size_t encoded_size(const Result& r);
void encode(const Candidate& c, unsigned char* dst);  // exactly encoded_size(c) bytes
void encode(const Result& r, unsigned char* dst);
Candidate decode_candidate(const unsigned char* src, std::size_t n, const std::string& context = "replay");
Result decode_result(const unsigned char* src, std::size_t n, const std::string& context = "replay");

// The candidate queue's config and account (docs/replay.md "The ledger").
struct QueueConfig {
  uint32_t capacity = 4096;  // slots
  uint32_t slot_bytes = 4096;
  std::chrono::milliseconds reap_after{100};
  uint32_t spin_us = 20;
  uint32_t max_claims = 0;  // takes before a dead consumer's claim counts lost
};

struct QueueLedger {
  uint64_t created = 0, scored = 0, requeued = 0;
  uint64_t lost_producer = 0, lost_consumer = 0, dropped = 0, corrupt = 0, lost_run_died = 0;
  uint64_t queued = 0, in_flight = 0;
  uint64_t lost() const { return lost_producer + lost_consumer + dropped + corrupt + lost_run_died; }
  bool balanced() const { return created == scored + lost() + queued + in_flight; }
};

// --- ReplayBuffer: groups of G <= 64 candidates and their results. Ready: all G scored or lost,
// or past the deadline (held: once released). Any thread of any attached process.

struct ReplayConfig {
  uint32_t capacity = 256;  // groups
  uint32_t group_bytes = 1u << 20;
  uint32_t result_bytes = 2048;  // the reason is cut to fit
};

struct ScoredGroup {
  uint64_t group_id = 0;
  std::string task;
  int64_t policy_version = 0;
  std::vector<int32_t> prompt_tokens;
  std::vector<Candidate> candidates;  // prompt_tokens empty: the group's
  std::vector<Result> results;
  std::vector<uint8_t> missing;  // 1: no result (deadline or lost)
  bool deadline_hit = false;
};

bool excluded_from_training(const ScoredGroup& g);
bool is_probe(const ScoredGroup& g);

enum class GroupPeek { absent, pending, ready };

struct ResultNote {
  uint64_t candidate_id = 0;
  Verdict verdict = Verdict::compile_error;
  Cause cause = Cause::kernel;
  bool joined = false;
  int32_t evaluator_id = 0;
  double speedup = 0, reward = 0;
};

struct ReplayStats {
  uint64_t opened = 0, taken = 0, open_now = 0, ready_now = 0;
  uint64_t results_joined = 0, results_orphan = 0, results_duplicate = 0;
  uint64_t dropped_stale = 0, evicted = 0, dropped_full = 0;
  uint64_t lost_filling = 0, lost_taking = 0, candidates_lost = 0, recoveries = 0;
  uint64_t refs_unresolved = 0;
};

class ReplayBuffer {
 public:
  static ReplayBuffer create(const std::string& name, const ReplayConfig& cfg, const SegmentOptions* opt = nullptr);
  static ReplayBuffer attach(const std::string& name, Timeout wait_ready = std::chrono::seconds(10));

  // False: no slot for `timeout` (counted). kf::Error for a malformed group.
  bool open_group(const std::vector<Candidate>& candidates, Timeout deadline, Timeout timeout = Timeout(0),
                  bool hold = false);
  GroupPeek peek_group(uint64_t group_id, ScoredGroup* out, bool release);
  bool release_group(uint64_t group_id);
  // False: no such group (orphan) or a result is in (*duplicate); counted.
  bool add_result(const Result& r, bool* duplicate = nullptr);
  // False: no open group holds it (counted). *scored: its result is in.
  bool read_candidate(const CandidateRef& ref, Candidate& out, bool* scored = nullptr) const;
  std::size_t mark_lost(const std::vector<uint64_t>& candidate_ids);
  // Drops (counts) groups lagging over max_lag first.
  std::size_t take_ready(std::vector<ScoredGroup>& out, std::size_t max, int64_t current_version, int64_t max_lag,
                         Timeout timeout);

  // Since *cursor (advanced); overwritten unread ones counted in *missed.
  std::vector<ResultNote> recent_results(uint64_t* cursor, uint64_t* missed = nullptr) const;
  static constexpr uint32_t kResultNotes = 4096;

  std::size_t reap();  // groups held by dead processes
  ReplayStats stats() const;

  // load() validates the whole file first (kf::Error names file and field).
  void save(const std::string& path) const;
  std::size_t load(const std::string& path);

  const ShmSegment& segment() const { return seg_; }
  struct Header;

 private:
  ReplayBuffer() = default;
  Header* hdr() const;
  ShmSegment seg_;
};

// --- KernelDb: verified kernels per task, deduplicated, bounded. Any thread of any process.

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
  static KernelDb create(const std::string& name, const KernelDbConfig& cfg, const SegmentOptions* opt = nullptr);
  static KernelDb attach(const std::string& name, Timeout wait_ready = std::chrono::seconds(10));

  InsertOutcome insert(const KernelEntry& e);
  std::optional<KernelEntry> best(const std::string& task) const;
  // One per speedup bucket of k, ascending (CUDA-L1).
  std::vector<KernelEntry> exemplars(const std::string& task, std::size_t k, uint64_t seed) const;
  std::vector<KernelEntry> entries(const std::string& task) const;  // ascending speedup
  std::vector<std::string> tasks() const;
  KernelDbStats stats() const;

  std::size_t seed_from_dir(const std::string& dir);  // <dir>/<task>/<name>.{cu,cpp,c}
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

// --- SnapshotStore: policy weight blobs; readers never see a torn one. One publisher at a
// time, any number of readers.

struct SnapshotConfig {
  uint64_t max_bytes = 64ull << 20;
  bool prefault = false;
};

struct SnapshotInfo {
  int64_t version = -1;  // -1: nothing published yet
  uint64_t bytes = 0;
};

class SnapshotStore {
 public:
  using CopyFn = std::function<void(void* dst, const void* src, std::size_t n)>;

  static SnapshotStore create(const std::string& name, const SnapshotConfig& cfg, const SegmentOptions* opt = nullptr);
  static SnapshotStore attach(const std::string& name, Timeout wait_ready = std::chrono::seconds(10),
                              bool prefault = false);

  void publish(int64_t version, const void* data, std::size_t bytes, int threads = 1);
  SnapshotInfo latest() const;
  // kf::Error if no consistent copy came in time.
  SnapshotInfo read(std::vector<unsigned char>& out, int threads = 1, Timeout timeout = std::chrono::seconds(30)) const;
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

void parallel_copy(void* dst, const void* src, std::size_t n, int threads);

// --- The work seam (docs/replay.md): how work moves: shm_* here, Redis in netqueue/, picked
// by kf::transport::open_*.

// `ticket`: the transport's handle, read only by its source.
struct Claim {
  Candidate candidate;
  uint64_t ticket = 0;
  std::string entry;        // stream entry id (network)
  uint32_t deliveries = 1;  // > 1: taken over from a dead or stalled evaluator
};

struct Completion {
  bool first = true;   // false: another evaluator's result counts (a late duplicate)
  bool joined = true;  // false: its group is gone or it was scored already
  bool kernel_inserted = false;
};

// Evaluators: one object per thread, which completes, gives back or drops its claims. A
// process that dies holding claims loses none.
class CandidateSource {
 public:
  virtual ~CandidateSource() = default;
  // Unresolved claims (group gone, scored) are settled and logged inside, counted below.
  virtual std::size_t claim(std::vector<Claim>& out, std::size_t max, Timeout timeout) = 0;
  // Stores r, enters its kernel (kernel_entry_of), then acknowledges c: a kill in between
  // scores it twice, never zero times. kf::Error: r was not stored; drop(c).
  virtual Completion complete(const Claim& c, const Result& r) = 0;
  virtual void give_back(const Claim& c) = 0;                              // unscored, to another evaluator
  virtual void drop(const Claim& c) = 0;                                   // counted lost (the caller logs why)
  virtual void keep_alive(const std::vector<Claim>& held) { (void)held; }  // any thread
  virtual uint64_t unresolved_gone() const { return 0; }
  virtual uint64_t unresolved_scored() const { return 0; }
  virtual std::string where() const = 0;  // "candidate queue of run R", "redis at H:P"
};

// ok results only; a degenerate task's kernels enter at speedup 1.0.
std::optional<KernelEntry> kernel_entry_of(const Candidate& c, const Result& r);

// Actors: one object per thread. `known`: results the actor scored (not queued).
struct GroupPublish {
  std::vector<Candidate> candidates;  // one group_id, indices 0..G-1
  std::vector<Result> known;
  Timeout deadline{};
  bool hold = false;  // the actor reads the results before the learner takes it
};
enum class PublishOutcome { published, full, stopped };
struct CandidateRoom {  // of the candidate queue
  uint64_t free_slots = 0, capacity = 0;
};

class GroupSink {
 public:
  virtual ~GroupSink() = default;
  // full: no room for room_wait. stopped: keep_going() (called while the queue is full)
  // turned false; the members not queued count lost and in *unqueued. kf::Error: malformed.
  virtual PublishOutcome publish(const GroupPublish& g, Timeout room_wait, const std::function<bool()>& keep_going,
                                 std::size_t* unqueued = nullptr) = 0;
  virtual GroupPeek peek(uint64_t group_id, ScoredGroup* out, bool release) = 0;
  virtual bool release(uint64_t group_id) = 0;
  // Room where publish() puts candidates, so an actor waits before it samples, not after.
  virtual CandidateRoom room() = 0;
  virtual std::string where() const = 0;
};

// The learner: this rank's share of the ready groups.
struct TakeRequest {
  int64_t step = 0;
  int rank = 0, world = 1;
  int64_t groups = 0;
  int64_t version = 0;
  int64_t max_lag = 0;
};
class ReadyGroups {
 public:
  virtual ~ReadyGroups() = default;
  virtual std::vector<ScoredGroup> take(const TakeRequest& r) = 0;
  virtual uint64_t dropped_stale() const { return 0; }
};

class RunShm;
// This node's run; `who` names the process in log lines.
std::unique_ptr<CandidateSource> shm_candidates(RunShm& shm, const std::string& who);
std::unique_ptr<GroupSink> shm_groups(RunShm& shm, const std::string& who);
std::unique_ptr<ReadyGroups> shm_ready_groups(ReplayBuffer& replay, std::chrono::milliseconds wait);

// --- RunShm: the segments of one run. The launcher create()s (a stale run is replaced, a live
// one throws; heartbeat() more often than stale_after) and shutdown()s them; workers attach().
// create/attach/shutdown from one thread.

struct RunShmConfig {
  QueueConfig candidates{1024, kCandidateRefBytes, std::chrono::milliseconds(100), 20, 3};
  ReplayConfig replay{};
  KernelDbConfig kernels{};
  SnapshotConfig snapshot{};
  std::chrono::milliseconds stale_after{30000};
};

RunShmConfig run_shm_config(const Config& cfg);

struct Salvage {
  bool found = false;  // stale old segments existed
  QueueLedger ledger;  // salvaged ones counted lost
  std::vector<uint64_t> lost_ids;
};

// A dead launcher's run: its queued and claimed candidates count lost (logged). Live: kf::Error.
Salvage salvage_or_count(const std::string& run, const std::string& run_dir);

class CandidateQueue;  // replay/src/queue.h

class RunShm {
 public:
  static std::string segment_name(const std::string& run, const char* part);  // "kf.<run>.<part>"
  static std::unique_ptr<RunShm> create(const std::string& run, const RunShmConfig& cfg = {});
  static std::unique_ptr<RunShm> attach(const std::string& run, Timeout wait_ready = std::chrono::seconds(10));
  static SegmentState probe(const std::string& run, std::chrono::milliseconds stale_after = {});
  static void remove(const std::string& run);
  ~RunShm();

  ControlBlock& control();
  CandidateQueue& candidates();  // replay/ only
  ReplayBuffer& replay();
  KernelDb& kernels();
  SnapshotStore& snapshots();
  const std::string& run() const;
  bool is_creator() const;

  QueueLedger candidate_ledger() const;  // created = scored + lost() + queued + in_flight
  CandidateRoom candidate_room() const;
  // After a worker died: its claims go back (or count lost), its groups in flight are freed.
  std::size_t reap();

  void heartbeat();  // creator
  void shutdown();   // creator: state stopped, parts unlinked (idempotent)

  // <run_dir>/checkpoints/replay.bin, kernels/kernel_db.json.
  void save(const std::string& run_dir) const;
  int load(const std::string& run_dir);

 private:
  RunShm();
  struct Parts;
  std::unique_ptr<Parts> p_;
};

}  // namespace kf::replay
