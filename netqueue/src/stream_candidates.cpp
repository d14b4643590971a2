// The evaluators' CandidateSource on the network (stream_candidates, kf/netqueue/netqueue.h):
// a consumer of kf:candidates; complete() puts the result into kf:results and acknowledges
// the entry in one atomic step (ack_forward), so of two evaluators that scored the same
// claimed entry exactly one result goes in. No shared memory: evaluator nodes have none.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <mutex>
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

std::string consumer_name(const std::string& node, const std::string& who) {
  std::string w = who;
  for (char& c : w)
    if (std::isspace(static_cast<unsigned char>(c))) c = '-';
  return node + ":" + w + ":" + std::to_string(::getpid());
}

class StreamCandidates : public replay::CandidateSource {
 public:
  StreamCandidates(const detail::NetSettings& s, std::string who)
      : s_(s),
        who_(std::move(who)),
        sc_(detail::stream_config(s, kCandidatesStream, kEvaluatorsGroup, consumer_name(s.node, who_))),
        where_("redis at " + sc_.host + ":" + std::to_string(sc_.port)),
        watch_(who_, where_, s.gone_after),
        counts_(s.server, who_) {
    // Counted by the forward itself: an evaluator killed right after it loses no count.
    sc_.count_hash = kCountsKey;
    sc_.forward_count_field = "results_sent";
    log_info(who_, ": candidates from ", where_, " stream ", kCandidatesStream, " (consumer ", sc_.consumer,
             "), results to ", kResultsStream);
  }
  ~StreamCandidates() override {
    count_dead();
    counts_.flush(true);
  }

  std::size_t claim(std::vector<replay::Claim>& out, std::size_t max, replay::Timeout timeout) override {
    std::vector<Message> msgs;
    try {
      open();
      msgs = q_->take(1, std::max(Millis(0), std::chrono::duration_cast<Millis>(timeout)));
      if (!msgs.empty() && max > 1) {
        // More only from a backlog, and only this evaluator's share of it: a candidate held in
        // one evaluator's batch is one another node's idle evaluator cannot score.
        const StreamDepth d = q_->depth();
        const uint64_t waiting = d.length > d.pending ? d.length - d.pending : 0;
        if (waiting > 0) {
          const std::size_t more = std::min<uint64_t>(max - 1, waiting / live_evaluators());
          if (more > 0)
            for (auto& m : q_->take(more, Millis(0))) msgs.push_back(std::move(m));
        }
      }
      watch_.ok();
    } catch (const std::exception& e) {
      reset();
      watch_.failed(e);  // throws once the server has been silent for gone_after
      std::this_thread::sleep_for(1s);
      return 0;
    }
    std::size_t n = 0;
    for (auto& m : msgs) {
      // Its own claim, idle past claim_idle without keep_alive, comes back to this consumer:
      // it is in hand here already.
      if (held_.count(m.id)) continue;
      if (m.deliveries > 1) {
        counts_.add("claimed_again", 1);
        log_warn(who_, ": candidate ", m.tag, " (entry ", m.id,
                 ") was claimed from a dead or stalled evaluator (delivery ", m.deliveries, "); scoring it here");
      }
      replay::Claim c;
      try {
        c.candidate = replay::decode_candidate(reinterpret_cast<const unsigned char*>(m.data.data()), m.data.size(),
                                               where_ + " stream " + kCandidatesStream + " entry " + m.id);
        if (c.candidate.id != m.tag)
          throw Error(where_ + " stream " + kCandidatesStream + " entry " + m.id + ": the record is candidate " +
                      std::to_string(c.candidate.id) + " but its tag says " + std::to_string(m.tag));
      } catch (const std::exception& e) {
        settle_undecodable(m, message_of(e));
        continue;
      }
      c.ticket = m.tag;
      c.entry = m.id;
      held_.insert(m.id);
      c.deliveries = m.deliveries;
      out.push_back(std::move(c));
      ++n;
    }
    count_dead();
    counts_.flush();
    return n;
  }

  replay::Completion complete(const replay::Claim& c, const replay::Result& r) override {
    if (c.entry.empty())
      throw Error(who_ + ": complete: candidate " + std::to_string(c.candidate.id) + " was not claimed from " +
                  where());
    const std::string bytes = detail::encode_record(r);
    // The result and the acknowledgement go in one step; on an error it is retried until the
    // server is gone (the entry stays pending meanwhile, so nothing is lost either way).
    for (const auto since = Clock::now();;) {
      try {
        open();
        std::vector<bool> first;
        q_->ack_forward({c.entry}, {{c.candidate.id, bytes}}, kResultsStream, &first);
        watch_.ok();
        held_.erase(c.entry);
        replay::Completion done;
        done.first = !first.empty() && first[0];
        done.joined = done.first;  // the head joins it (or counts it orphan) when it drains kf:results
        if (!done.first) {         // results_sent is counted by the forward itself
          counts_.add("results_late", 1);
          log_warn(who_, ": candidate ", c.candidate.id,
                   " was claimed by another evaluator meanwhile; its result from here is dropped (the other one "
                   "counts)");
        }
        count_dead();
        counts_.flush();
        return done;
      } catch (const std::exception& e) {
        reset();
        const auto quiet = Clock::now() - since;
        if (quiet > s_.gone_after)
          throw Error(who_ + ": the result of candidate " + std::to_string(c.candidate.id) +
                      " could not be stored: " + message_of(e) + "; " + where_ + " has not answered for " +
                      std::to_string(std::chrono::duration_cast<std::chrono::seconds>(quiet).count()) +
                      " s (cluster.redis.gone_after_s): the run has ended or its head is gone");
        log_warn(who_, ": storing the result of candidate ", c.candidate.id, " failed: ", message_of(e),
                 "; retrying in 1 s");
        std::this_thread::sleep_for(1s);
      }
    }
  }

