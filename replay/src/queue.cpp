// ShmQueue implementation. Layout of the segment after the segment header:
//   Header | ring[capacity] u32 | free[capacity] u32 | slots[capacity] (64-byte SlotHdr + payload)
// Slot states: FREE -> WRITING(pid) -> QUEUED -> READING(pid) -> FREE, and
// READING(dead pid) -> QUEUED when reap() puts a dead consumer's claim back.
// All state changes happen under the header's robust mutex; the owner word is the
// truth and the ring/free stack are rebuilt from it if a lock owner died.
#include "queue.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <type_traits>
#include <unordered_map>

#include "kf/common/error.h"
#include "kf/common/log.h"
#include "segment.h"
#include "shm_util.h"

namespace kf::replay {
using namespace detail;

namespace {
enum SlotState : uint32_t { kFree = 0, kWriting = 1, kQueued = 2, kReading = 3 };

struct SlotHdr {
  std::atomic<uint64_t> owner;  // owner_word(state, pid)
  uint64_t owner_start;         // owner's start time; written with owner, under the lock
  uint64_t seq;                 // commit order (QUEUED)
  uint64_t tag;
  uint64_t checksum;
  uint32_t len;
  uint32_t claims;  // takes so far (consumers that claimed this record)
  unsigned char pad2[16];
};
static_assert(sizeof(SlotHdr) == 64, "slot header is one cache line");
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "shared-memory atomics must be lock-free (address-free)");

uint64_t record_checksum(const unsigned char* d, uint32_t len, uint64_t tag) { return hash_bytes(d, len, tag); }
}  // namespace

enum class FreeKind : uint32_t { abandoned, released, dropped, corrupt };
constexpr uint32_t kTransCommit = 1000;

struct ShmQueue::Header {
  uint32_t capacity, slot_bytes, stride, spin_us;
  int64_t reap_after_ns;
  uint32_t max_claims, pad_;
  uint64_t ring_off, free_off, slots_off;
  alignas(64) pthread_mutex_t mu;
  // Guarded by mu (atomic only so stats() may read them without the lock).
  std::atomic<uint32_t> ring_head, ring_count, free_top;
  std::atomic<uint64_t> next_seq, pushed, popped;
  std::atomic<uint64_t> lost_producer, lost_consumer, lost_count;
  // Redo journal for reaping one slot: the lost accounting must be exact even if the
  // reaper itself dies half-way (the next locker restores the counters and redoes it).
  uint32_t j_slot;
  uint32_t j_kind;
  uint64_t j_lost_count, j_lost_producer, j_lost_consumer;
  uint64_t j_requeued, j_seq;  // kind kRequeue: the counter before, and the seq given
  std::atomic<uint32_t> j_active;
  // Redo journal of one slot's commit or free, so that pushed/popped/dropped/corrupt stay
  // exact (the ledger) when a process dies inside commit() or release().
  uint32_t t_slot, t_kind;  // t_kind: kTransCommit or a FreeKind + 1
  uint64_t t_before, t_seq;
  std::atomic<uint32_t> t_active;
  alignas(64) std::atomic<uint32_t> items_futex;
  std::atomic<uint32_t> consumer_waiters;
  alignas(64) std::atomic<uint32_t> space_futex;
  std::atomic<uint32_t> producer_waiters;
  alignas(64) std::atomic<uint64_t> queued_hint;
  std::atomic<uint64_t> dropped_full, dropped_too_large, dropped_abandoned, corrupt, recoveries;
  std::atomic<uint64_t> requeued, dropped_by_consumer;  // guarded by mu
  uint64_t lost_log[kLostLog];

  uint32_t* ring() {
    return reinterpret_cast<uint32_t*>(reinterpret_cast<char*>(this) - kSegmentHeaderBytes + ring_off);
  }
  uint32_t* free_stack() {
    return reinterpret_cast<uint32_t*>(reinterpret_cast<char*>(this) - kSegmentHeaderBytes + free_off);
  }
  SlotHdr* slot(uint32_t i) {
    return reinterpret_cast<SlotHdr*>(reinterpret_cast<char*>(this) - kSegmentHeaderBytes + slots_off +
                                      static_cast<uint64_t>(i) * stride);
  }
  unsigned char* payload(uint32_t i) { return reinterpret_cast<unsigned char*>(slot(i)) + sizeof(SlotHdr); }
};

