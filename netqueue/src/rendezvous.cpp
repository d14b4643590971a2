// StoreRendezvous: announce, wait, publish / fetch through plain Redis keys (SET PX, MGET).
#include "kf/netqueue/netqueue.h"

#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "conn.h"
#include "kf/common/error.h"
#include "kf/common/log.h"

namespace kf::netqueue {

using detail::Args;
using detail::Conn;
using detail::Reply;
using Clock = std::chrono::steady_clock;

namespace {

std::string make_token() {
  std::random_device rd;
  std::mt19937_64 g((static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(getpid()));
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%d-%016llx", static_cast<int>(getpid()), static_cast<unsigned long long>(g()));
  return buf;
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

// KEYS[1..n] the announcements of ranks 1..n, KEYS[n+1] rank 0's, KEYS[n+2] the
// publication; ARGV[1] the blob, ARGV[2] TTL ms. Publishes only when all n are there,
// and consumes them (an announcement serves one attempt: a later rank 0 waits for fresh ones).
const char* kPublishScript = R"lua(
local n = #KEYS - 2
local v = ''
for i = 1, n do
  local t = redis.call('GET', KEYS[i])
  if not t then return 0 end
  v = v .. t .. ','
end
redis.call('SET', KEYS[n + 2], v .. '\n' .. ARGV[1], 'PX', ARGV[2])
for i = 1, n + 1 do redis.call('DEL', KEYS[i]) end
return 1
)lua";

// A mistake no retry can fix (wrong password, missing ACL rights): fail at once.
bool permanent(const std::string& msg) {
  return msg.find("AUTH refused") != std::string::npos || msg.find("NOPERM") != std::string::npos ||
         msg.find("NOAUTH") != std::string::npos;
}

}  // namespace

struct StoreRendezvous::Impl {
  RendezvousConfig cfg;
  std::unique_ptr<Conn> conn;
  std::string token = make_token();
  std::string last_error;
  std::string key;  // the current operation's key, for messages

  std::string base() const { return "kf:rdv:" + cfg.scope + ":" + key; }
  std::string rank_key(int r) const { return base() + ":rank:" + std::to_string(r); }
  std::string server() const { return "redis at " + cfg.server.host + ":" + std::to_string(cfg.server.port); }
  std::string where() const { return "rendezvous '" + key + "' of run '" + cfg.scope + "' at " + server(); }
  std::string ttl_ms(Millis timeout) const { return std::to_string(timeout.count() + 60000); }

  // Runs f on a live connection. A Redis error is remembered (and logged the first time)
  // and false returned, so the caller retries until its deadline; a wrong password or
  // missing rights throws at once.
  template <class F>
  bool attempt(F&& f) {
    try {
      if (!conn)
        conn = std::make_unique<Conn>(cfg.server.host, cfg.server.port, cfg.server.user, cfg.server.password,
                                      cfg.server.connect_timeout, cfg.server.io_timeout);
      f(*conn);
      return true;
    } catch (const Error& e) {
      const std::string msg = e.what();
      if (permanent(msg)) throw Error(where() + ", rank " + std::to_string(cfg.rank) + ": " + msg);
      if (last_error.empty())
        log_warn(where(), ", rank ", cfg.rank, ": ", msg, "; retrying every 200 ms until the rendezvous times out");
      last_error = msg;
      conn.reset();
      std::this_thread::sleep_for(Millis(200));
      return false;
    }
  }

  // Which of the ranks in [first, world) have no announcement now (empty: all there, or
  // the server could not be asked: then `asked` is false).
  std::vector<int> missing(int first, bool* asked) {
    std::vector<int> out;
    *asked = attempt([&](Conn& c) {
      Args a;
      a.add("MGET");
      for (int r = first; r < cfg.world; ++r) a.add_copy(rank_key(r));
      Reply rep = c.call(a, "MGET (rendezvous announcements)");
      if (rep->type != REDIS_REPLY_ARRAY || rep->elements != static_cast<std::size_t>(cfg.world - first))
        throw Error(c.where() + ": MGET (rendezvous announcements): unexpected reply " + detail::describe(rep.get()));
      out.clear();
      for (std::size_t i = 0; i < rep->elements; ++i)
        if (rep->element[i]->type != REDIS_REPLY_STRING) out.push_back(first + static_cast<int>(i));
    });
    return out;
  }

  Args announce(Millis timeout) const {
    Args a;
    a.add("SET").add_copy(rank_key(cfg.rank)).add(token).add("PX").add_copy(ttl_ms(timeout));
    return a;
  }

