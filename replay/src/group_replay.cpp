// ReplayBuffer implementation. Segment layout after the segment header:
//   Header | GroupSlot[capacity] | data[capacity][group_bytes]
// data of one group: G result regions of result_bytes (u32 len + encoded Result),
// then the head blob (u32 tag, prompt tokens, G x encoded Candidate without the prompt when
// it is the group's: a later turn's member keeps its own conversation).
// Slot states: FREE -> FILLING(pid) -> OPEN -> TAKING(pid) -> FREE.
#include "kf/replay/replay.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <thread>

#include "codec.h"
#include "kf/common/error.h"
#include "kf/common/run_dir.h"
#include "segment.h"
#include "shm_util.h"

namespace kf::replay {
using namespace detail;

namespace {
enum GroupState : uint32_t { kFree = 0, kFilling = 1, kOpen = 2, kTaking = 3 };
constexpr uint32_t kMaxG = 64;
constexpr uint32_t kHeadTag = 0x44414548;  // "HEAD"
constexpr uint32_t kFileVersion = 1;
const char kFileMagic[8] = {'K', 'F', 'R', 'E', 'P', 'L', 'A', 'Y'};

struct NoteSlot {
  uint64_t candidate_id;
  double speedup, reward;
  int32_t evaluator_id;
  uint8_t verdict, cause, joined, pad;
};

struct GroupSlot {
  std::atomic<uint64_t> owner;
  uint64_t owner_start;
  uint64_t group_id;
  int64_t policy_version;
  uint64_t open_seq;
  int64_t deadline_ns;
  uint32_t g;
  uint32_t head_len;
  std::atomic<uint64_t> scored_mask;
  std::atomic<uint64_t> lost_mask;
  uint32_t held;  // 1: the actor reads the results first (multi-turn); guarded by mu
  uint32_t pad;
  uint64_t cand_ids[kMaxG];
  char task[128];
};

uint64_t full_mask(uint32_t g) { return g >= 64 ? ~0ull : ((1ull << g) - 1); }
uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
}  // namespace

struct ReplayBuffer::Header {
  uint32_t capacity, group_bytes, result_bytes, pad;
  uint64_t slots_off, data_off;
  alignas(64) pthread_mutex_t mu;
  uint64_t next_seq;  // guarded by mu
  std::atomic<uint64_t> opened, taken, joined, orphan, duplicate, stale, evicted, dropped_full, lost_filling,
      lost_taking, cand_lost, recoveries, unresolved;
  alignas(64) std::atomic<uint32_t> ready_futex;
  // Result notes (guarded by mu): note i lives at notes[i % kResultNotes]; note_seq is the
  // next one's number, advanced after the note is written (a writer killed mid-note
  // leaves it unpublished).
  uint64_t note_seq;
  NoteSlot notes[ReplayBuffer::kResultNotes];

