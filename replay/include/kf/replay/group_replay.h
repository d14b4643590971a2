// ReplayBuffer: scored groups waiting for the learner.
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
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kf/replay/queue.h"
#include "kf/replay/records.h"
#include "kf/replay/segment.h"

namespace kf::replay {

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

}  // namespace kf::replay