namespace {
constexpr uint32_t kRequeue = 100;

template <typename H>
std::atomic<uint64_t>* free_counter(H* h, FreeKind kind) {
  return kind == FreeKind::released  ? &h->popped
         : kind == FreeKind::dropped ? &h->dropped_by_consumer
         : kind == FreeKind::corrupt ? &h->corrupt
                                     : &h->dropped_abandoned;
}

// Frees one slot and counts it, journaled; caller holds the lock.
template <typename H>
void free_one(H* h, uint32_t idx, FreeKind kind) {
  std::atomic<uint64_t>* c = free_counter(h, kind);
  h->t_slot = idx;
  h->t_kind = static_cast<uint32_t>(kind);
  h->t_before = c->load(std::memory_order_relaxed);
  h->t_active.store(1, std::memory_order_release);
  h->slot(idx)->owner.store(owner_word(kFree, 0), std::memory_order_relaxed);
  const uint32_t top = h->free_top.load(std::memory_order_relaxed);
  h->free_stack()[top] = idx;
  h->free_top.store(top + 1, std::memory_order_relaxed);
  c->store(h->t_before + 1, std::memory_order_relaxed);
  h->t_active.store(0, std::memory_order_release);
}  // journal kind: a dead consumer's claim goes back to the queue

// Appends QUEUED slot idx at the ring's tail with sequence number seq; caller holds the lock.
template <typename H>
void enqueue_slot(H* h, uint32_t idx, uint64_t seq) {
  SlotHdr* s = h->slot(idx);
  s->seq = seq;
  h->next_seq.store(std::max(h->next_seq.load(std::memory_order_relaxed), seq + 1), std::memory_order_relaxed);
  s->owner.store(owner_word(kQueued, 0), std::memory_order_relaxed);
  const uint32_t count = h->ring_count.load(std::memory_order_relaxed);
  h->ring()[(h->ring_head.load(std::memory_order_relaxed) + count) % h->capacity] = idx;
  h->ring_count.store(count + 1, std::memory_order_relaxed);
  h->queued_hint.store(count + 1, std::memory_order_release);
}

// A dead consumer's claim goes back to the queue, journaled like reap_slot; caller holds the lock.
template <typename H>
void requeue_slot(H* h, uint32_t idx) {
  h->j_slot = idx;
  h->j_kind = kRequeue;
  h->j_requeued = h->requeued.load(std::memory_order_relaxed);
  h->j_seq = h->next_seq.load(std::memory_order_relaxed);
  h->j_active.store(1, std::memory_order_release);
  stall_point("queue.requeue_journaled");
  enqueue_slot(h, idx, h->j_seq);
  h->requeued.store(h->j_requeued + 1, std::memory_order_relaxed);
  h->j_active.store(0, std::memory_order_release);
}

// Exact lost accounting for one slot; caller holds the lock.
template <typename H>
void reap_slot(H* h, uint32_t idx) {
  SlotHdr* s = h->slot(idx);
  uint32_t st = word_state(s->owner.load(std::memory_order_relaxed));
  h->j_slot = idx;
  h->j_kind = st;
  h->j_lost_count = h->lost_count.load(std::memory_order_relaxed);
  h->j_lost_producer = h->lost_producer.load(std::memory_order_relaxed);
  h->j_lost_consumer = h->lost_consumer.load(std::memory_order_relaxed);
  h->j_active.store(1, std::memory_order_release);
  stall_point("queue.reap_journaled");
  uint64_t n = h->j_lost_count;
  h->lost_log[n % ShmQueue::kLostLog] = s->tag;
  h->lost_count.store(n + 1, std::memory_order_relaxed);
  if (st == kWriting)
    h->lost_producer.store(h->j_lost_producer + 1, std::memory_order_relaxed);
  else
    h->lost_consumer.store(h->j_lost_consumer + 1, std::memory_order_relaxed);
  s->owner.store(owner_word(kFree, 0), std::memory_order_relaxed);
  h->free_stack()[h->free_top.load(std::memory_order_relaxed)] = idx;
  h->free_top.store(h->free_top.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  h->j_active.store(0, std::memory_order_release);
}

// Rebuilds ring and free stack from the slot owner words (lock owner died). Idempotent.
template <typename H>
void repair(H* h) {
  if (h->t_active.load(std::memory_order_acquire)) {  // redo one commit or free
    SlotHdr* s = h->slot(h->t_slot);
    if (h->t_kind == kTransCommit) {
      s->seq = h->t_seq;
      s->owner.store(owner_word(kQueued, 0), std::memory_order_relaxed);
      h->pushed.store(h->t_before + 1, std::memory_order_relaxed);
    } else {
      s->owner.store(owner_word(kFree, 0), std::memory_order_relaxed);
      free_counter(h, static_cast<FreeKind>(h->t_kind))->store(h->t_before + 1, std::memory_order_relaxed);
    }
    h->t_active.store(0, std::memory_order_release);
  }
  if (h->j_active.load(std::memory_order_acquire) && h->j_kind == kRequeue) {
    // Redo: the slot is QUEUED with its journaled seq (the ring is rebuilt below).
    SlotHdr* s = h->slot(h->j_slot);
    s->seq = h->j_seq;
    s->owner.store(owner_word(kQueued, 0), std::memory_order_relaxed);
    h->requeued.store(h->j_requeued + 1, std::memory_order_relaxed);
    h->next_seq.store(std::max(h->next_seq.load(std::memory_order_relaxed), h->j_seq + 1), std::memory_order_relaxed);
    h->j_active.store(0, std::memory_order_release);
  } else if (h->j_active.load(std::memory_order_acquire)) {
    uint32_t idx = h->j_slot;
    SlotHdr* s = h->slot(idx);
    h->lost_count.store(h->j_lost_count + 1, std::memory_order_relaxed);
    h->lost_log[h->j_lost_count % ShmQueue::kLostLog] = s->tag;
    h->lost_producer.store(h->j_lost_producer + (h->j_kind == kWriting ? 1 : 0), std::memory_order_relaxed);
    h->lost_consumer.store(h->j_lost_consumer + (h->j_kind == kWriting ? 0 : 1), std::memory_order_relaxed);
    s->owner.store(owner_word(kFree, 0), std::memory_order_relaxed);
    h->j_active.store(0, std::memory_order_release);
  }
  std::vector<std::pair<uint64_t, uint32_t>> queued;
  uint32_t nfree = 0;
  uint64_t max_seq = h->next_seq.load(std::memory_order_relaxed);
  for (uint32_t i = 0; i < h->capacity; ++i) {
    SlotHdr* s = h->slot(i);
    uint32_t st = word_state(s->owner.load(std::memory_order_relaxed));
    if (st == kFree)
      h->free_stack()[nfree++] = i;
    else if (st == kQueued) {
      queued.emplace_back(s->seq, i);
      max_seq = std::max(max_seq, s->seq + 1);
    }
  }
  std::sort(queued.begin(), queued.end());
  for (uint32_t k = 0; k < queued.size(); ++k) h->ring()[k] = queued[k].second;
  h->ring_head.store(0, std::memory_order_relaxed);
  h->ring_count.store(static_cast<uint32_t>(queued.size()), std::memory_order_relaxed);
  h->free_top.store(nfree, std::memory_order_relaxed);
  h->next_seq.store(max_seq, std::memory_order_relaxed);
  h->queued_hint.store(queued.size(), std::memory_order_relaxed);
}
}  // namespace

ShmQueue::Header* ShmQueue::hdr() const { return static_cast<Header*>(segment_body(seg_)); }
uint32_t ShmQueue::slot_bytes() const { return hdr()->slot_bytes; }
uint32_t ShmQueue::capacity() const { return hdr()->capacity; }

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

std::size_t ShmQueue::segment_bytes(const QueueConfig& cfg) {
  uint64_t off = kSegmentHeaderBytes + align_up(sizeof(Header), 64);
  off = align_up(off + 4ull * cfg.capacity, 64);
  off = align_up(off + 4ull * cfg.capacity, 64);
  uint64_t stride = align_up(sizeof(SlotHdr) + cfg.slot_bytes, 64);
  return off + stride * cfg.capacity;
}

ShmQueue ShmQueue::create(const std::string& name, const QueueConfig& cfg, const SegmentOptions& opt) {
  if (cfg.capacity == 0 || cfg.slot_bytes == 0)
    throw Error("replay: queue '" + name + "': capacity and slot_bytes must be > 0");
  ShmQueue q;
  q.seg_ = create_segment(name, SegmentKind::Queue, segment_bytes(cfg), opt);
  Header* h = new (segment_body(q.seg_)) Header();
  h->capacity = cfg.capacity;
  h->slot_bytes = cfg.slot_bytes;
  h->stride = static_cast<uint32_t>(align_up(sizeof(SlotHdr) + cfg.slot_bytes, 64));
  h->spin_us = cfg.spin_us;
  h->max_claims = cfg.max_claims;
  h->reap_after_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(cfg.reap_after).count();
  uint64_t off = kSegmentHeaderBytes + align_up(sizeof(Header), 64);
  h->ring_off = off;
  off = align_up(off + 4ull * cfg.capacity, 64);
  h->free_off = off;
  off = align_up(off + 4ull * cfg.capacity, 64);
  h->slots_off = off;
  robust_mutex_init(&h->mu);
  for (uint32_t i = 0; i < cfg.capacity; ++i) {
    new (h->slot(i)) SlotHdr();
    h->free_stack()[i] = cfg.capacity - 1 - i;
  }
  h->free_top.store(cfg.capacity);
  mark_segment_ready(q.seg_);
  return q;
}

ShmQueue ShmQueue::attach(const std::string& name, Timeout wait_ready) {
  ShmQueue q;
  q.seg_ = attach_segment(name, SegmentKind::Queue, wait_ready);
  Header* h = q.hdr();
  if (segment_bytes(QueueConfig{h->capacity, h->slot_bytes}) != segment_size(q.seg_))
    throw Error("replay: queue '" + name + "': field capacity/slot_bytes disagree with the segment size");
  return q;
}

#define KF_QUEUE_LOCK(h) \
  RobustLock lock_(      \
      &(h)->mu, "queue", [h] { repair(h); }, &(h)->recoveries)

std::size_t ShmQueue::acquire(Slot* out, std::size_t n, const uint64_t* tags, Timeout timeout) {
  Header* h = hdr();
  const int64_t start = now_ns(), deadline = start + timeout.count();
  int64_t last_reap = start;
  const pid_t me = self_pid();
  const uint64_t me_start = self_start();
  for (;;) {
    uint32_t v = h->space_futex.load(std::memory_order_acquire);
    std::size_t k = 0;
    {
      KF_QUEUE_LOCK(h);
      uint32_t top = h->free_top.load(std::memory_order_relaxed);
      k = std::min<std::size_t>(n, top);
      for (std::size_t i = 0; i < k; ++i) {
        uint32_t idx = h->free_stack()[--top];
        SlotHdr* s = h->slot(idx);
        s->owner_start = me_start;
        s->tag = tags ? tags[i] : 0;
        s->claims = 0;
        s->owner.store(owner_word(kWriting, me), std::memory_order_relaxed);
        h->free_top.store(top, std::memory_order_relaxed);
        out[i] = Slot{idx, h->payload(idx), 0, s->tag};
      }
      stall_point("queue.acquire_locked");
    }
    if (k > 0) return k;
    int64_t now = now_ns();
    if (now >= deadline) return 0;
    if (now - last_reap >= h->reap_after_ns) {
      last_reap = now;
      if (reap() > 0) continue;
    }
    h->producer_waiters.fetch_add(1);
    futex_wait(&h->space_futex, v, std::min(deadline - now, h->reap_after_ns));
    h->producer_waiters.fetch_sub(1);
  }
}

void ShmQueue::commit(Slot* slots, std::size_t n) {
  if (n == 0) return;
  Header* h = hdr();
  for (std::size_t i = 0; i < n; ++i) {
    SlotHdr* s = h->slot(slots[i].handle);
    s->len = slots[i].len;
    s->checksum = record_checksum(slots[i].data, slots[i].len, s->tag);
  }
  {
    KF_QUEUE_LOCK(h);
    stall_point("queue.commit_locked");
    uint32_t head = h->ring_head.load(std::memory_order_relaxed);
    uint32_t count = h->ring_count.load(std::memory_order_relaxed);
    uint64_t seq = h->next_seq.load(std::memory_order_relaxed);
    for (std::size_t i = 0; i < n; ++i) {
      SlotHdr* s = h->slot(slots[i].handle);
      h->t_slot = slots[i].handle;
      h->t_kind = kTransCommit;
      h->t_before = h->pushed.load(std::memory_order_relaxed);
      h->t_seq = seq;
      h->t_active.store(1, std::memory_order_release);
      s->seq = seq++;
      h->next_seq.store(seq, std::memory_order_relaxed);
      s->owner.store(owner_word(kQueued, 0), std::memory_order_relaxed);
      h->ring()[(head + count) % h->capacity] = slots[i].handle;
      h->ring_count.store(++count, std::memory_order_relaxed);
      h->pushed.store(h->t_before + 1, std::memory_order_relaxed);
      h->t_active.store(0, std::memory_order_release);
    }
    h->queued_hint.store(count, std::memory_order_release);
  }
  h->items_futex.fetch_add(1);
  if (h->consumer_waiters.load() > 0) futex_wake(&h->items_futex, static_cast<int>(std::min<std::size_t>(n, INT_MAX)));
}

static void free_slots(ShmQueue::Header* h, ShmQueue::Slot* slots, std::size_t n, FreeKind kind) {
  if (n == 0) return;
  {
    KF_QUEUE_LOCK(h);
    for (std::size_t i = 0; i < n; ++i) free_one(h, slots[i].handle, kind);
  }
  h->space_futex.fetch_add(1);
  if (h->producer_waiters.load() > 0) futex_wake(&h->space_futex, INT_MAX);
}

void ShmQueue::abandon(Slot* slots, std::size_t n) { free_slots(hdr(), slots, n, FreeKind::abandoned); }
void ShmQueue::release(Slot* slots, std::size_t n) { free_slots(hdr(), slots, n, FreeKind::released); }
void ShmQueue::drop(Slot* slots, std::size_t n) { free_slots(hdr(), slots, n, FreeKind::dropped); }

void ShmQueue::give_back(Slot* slots, std::size_t n) {
  if (n == 0) return;
  Header* h = hdr();
  {
    KF_QUEUE_LOCK(h);
    for (std::size_t i = 0; i < n; ++i) {
      // Journaled as a requeue, so a kill in here leaves the slot queued and counted once.
      SlotHdr* s = h->slot(slots[i].handle);
      s->claims = s->claims > 0 ? s->claims - 1 : 0;  // not a failed claim
      requeue_slot(h, slots[i].handle);
    }
  }
  h->items_futex.fetch_add(1);
  if (h->consumer_waiters.load() > 0) futex_wake(&h->items_futex, static_cast<int>(std::min<std::size_t>(n, INT_MAX)));
}

std::size_t ShmQueue::take(Slot* out, std::size_t max, Timeout timeout) {
  Header* h = hdr();
  const int64_t start = now_ns(), deadline = start + timeout.count();
  int64_t last_reap = start;
  const pid_t me = self_pid();
  const uint64_t me_start = self_start();
  for (;;) {
    uint32_t v = h->items_futex.load(std::memory_order_acquire);
    std::size_t k = 0;
    if (h->queued_hint.load(std::memory_order_acquire) > 0) {
      KF_QUEUE_LOCK(h);
      uint32_t head = h->ring_head.load(std::memory_order_relaxed);
      uint32_t count = h->ring_count.load(std::memory_order_relaxed);
      k = std::min<std::size_t>(max, count);
      for (std::size_t i = 0; i < k; ++i) {
        uint32_t idx = h->ring()[head];
        head = (head + 1) % h->capacity;
        SlotHdr* s = h->slot(idx);
        s->owner_start = me_start;
        s->claims = s->claims + 1;
        s->owner.store(owner_word(kReading, me), std::memory_order_relaxed);
        h->ring_head.store(head, std::memory_order_relaxed);
        h->ring_count.store(--count, std::memory_order_relaxed);
        out[i] = Slot{idx, h->payload(idx), s->len, s->tag, s->claims};
      }
      h->queued_hint.store(count, std::memory_order_relaxed);
    }
    if (k > 0) {
      // Checksums: a record that fails is dropped and counted (defence in depth; the
      // commit protocol already keeps torn records out of the ring).
      std::size_t good = 0;
      for (std::size_t i = 0; i < k; ++i) {
        SlotHdr* s = h->slot(out[i].handle);
        if (out[i].len <= h->slot_bytes && record_checksum(out[i].data, out[i].len, out[i].tag) == s->checksum) {
          out[good++] = out[i];
        } else {
          Slot bad = out[i];
          free_slots(h, &bad, 1, FreeKind::corrupt);
        }
      }
      if (good > 0) return good;
      continue;
    }
    int64_t now = now_ns();
    if (now >= deadline) return 0;
    if (now - last_reap >= h->reap_after_ns) {
      last_reap = now;
      reap();
    }
    // Spin briefly (low latency when producers are active), then sleep on the futex.
    const int64_t spin_end = std::min(deadline, now + static_cast<int64_t>(h->spin_us) * 1000);
    bool got = false;
    while (now_ns() < spin_end) {
      if (h->queued_hint.load(std::memory_order_acquire) > 0) {
        got = true;
        break;
      }
      for (int i = 0; i < 16; ++i) __builtin_ia32_pause();
    }
    if (got) continue;
    now = now_ns();
    if (now >= deadline) continue;
    h->consumer_waiters.fetch_add(1);
    if (h->items_futex.load() == v && h->queued_hint.load() == 0)
      futex_wait(&h->items_futex, v, std::min(deadline - now, h->reap_after_ns));
    h->consumer_waiters.fetch_sub(1);
  }
}

bool ShmQueue::push(const void* data, std::size_t len, uint64_t tag, Timeout timeout) {
  Header* h = hdr();
  if (len > h->slot_bytes) {
    h->dropped_too_large.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  Slot s;
  if (acquire(&s, 1, &tag, timeout) == 0) {
    h->dropped_full.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  const std::size_t half = len / 2;
  std::memcpy(s.data, data, half);
  stall_point("queue.write_mid");  // tests kill the producer here: a half-written slot
  std::memcpy(s.data + half, static_cast<const char*>(data) + half, len - half);
  s.len = static_cast<uint32_t>(len);
  commit(&s, 1);
  return true;
}

std::size_t ShmQueue::push_batch(const std::vector<std::string>& records, const std::vector<uint64_t>& tags,
                                 Timeout timeout) {
  Header* h = hdr();
  const int64_t deadline = now_ns() + timeout.count();
  std::vector<Slot> slots(std::min<std::size_t>(records.size(), 256));
  std::size_t done = 0;
  while (done < records.size()) {
    if (records[done].size() > h->slot_bytes) {
      h->dropped_too_large.fetch_add(1, std::memory_order_relaxed);
      ++done;
      continue;
    }
    std::size_t want = 0;  // a run of records that fit
    while (done + want < records.size() && want < slots.size() && records[done + want].size() <= h->slot_bytes) ++want;
    int64_t left = std::max<int64_t>(0, deadline - now_ns());
    std::size_t k = acquire(slots.data(), want, tags.empty() ? nullptr : tags.data() + done, Timeout(left));
    if (k == 0) {
      h->dropped_full.fetch_add(records.size() - done, std::memory_order_relaxed);
      return done;
    }
    for (std::size_t i = 0; i < k; ++i) {
      const std::string& r = records[done + i];
      std::memcpy(slots[i].data, r.data(), r.size());
      slots[i].len = static_cast<uint32_t>(r.size());
    }
    commit(slots.data(), k);
    done += k;
  }
  return done;
}

std::size_t ShmQueue::pop_batch(std::vector<std::string>& out, std::size_t max, Timeout timeout) {
  std::vector<Slot> slots(std::max<std::size_t>(1, std::min<std::size_t>(max, 1024)));
  std::size_t k = take(slots.data(), slots.size(), timeout);
  for (std::size_t i = 0; i < k; ++i) out.emplace_back(reinterpret_cast<const char*>(slots[i].data), slots[i].len);
  release(slots.data(), k);
  return k;
}

std::size_t ShmQueue::reap() {
  Header* h = hdr();
  // Phase 1, no lock: which owners of in-flight slots are dead? (/proc reads are slow,
  // keep them out of the critical section.) A torn (pid, start) pair read here can
  // only mark a non-existent identity dead; phase 2 matches exact pairs.
  std::vector<std::pair<pid_t, uint64_t>> dead;
  std::unordered_map<uint64_t, bool> seen;
  for (uint32_t i = 0; i < h->capacity; ++i) {
    SlotHdr* s = h->slot(i);
    uint64_t w = s->owner.load(std::memory_order_relaxed);
    uint32_t st = word_state(w);
    if (st != kWriting && st != kReading) continue;
    pid_t pid = word_pid(w);
    uint64_t start = s->owner_start;
    uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(pid)) << 40) ^ start;
    if (seen.count(key)) continue;
    bool alive = proc_alive(pid, start);
    seen[key] = alive;
    if (!alive) dead.emplace_back(pid, start);
  }
  if (dead.empty()) return 0;
  struct Event {
    uint64_t tag;
    pid_t pid;
    uint32_t state, claims;
    bool requeued;
  };
  std::vector<Event> events;
  {
    KF_QUEUE_LOCK(h);
    for (uint32_t i = 0; i < h->capacity; ++i) {
      SlotHdr* s = h->slot(i);
      uint64_t w = s->owner.load(std::memory_order_relaxed);
      uint32_t st = word_state(w);
      if (st != kWriting && st != kReading) continue;
      for (auto& d : dead)
        if (d.first == word_pid(w) && d.second == s->owner_start) {
          const bool back = st == kReading && s->claims < h->max_claims;
          events.push_back({s->tag, d.first, st, s->claims, back});
          if (back)
            requeue_slot(h, i);
          else
            reap_slot(h, i);
          break;
        }
    }
  }
  if (events.empty()) return 0;
  h->space_futex.fetch_add(1);
  futex_wake(&h->space_futex, INT_MAX);
  h->items_futex.fetch_add(1);
  futex_wake(&h->items_futex, INT_MAX);
  const std::string& q = seg_.name();
  for (const auto& e : events) {
    if (e.state == kWriting)
      log_warn("replay: queue ", q, ": record ", e.tag, " was being written by pid ", e.pid,
               ", which died; it never entered the queue and is counted lost (lost_producer)");
    else if (e.requeued)
      log_warn("replay: queue ", q, ": record ", e.tag, " was claimed by pid ", e.pid,
               ", which died before acknowledging it; it goes back to the queue (claim ", e.claims, " of ",
               h->max_claims, ")");
    else
      log_error("replay: queue ", q, ": record ", e.tag, " was claimed by pid ", e.pid, ", which died",
                h->max_claims ? " (claim " + std::to_string(e.claims) + " of " + std::to_string(h->max_claims) +
                                    ", no claims left)"
                              : "",
                "; it is counted lost (lost_consumer) and not retried");
  }
  return events.size();
}

QueueStats ShmQueue::stats() const {
  Header* h = hdr();
  QueueStats s;
  s.pushed = h->pushed.load();
  s.popped = h->popped.load();
  s.queued = h->ring_count.load();
  s.free_slots = h->free_top.load();
  s.dropped_full = h->dropped_full.load();
  s.dropped_too_large = h->dropped_too_large.load();
  s.dropped_abandoned = h->dropped_abandoned.load();
  s.lost_producer = h->lost_producer.load();
  s.lost_consumer = h->lost_consumer.load();
  s.corrupt = h->corrupt.load();
  s.recoveries = h->recoveries.load();
  s.requeued = h->requeued.load();
  s.dropped_by_consumer = h->dropped_by_consumer.load();
  return s;
}

QueueLedger ShmQueue::ledger() const {
  Header* h = hdr();
  QueueLedger l;
  KF_QUEUE_LOCK(h);
  for (uint32_t i = 0; i < h->capacity; ++i)
    if (word_state(h->slot(i)->owner.load(std::memory_order_relaxed)) == kReading) ++l.in_flight;
  l.lost_producer = h->lost_producer.load(std::memory_order_relaxed);
  l.lost_consumer = h->lost_consumer.load(std::memory_order_relaxed);
  l.created = h->pushed.load(std::memory_order_relaxed) + l.lost_producer;
  l.scored = h->popped.load(std::memory_order_relaxed);
  l.requeued = h->requeued.load(std::memory_order_relaxed);
  l.dropped = h->dropped_by_consumer.load(std::memory_order_relaxed);
  l.corrupt = h->corrupt.load(std::memory_order_relaxed);
  l.queued = h->ring_count.load(std::memory_order_relaxed);
  return l;
}

std::vector<std::pair<uint64_t, bool>> ShmQueue::pending_tags() const {
  Header* h = hdr();
  std::vector<std::pair<uint64_t, bool>> out;
  KF_QUEUE_LOCK(h);
  for (uint32_t i = 0; i < h->capacity; ++i) {
    const uint32_t st = word_state(h->slot(i)->owner.load(std::memory_order_relaxed));
    if (st == kQueued || st == kReading) out.emplace_back(h->slot(i)->tag, st == kReading);
  }
  return out;
}

std::vector<uint64_t> ShmQueue::lost_tags(uint64_t* cursor) const {
  Header* h = hdr();
  std::vector<uint64_t> out;
  KF_QUEUE_LOCK(h);
  uint64_t n = h->lost_count.load(std::memory_order_relaxed);
  uint64_t from = std::max<uint64_t>(*cursor, n > kLostLog ? n - kLostLog : 0);
  for (uint64_t i = from; i < n; ++i) out.push_back(h->lost_log[i % kLostLog]);
  *cursor = n;
  return out;
}

// --- typed queues
template <typename T>
bool RecordQueue<T>::push(const T& rec, Timeout timeout) {
  const std::size_t n = encoded_size(rec);
  if (n > q_.slot_bytes()) {
    q_.hdr()->dropped_too_large.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  uint64_t tag = rec.candidate_id;
  ShmQueue::Slot s;
  if (q_.acquire(&s, 1, &tag, timeout) == 0) {
    q_.hdr()->dropped_full.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  encode(rec, s.data);
  s.len = static_cast<uint32_t>(n);
  q_.commit(&s, 1);
  return true;
}

template <typename T>
std::size_t RecordQueue<T>::pop_batch(std::vector<T>& out, std::size_t max, Timeout timeout) {
  std::vector<ShmQueue::Slot> slots(std::max<std::size_t>(1, std::min<std::size_t>(max, 1024)));
  std::size_t k = q_.take(slots.data(), slots.size(), timeout);
  std::size_t got = 0;
  std::vector<ShmQueue::Slot> bad;
  for (std::size_t i = 0; i < k; ++i) {
    try {
      out.push_back(decode(slots[i]));
      slots[got++] = slots[i];
    } catch (const Error&) {
      bad.push_back(slots[i]);  // checksum passed, encoding did not: counted corrupt
    }
  }
  q_.release(slots.data(), got);
  free_slots(q_.hdr(), bad.data(), bad.size(), FreeKind::corrupt);
  return got;
}

template <typename T>
T RecordQueue<T>::decode(const ShmQueue::Slot& s) const {
  static_assert(std::is_same_v<T, CandidateRef>, "RecordQueue: decode() knows candidate handles only");
  return decode_candidate_ref(s.data, s.len, q_.segment().name());
}

template <typename T>
std::size_t RecordQueue<T>::claim(std::vector<T>& out, std::vector<ShmQueue::Slot>& claims, std::size_t max,
                                  Timeout timeout) {
  std::vector<ShmQueue::Slot> slots(std::max<std::size_t>(1, std::min<std::size_t>(max, 1024)));
  const std::size_t k = q_.take(slots.data(), slots.size(), timeout);
  std::size_t got = 0;
  for (std::size_t i = 0; i < k; ++i) {
    try {
      out.push_back(decode(slots[i]));
      claims.push_back(slots[i]);
      ++got;
    } catch (const Error& e) {
      log_error("replay: queue ", q_.segment().name(), ": record ", slots[i].tag, " does not decode (", e.what(),
                "); counted corrupt and freed");
      free_slots(q_.hdr(), &slots[i], 1, FreeKind::corrupt);
    }
  }
  return got;
}

template class RecordQueue<CandidateRef>;

std::size_t CandidateQueue::claim(std::vector<Candidate>& out, std::vector<ShmQueue::Slot>& claims, std::size_t max,
                                  Timeout timeout, const std::string& who, Unresolved* unresolved) {
  if (!replay_) throw Error("replay: candidate queue " + raw().segment().name() + ": no replay buffer to resolve in");
  std::vector<CandidateRef> refs;
  std::vector<ShmQueue::Slot> slots;
  for (;;) {
    refs.clear();
    slots.clear();
    const std::size_t k = RecordQueue::claim(refs, slots, max, timeout);
    if (k == 0) return 0;
    std::size_t got = 0;
    for (std::size_t i = 0; i < k; ++i) {
      const CandidateRef& r = refs[i];
      Candidate c;
      bool scored = false, found = false;
      std::string why = "its group is gone from the replay (evicted, or taken by the learner at its deadline)";
      try {
        found = replay_->read_candidate(r, c, &scored);
      } catch (const Error& e) {
        why = std::string("its group does not decode (") + e.what() + ")";
      }
      if (found && !scored) {
        out.push_back(std::move(c));
        claims.push_back(slots[i]);
        ++got;
      } else if (found) {
        raw().release(&slots[i], 1);
        log_warn(who, ": candidate ", r.candidate_id, " (group ", r.group_id, ", index ", r.index_in_group,
                 ") came back to the candidate queue, but its result is already in its group (its evaluator died "
                 "before acknowledging it); acknowledged now, not scored again");
        if (unresolved) unresolved->scored.push_back(r);
      } else {
        raw().drop(&slots[i], 1);
        log_error(who, ": candidate ", r.candidate_id, " (group ", r.group_id, ", index ", r.index_in_group, "): ", why,
                  "; counted lost (candidate queue: dropped), nothing is scored, going on");
        if (unresolved) unresolved->gone.push_back(r);
      }
    }
    if (got > 0) return got;
    timeout = Timeout(0);  // every handle taken was settled here: look for more without waiting
  }
}

std::size_t CandidateQueue::pop_batch(std::vector<Candidate>& out, std::size_t max, Timeout timeout) {
  std::vector<ShmQueue::Slot> claims;
  const std::size_t n = claim(out, claims, max, timeout, "consumer of " + raw().segment().name());
  raw().release(claims.data(), claims.size());
  return n;
}

}  // namespace kf::replay
