// The learner's ReadyGroups on the network (stream_ready_groups, kf/netqueue/netqueue.h).
//   rank 0 (on the head, with the head's run): each take drains kf:groups into the head's
//     replay (open_group, the known results), then kf:results (add_result; a verified kernel
//     into the head's KernelDb by kernel_entry_of), acknowledging each entry after it is
//     stored, then takes ready groups; it serves the ranks on learners nodes through
//     GroupRelay and publishes the kernel DB and the newest snapshot for actor nodes.
//   other head ranks: ready groups from the head's replay (rank 0 fills it).
//   ranks on learners nodes (no shared memory): their share from rank 0 through GroupRelay.
// Results are routed by candidate id through the group records rank 0 opened, so a result
// whose own routing fields are empty (a candidate that did not decode) still finds its group.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <nlohmann/json.hpp>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "kf/common/error.h"
#include "kf/common/log.h"
#include "records.h"
#include "relay.h"
#include "work.h"

namespace kf::netqueue {
namespace {

using namespace std::chrono_literals;
using detail::Clock;

// A rank on another node waits this long for rank 0's reply (rank 0 may be checkpointing,
// or waiting for ready groups for every remote rank in turn), and rank 0 as long for a
// remote rank's request; the steps are in lockstep anyway (each ends in an all-reduce).
constexpr Millis kRelayWait{1800 * 1000};
// A group opened on the head gets at least this much of its deadline: it may have waited in
// kf:groups past it, and its results already in kf:results must join before any rank can
// take it.
constexpr Millis kMinOpenDeadline{5000};
// Most routes (members awaiting a result) and opened group ids remembered.
constexpr std::size_t kMaxRoutes = 1u << 20, kMaxSeenGroups = 1u << 16;

int64_t parse_version(const std::string& s) {
  try {
    return std::stoll(s);
  } catch (const std::exception&) {
    return -1;
  }
}

// Milliseconds of a stream entry id "<ms>-<seq>" (the server's wall clock at XADD).
int64_t entry_ms(const std::string& id) {
  try {
    return std::stoll(id.substr(0, id.find('-')));
  } catch (const std::exception&) {
    return 0;
  }
}

GroupRequest request_of(const replay::TakeRequest& r) {
  GroupRequest q;
  q.step = r.step;
  q.groups = r.groups;
  q.version = r.version;
  q.max_lag = r.max_lag;
  return q;
}

// Rank 0 on the head.
class HeadGather : public replay::ReadyGroups {
 public:
  HeadGather(const detail::NetSettings& s, replay::RunShm& shm, int world, int remote_from, Millis wait)
      : s_(s),
        shm_(shm),
        world_(world),
        remote_from_(remote_from),
        wait_(wait),
        where_("redis at " + s.server.host + ":" + std::to_string(s.server.port)),
        consumer_(s.node + ":learner-0:" + std::to_string(::getpid())),
        counts_(s.server, "learner rank 0") {
    log_info("learner rank 0: gathers ", kGroupsStream, " and ", kResultsStream, " from ", where_,
             " into the head's replay (run ", shm_.run(), ")",
             remote_from_ < world_
                 ? "; serves the groups of ranks " + std::to_string(remote_from_) + ".." + std::to_string(world_ - 1)
                 : std::string());
  }
  ~HeadGather() override {
    count_dead();
    counts_.flush(true);
  }

  std::vector<replay::ScoredGroup> take(const replay::TakeRequest& r) override {
    auto own = gather(r.groups, r.version, r.max_lag);
    for (int rank = remote_from_; rank < r.world; ++rank) {
      if (!relay_) relay_ = std::make_unique<GroupRelay>(s_.server, s_.run);
      const auto q = relay_->next_request(rank, kRelayWait);
      if (q.step != r.step)
        throw Error(relay_->where() + ": rank " + std::to_string(rank) + " asks for step " + std::to_string(q.step) +
                    " while rank 0 is at step " + std::to_string(r.step) + " (the ranks are out of step)");
      relay_->reply(rank, q.step, gather(q.groups, q.version, q.max_lag));
    }
    count_dead();
    counts_.flush();
    return own;
  }

