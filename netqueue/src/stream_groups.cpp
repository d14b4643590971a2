// The actors' GroupSink on the network (stream_groups, kf/netqueue/netqueue.h): the group
// record to kf:groups first, then the members still to be scored to kf:candidates (so an
// evaluator's result never arrives on the head before its group can be opened). On the
// head, peek/release read the head's replay, where the learner's rank 0 opens the group;
// on an actor node the sink also mirrors the head's weights and kernel database into the
// node's own run and announces the node (kf:actor_nodes).
#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "kf/common/error.h"
#include "kf/common/log.h"
#include "records.h"
#include "work.h"

namespace kf::netqueue {
namespace {

using namespace std::chrono_literals;
using detail::Clock;

int64_t parse_version(const std::string& s) {
  try {
    return std::stoll(s);
  } catch (const std::exception&) {
    return -1;
  }
}

class StreamGroups : public replay::GroupSink {
 public:
  StreamGroups(const detail::NetSettings& s, replay::RunShm* shm, std::string who)
      : s_(s),
        who_(std::move(who)),
        node_shm_(shm && s.role == "actors" ? shm : nullptr),
        head_shm_(shm && s.role != "actors" ? shm : nullptr),
        where_("redis at " + s.server.host + ":" + std::to_string(s.server.port)),
        watch_(who_, where_, s.gone_after),
        counts_(s.server, who_) {
    log_info(who_, ": groups to ", where_, " stream ", kGroupsStream, ", their candidates to ", kCandidatesStream,
             " (at most ", s.server.bound, " waiting)",
             node_shm_
                 ? "; the head's weights and kernel database are mirrored into this node's run " + node_shm_->run()
                 : std::string());
  }
  ~StreamGroups() override { counts_.flush(true); }

  replay::PublishOutcome publish(const replay::GroupPublish& g, replay::Timeout room_wait,
                                 const std::function<bool()>& keep_going, std::size_t* unqueued) override {
    if (unqueued) *unqueued = 0;
    if (g.candidates.empty()) throw Error(who_ + ": publish: a group needs at least one candidate");
    const uint64_t gid = g.candidates.front().group_id;
    const auto going = [&] { return !keep_going || keep_going(); };
    tend();
    // Only an actor on the head can read a held group's results (peek): elsewhere nobody
    // would ever release it, and the learner would get it only at its deadline.
    replay::GroupPublish sent_as = g;
    if (!head_shm_) sent_as.hold = false;
    const std::string rec = detail::encode_published(sent_as);
    std::vector<bool> known(g.candidates.size(), false);
    for (const auto& r : g.known)
      if (r.index_in_group < known.size()) known[r.index_in_group] = true;
    std::vector<Outgoing> members;
    for (std::size_t i = 0; i < g.candidates.size(); ++i)
      if (!known[i]) members.push_back({g.candidates[i].id, detail::encode_record(g.candidates[i])});
    const std::size_t total = members.size();
    auto stop = [&](std::size_t left, const char* when) {
      if (unqueued) *unqueued = left;
      counts_.add("unqueued", left);
      counts_.flush();
      log_warn(who_, ": stopped ", when, ": ", left, " of group ", gid, "'s ", g.candidates.size(),
               " candidate(s) were not handed over to the evaluators (counted lost)");
      return replay::PublishOutcome::stopped;
    };
    // Once the group record is in, the members never handed over are marked lost on the
    // head (as ShmGroups marks them in the replay), so their group does not wait for its
    // deadline. Best effort: a server that does not take them leaves the deadline to it.
    auto mark_lost = [&](const std::vector<Outgoing>& left) {
      std::vector<Outgoing> marks;
      for (const auto& m : left) marks.push_back({m.tag, detail::kLostMember});
      std::size_t n = 0;
      try {
        connect();
        n = results_->push_batch(marks, 200ms);
      } catch (const std::exception& e) {
        reset();
        log_warn(who_, ": marking group ", gid, "'s unsent member(s) lost in ", kResultsStream, " failed (",
                 message_of(e), "); the head completes the group at its deadline");
        return;
      }
      if (n < marks.size())
        log_warn(who_, ": ", marks.size() - n, " of group ", gid, "'s unsent member(s) could not be marked lost (",
                 kResultsStream, " full); the head completes the group at its deadline");
    };

    // 1. The group record, waiting up to room_wait for room in kf:groups.
    const Millis wait = std::max(Millis(0), std::chrono::duration_cast<Millis>(room_wait));
    bool in = false;
    for (;;) {
      try {
        connect();
        in = groups_->push(gid, rec, wait);
        watch_.ok();
        break;
      } catch (const std::exception& e) {
        reset();
        watch_.failed(e);  // throws once the head's server has been silent for gone_after
        if (!going()) return stop(total, "while the head's server did not answer");
        std::this_thread::sleep_for(1s);
      }
    }
    if (!in) return replay::PublishOutcome::full;
    counts_.add("groups_published", 1);
    counts_.add("known_results", g.known.size());
    if (g.hold && head_shm_) held_[gid] = Clock::now() + std::chrono::duration_cast<Clock::duration>(g.deadline) + 5s;

    // 2. Its members, while kf:candidates has room (the evaluators' back-pressure).
    while (!members.empty()) {
      try {
        connect();
        const std::size_t n = cands_->push_batch(members, 200ms);
        watch_.ok();
        members.erase(members.begin(), members.begin() + static_cast<long>(n));
      } catch (const std::exception& e) {
        reset();
        watch_.failed(e);  // throws once the head's server has been silent for gone_after
        std::this_thread::sleep_for(1s);
      }
      if (members.empty()) break;
      tend();
      if (!going()) {
        mark_lost(members);
        return stop(members.size(), ("while " + std::string(kCandidatesStream) + " was full").c_str());
      }
    }
    counts_.flush();
    return replay::PublishOutcome::published;
  }

