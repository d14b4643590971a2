// The work seam over this node's shared memory (kf/replay/replay.h, "The work seam"):
//   shm_candidates    evaluators claim candidate handles from the run's CandidateQueue, read each
//                     candidate from its replay group, and complete it by writing the result into
//                     the group (then the kernel database, then the acknowledgement)
//   shm_groups        actors open a group in the replay, store the results they know, and queue a
//                     handle per member still to be scored
//   shm_ready_groups  the learner takes ready groups from the replay
// kernel_entry_of is the one kernel-database rule, used here and by the network transport.
#include <algorithm>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "kf/common/error.h"
#include "kf/common/log.h"
#include "queue.h"
#include "shm_util.h"

namespace kf::replay {

std::optional<KernelEntry> kernel_entry_of(const Candidate& c, const Result& r) {
  if (r.verdict != Verdict::ok || c.task.empty() || c.source.empty()) return std::nullopt;
  KernelEntry e;
  e.task = c.task;
  // A degenerate task's speedup measures nothing: its correct kernels never rank as fast.
  e.speedup = r.task_degenerate ? 1.0 : r.speedup;
  e.policy_version = c.policy_version;
  e.source = c.source;
  return e;
}

namespace {

// Claims are ShmQueue slots of this process; a ticket names one in held_, so a claim settled
// twice (a caller's bug) is refused here instead of freeing a slot another claim owns now.
class ShmCandidates final : public CandidateSource {
 public:
  ShmCandidates(RunShm& shm, std::string who) : shm_(shm), queue_(shm.candidates()), who_(std::move(who)) {
    // Claims of evaluators that died go back to the queue now (each logged by the queue).
    const std::size_t reaped = queue_.raw().reap();
    if (reaped)
      log_warn(who_, ": at start-up, reclaimed ", reaped,
               " candidate slot(s) held by dead processes (see the lines above)");
  }

  // Claims still held (the owner unwound past them): unscored, back to the queue now rather
  // than when this process exits.
  ~ShmCandidates() override {
    std::lock_guard<std::mutex> g(mu_);
    if (held_.empty()) return;
    log_warn(who_, ": ", held_.size(), " claimed candidate(s) were neither completed nor given back; ",
             "they go back to the candidate queue unscored");
    for (auto& [ticket, slot] : held_) {
      try {
        queue_.raw().give_back(&slot, 1);
      } catch (const std::exception& e) {
        log_error(who_, ": giving candidate ", slot.tag, " back failed (", e.what(),
                  "); its claim is reaped when this process has exited");
      }
    }
  }

  std::size_t claim(std::vector<Claim>& out, std::size_t max, Timeout timeout) override {
    std::vector<Candidate> cands;
    std::vector<ShmQueue::Slot> slots;
    Unresolved un;
    const std::size_t got = queue_.claim(cands, slots, max, timeout, who_, &un);
    std::lock_guard<std::mutex> g(mu_);
    gone_ += un.gone.size();
    scored_ += un.scored.size();
    for (std::size_t i = 0; i < got; ++i) {
      Claim c;
      c.candidate = std::move(cands[i]);
      c.ticket = ++next_ticket_;
      c.deliveries = std::max<uint32_t>(1, slots[i].claims);
      held_.emplace(c.ticket, slots[i]);
      out.push_back(std::move(c));
    }
    return got;
  }

  Completion complete(const Claim& c, const Result& r) override {
    std::optional<ShmQueue::Slot> slot = find(c);
    Completion done;
    bool duplicate = false;  // else not joined: an orphan, its group gone
    try {
      done.joined = shm_.replay().add_result(r, &duplicate);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw Error(who_ + ": storing the result of candidate " + std::to_string(c.candidate.id) +
                  " in the replay: " + e.what());
    }
    done.first = !duplicate;
    // The result is stored: whatever the kernel database says, the claim is acknowledged below.
    if (auto e = kernel_entry_of(c.candidate, r)) {
      try {
        done.kernel_inserted = shm_.kernels().insert(*e) == InsertOutcome::inserted;
      } catch (const std::exception& ex) {
        log_error(who_, ": the kernel of candidate ", c.candidate.id, " (task ", c.candidate.task,
                  ") did not enter the kernel database (", ex.what(), "); its result is stored, going on");
      }
    }
    if (slot) {
      queue_.raw().release(&*slot, 1);
      forget(c);
    } else {
      log_warn(who_, ": candidate ", c.candidate.id, " completed on a claim this source does not hold (completed, ",
               "given back or dropped before); its result went to the replay (", done.joined ? "joined" : "not joined",
               "), no claim is acknowledged");
    }
    return done;
  }

  void give_back(const Claim& c) override { settle(c, &ShmQueue::give_back, "given back"); }
  void drop(const Claim& c) override { settle(c, &ShmQueue::drop, "dropped"); }