  uint64_t dropped_stale() const override { return shm_.replay().stats().dropped_stale; }

 private:
  // Drains the network into the replay until ready groups are there or wait_ has passed.
  std::vector<replay::ScoredGroup> gather(int64_t groups, int64_t version, int64_t max_lag) {
    std::vector<replay::ScoredGroup> out;
    const auto until = Clock::now() + wait_;
    for (;;) {
      drain();
      publish_for_actor_nodes();
      if (groups <= 0) break;
      const auto left = std::chrono::duration_cast<Millis>(until - Clock::now());
      shm_.replay().take_ready(out, static_cast<std::size_t>(groups), version, max_lag,
                               std::clamp(left, Millis(0), Millis(100)));
      if (!out.empty() || Clock::now() >= until) break;
    }
    return out;
  }

  void connect() {
    if (!groups_)
      groups_ = std::make_unique<StreamQueue>(
          StreamQueue::open(detail::stream_config(s_, kGroupsStream, kHeadGroup, consumer_)));
    if (!results_)
      results_ = std::make_unique<StreamQueue>(
          StreamQueue::open(detail::stream_config(s_, kResultsStream, kHeadGroup, consumer_)));
    if (!store_) store_ = std::make_unique<KeyStore>(KeyStore::open(s_.server));
  }
  void reset() {
    count_dead();
    groups_.reset();
    results_.reset();
    store_.reset();
    dead_groups_ = dead_results_ = 0;
  }
  void count_dead() {
    if (groups_) counts_.add_dead(*groups_, &dead_groups_);
    if (results_) counts_.add_dead(*results_, &dead_results_);
  }
  void failed(const char* what, const std::exception& e) {
    if (!failing_)
      log_warn("learner rank 0: ", what, " failed: ", message_of(e),
               "; retried at the next take (the head's replay still serves what it holds)");
    failing_ = true;
    reset();
  }

  void drain() {
    try {
      connect();
      const auto until = Clock::now() + 2s;  // a take is not held up for long by a flood
      drain_groups(until);
      drain_results(until);
      if (failing_) log_info("learner rank 0: ", where_, " answers again");
      failing_ = false;
    } catch (const std::exception& e) {
      failed("draining the network into the head's replay", e);
    }
  }

  void drain_groups(Clock::time_point until) {
    for (;;) {
      const auto msgs = groups_->take(64, Millis(0));
      if (msgs.empty()) return;
      std::vector<std::string> ids;
      for (const auto& m : msgs) {
        open_group(m);
        ids.push_back(m.id);
      }
      groups_->ack(ids);  // after each group is in the replay
      if (Clock::now() >= until) return;
    }
  }

