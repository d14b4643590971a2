// RunShm: all shared-memory segments of one run, named "kf.<run>.<part>"
// (ctl, cand, replay, kdb, snap). A candidate lives in its replay group; the candidate
// queue ("cand") carries handles of candidates (CandidateQueue), and evaluators write
// results into the groups (ReplayBuffer::add_result): no queue carries a payload. The launcher creates them; workers attach by
// run name. Parts share one random incarnation id, so a worker never mixes a stale
// segment with a fresh one.
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
#pragma once
#include <memory>
#include <string>

#include "kf/common/config.h"
#include "kf/replay/control.h"
#include "kf/replay/group_replay.h"
#include "kf/replay/kernel_db.h"
#include "kf/replay/queue.h"
#include "kf/replay/snapshot.h"

namespace kf::replay {

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
  std::unique_ptr<ReplayBuffer> replay_;          // before candidates_: the queue resolves in it
  std::unique_ptr<CandidateQueue> candidates_;
  std::unique_ptr<KernelDb> kernels_;
  std::unique_ptr<SnapshotStore> snapshots_;
};

}  // namespace kf::replay