  GroupSlot* slot(uint32_t i) {
    return reinterpret_cast<GroupSlot*>(reinterpret_cast<char*>(this) - kSegmentHeaderBytes + slots_off) + i;
  }
  unsigned char* data(uint32_t i) {
    return reinterpret_cast<unsigned char*>(this) - kSegmentHeaderBytes + data_off +
           static_cast<uint64_t>(i) * group_bytes;
  }
  unsigned char* result_region(uint32_t i, uint32_t k) { return data(i) + static_cast<uint64_t>(k) * result_bytes; }
  unsigned char* head(uint32_t i, uint32_t g) { return data(i) + static_cast<uint64_t>(g) * result_bytes; }
};

// No derived structures to rebuild: groups are found by scanning owner words, and a
// result counts only once its bit is set (after its bytes were written).
#define KF_REPLAY_LOCK(h) RobustLock lock_(&(h)->mu, "replay buffer", nullptr, &(h)->recoveries)

ReplayBuffer::Header* ReplayBuffer::hdr() const { return static_cast<Header*>(segment_body(seg_)); }

static std::size_t segment_bytes(const ReplayConfig& cfg) {
  uint64_t off = align_up(kSegmentHeaderBytes + sizeof(ReplayBuffer::Header), 64);
  off = align_up(off + sizeof(GroupSlot) * cfg.capacity, 4096);
  return off + static_cast<uint64_t>(cfg.group_bytes) * cfg.capacity;
}

ReplayBuffer ReplayBuffer::create(const std::string& name, const ReplayConfig& cfg, const SegmentOptions* opt) {
  if (cfg.capacity == 0 || cfg.result_bytes < 256 || cfg.group_bytes < cfg.result_bytes * 2 + 64)
    throw Error("replay: replay buffer '" + name +
                "': need capacity > 0, result_bytes >= 256, group_bytes > 2*result_bytes");
  ReplayBuffer r;
  r.seg_ = create_segment(name, SegmentKind::Replay, segment_bytes(cfg), opt ? *opt : SegmentOptions{});
  Header* h = new (segment_body(r.seg_)) Header();
  h->capacity = cfg.capacity;
  h->group_bytes = cfg.group_bytes;
  h->result_bytes = cfg.result_bytes;
  uint64_t off = align_up(kSegmentHeaderBytes + sizeof(Header), 64);
  h->slots_off = off;
  h->data_off = align_up(off + sizeof(GroupSlot) * cfg.capacity, 4096);
  robust_mutex_init(&h->mu);
  for (uint32_t i = 0; i < cfg.capacity; ++i) new (h->slot(i)) GroupSlot();
  mark_segment_ready(r.seg_);
  return r;
}

ReplayBuffer ReplayBuffer::attach(const std::string& name, Timeout wait_ready) {
  ReplayBuffer r;
  r.seg_ = attach_segment(name, SegmentKind::Replay, wait_ready);
  Header* h = r.hdr();
  if (segment_bytes(ReplayConfig{h->capacity, h->group_bytes, h->result_bytes}) != segment_size(r.seg_))
    throw Error("replay: replay buffer '" + name + "': field capacity/group_bytes disagree with the segment size");
  return r;
}

namespace {
// Head blob: what the actor contributes (prompt + candidates without the prompt).
std::vector<unsigned char> encode_head(const std::vector<Candidate>& cands) {
  std::vector<Candidate> stripped(cands.size());
  std::size_t n = 4 + 4 + cands[0].prompt_tokens.size() * 4;
  for (std::size_t i = 0; i < cands.size(); ++i) {
    stripped[cands[i].index_in_group] = cands[i];
    if (cands[i].prompt_tokens != cands[0].prompt_tokens) {  // a later turn: its own conversation
      n += 4 + encoded_size(cands[i]);
      continue;
    }
    stripped[cands[i].index_in_group].prompt_tokens.clear();
    n += 4 + encoded_size(cands[i]) - 4 * cands[i].prompt_tokens.size();
  }
  std::vector<unsigned char> out(n);
  ByteWriter w(out.data());
  w.put(kHeadTag);
  w.vec(cands[0].prompt_tokens);
  for (auto& c : stripped) {
    const std::size_t len = encoded_size(c);
    w.put(static_cast<uint32_t>(len));
    encode(c, w.cur());
    w.advance(len);
  }
  return out;
}

void decode_head(const unsigned char* p, std::size_t n, uint32_t g, ScoredGroup& out, const std::string& what) {
  ByteReader r(p, n, what);
  if (r.get<uint32_t>("head.tag") != kHeadTag) r.fail("head.tag", "not a group head");
  out.prompt_tokens = r.vec<int32_t>("head.prompt_tokens");
  out.candidates.clear();
  for (uint32_t i = 0; i < g; ++i) {
    uint32_t len = r.get<uint32_t>("head.candidate_len");
    const unsigned char* c = r.raw(len, "head.candidate");
    out.candidates.push_back(decode_candidate(c, len, what));
  }
}

// Result region bytes: u32 length + encoded result (reason truncated to fit).
Result fit_result(const Result& r, uint32_t region) {
  Result x = r;
  std::size_t n = encoded_size(x) + 4;
  if (n > region) x.reason.resize(x.reason.size() - std::min(x.reason.size(), n - region));
  return x;
}

void validate_group(const std::vector<Candidate>& c) {
  if (c.empty() || c.size() > kMaxG)
    throw Error("replay: open_group: group of " + std::to_string(c.size()) + " candidates (need 1..64)");
  uint64_t seen = 0;
  for (const auto& x : c) {
    if (x.group_id != c[0].group_id || x.task != c[0].task)
      throw Error("replay: open_group " + std::to_string(c[0].group_id) + ": candidate " + std::to_string(x.id) +
                  " has another group id or task");
    if (x.index_in_group >= c.size() || (seen >> x.index_in_group) & 1)
      throw Error("replay: open_group " + std::to_string(c[0].group_id) + ": field index_in_group " +
                  std::to_string(x.index_in_group) + " is out of range or repeated");
    seen |= 1ull << x.index_in_group;
  }
  if (c[0].task.size() >= 128) throw Error("replay: open_group: task name longer than 127 chars: " + c[0].task);
}
}  // namespace

bool ReplayBuffer::open_group(const std::vector<Candidate>& cands, Timeout deadline, Timeout timeout, bool hold) {
  validate_group(cands);
  Header* h = hdr();
  const uint32_t g = static_cast<uint32_t>(cands.size());
  std::vector<unsigned char> head = encode_head(cands);
  const uint64_t head_cap = h->group_bytes - static_cast<uint64_t>(g) * h->result_bytes;
  if (head.size() > head_cap)
    throw Error("replay: open_group " + std::to_string(cands[0].group_id) + ": encoded group is " +
                std::to_string(head.size()) + " bytes, group_bytes leaves " + std::to_string(head_cap));
  int64_t pv = cands[0].policy_version;
  for (auto& c : cands) pv = std::min(pv, c.policy_version);

  const int64_t t_end = now_ns() + timeout.count();
  int64_t idx = -1;
  for (;;) {
    {
      KF_REPLAY_LOCK(h);
      int64_t victim = -1;
      for (uint32_t i = 0; i < h->capacity && idx < 0; ++i) {
        GroupSlot* s = h->slot(i);
        uint32_t st = word_state(s->owner.load(std::memory_order_relaxed));
        if (st == kFree)
          idx = i;
        else if (st == kOpen) {
          if (victim < 0) victim = i;
          GroupSlot* v = h->slot(static_cast<uint32_t>(victim));
          if (s->policy_version < v->policy_version ||
              (s->policy_version == v->policy_version && s->open_seq < v->open_seq))
            victim = i;
        }
      }
      if (idx < 0 && victim >= 0) {
        idx = victim;
        h->evicted.fetch_add(1, std::memory_order_relaxed);
      }
      if (idx >= 0) {
        GroupSlot* s = h->slot(static_cast<uint32_t>(idx));
        s->owner_start = self_start();
        s->owner.store(owner_word(kFilling, self_pid()), std::memory_order_relaxed);
        s->group_id = cands[0].group_id;
        s->policy_version = pv;
        s->g = g;
        s->head_len = static_cast<uint32_t>(head.size());
        s->scored_mask.store(0, std::memory_order_relaxed);
        s->lost_mask.store(0, std::memory_order_relaxed);
        s->held = hold ? 1 : 0;
        for (auto& c : cands) s->cand_ids[c.index_in_group] = c.id;
        std::memset(s->task, 0, sizeof s->task);
        std::memcpy(s->task, cands[0].task.data(), cands[0].task.size());
      }
    }
    if (idx >= 0) break;
    if (now_ns() >= t_end) {
      h->dropped_full.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    reap();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const uint32_t i = static_cast<uint32_t>(idx);
  unsigned char* dst = h->head(i, g);
  std::memcpy(dst, head.data(), head.size() / 2);
  stall_point("replay.fill_mid");
  std::memcpy(dst + head.size() / 2, head.data() + head.size() / 2, head.size() - head.size() / 2);
  {
    KF_REPLAY_LOCK(h);
    GroupSlot* s = h->slot(i);
    s->deadline_ns = now_ns() + deadline.count();
    s->open_seq = h->next_seq++;
    s->owner.store(owner_word(kOpen, 0), std::memory_order_release);
    h->opened.fetch_add(1, std::memory_order_relaxed);
  }
  return true;
}

bool ReplayBuffer::read_candidate(const CandidateRef& ref, Candidate& out, bool* scored) const {
  Header* h = hdr();
  KF_REPLAY_LOCK(h);
  GroupSlot* s = nullptr;
  uint32_t i = 0;
  for (; i < h->capacity; ++i) {
    GroupSlot* c = h->slot(i);
    if (word_state(c->owner.load(std::memory_order_relaxed)) == kOpen && c->group_id == ref.group_id) {
      s = c;
      break;
    }
  }
  if (!s || ref.index_in_group >= s->g || s->cand_ids[ref.index_in_group] != ref.candidate_id) {
    h->unresolved.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  // Head blob: tag, prompt tokens, then G x (u32 length, encoded candidate): skip to ours.
  const std::string what = seg_.name() + ": group " + std::to_string(ref.group_id);
  ByteReader r(h->head(i, s->g), s->head_len, what);
  if (r.get<uint32_t>("head.tag") != kHeadTag) r.fail("head.tag", "not a group head");
  std::vector<int32_t> prompt = r.vec<int32_t>("head.prompt_tokens");
  for (uint32_t k = 0; k < ref.index_in_group; ++k) r.raw(r.get<uint32_t>("head.candidate_len"), "head.candidate");
  const uint32_t len = r.get<uint32_t>("head.candidate_len");
  out = decode_candidate(r.raw(len, "head.candidate"), len, what);
  if (out.id != ref.candidate_id) r.fail("head.candidate", "id " + std::to_string(out.id) + " differs from the slot's");
  if (out.prompt_tokens.empty()) out.prompt_tokens = std::move(prompt);  // else a later turn's own conversation
  out.t_pushed_ns = ref.t_pushed_ns;
  if (scored) *scored = (s->scored_mask.load(std::memory_order_relaxed) >> ref.index_in_group) & 1;
  return true;
}

namespace {
// Under the replay lock.
void note_result(ReplayBuffer::Header* h, const Result& r, bool joined);
}  // namespace

bool ReplayBuffer::add_result(const Result& r, bool* duplicate) {
  if (duplicate) *duplicate = false;
  Header* h = hdr();
  Result x = fit_result(r, h->result_bytes);
  const std::size_t n = encoded_size(x);
  bool complete = false;
  {
    KF_REPLAY_LOCK(h);
    GroupSlot* s = nullptr;
    uint32_t i = 0;
    for (; i < h->capacity; ++i) {
      GroupSlot* c = h->slot(i);
      if (word_state(c->owner.load(std::memory_order_relaxed)) == kOpen && c->group_id == r.group_id) {
        s = c;
        break;
      }
    }
    if (!s || r.index_in_group >= s->g || s->cand_ids[r.index_in_group] != r.candidate_id) {
      h->orphan.fetch_add(1, std::memory_order_relaxed);
      note_result(h, r, false);
      return false;
    }
    const uint64_t bit = 1ull << r.index_in_group;
    if (s->scored_mask.load(std::memory_order_relaxed) & bit) {
      h->duplicate.fetch_add(1, std::memory_order_relaxed);
      if (duplicate) *duplicate = true;
      return false;
    }
    unsigned char* region = h->result_region(i, r.index_in_group);
    uint32_t len32 = static_cast<uint32_t>(n);
    std::memcpy(region, &len32, 4);
    encode(x, region + 4);
    stall_point("replay.result_locked");
    uint64_t m = s->scored_mask.load(std::memory_order_relaxed) | bit;
    s->scored_mask.store(m, std::memory_order_release);
    s->lost_mask.fetch_and(~bit, std::memory_order_relaxed);
    h->joined.fetch_add(1, std::memory_order_relaxed);
    note_result(h, r, true);
    complete = ((m | s->lost_mask.load(std::memory_order_relaxed)) & full_mask(s->g)) == full_mask(s->g);
  }
  if (complete) {
    h->ready_futex.fetch_add(1);
    futex_wake(&h->ready_futex, INT_MAX);
  }
  return true;
}

namespace {
void note_result(ReplayBuffer::Header* h, const Result& r, bool joined) {
  NoteSlot& n = h->notes[h->note_seq % ReplayBuffer::kResultNotes];
  n.candidate_id = r.candidate_id;
  n.speedup = r.speedup;
  n.reward = r.reward;
  n.evaluator_id = r.evaluator_id;
  n.verdict = static_cast<uint8_t>(r.verdict);
  n.cause = static_cast<uint8_t>(r.cause);
  n.joined = joined;
  ++h->note_seq;
}
}  // namespace

std::vector<ResultNote> ReplayBuffer::recent_results(uint64_t* cursor, uint64_t* missed) const {
  Header* h = hdr();
  std::vector<ResultNote> out;
  KF_REPLAY_LOCK(h);
  const uint64_t end = h->note_seq;
  uint64_t from = std::min(*cursor, end);
  if (end - from > kResultNotes) {
    if (missed) *missed += end - from - kResultNotes;
    from = end - kResultNotes;
  }
  out.reserve(end - from);
  for (uint64_t i = from; i < end; ++i) {
    const NoteSlot& n = h->notes[i % kResultNotes];
    ResultNote x;
    x.candidate_id = n.candidate_id;
    x.verdict =
        n.verdict <= static_cast<uint8_t>(Verdict::ok) ? static_cast<Verdict>(n.verdict) : Verdict::runtime_error;
    x.cause = n.cause ? Cause::environment : Cause::kernel;
    x.joined = n.joined;
    x.evaluator_id = n.evaluator_id;
    x.speedup = n.speedup;
    x.reward = n.reward;
    out.push_back(x);
  }
  *cursor = end;
  return out;
}

bool excluded_from_training(const ScoredGroup& g) {
  for (std::size_t i = 0; i < g.results.size(); ++i)
    if (!(i < g.missing.size() && g.missing[i]) && g.results[i].exclude_from_training) return true;
  return false;
}

bool is_probe(const ScoredGroup& g) {
  for (const auto& c : g.candidates)
    if (c.probe) return true;
  return false;
}

std::size_t ReplayBuffer::mark_lost(const std::vector<uint64_t>& ids) {
  Header* h = hdr();
  std::size_t marked = 0;
  bool any_complete = false;
  {
    KF_REPLAY_LOCK(h);
    for (uint32_t i = 0; i < h->capacity; ++i) {
      GroupSlot* s = h->slot(i);
      if (word_state(s->owner.load(std::memory_order_relaxed)) != kOpen) continue;
      for (uint32_t k = 0; k < s->g; ++k) {
        const uint64_t bit = 1ull << k;
        if ((s->scored_mask.load() | s->lost_mask.load()) & bit) continue;
        if (std::find(ids.begin(), ids.end(), s->cand_ids[k]) == ids.end()) continue;
        s->lost_mask.fetch_or(bit);
        ++marked;
        if (((s->scored_mask.load() | s->lost_mask.load()) & full_mask(s->g)) == full_mask(s->g)) any_complete = true;
      }
    }
    h->cand_lost.fetch_add(marked, std::memory_order_relaxed);
  }
  if (any_complete) {
    h->ready_futex.fetch_add(1);
    futex_wake(&h->ready_futex, INT_MAX);
  }
  return marked;
}

namespace {
ScoredGroup read_group(ReplayBuffer::Header* h, uint32_t i, const std::string& what) {
  GroupSlot* s = h->slot(i);
  ScoredGroup g;
  g.group_id = s->group_id;
  g.task.assign(s->task, strnlen(s->task, sizeof s->task));
  g.policy_version = s->policy_version;
  decode_head(h->head(i, s->g), s->head_len, s->g, g, what);
  const uint64_t scored = s->scored_mask.load(std::memory_order_acquire);
  g.results.resize(s->g);
  g.missing.assign(s->g, 1);
  for (uint32_t k = 0; k < s->g; ++k) {
    if (!((scored >> k) & 1)) {
      g.results[k].candidate_id = s->cand_ids[k];
      g.results[k].group_id = s->group_id;
      g.results[k].index_in_group = k;
      continue;
    }
    uint32_t len;
    std::memcpy(&len, h->result_region(i, k), 4);
    if (len + 4 > h->result_bytes) throw Error(what + ": field result_len: " + std::to_string(len) + " too large");
    g.results[k] = decode_result(h->result_region(i, k) + 4, len, what);
    g.missing[k] = 0;
  }
  return g;
}
}  // namespace

std::size_t ReplayBuffer::take_ready(std::vector<ScoredGroup>& out, std::size_t max, int64_t current_version,
                                     int64_t max_lag, Timeout timeout) {
  Header* h = hdr();
  const int64_t t_end = now_ns() + timeout.count();
  int64_t last_reap = now_ns();
  for (;;) {
    uint32_t v = h->ready_futex.load();
    std::vector<std::pair<std::pair<int64_t, uint64_t>, uint32_t>> ready;
    std::vector<uint8_t> hit;
    int64_t next_deadline = INT64_MAX;
    {
      KF_REPLAY_LOCK(h);
      const int64_t now = now_ns();
      for (uint32_t i = 0; i < h->capacity; ++i) {
        GroupSlot* s = h->slot(i);
        if (word_state(s->owner.load(std::memory_order_relaxed)) != kOpen) continue;
        if (current_version - s->policy_version > max_lag) {
          s->owner.store(owner_word(kFree, 0), std::memory_order_relaxed);
          h->stale.fetch_add(1, std::memory_order_relaxed);
          continue;
        }
        const bool full = ((s->scored_mask.load() | s->lost_mask.load()) & full_mask(s->g)) == full_mask(s->g);
        if ((full && !s->held) || now >= s->deadline_ns)
          ready.push_back({{s->policy_version, s->open_seq}, i});
        else
          next_deadline = std::min(next_deadline, s->deadline_ns);
      }
      std::sort(ready.begin(), ready.end());
      if (ready.size() > max) ready.resize(max);
      for (auto& r : ready) {
        GroupSlot* s = h->slot(r.second);
        const bool full = ((s->scored_mask.load() | s->lost_mask.load()) & full_mask(s->g)) == full_mask(s->g);
        hit.push_back(!full);
        s->owner_start = self_start();
        s->owner.store(owner_word(kTaking, self_pid()), std::memory_order_relaxed);
      }
    }
    if (!ready.empty()) {
      std::size_t got = 0;
      for (std::size_t k = 0; k < ready.size(); ++k) {
        try {
          ScoredGroup g = read_group(h, ready[k].second, seg_.name());
          g.deadline_hit = hit[k];
          out.push_back(std::move(g));
          ++got;
        } catch (const Error&) {
          h->orphan.fetch_add(1, std::memory_order_relaxed);  // cannot happen unless memory is corrupted
        }
        stall_point("replay.take_mid");
      }
      {
        KF_REPLAY_LOCK(h);
        for (auto& r : ready) h->slot(r.second)->owner.store(owner_word(kFree, 0), std::memory_order_release);
        h->taken.fetch_add(got, std::memory_order_relaxed);
      }
      return got;
    }
    const int64_t now = now_ns();
    if (now >= t_end) return 0;
    if (now - last_reap > 100'000'000) {
      last_reap = now;
      reap();
    }
    int64_t wait = std::min<int64_t>({t_end - now, 50'000'000, std::max<int64_t>(next_deadline - now, 100'000)});
    futex_wait(&h->ready_futex, v, wait);
  }
}

GroupPeek ReplayBuffer::peek_group(uint64_t group_id, ScoredGroup* out, bool release) {
  Header* h = hdr();
  bool wake = false;
  GroupPeek got = GroupPeek::absent;
  {
    KF_REPLAY_LOCK(h);
    for (uint32_t i = 0; i < h->capacity; ++i) {
      GroupSlot* s = h->slot(i);
      if (word_state(s->owner.load(std::memory_order_relaxed)) != kOpen || s->group_id != group_id) continue;
      const bool full = ((s->scored_mask.load() | s->lost_mask.load()) & full_mask(s->g)) == full_mask(s->g);
      if (!full && now_ns() < s->deadline_ns) return GroupPeek::pending;
      if (out) {
        *out = read_group(h, i, seg_.name());
        out->deadline_hit = !full;
      }
      if (release && s->held) {
        s->held = 0;
        wake = true;
      }
      got = GroupPeek::ready;
      break;
    }
  }
  if (wake) {
    h->ready_futex.fetch_add(1);
    futex_wake(&h->ready_futex, INT_MAX);
  }
  return got;
}

bool ReplayBuffer::release_group(uint64_t group_id) {
  Header* h = hdr();
  {
    KF_REPLAY_LOCK(h);
    uint32_t i = 0;
    for (; i < h->capacity; ++i) {
      GroupSlot* s = h->slot(i);
      if (word_state(s->owner.load(std::memory_order_relaxed)) == kOpen && s->group_id == group_id) break;
    }
    if (i == h->capacity || !h->slot(i)->held) return false;
    h->slot(i)->held = 0;
  }
  h->ready_futex.fetch_add(1);
  futex_wake(&h->ready_futex, INT_MAX);
  return true;
}

std::size_t ReplayBuffer::reap() {
  Header* h = hdr();
  std::vector<uint32_t> suspects;
  for (uint32_t i = 0; i < h->capacity; ++i) {
    GroupSlot* s = h->slot(i);
    uint64_t w = s->owner.load(std::memory_order_relaxed);
    uint32_t st = word_state(w);
    if ((st == kFilling || st == kTaking) && !proc_alive(word_pid(w), s->owner_start)) suspects.push_back(i);
  }
  if (suspects.empty()) return 0;
  std::size_t n = 0;
  KF_REPLAY_LOCK(h);
  for (uint32_t i : suspects) {
    GroupSlot* s = h->slot(i);
    uint64_t w = s->owner.load(std::memory_order_relaxed);
    uint32_t st = word_state(w);
    if ((st != kFilling && st != kTaking) || proc_alive(word_pid(w), s->owner_start)) continue;
    (st == kFilling ? h->lost_filling : h->lost_taking).fetch_add(1, std::memory_order_relaxed);
    s->owner.store(owner_word(kFree, 0), std::memory_order_release);
    ++n;
  }
  return n;
}

ReplayStats ReplayBuffer::stats() const {
  Header* h = hdr();
  ReplayStats s;
  s.opened = h->opened.load();
  s.taken = h->taken.load();
  const int64_t now = now_ns();
  for (uint32_t i = 0; i < h->capacity; ++i) {
    GroupSlot* g = h->slot(i);
    if (word_state(g->owner.load()) != kOpen) continue;
    ++s.open_now;
    bool full = ((g->scored_mask.load() | g->lost_mask.load()) & full_mask(g->g)) == full_mask(g->g);
    if ((full && !g->held) || now >= g->deadline_ns) ++s.ready_now;
  }
  s.results_joined = h->joined.load();
  s.results_orphan = h->orphan.load();
  s.results_duplicate = h->duplicate.load();
  s.dropped_stale = h->stale.load();
  s.evicted = h->evicted.load();
  s.dropped_full = h->dropped_full.load();
  s.lost_filling = h->lost_filling.load();
  s.lost_taking = h->lost_taking.load();
  s.candidates_lost = h->cand_lost.load();
  s.recoveries = h->recoveries.load();
  s.refs_unresolved = h->unresolved.load();
  return s;
}

// --- persistence
// File: magic "KFREPLAY", u32 version, u32 group count, then per group
//   u64 payload length, u64 payload hash, payload:
//   u64 group_id, i64 policy_version, str task, u32 G, u64 scored_mask, u64 lost_mask,
//   i64 deadline_remaining_ns, u64 cand_ids[G], bytes head, G x bytes result (empty if unscored)
void ReplayBuffer::save(const std::string& path) const {
  Header* h = hdr();
  std::string file(kFileMagic, 8);
  auto put = [&file](const void* p, std::size_t n) { file.append(static_cast<const char*>(p), n); };
  uint32_t ver = kFileVersion, count = 0;
  put(&ver, 4);
  const std::size_t count_at = file.size();
  put(&count, 4);
  for (uint32_t i = 0; i < h->capacity; ++i) {
    std::string p;
    {
      KF_REPLAY_LOCK(h);  // one group at a time: never holds the lock for the whole save
      GroupSlot* s = h->slot(i);
      if (word_state(s->owner.load(std::memory_order_relaxed)) != kOpen) continue;
      auto pp = [&p](const void* d, std::size_t n) { p.append(static_cast<const char*>(d), n); };
      auto pb = [&](const void* d, std::size_t n) {
        uint32_t n32 = static_cast<uint32_t>(n);
        pp(&n32, 4);
        pp(d, n);
      };
      uint64_t scored = s->scored_mask.load(), lost = s->lost_mask.load();
      int64_t remaining = std::max<int64_t>(0, s->deadline_ns - now_ns());
      pp(&s->group_id, 8);
      pp(&s->policy_version, 8);
      pb(s->task, strnlen(s->task, sizeof s->task));
      pp(&s->g, 4);
      pp(&scored, 8);
      pp(&lost, 8);
      pp(&remaining, 8);
      pp(s->cand_ids, 8ull * s->g);
      pb(h->head(i, s->g), s->head_len);
      for (uint32_t k = 0; k < s->g; ++k) {
        uint32_t len = 0;
        if ((scored >> k) & 1) std::memcpy(&len, h->result_region(i, k), 4);
        pb(h->result_region(i, k) + 4, std::min<uint32_t>(len, h->result_bytes - 4));
      }
    }
    uint64_t len = p.size(), hash = hash_bytes(p.data(), p.size());
    put(&len, 8);
    put(&hash, 8);
    file += p;
    ++count;
  }
  std::memcpy(&file[count_at], &count, 4);
  write_file_atomic(path, file);
}

namespace {
struct LoadedGroup {
  uint64_t group_id;
  int64_t policy_version;
  std::string task;
  uint32_t g;
  uint64_t scored, lost;
  int64_t remaining;
  std::vector<uint64_t> ids;
  std::string head;
  std::vector<std::string> results;
};
}  // namespace

std::size_t ReplayBuffer::load(const std::string& path) {
  Header* h = hdr();
  const std::string file = read_file(path);
  const auto* base = reinterpret_cast<const unsigned char*>(file.data());
  ByteReader r(base, file.size(), path);
  const unsigned char* magic = r.raw(8, "magic");
  if (std::memcmp(magic, kFileMagic, 8) != 0) r.fail("magic", "not a KernelForge replay file");
  uint32_t ver = r.get<uint32_t>("version");
  if (ver != kFileVersion)
    r.fail("version",
           std::to_string(ver) + " is not supported (this build reads " + std::to_string(kFileVersion) + ")");
  uint32_t count = r.get<uint32_t>("group_count");
  std::vector<LoadedGroup> groups;
  for (uint32_t n = 0; n < count; ++n) {
    const std::string what = path + ": group " + std::to_string(n);
    uint64_t len = r.get<uint64_t>("group.length");
    uint64_t hash = r.get<uint64_t>("group.hash");
    if (len > r.left()) r.fail("group.length", "group " + std::to_string(n) + " runs past the end of the file");
    const unsigned char* p = r.raw(len, "group.payload");
    if (hash_bytes(p, len) != hash) throw Error(what + ": field hash: payload checksum mismatch (corrupt file)");
    ByteReader g(p, len, what);
    LoadedGroup x;
    x.group_id = g.get<uint64_t>("group_id");
    x.policy_version = g.get<int64_t>("policy_version");
    x.task = g.str("task");
    x.g = g.get<uint32_t>("G");
    if (x.g == 0 || x.g > kMaxG) g.fail("G", std::to_string(x.g) + " out of range 1..64");
    if (x.task.size() >= 128) g.fail("task", "longer than 127 chars");
    x.scored = g.get<uint64_t>("scored_mask");
    x.lost = g.get<uint64_t>("lost_mask");
    x.remaining = g.get<int64_t>("deadline_remaining_ns");
    for (uint32_t k = 0; k < x.g; ++k) x.ids.push_back(g.get<uint64_t>("cand_ids"));
    x.head = g.str("head");
    if (x.head.size() > h->group_bytes - static_cast<uint64_t>(x.g) * h->result_bytes)
      g.fail("head", "larger than this buffer's group_bytes allows");
    ScoredGroup check;
    decode_head(reinterpret_cast<const unsigned char*>(x.head.data()), x.head.size(), x.g, check, what);
    for (uint32_t k = 0; k < x.g; ++k) {
      x.results.push_back(g.str("result"));
      if (x.results.back().size() + 4 > h->result_bytes) g.fail("result", "larger than this buffer's result_bytes");
      if ((x.scored >> k) & 1)
        decode_result(reinterpret_cast<const unsigned char*>(x.results.back().data()), x.results.back().size(), what);
    }
    groups.push_back(std::move(x));
  }
  if (r.left() != 0) r.fail("end", std::to_string(r.left()) + " trailing bytes");

  KF_REPLAY_LOCK(h);
  std::vector<uint32_t> free_idx;
  for (uint32_t i = 0; i < h->capacity; ++i)
    if (word_state(h->slot(i)->owner.load(std::memory_order_relaxed)) == kFree) free_idx.push_back(i);
  if (free_idx.size() < groups.size())
    throw Error(path + ": field group_count: " + std::to_string(groups.size()) + " groups but only " +
                std::to_string(free_idx.size()) + " free slots in the replay buffer");
  const int64_t now = now_ns();
  for (std::size_t n = 0; n < groups.size(); ++n) {
    const LoadedGroup& x = groups[n];
    const uint32_t i = free_idx[n];
    GroupSlot* s = h->slot(i);
    s->group_id = x.group_id;
    s->policy_version = x.policy_version;
    s->g = x.g;
    s->head_len = static_cast<uint32_t>(x.head.size());
    s->scored_mask.store(x.scored & full_mask(x.g));
    s->lost_mask.store(x.lost & full_mask(x.g));
    s->held = 0;  // the actor that held it is gone
    s->deadline_ns = now + x.remaining;
    std::memcpy(s->cand_ids, x.ids.data(), 8ull * x.g);
    std::memset(s->task, 0, sizeof s->task);
    std::memcpy(s->task, x.task.data(), x.task.size());
    std::memcpy(h->head(i, x.g), x.head.data(), x.head.size());
    for (uint32_t k = 0; k < x.g; ++k) {
      uint32_t len = static_cast<uint32_t>(x.results[k].size());
      std::memcpy(h->result_region(i, k), &len, 4);
      std::memcpy(h->result_region(i, k) + 4, x.results[k].data(), len);
    }
    s->open_seq = h->next_seq++;
    s->owner.store(owner_word(kOpen, 0), std::memory_order_release);
  }
  return groups.size();
}

}  // namespace kf::replay
