// GroupRelay (relay.h): scored groups for learner ranks on other nodes through Redis lists
// (RPUSH / BLPOP); the groups travel in records.h's byte form.
#include "relay.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <thread>

#include "conn.h"
#include "kf/common/error.h"
#include "kf/common/log.h"
#include "kf/replay/replay.h"
#include "records.h"

namespace kf::netqueue {

using detail::Args;
using detail::Conn;
using detail::decode_groups;
using detail::encode_groups;
using detail::Reply;
using Clock = std::chrono::steady_clock;

struct GroupRelay::Impl {
  StreamConfig server;
  std::string scope;
  Conn conn;
  Impl(const StreamConfig& s, std::string sc)
      : server(s), scope(std::move(sc)), conn(s.host, s.port, s.user, s.password, s.connect_timeout, s.io_timeout) {}
  std::string key(const char* kind, int rank) const {
    return "kf:lrn:" + scope + ":" + kind + ":" + std::to_string(rank);
  }
  void send(const std::string& k, const std::string& bytes) {
    std::vector<Args> cmds(2);
    cmds[0].add("RPUSH").add(k).add(bytes);
    cmds[1].add("PEXPIRE").add(k).add("3600000");  // leftovers of a dead run go away
    conn.pipeline(cmds, "RPUSH (learner groups)");
  }
  // BLPOP in slices of 2 s (a lost connection is retried on the next slice).
  std::string receive(const std::string& k, Millis timeout, const std::string& what) {
    const auto deadline = Clock::now() + timeout;
    std::string last_error;
    for (;;) {
      const auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
      if (left.count() <= 0)
        throw Error(conn.where() + ": run '" + scope + "': " + what + " within " + std::to_string(timeout.count()) +
                    " ms" + (last_error.empty() ? "" : "; last Redis error: " + last_error));
      const Millis slice = std::min(left, Millis(2000));
      try {
        Args a;
        char secs[32];
        std::snprintf(secs, sizeof(secs), "%.3f", static_cast<double>(std::max<long long>(slice.count(), 1)) / 1000.0);
        a.add("BLPOP").add(k).add_copy(secs);
        conn.set_read_timeout(slice + server.io_timeout);
        Reply r = conn.call(a, "BLPOP (learner groups)");
        conn.reset_read_timeout();
        if (r->type == REDIS_REPLY_ARRAY && r->elements == 2)
          return std::string(r->element[1]->str, r->element[1]->len);
      } catch (const Error& e) {
        if (last_error.empty()) log_warn(e.what(), "; retrying until the deadline");
        last_error = e.what();
        std::this_thread::sleep_for(Millis(200));
      }
    }
  }
};

GroupRelay::GroupRelay(const StreamConfig& server, std::string scope)
    : impl_(std::make_unique<Impl>(server, std::move(scope))) {}
GroupRelay::~GroupRelay() = default;
std::string GroupRelay::where() const { return impl_->conn.where() + " run '" + impl_->scope + "'"; }

std::vector<replay::ScoredGroup> GroupRelay::request(int rank, const GroupRequest& req, Millis timeout) {
  std::ostringstream os;
  os << req.step << ' ' << req.groups << ' ' << req.version << ' ' << req.max_lag;
  impl_->send(impl_->key("req", rank), os.str());
  const std::string what = "no reply from rank 0 to rank " + std::to_string(rank) + "'s request for step " +
                           std::to_string(req.step) + " (is the head's learner rank 0 running?)";
  const std::string rep = impl_->receive(impl_->key("rep", rank), timeout, what);
  const auto sp = rep.find(' ');
  const std::string ctx = where() + ": reply to rank " + std::to_string(rank);
  if (sp == std::string::npos) throw Error(ctx + ": no step field");
  const long long step = std::stoll(rep.substr(0, sp));
  if (step != req.step)
    throw Error(ctx + ": the reply is for step " + std::to_string(step) + ", the request was for step " +
                std::to_string(req.step) + " (the ranks are out of step)");
  return decode_groups(rep.substr(sp + 1), ctx);
}

GroupRequest GroupRelay::next_request(int rank, Millis timeout) {
  const std::string what = "no request from rank " + std::to_string(rank) +
                           " (is that node's learner running, with the same run name and cluster.redis.host?)";
  const std::string s = impl_->receive(impl_->key("req", rank), timeout, what);
  GroupRequest r;
  std::istringstream in(s);
  if (!(in >> r.step >> r.groups >> r.version >> r.max_lag))
    throw Error(where() + ": request of rank " + std::to_string(rank) + " is malformed: '" + s.substr(0, 80) + "'");
  return r;
}

void GroupRelay::reply(int rank, int64_t step, const std::vector<replay::ScoredGroup>& groups) {
  impl_->send(impl_->key("rep", rank), std::to_string(step) + " " + encode_groups(groups));
}

}  // namespace kf::netqueue