  replay::GroupPeek peek(uint64_t group_id, replay::ScoredGroup* out, bool release) override {
    tend();
    if (!head_shm_) {
      no_head("peek");
      return replay::GroupPeek::absent;
    }
    const auto st = head_shm_->replay().peek_group(group_id, out, release);
    const auto it = held_.find(group_id);
    if (st != replay::GroupPeek::absent) {
      if (it != held_.end()) held_.erase(it);
      return st;
    }
    // Published, and the head's learner has not opened it yet: still on its way.
    if (it != held_.end() && Clock::now() < it->second) return replay::GroupPeek::pending;
    if (it != held_.end()) held_.erase(it);
    return replay::GroupPeek::absent;
  }

  bool release(uint64_t group_id) override {
    tend();
    if (!head_shm_) {
      no_head("release");
      return false;
    }
    if (head_shm_->replay().release_group(group_id)) {
      held_.erase(group_id);
      return true;
    }
    const auto it = held_.find(group_id);
    if (it == held_.end() || Clock::now() >= it->second) return false;
    releases_.insert(group_id);  // released here once the head's learner opens it (tend)
    return true;
  }

  // kf:candidates under cluster.redis.bound, read at most every 100 ms (an actor asks every
  // 20 ms while it waits). An unanswered read says "room": publish() then meets the server
  // and decides (retry, or the run is gone).
  replay::CandidateRoom room() override {
    const auto now = Clock::now();
    if (now < room_read_ + 100ms) return room_;
    room_read_ = now;
    room_.capacity = s_.server.bound;
    try {
      connect();
      const uint64_t unacked = cands_->depth().length;
      room_.free_slots = unacked < room_.capacity ? room_.capacity - unacked : 0;
      watch_.ok();
      room_failing_ = false;
    } catch (const std::exception& e) {
      reset();
      room_.free_slots = room_.capacity;
      if (!room_failing_)
        log_warn(who_, ": reading the room in ", kCandidatesStream, " at ", where_, " failed (", message_of(e),
                 "); sampling goes on, the publish waits for the server");
      room_failing_ = true;
    }
    return room_;
  }

  std::string where() const override { return where_ + " streams " + kGroupsStream + ", " + kCandidatesStream; }

 private:
  void connect() {
    if (!groups_)
      groups_ = std::make_unique<StreamQueue>(StreamQueue::open(detail::stream_config(s_, kGroupsStream, kHeadGroup)));
    if (!cands_) {
      // Counted by the push itself: a publisher killed right after it loses no count.
      StreamConfig c = detail::stream_config(s_, kCandidatesStream, kEvaluatorsGroup);
      c.count_hash = kCountsKey;
      c.push_count_field = "candidates_published";
      cands_ = std::make_unique<StreamQueue>(StreamQueue::open(c));
    }
    if (!results_)
      results_ =
          std::make_unique<StreamQueue>(StreamQueue::open(detail::stream_config(s_, kResultsStream, kHeadGroup)));
  }
  void reset() {
    groups_.reset();
    cands_.reset();
    results_.reset();
  }

  void no_head(const char* what) {
    if (no_head_logged_) return;
    no_head_logged_ = true;
    log_warn(who_, ": ", what,
             " of a held group: multi-turn and probe groups need the head's replay, which this node cannot read; "
             "such groups count as gone here");
  }

