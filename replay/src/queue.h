// The queues of the run's shared memory, internal to replay/: ShmQueue (a bounded MPMC queue
// of byte records in one segment), RecordQueue<T> (typed records over it) and CandidateQueue
// (the run's candidate queue of CandidateRef handles, resolved in the replay). Other components
// move candidates through the work seam (kf/replay/replay.h: shm_candidates, shm_groups) and
// read the queue's account through RunShm (candidate_ledger, candidate_room, reap); replay/'s
// own code and tests (tests/replay, with replay/src on their include path) use these directly.
// Design and recovery protocol: docs/replay.md "Queues".
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kf/replay/replay.h"
#include "segment.h"

namespace kf::replay {

// The encoding of a CandidateRef (exactly kCandidateRefBytes: tag CREF, version, the fields).
void encode(const CandidateRef& r, unsigned char* dst);
inline std::size_t encoded_size(const CandidateRef&) { return kCandidateRefBytes; }
// Throws kf::Error("<context>: candidate handle: field <f>: ...") on malformed input.
CandidateRef decode_candidate_ref(const unsigned char* src, std::size_t n, const std::string& context = "replay");

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
    uint32_t len = 0;     // reading: record length; writing: set before commit
    uint64_t tag = 0;     // caller's id for the record (e.g. candidate id)
    uint32_t claims = 0;  // take(): takes of this record so far, this one included (> 1: redelivered)
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

}  // namespace kf::replay