  void open_group(const Message& m) {
    detail::PublishedGroup pg;
    try {
      pg = detail::decode_published(m.data, where_ + " stream " + kGroupsStream + " entry " + m.id);
    } catch (const std::exception& e) {
      counts_.add("undecodable", 1);
      log_error("learner rank 0: ", message_of(e),
                "; the group record is dropped (the results of its candidates will be orphans)");
      return;
    }
    auto& rb = shm_.replay();
    const std::string task = pg.candidates.front().task;
    if (seen_set_.count(pg.group_id) || rb.peek_group(pg.group_id, nullptr, false) != replay::GroupPeek::absent) {
      counts_.add("groups_duplicate", 1);
      log_warn("learner rank 0: group ", pg.group_id, " of ", task,
               " came a second time (redelivered); dropped, counted duplicate");
      return;
    }
    // Its deadline counts from the publish: the entry id holds the server's clock then,
    // and the server runs on this node.
    const int64_t now_ms =
        std::chrono::duration_cast<Millis>(std::chrono::system_clock::now().time_since_epoch()).count();
    const int64_t waited = std::max<int64_t>(0, now_ms - entry_ms(m.id));
    const Millis left = std::max(Millis(pg.deadline_ms - waited), kMinOpenDeadline);
    bool opened = false;
    try {
      opened = rb.open_group(pg.candidates, left, 1s, pg.hold);
    } catch (const std::exception& e) {
      log_error("learner rank 0: group ", pg.group_id, " of ", task, " not opened (", message_of(e), ")");
    }
    if (!opened) {
      counts_.add("groups_dropped", 1);
      log_warn("learner rank 0: group ", pg.group_id, " of ", task,
               " not opened in the head's replay (it stayed full for 1 s, or the group is malformed); dropped, the "
               "results of its candidates will be orphans");
      return;
    }
    counts_.add("groups_opened", 1);
    remember_group(pg.group_id);
    std::vector<bool> known(pg.candidates.size(), false);
    for (auto r : pg.known) {
      known[r.index_in_group] = true;
      r.group_id = pg.group_id;
      r.candidate_id = pg.candidates[r.index_in_group].id;
      join(r, &pg.candidates[r.index_in_group]);
    }
    for (std::size_t i = 0; i < pg.candidates.size(); ++i)
      if (!known[i]) add_route(pg.candidates[i].id, pg.group_id, static_cast<uint32_t>(i));
  }

  void drain_results(Clock::time_point until) {
    for (;;) {
      const auto msgs = results_->take(256, Millis(0));
      if (msgs.empty()) return;
      // Every result read here went in after its candidate, whose group record went in
      // before it: one more pass over kf:groups finds any group still on its way.
      for (const auto& m : msgs)
        if (!routes_.count(m.tag)) {
          drain_groups(Clock::now() + 2s);
          break;
        }
      std::vector<std::string> ids;
      for (const auto& m : msgs) {
        join_message(m);
        ids.push_back(m.id);
      }
      results_->ack(ids);  // after each result is in its group (or counted)
      if (Clock::now() >= until) return;
    }
  }

  void join_message(const Message& m) {
    if (m.data == detail::kLostMember) {  // never handed to the evaluators: its group need not wait
      const std::size_t marked = shm_.replay().mark_lost({m.tag});
      routes_.erase(m.tag);
      if (marked > 0)
        counts_.add("members_lost", 1);
      else  // its actor counted it lost already (unqueued)
        log_info("learner rank 0: candidate ", m.tag,
                 " was marked lost by its actor, but no open group holds it unscored (gone, or taken at its "
                 "deadline); nothing to mark");
      return;
    }
    replay::Result r;
    try {
      r = replay::decode_result(reinterpret_cast<const unsigned char*>(m.data.data()), m.data.size(),
                                where_ + " stream " + kResultsStream + " entry " + m.id);
    } catch (const std::exception& e) {
      counts_.add("undecodable", 1);
      log_error("learner rank 0: result of candidate ", m.tag, ": ", message_of(e),
                "; scored runtime_error (environment) so that its group completes");
      r = replay::Result{};
      r.verdict = replay::Verdict::runtime_error;
      r.cause = replay::Cause::environment;
      r.reason = "the result did not decode";
    }
    r.candidate_id = m.tag;
    // Routing comes from the group record the head opened, not from the network.
    const auto it = routes_.find(m.tag);
    if (it != routes_.end()) {
      r.group_id = it->second.group;
      r.index_in_group = it->second.index;
    }
    join(r, nullptr);
  }

