// GroupRelay: scored groups through Redis lists (RPUSH / BLPOP), and their byte form.
#include "kf/netqueue/netqueue.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <thread>

#include "conn.h"
#include "kf/common/error.h"
#include "kf/common/log.h"
#include "kf/replay/replay.h"

namespace kf::netqueue {

using detail::Args;
using detail::Conn;
using detail::Reply;
using Clock = std::chrono::steady_clock;

namespace {

const char kMagic[4] = {'K', 'F', 'G', '1'};

template <class T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}
void put_bytes(std::string& out, const std::string& s) {
  put<uint32_t>(out, static_cast<uint32_t>(s.size()));
  out += s;
}

struct Reader {
  const std::string& b;
  std::size_t pos = 0;
  const std::string& context;
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(context + ": scored groups record: " + what + " at byte " + std::to_string(pos) + " of " +
                std::to_string(b.size()));
  }
  template <class T>
  T get(const char* field) {
    if (b.size() - pos < sizeof(T)) fail(std::string("field ") + field + " cut short");
    T v;
    std::memcpy(&v, b.data() + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
  std::string bytes(const char* field) {
    const auto n = get<uint32_t>(field);
    if (b.size() - pos < n) fail(std::string("field ") + field + " of " + std::to_string(n) + " bytes cut short");
    std::string s = b.substr(pos, n);
    pos += n;
    return s;
  }
};

}  // namespace

std::string encode_groups(const std::vector<replay::ScoredGroup>& groups) {
  std::string out(kMagic, 4);
  put<uint32_t>(out, static_cast<uint32_t>(groups.size()));
  for (const auto& g : groups) {
    if (g.results.size() != g.candidates.size() || g.missing.size() != g.candidates.size())
      throw Error("encode_groups: group " + std::to_string(g.group_id) + " has " + std::to_string(g.candidates.size()) +
                  " candidates, " + std::to_string(g.results.size()) + " results and " +
                  std::to_string(g.missing.size()) + " missing flags (must be equal)");
    put<uint64_t>(out, g.group_id);
    put_bytes(out, g.task);
    put<int64_t>(out, g.policy_version);
    put<uint32_t>(out, static_cast<uint32_t>(g.prompt_tokens.size()));
    out.append(reinterpret_cast<const char*>(g.prompt_tokens.data()), g.prompt_tokens.size() * sizeof(int32_t));
    put<uint32_t>(out, static_cast<uint32_t>(g.candidates.size()));
    for (std::size_t i = 0; i < g.candidates.size(); ++i) {
      std::string c(replay::encoded_size(g.candidates[i]), '\0');
      replay::encode(g.candidates[i], reinterpret_cast<unsigned char*>(c.data()));
      put_bytes(out, c);
      std::string r(replay::encoded_size(g.results[i]), '\0');
      replay::encode(g.results[i], reinterpret_cast<unsigned char*>(r.data()));
      put_bytes(out, r);
      put<uint8_t>(out, g.missing[i]);
    }
    put<uint8_t>(out, g.deadline_hit ? 1 : 0);
  }
  return out;
}

std::vector<replay::ScoredGroup> decode_groups(const std::string& bytes, const std::string& context) {
  Reader rd{bytes, 0, context};
  if (bytes.size() < 4 || std::memcmp(bytes.data(), kMagic, 4) != 0) rd.fail("not a scored groups record (magic)");
  rd.pos = 4;
  const auto n = rd.get<uint32_t>("count");
  std::vector<replay::ScoredGroup> out;
  for (uint32_t k = 0; k < n; ++k) {
    replay::ScoredGroup g;
    g.group_id = rd.get<uint64_t>("group_id");
    g.task = rd.bytes("task");
    g.policy_version = rd.get<int64_t>("policy_version");
    const auto np = rd.get<uint32_t>("prompt length");
    if ((bytes.size() - rd.pos) / sizeof(int32_t) < np) rd.fail("prompt tokens cut short");
    g.prompt_tokens.resize(np);
    std::memcpy(g.prompt_tokens.data(), bytes.data() + rd.pos, np * sizeof(int32_t));
    rd.pos += np * sizeof(int32_t);
    const auto nc = rd.get<uint32_t>("candidates");
    for (uint32_t i = 0; i < nc; ++i) {
      const std::string c = rd.bytes("candidate"), r = rd.bytes("result");
      g.candidates.push_back(
          replay::decode_candidate(reinterpret_cast<const unsigned char*>(c.data()), c.size(), context));
      g.results.push_back(replay::decode_result(reinterpret_cast<const unsigned char*>(r.data()), r.size(), context));
      g.missing.push_back(rd.get<uint8_t>("missing"));
    }
    g.deadline_hit = rd.get<uint8_t>("deadline_hit") != 0;
    out.push_back(std::move(g));
  }
  if (rd.pos != bytes.size()) rd.fail(std::to_string(bytes.size() - rd.pos) + " trailing bytes");
  return out;
}

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