  std::string unreachable_note() const { return last_error.empty() ? "" : "; last Redis error: " + last_error; }
};

StoreRendezvous::StoreRendezvous(RendezvousConfig cfg) : impl_(std::make_unique<Impl>()) {
  auto bad = [](const std::string& field, const std::string& why) {
    return error_at("rendezvous config", "field '" + field + "' " + why);
  };
  if (cfg.server.host.empty()) throw bad("server.host", "is empty");
  if (cfg.server.port < 1 || cfg.server.port > 65535)
    throw bad("server.port", "must be 1..65535, got " + std::to_string(cfg.server.port));
  if (cfg.scope.empty()) throw bad("scope", "is empty (the run name)");
  for (char ch : cfg.scope)
    if (ch == ':' || std::isspace(static_cast<unsigned char>(ch)))
      throw bad("scope", "'" + cfg.scope + "' must not contain ':' or whitespace");
  if (cfg.world < 1) throw bad("world", "must be at least 1, got " + std::to_string(cfg.world));
  if (cfg.rank < 0 || cfg.rank >= cfg.world)
    throw bad("rank", "must be 0.." + std::to_string(cfg.world - 1) + ", got " + std::to_string(cfg.rank));
  if (cfg.timeout.count() < 1) throw bad("timeout", "must be positive");
  impl_->cfg = std::move(cfg);
}

StoreRendezvous::~StoreRendezvous() = default;

std::string StoreRendezvous::where() const { return impl_->where(); }

void StoreRendezvous::publish(const std::string& key, const std::string& bytes) {
  Impl& m = *impl_;
  m.key = key;
  if (m.cfg.rank != 0) throw Error(m.where() + ": publish is rank 0's; this is rank " + std::to_string(m.cfg.rank));
  const auto deadline = Clock::now() + m.cfg.timeout;
  bool announced = false;
  for (;;) {
    bool done = false;
    m.attempt([&](Conn& c) {
      if (!announced) {
        c.call(m.announce(m.cfg.timeout), "SET (rendezvous announcement)");
        announced = true;
      }
      Args a;
      a.add("EVAL").add(kPublishScript).add_copy(std::to_string(m.cfg.world + 1));
      for (int r = 1; r < m.cfg.world; ++r) a.add_copy(m.rank_key(r));
      a.add_copy(m.rank_key(0)).add_copy(m.base()).add(bytes).add_copy(m.ttl_ms(m.cfg.timeout));
      done = detail::reply_integer(c.call(a, "EVAL (rendezvous publication)").get(), c.where(),
                                   "rendezvous publication") == 1;
    });
    if (!m.conn) announced = false;  // a Redis error: the server may have lost it
    if (done) {
      m.last_error.clear();
      return;
    }
    if (Clock::now() > deadline) {
      bool asked = false;
      const auto miss = m.missing(1, &asked);
      throw Error(m.where() + ": rank 0 of " + std::to_string(m.cfg.world) + ": " +
                  (asked ? "rank(s) " + join_ranks(miss) + " did not announce themselves"
                         : std::string("could not reach the server")) +
                  " within " + std::to_string(m.cfg.timeout.count()) +
                  " ms (are those nodes' launchers running, with the same run name and cluster.redis.host?)" +
                  m.unreachable_note());
    }
    std::this_thread::sleep_for(Millis(20));
  }
}

std::string StoreRendezvous::fetch(const std::string& key, Millis timeout) {
  Impl& m = *impl_;
  m.key = key;
  if (m.cfg.rank == 0)
    throw Error(m.where() + ": rank 0 publishes; fetch is for ranks 1.." + std::to_string(m.cfg.world - 1));
  const auto deadline = Clock::now() + timeout;
  bool stale_seen = false, announced = false;
  for (;;) {
    std::string out;
    bool got = false;
    m.attempt([&](Conn& c) {
      if (!announced) {  // once: rank 0 consumes announcements when it publishes
        c.call(m.announce(timeout), "SET (rendezvous announcement)");
        announced = true;
      }
      Args get;
      get.add("GET").add_copy(m.base());
      Reply rep = c.call(get, "GET (rendezvous publication)");
      const redisReply* v = rep.get();
      if (v->type != REDIS_REPLY_STRING) return;
      const std::string s(v->str, v->len);
      const auto nl = s.find('\n');
      if (nl == std::string::npos)
        throw Error(c.where() + ": rendezvous value under " + m.base() + " has no token line");
      // Tokens of ranks 1..world-1, each followed by ','.
      std::size_t pos = 0;
      for (int r = 1; r < m.cfg.rank; ++r) {
        pos = s.find(',', pos);
        if (pos == std::string::npos || pos > nl) break;
        ++pos;
      }
      const auto end = s.find(',', pos);
      if (pos < nl && end != std::string::npos && end < nl && s.compare(pos, end - pos, m.token) == 0) {
        out = s.substr(nl + 1);
        got = true;
      } else {
        stale_seen = true;  // an earlier attempt's publication: wait for this one's
      }
    });
    if (got) return out;
    if (!m.conn) announced = false;  // a Redis error: the server may have lost it
    if (Clock::now() > deadline) {
      bool asked = false;
      const auto miss = m.missing(0, &asked);
      std::string why = "rank 0 did not publish";
      if (stale_seen) why += " for this attempt (only an earlier attempt's value is there)";
      if (asked && !miss.empty()) why += "; rank(s) " + join_ranks(miss) + " never announced themselves";
      if (!asked) why = "could not reach the server";
      throw Error(m.where() + ": rank " + std::to_string(m.cfg.rank) + " of " + std::to_string(m.cfg.world) + ": " +
                  why + " within " + std::to_string(timeout.count()) + " ms" + m.unreachable_note());
    }
    std::this_thread::sleep_for(Millis(20));
  }
}

}  // namespace kf::netqueue