  // Into the group's empty slot (then kernel_entry_of -> the head's KernelDb), or counted.
  void join(const replay::Result& r, const replay::Candidate* known_candidate) {
    auto& rb = shm_.replay();
    replay::CandidateRef ref;
    ref.candidate_id = r.candidate_id;
    ref.group_id = r.group_id;
    ref.index_in_group = r.index_in_group;
    replay::Candidate c;
    bool scored = false;
    const bool resolved = known_candidate ? true : rb.read_candidate(ref, c, &scored);
    if (known_candidate) c = *known_candidate;
    // add_result also when unresolved: the replay counts (and notes) the orphan itself.
    const bool joined = rb.add_result(r);
    if (joined) {
      counts_.add("results_joined", 1);
      routes_.erase(r.candidate_id);
      try {
        if (const auto e = replay::kernel_entry_of(c, r))
          if (shm_.kernels().insert(*e) == replay::InsertOutcome::inserted) counts_.add("kernels_inserted", 1);
      } catch (const std::exception& e) {
        log_error("learner rank 0: the kernel of candidate ", r.candidate_id, " did not enter the kernel database (",
                  message_of(e), "); its result counts");
      }
    } else if (resolved && scored) {
      counts_.add("results_duplicate", 1);
      log_warn("learner rank 0: a second result for candidate ", r.candidate_id, " (group ", r.group_id,
               "); dropped, counted duplicate");
    } else {
      counts_.add("results_orphan", 1);
      routes_.erase(r.candidate_id);
      if (++orphans_ <= 10 || orphans_ % 100 == 0)
        log_warn("learner rank 0: the result of candidate ", r.candidate_id, " (group ", r.group_id,
                 ") has no open group in the head's replay (evicted, taken at its deadline, or never opened); "
                 "dropped, counted orphan (",
                 orphans_, " so far)");
    }
  }

  struct Route {
    uint64_t group = 0;
    uint32_t index = 0;
  };
  void add_route(uint64_t candidate, uint64_t group, uint32_t index) {
    routes_[candidate] = Route{group, index};
    route_order_.push_back(candidate);
    while (route_order_.size() > kMaxRoutes) {  // members that never got a result
      routes_.erase(route_order_.front());
      route_order_.pop_front();
    }
  }
  void remember_group(uint64_t id) {
    seen_set_.insert(id);
    seen_order_.push_back(id);
    while (seen_order_.size() > kMaxSeenGroups) {
      seen_set_.erase(seen_order_.front());
      seen_order_.pop_front();
    }
  }

  // The newest snapshot and the kernel DB for actor nodes, once one announced itself.
  void publish_for_actor_nodes() {
    if (!store_) return;  // drain() connects; it failed this round
    try {
      const auto now = Clock::now();
      if (!nodes_seen_) {
        if (now < next_nodes_) return;
        next_nodes_ = now + 1s;
        const auto v = store_->get(kActorNodesKey);
        if (!v) return;
        nodes_seen_ = true;
        next_weights_ = next_kernels_ = now;
        if (const auto w = store_->get(kWeightsVersionKey)) weights_published_ = parse_version(*w);
        log_info("learner rank 0: actor node ", *v,
                 " connected; the head now publishes weights and kernels for actor nodes to ", where_);
      }
      if (now >= next_weights_) {
        next_weights_ = now + 500ms;
        const auto latest = shm_.snapshots().latest();
        if (latest.version >= 0 && latest.version > weights_published_) {
          std::vector<unsigned char> blob;
          const auto info = shm_.snapshots().read(blob);
          if (info.version >= 0) {
            // The blob first, then its version: a node that sees the version finds that blob (or a newer one).
            store_->set(kWeightsKey, detail::encode_weights(info.version, blob.data(), blob.size()));
            store_->set(kWeightsVersionKey, std::to_string(info.version));
            weights_published_ = info.version;
            log_info("learner rank 0: published policy version ", info.version, " (", blob.size(),
                     " bytes) for actor nodes");
          }
        }
      }
      if (now >= next_kernels_) {
        next_kernels_ = now + 2s;
        auto& db = shm_.kernels();
        const auto st = db.stats();
        const uint64_t mark = st.inserted + st.evicted + st.entries;
        if (mark != kernels_mark_) {
          nlohmann::json arr = nlohmann::json::array();
          for (const auto& task : db.tasks())
            for (const auto& e : db.entries(task))
              arr.push_back({{"task", e.task},
                             {"speedup", e.speedup},
                             {"policy_version", e.policy_version},
                             {"source", e.source}});
          const auto old = store_->get(kKernelsVersionKey);
          const int64_t version = std::max<int64_t>(0, old ? parse_version(*old) : 0) + 1;
          store_->set(kKernelsKey, arr.dump());
          store_->set(kKernelsVersionKey, std::to_string(version));
          kernels_mark_ = mark;
          log_info("learner rank 0: published the kernel database (", arr.size(), " kernel(s), version ", version,
                   ") for actor nodes' exemplars");
        }
      }
    } catch (const std::exception& e) {
      failed("publishing for actor nodes", e);
    }
  }

