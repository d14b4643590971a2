// ControlBlock: run state, the process table (heartbeats, counters) and rendezvous slots in one
// segment. Table writes and rendezvous puts take a robust mutex; the rest are lock-free atomics.
#include "kf/replay/replay.h"

#include <climits>
#include <cstring>
#include <thread>

#include "kf/common/error.h"
#include "segment.h"
#include "shm_util.h"

namespace kf::replay {
using namespace detail;

namespace {
constexpr int kMaxProcs = 128;
constexpr int kRendezvous = 8;
constexpr int kRendezvousBytes = 256;

struct ProcEntry {
  std::atomic<uint64_t> owner;  // owner_word(1, pid) when claimed
  uint64_t start;
  char role[24];
  int32_t id;
  uint32_t pad;
  std::atomic<int64_t> heartbeat_ns;
  std::atomic<uint64_t> counters[ControlBlock::kCounters];
};
struct RdvEntry {
  std::atomic<uint64_t> seq;  // seqlock: odd while written
  char key[32];
  uint32_t len;
  unsigned char data[kRendezvousBytes];
};
}  // namespace

struct ControlBlock::Header {
  std::atomic<uint32_t> state;
  std::atomic<uint32_t> state_futex;
  alignas(64) pthread_mutex_t mu;
  std::atomic<uint64_t> recoveries;
  ProcEntry procs[kMaxProcs];
  RdvEntry rdv[kRendezvous];
};

const char* run_state_name(RunState s) {
  switch (s) {
    case RunState::starting:
      return "starting";
    case RunState::running:
      return "running";
    case RunState::draining:
      return "draining";
    case RunState::stopped:
      return "stopped";
  }
  return "unknown";
}

static std::size_t segment_bytes() { return kSegmentHeaderBytes + sizeof(ControlBlock::Header); }
ControlBlock::Header* ControlBlock::hdr() const { return static_cast<Header*>(segment_body(seg_)); }

ControlBlock ControlBlock::create(const std::string& name, const SegmentOptions* opt) {
  ControlBlock c;
  c.seg_ = create_segment(name, SegmentKind::Control, segment_bytes(), opt ? *opt : SegmentOptions{});
  Header* h = new (segment_body(c.seg_)) Header();
  robust_mutex_init(&h->mu);
  mark_segment_ready(c.seg_);
  return c;
}

ControlBlock ControlBlock::attach(const std::string& name, Timeout wait_ready) {
  ControlBlock c;
  c.seg_ = attach_segment(name, SegmentKind::Control, wait_ready);
  if (segment_size(c.seg_) != segment_bytes())
    throw Error("replay: control block '" + name + "': field total_bytes: layout differs from this build");
  return c;
}

RunState ControlBlock::state() const { return static_cast<RunState>(hdr()->state.load(std::memory_order_acquire)); }

void ControlBlock::set_state(RunState s) {
  hdr()->state.store(static_cast<uint32_t>(s), std::memory_order_release);
  hdr()->state_futex.fetch_add(1);
  futex_wake(&hdr()->state_futex, INT_MAX);
}

RunState ControlBlock::wait_state_change(RunState from, Timeout timeout) const {
  const int64_t deadline = now_ns() + timeout.count();
  for (;;) {
    uint32_t v = hdr()->state_futex.load();
    RunState s = state();
    int64_t left = deadline - now_ns();
    if (s != from || left <= 0) return s;
    futex_wait(&hdr()->state_futex, v, left);
  }
}

// Nothing to rebuild: every entry is claimed by one 64-bit store, and half-written
// role text in a claimed entry is rewritten by its next owner.
#define KF_CONTROL_LOCK(h) RobustLock lock_(&(h)->mu, "control block", nullptr, &(h)->recoveries)

int ControlBlock::register_process(const std::string& role, int32_t id) {
  Header* h = hdr();
  KF_CONTROL_LOCK(h);
  int chosen = -1;
  for (int i = 0; i < kMaxProcs && chosen < 0; ++i) {
    uint64_t w = h->procs[i].owner.load();
    if (w == 0 || !proc_alive(word_pid(w), h->procs[i].start)) chosen = i;
  }
  if (chosen < 0) throw Error("replay: control block: all " + std::to_string(kMaxProcs) + " process entries are live");
  ProcEntry& e = h->procs[chosen];
  e.owner.store(0);
  e.start = self_start();
  std::memset(e.role, 0, sizeof e.role);
  std::strncpy(e.role, role.c_str(), sizeof e.role - 1);
  e.id = id;
  for (auto& c : e.counters) c.store(0);
  e.heartbeat_ns.store(now_ns());
  e.owner.store(owner_word(1, self_pid()), std::memory_order_release);
  return chosen;
}

void ControlBlock::unregister_process(int slot) {
  if (slot < 0 || slot >= kMaxProcs) return;
  hdr()->procs[slot].owner.store(0, std::memory_order_release);
}

void ControlBlock::heartbeat(int slot) {
  if (slot < 0 || slot >= kMaxProcs)
    throw Error("replay: control block: heartbeat for bad slot " + std::to_string(slot));
  hdr()->procs[slot].heartbeat_ns.store(now_ns(), std::memory_order_relaxed);
}

void ControlBlock::add_counter(int slot, int counter, uint64_t delta) {
  if (slot < 0 || slot >= kMaxProcs || counter < 0 || counter >= kCounters)
    throw Error("replay: control block: counter " + std::to_string(counter) + " of slot " + std::to_string(slot) +
                " out of range");
  hdr()->procs[slot].counters[counter].fetch_add(delta, std::memory_order_relaxed);
}

std::vector<PeerInfo> ControlBlock::peers(Timeout heartbeat_timeout) const {
  std::vector<PeerInfo> out;
  const int64_t now = now_ns();
  for (int i = 0; i < kMaxProcs; ++i) {
    const ProcEntry& e = hdr()->procs[i];
    uint64_t w = e.owner.load(std::memory_order_acquire);
    if (w == 0) continue;
    PeerInfo p;
    p.slot = i;
    p.pid = word_pid(w);
    p.role.assign(e.role, strnlen(e.role, sizeof e.role));
    p.id = e.id;
    p.heartbeat_age_ns = now - e.heartbeat_ns.load(std::memory_order_relaxed);
    p.alive = proc_alive(p.pid, e.start);
    p.fresh = p.alive && p.heartbeat_age_ns <= heartbeat_timeout.count();
    for (auto& c : e.counters) p.counters.push_back(c.load(std::memory_order_relaxed));
    out.push_back(std::move(p));
  }
  return out;
}

int64_t ControlBlock::newest_heartbeat_ns() const {
  int64_t best = 0;
  for (int i = 0; i < kMaxProcs; ++i) {
    const ProcEntry& e = hdr()->procs[i];
    uint64_t w = e.owner.load(std::memory_order_acquire);
    if (w != 0 && proc_alive(word_pid(w), e.start)) best = std::max(best, e.heartbeat_ns.load());
  }
  return best;
}

void ControlBlock::rendezvous_put(const std::string& key, const void* data, std::size_t len) {
  if (key.empty() || key.size() > 31) throw Error("replay: rendezvous key '" + key + "' must be 1..31 chars");
  if (len > kRendezvousBytes)
    throw Error("replay: rendezvous '" + key + "': " + std::to_string(len) + " bytes > " +
                std::to_string(kRendezvousBytes));
  Header* h = hdr();
  KF_CONTROL_LOCK(h);
  RdvEntry* slot = nullptr;
  for (auto& r : h->rdv)
    if (std::strncmp(r.key, key.c_str(), sizeof r.key) == 0) slot = &r;
  for (auto& r : h->rdv)
    if (!slot && r.key[0] == 0) slot = &r;
  if (!slot) throw Error("replay: rendezvous: all " + std::to_string(kRendezvous) + " keys in use");
  // Seqlock write; a writer that died mid-write left seq odd: make it odd again.
  uint64_t s = slot->seq.load();
  uint64_t odd = (s % 2 == 0) ? s + 1 : s + 2;
  slot->seq.store(odd, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  std::memcpy(slot->data, data, len);
  slot->len = static_cast<uint32_t>(len);
  std::strncpy(slot->key, key.c_str(), sizeof slot->key - 1);
  slot->seq.store(odd + 1, std::memory_order_release);
}

std::optional<std::string> ControlBlock::rendezvous_get(const std::string& key, Timeout timeout) const {
  const int64_t deadline = now_ns() + timeout.count();
  for (;;) {
    for (const auto& r : hdr()->rdv) {
      uint64_t s1 = r.seq.load(std::memory_order_acquire);
      if (s1 == 0 || s1 % 2) continue;
      char k[32];
      std::memcpy(k, r.key, sizeof k);
      k[31] = 0;
      uint32_t len = std::min<uint32_t>(r.len, kRendezvousBytes);
      std::string out(reinterpret_cast<const char*>(r.data), len);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (r.seq.load(std::memory_order_relaxed) != s1) continue;
      if (key == k) return out;
    }
    if (now_ns() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace kf::replay