  uint64_t unresolved_gone() const override {
    std::lock_guard<std::mutex> g(mu_);
    return gone_;
  }
  uint64_t unresolved_scored() const override {
    std::lock_guard<std::mutex> g(mu_);
    return scored_;
  }
  std::string where() const override { return "candidate queue of run " + shm_.run(); }

 private:
  std::optional<ShmQueue::Slot> find(const Claim& c) const {
    std::lock_guard<std::mutex> g(mu_);
    auto it = held_.find(c.ticket);
    if (it == held_.end() || it->second.tag != c.candidate.id) return std::nullopt;
    return it->second;
  }
  void forget(const Claim& c) {
    std::lock_guard<std::mutex> g(mu_);
    held_.erase(c.ticket);
  }
  void settle(const Claim& c, void (ShmQueue::*how)(ShmQueue::Slot*, std::size_t), const char* what) {
    std::optional<ShmQueue::Slot> slot = find(c);
    if (!slot) {
      log_warn(who_, ": candidate ", c.candidate.id, " ", what, " on a claim this source does not hold ",
               "(completed, given back or dropped before); nothing changes");
      return;
    }
    (queue_.raw().*how)(&*slot, 1);
    forget(c);
  }

  RunShm& shm_;
  CandidateQueue& queue_;
  const std::string who_;
  mutable std::mutex mu_;  // keep_alive may come from another thread; the rest is the owner's
  std::unordered_map<uint64_t, ShmQueue::Slot> held_;
  uint64_t next_ticket_ = 0;
  uint64_t gone_ = 0, scored_ = 0;
};

class ShmGroups final : public GroupSink {
 public:
  // The actor logs what publish() reports (dropped groups, lost members): no `who` needed here.
  explicit ShmGroups(RunShm& shm) : shm_(shm), queue_(shm.candidates()) {}

  PublishOutcome publish(const GroupPublish& g, Timeout room_wait, const std::function<bool()>& keep_going,
                         std::size_t* unqueued) override {
    if (unqueued) *unqueued = 0;
    // The group is the candidates' one home: it exists before any handle of it is queued.
    if (!shm_.replay().open_group(g.candidates, g.deadline, room_wait, g.hold)) return PublishOutcome::full;
    std::unordered_set<uint64_t> known;
    for (const Result& r : g.known) {
      shm_.replay().add_result(r);
      known.insert(r.candidate_id);
    }
    std::vector<uint64_t> unpushed;
    for (const Candidate& c : g.candidates) {
      if (known.count(c.id)) continue;
      bool ok = false;
      while (unpushed.empty()) {  // once stopped, the rest are not tried
        CandidateRef ref = ref_of(c);
        ref.t_pushed_ns = detail::now_ns();
        ok = queue_.push(ref, std::chrono::milliseconds(100));  // blocks only while the queue is full
        if (ok || !keep_going()) break;
      }
      if (!ok) unpushed.push_back(c.id);
    }
    if (unpushed.empty()) return PublishOutcome::published;
    shm_.replay().mark_lost(unpushed);  // their group need not wait for its deadline
    if (unqueued) *unqueued = unpushed.size();
    return PublishOutcome::stopped;
  }

  GroupPeek peek(uint64_t group_id, ScoredGroup* out, bool release) override {
    return shm_.replay().peek_group(group_id, out, release);
  }
  bool release(uint64_t group_id) override { return shm_.replay().release_group(group_id); }
  CandidateRoom room() override { return shm_.candidate_room(); }
  std::string where() const override { return "replay and candidate queue of run " + shm_.run(); }

 private:
  RunShm& shm_;
  CandidateQueue& queue_;
};

class ShmReadyGroups final : public ReadyGroups {
 public:
  ShmReadyGroups(ReplayBuffer& replay, std::chrono::milliseconds wait) : replay_(replay), wait_(wait) {}

  std::vector<ScoredGroup> take(const TakeRequest& r) override {
    std::vector<ScoredGroup> out;
    if (r.groups <= 0) return out;
    replay_.take_ready(out, static_cast<std::size_t>(r.groups), r.version, r.max_lag, wait_);
    return out;
  }
  uint64_t dropped_stale() const override { return replay_.stats().dropped_stale; }

 private:
  ReplayBuffer& replay_;
  const std::chrono::milliseconds wait_;
};

}  // namespace

std::unique_ptr<CandidateSource> shm_candidates(RunShm& shm, const std::string& who) {
  return std::make_unique<ShmCandidates>(shm, who);
}

std::unique_ptr<GroupSink> shm_groups(RunShm& shm, const std::string& who) {
  (void)who;
  return std::make_unique<ShmGroups>(shm);
}

std::unique_ptr<ReadyGroups> shm_ready_groups(ReplayBuffer& replay, std::chrono::milliseconds wait) {
  return std::make_unique<ShmReadyGroups>(replay, wait);
}

}  // namespace kf::replay