  detail::NetSettings s_;
  replay::RunShm& shm_;
  int world_, remote_from_;
  Millis wait_;
  std::string where_, consumer_;
  detail::Counts counts_;
  std::unique_ptr<StreamQueue> groups_, results_;
  std::unique_ptr<KeyStore> store_;
  std::unique_ptr<GroupRelay> relay_;
  uint64_t dead_groups_ = 0, dead_results_ = 0, orphans_ = 0;
  bool failing_ = false;
  std::unordered_map<uint64_t, Route> routes_;
  std::deque<uint64_t> route_order_;
  std::unordered_set<uint64_t> seen_set_;
  std::deque<uint64_t> seen_order_;
  bool nodes_seen_ = false;
  Clock::time_point next_nodes_{}, next_weights_{}, next_kernels_{};
  int64_t weights_published_ = -1;
  uint64_t kernels_mark_ = ~0ull;
};

// Head ranks > 0: what rank 0 gathered into the head's replay.
class HeadRank : public replay::ReadyGroups {
 public:
  HeadRank(replay::ReplayBuffer& rb, Millis wait) : rb_(rb), wait_(wait) {}
  std::vector<replay::ScoredGroup> take(const replay::TakeRequest& r) override {
    std::vector<replay::ScoredGroup> out;
    if (r.groups > 0) rb_.take_ready(out, static_cast<std::size_t>(r.groups), r.version, r.max_lag, wait_);
    return out;
  }
  uint64_t dropped_stale() const override { return rb_.stats().dropped_stale; }

 private:
  replay::ReplayBuffer& rb_;
  Millis wait_;
};

// Ranks on learners nodes: one request to rank 0 per take.
class RemoteRank : public replay::ReadyGroups {
 public:
  RemoteRank(const detail::NetSettings& s, int rank) : s_(s) {
    relay_ = std::make_unique<GroupRelay>(s_.server, s_.run);
    log_info("learner rank ", rank, ": takes its groups from rank 0 through ", relay_->where());
  }
  std::vector<replay::ScoredGroup> take(const replay::TakeRequest& r) override {
    return relay_->request(r.rank, request_of(r), kRelayWait);
  }

 private:
  detail::NetSettings s_;
  std::unique_ptr<GroupRelay> relay_;
};

}  // namespace

std::unique_ptr<replay::ReadyGroups> stream_ready_groups(const Config& cfg, replay::RunShm* shm, int rank, int world,
                                                         std::chrono::milliseconds wait) {
  const auto s = detail::net_settings(cfg);
  const int head = static_cast<int>(cfg.get_int("cluster.head_learner_ranks"));
  const int remote_from = head > 0 && head < world ? head : world;
  if (rank < 0 || rank >= world)
    throw Error("learner rank " + std::to_string(rank) + ": not a rank of " + std::to_string(world));
  if (rank == 0) {
    if (!shm)
      throw Error(
          "learner rank 0: gathers the groups into the head's replay, so it runs on the head with the run's shared "
          "memory (none was given)");
    return std::make_unique<HeadGather>(s, *shm, world, remote_from, wait);
  }
  if (shm) return std::make_unique<HeadRank>(shm->replay(), wait);
  return std::make_unique<RemoteRank>(s, rank);
}

}  // namespace kf::netqueue