  void give_back(const replay::Claim& c) override {
    held_.erase(c.entry);
    try {
      open();
      if (q_->give_back({c.entry}) == 1)
        log_info(who_, ": candidate ", c.candidate.id, " (entry ", c.entry,
                 ") handed back unscored; the next evaluator to claim takes it");
    } catch (const std::exception& e) {
      reset();
      log_warn(who_, ": handing back candidate ", c.candidate.id, " failed (", message_of(e),
               "); another evaluator claims it after cluster.redis.claim_idle_s");
    }
  }

  void drop(const replay::Claim& c) override {
    held_.erase(c.entry);
    counts_.add("dropped", 1);
    try {
      open();
      q_->ack({c.entry});
    } catch (const std::exception& e) {
      reset();
      log_warn(who_, ": acknowledging dropped candidate ", c.candidate.id, " failed (", message_of(e),
               "); it stays pending and may be scored elsewhere");
    }
    counts_.flush();
  }

  // Any thread: its own connection, under the same consumer name (only a consumer's own
  // entries are kept).
  void keep_alive(const std::vector<replay::Claim>& held) override {
    std::vector<std::string> ids;
    for (const auto& c : held)
      if (!c.entry.empty()) ids.push_back(c.entry);
    if (ids.empty()) return;
    std::lock_guard<std::mutex> g(keep_mu_);
    try {
      if (!keeper_) keeper_ = std::make_unique<StreamQueue>(StreamQueue::open(sc_));
      const std::size_t owned = keeper_->keep_alive(ids);
      if (owned < ids.size()) {
        std::string list;
        for (const auto& id : ids) list += (list.empty() ? "" : ", ") + id;
        log_warn(who_, ": ", ids.size() - owned, " of the entries in hand (", list,
                 ") are no longer ours (claimed by another evaluator); their results will be dropped as late");
      }
    } catch (const std::exception& e) {
      log_warn(who_, ": keep-alive of entry ", ids.front(), ids.size() > 1 ? " and others" : "",
               " failed: ", message_of(e), "; retried at the next beat");
      keeper_.reset();
    }
  }

  std::string where() const override { return where_ + " stream " + kCandidatesStream; }

 private:
  void open() {
    if (!q_) q_ = std::make_unique<StreamQueue>(StreamQueue::open(sc_));
  }
  void reset() {
    count_dead();
    q_.reset();
    dead_seen_ = 0;
  }
  // The evaluators seen within claim_idle, read again at most every claim_idle / 4: they join
  // and leave slowly, and the read's reply grows with every consumer the group has known.
  uint64_t live_evaluators() {
    const auto now = Clock::now();
    if (live_ == 0 || now >= live_read_ + sc_.claim_idle / 4) {
      live_ = std::max<uint64_t>(q_->live_consumers(), 1);
      live_read_ = now;
    }
    return live_;
  }
  void count_dead() {
    if (q_) counts_.add_dead(*q_, &dead_seen_);
  }

  // A record that does not decode cannot be verified: its result says so (runtime_error,
  // environment: the learner leaves it out), routed by the tag (the candidate id) on the head.
  void settle_undecodable(const Message& m, const std::string& why) {
    log_error(who_, ": ", why, "; scored runtime_error (environment)");
    replay::Result r;
    r.candidate_id = m.tag;
    r.verdict = replay::Verdict::runtime_error;
    r.cause = replay::Cause::environment;
    r.reason = "the candidate record did not decode";
    try {
      open();
      std::vector<bool> first;
      q_->ack_forward({m.id}, {{m.tag, detail::encode_record(r)}}, kResultsStream, &first);
      counts_.add("undecodable", 1);
    } catch (const std::exception& e) {
      reset();
      log_warn(who_, ": settling entry ", m.id, " failed (", message_of(e), "); it stays pending and comes back");
    }
  }

  detail::NetSettings s_;
  std::string who_;
  StreamConfig sc_;
  std::string where_;
  detail::Reachability watch_;
  detail::Counts counts_;
  std::unique_ptr<StreamQueue> q_;
  uint64_t dead_seen_ = 0;
  uint64_t live_ = 0;
  Clock::time_point live_read_{};
  std::set<std::string> held_;  // entries claimed here and not yet completed, given back or dropped
  std::mutex keep_mu_;
  std::unique_ptr<StreamQueue> keeper_;
};

}  // namespace

std::unique_ptr<replay::CandidateSource> stream_candidates(const Config& cfg, const std::string& who) {
  return std::make_unique<StreamCandidates>(detail::net_settings(cfg), who);
}

}  // namespace kf::netqueue