  // Between calls: releases waiting for their group to open, forgotten groups, the mirror.
  void tend() {
    const auto now = Clock::now();
    if (head_shm_) {
      for (auto it = releases_.begin(); it != releases_.end();) {
        const auto h = held_.find(*it);
        if (head_shm_->replay().release_group(*it) || h == held_.end() || now >= h->second) {
          if (h != held_.end()) held_.erase(h);
          it = releases_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto it = held_.begin(); it != held_.end();) it = now >= it->second ? held_.erase(it) : std::next(it);
    mirror();
  }

  // Actor node: the head's newest snapshot and kernel database into this node's run.
  void mirror() {
    if (!node_shm_) return;
    const auto now = Clock::now();
    if (now < next_mirror_) return;
    next_mirror_ = now + 1s;
    try {
      if (!store_) {
        store_ = std::make_unique<KeyStore>(KeyStore::open(s_.server));
        store_->set(kActorNodesKey, s_.node);  // the head publishes weights and kernels from now on
      }
      mirror_weights();
      mirror_kernels();
      if (mirror_failing_) log_info(who_, ": ", where_, " answers again; mirroring the head's weights and kernels");
      mirror_failing_ = false;
    } catch (const std::exception& e) {
      if (!mirror_failing_)
        log_warn(who_, ": mirroring the head's weights and kernels failed (", message_of(e),
                 "); the actors keep what they have, retried every 1 s");
      mirror_failing_ = true;
      store_.reset();
    }
  }

  void mirror_weights() {
    const auto v = store_->get(kWeightsVersionKey);
    if (!v) return;
    const int64_t announced = parse_version(*v);
    auto& snaps = node_shm_->snapshots();
    if (announced <= weights_seen_) return;
    if (announced <= snaps.latest().version) {  // another actor of this node copied it
      weights_seen_ = announced;
      return;
    }
    const auto rec = store_->get(kWeightsKey);
    weights_seen_ = announced;
    if (!rec) {
      log_error(who_, ": ", kWeightsVersionKey, " says ", announced, " but ", kWeightsKey,
                " is missing; the actors keep the weights they have");
      return;
    }
    int64_t version = -1;
    std::size_t off = 0, n = 0;
    try {
      detail::decode_weights(*rec, where_ + " key " + kWeightsKey, &version, &off, &n);
    } catch (const std::exception& e) {
      log_error(who_, ": ", message_of(e), "; ignored, the actors keep the weights they have");
      return;
    }
    if (version > snaps.latest().version) {
      snaps.publish(version, rec->data() + off, n);
      log_info(who_, ": policy version ", version, " (", n,
               " bytes) from the head into this node's snapshot store; the actors load it between groups");
    }
    weights_seen_ = std::max(weights_seen_, version);
  }

  void mirror_kernels() {
    const auto v = store_->get(kKernelsVersionKey);
    if (!v || parse_version(*v) <= kernels_seen_) return;
    const auto text = store_->get(kKernelsKey);
    kernels_seen_ = parse_version(*v);
    if (!text) return;
    std::size_t added = 0, total = 0;
    try {
      for (const auto& e : nlohmann::json::parse(*text)) {
        ++total;
        const auto got =
            node_shm_->kernels().insert({e.at("task").get<std::string>(), e.at("speedup").get<double>(),
                                         e.at("policy_version").get<int64_t>(), e.at("source").get<std::string>(), 0});
        if (got == replay::InsertOutcome::inserted) ++added;
      }
    } catch (const std::exception& ex) {
      log_error(who_, ": the head's kernel database in ", where_, " key ", kKernelsKey, " did not read (",
                message_of(ex), "); the actors' exemplars stay as they were");
      return;
    }
    if (added > 0)
      log_info(who_, ": kernel database version ", kernels_seen_, " from the head (", total, " kernel(s), ", added,
               " new here) for the actors' exemplars");
  }

  detail::NetSettings s_;
  std::string who_;
  replay::RunShm* node_shm_;  // an actor node's own run (mirror target)
  replay::RunShm* head_shm_;  // the head's run (peek/release)
  std::string where_;
  detail::Reachability watch_;
  detail::Counts counts_;
  std::unique_ptr<StreamQueue> groups_, cands_, results_;
  replay::CandidateRoom room_;
  Clock::time_point room_read_{};
  bool room_failing_ = false;
  std::unique_ptr<KeyStore> store_;
  // Held groups this sink published, until their deadline (+5 s): peek says pending while the
  // head's learner has not opened them yet.
  std::map<uint64_t, Clock::time_point> held_;
  std::set<uint64_t> releases_;
  bool no_head_logged_ = false;
  Clock::time_point next_mirror_{};
  bool mirror_failing_ = false;
  int64_t weights_seen_ = -1, kernels_seen_ = -1;
};

}  // namespace

std::unique_ptr<replay::GroupSink> stream_groups(const Config& cfg, replay::RunShm* shm, const std::string& who) {
  return std::make_unique<StreamGroups>(detail::net_settings(cfg), shm, who);
}

}  // namespace kf::netqueue
