// StreamQueue: producer admission, consumer reads and claims, acknowledgement, dead
// letters. The multi-step operations run as Lua scripts so that each is atomic on the
// server (a client dying between two commands cannot leave an acknowledged record in
// the stream or a record both forwarded and still pending).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <thread>

#include "conn.h"
#include "kf/common/error.h"
#include "kf/common/log.h"
#include "kf/netqueue/netqueue.h"

namespace kf::netqueue {

using detail::Args;
using detail::Conn;
using detail::Reply;
using Clock = std::chrono::steady_clock;

namespace {

// KEYS[1] stream, KEYS[2] count hash; ARGV[1] bound, ARGV[2] count field ("" = none),
// ARGV[3..] tag, data pairs. Adds as many as fit under the bound (XLEN counts only
// unacknowledged records: ack deletes), in order, and counts them in the same step.
const char* kPushScript = R"lua(
local room = tonumber(ARGV[1]) - redis.call('XLEN', KEYS[1])
local n = (#ARGV - 2) / 2
if room < n then n = room end
if n <= 0 then return 0 end
for i = 1, n do
  redis.call('XADD', KEYS[1], 'MAXLEN', ARGV[1], '*', 't', ARGV[2*i+1], 'd', ARGV[2*i+2])
end
if ARGV[2] ~= '' then redis.call('HINCRBY', KEYS[2], ARGV[2], n) end
return n
)lua";

// KEYS[1] stream, KEYS[2] output stream, KEYS[3] count hash; ARGV[1] group, ARGV[2] n,
// ARGV[3] count field for the outputs ("" = none), ARGV[4..3+n] ids, then (when forwarding)
// n tag, data pairs. Per id: 1 = was pending (acked, deleted, output appended), 0 = not
// pending (already acknowledged elsewhere; output dropped). Outputs are counted in the same
// step, so a process killed right after it loses no count.
const char* kAckScript = R"lua(
local n = tonumber(ARGV[2])
local fwd = #ARGV >= 3 + 3 * n
local res = {}
local sent = 0
for i = 1, n do
  local id = ARGV[3 + i]
  local a = redis.call('XACK', KEYS[1], ARGV[1], id)
  if a == 1 then
    redis.call('XDEL', KEYS[1], id)
    if fwd then
      redis.call('XADD', KEYS[2], '*', 't', ARGV[3 + n + 2 * i - 1], 'd', ARGV[3 + n + 2 * i])
      sent = sent + 1
    end
  end
  res[i] = a
end
if sent > 0 and ARGV[3] ~= '' then redis.call('HINCRBY', KEYS[3], ARGV[3], sent) end
return res
)lua";

// KEYS[1] stream, KEYS[2] dead-letter stream; ARGV[1] group, ARGV[2] id, ARGV[3] reason,
// ARGV[4..] the entry's field/value pairs (copied for inspection).
const char* kDeadScript = R"lua(
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  redis.call('XDEL', KEYS[1], ARGV[2])
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', '10000', '*', 'id', ARGV[2], 'reason', ARGV[3], unpack(ARGV, 4))
  return 1
end
return 0
)lua";

// KEYS[1] stream; ARGV[1] group, ARGV[2] consumer, ARGV[3..] ids. Resets the idle time
// of the ids this consumer still owns (never takes one another consumer claimed).
const char* kKeepAliveScript = R"lua(
local n = 0
for i = 3, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if #p == 1 and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
    n = n + 1
  end
end
return n
)lua";

// KEYS[1] stream; ARGV[1] group, ARGV[2] consumer, ARGV[3] idle ms, ARGV[4..] ids. Sets the
// idle time of the ids this consumer owns to ARGV[3], so the next XAUTOCLAIM takes them.
const char* kGiveBackScript = R"lua(
local n = 0
for i = 4, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if #p == 1 and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'IDLE', ARGV[3], 'JUSTID')
    n = n + 1
  end
end
return n
)lua";

bool valid_id(const std::string& id) {
  auto dash = id.find('-');
  if (dash == std::string::npos || dash == 0 || dash + 1 == id.size()) return false;
  for (std::size_t i = 0; i < id.size(); ++i)
    if (i != dash && !std::isdigit(static_cast<unsigned char>(id[i]))) return false;
  return true;
}

bool parse_u64(const char* s, std::size_t n, uint64_t* out) {
  if (n == 0 || n > 20) return false;
  uint64_t v = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
    uint64_t d = static_cast<uint64_t>(s[i] - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

std::string default_consumer() {
  static std::atomic<int> counter{0};
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) std::snprintf(host, sizeof(host), "host");
  return std::string(host) + ":" + std::to_string(getpid()) + ":" + std::to_string(counter++);
}

void check_config(const StreamConfig& c) {
  auto bad = [](const std::string& field, const std::string& why) {
    return error_at("netqueue config", "field '" + field + "' " + why);
  };
  if (c.host.empty()) throw bad("host", "is empty");
  if (c.port < 1 || c.port > 65535) throw bad("port", "must be 1..65535, got " + std::to_string(c.port));
  if (c.stream.empty()) throw bad("stream", "is empty");
  if (c.group.empty()) throw bad("group", "is empty");
  if (c.bound < 1) throw bad("bound", "must be at least 1");
  if (c.batch_records < 1) throw bad("batch_records", "must be at least 1");
  if (c.max_deliveries < 1) throw bad("max_deliveries", "must be at least 1");
  if (c.claim_idle.count() < 1) throw bad("claim_idle", "must be at least 1 ms");
  if (c.io_timeout.count() < 1) throw bad("io_timeout", "must be at least 1 ms");
  if (c.connect_timeout.count() < 1) throw bad("connect_timeout", "must be at least 1 ms");
}

}  // namespace

struct StreamQueue::Impl {
  StreamConfig cfg;
  std::string dead_stream;
  Conn conn;
  StreamStats stats;
  std::string claim_cursor = "0-0";
  Clock::time_point next_claim = Clock::now();
  Millis claim_every;
  Millis prune_after;  // forget consumers idle this long with nothing pending
  Clock::time_point next_prune;
  Clock::time_point next_full_log{};  // push_batch's "stream full" line: at most one a minute
  uint64_t full_unlogged = 0;

  explicit Impl(const StreamConfig& c)
      : cfg(c),
        dead_stream(c.stream + ":dead"),
        conn(c.host, c.port, c.user, c.password, c.connect_timeout, c.io_timeout) {
    claim_every = cfg.claim_every.count() > 0 ? cfg.claim_every : std::max(Millis(10), cfg.claim_idle / 4);
    prune_after = cfg.claim_idle * 10;
    next_prune = Clock::now() + prune_after;
    ensure_group();
  }

  std::string where() const { return conn.where() + " stream " + cfg.stream; }

  void ensure_group() {
    Args a;
    a.add("XGROUP").add("CREATE").add(cfg.stream).add(cfg.group).add("0").add("MKSTREAM");
    Reply r = conn.call(a, "XGROUP CREATE", false);
    if (r->type == REDIS_REPLY_ERROR) {
      std::string e(r->str, r->len);
      if (e.rfind("BUSYGROUP", 0) != 0)
        throw Error(where() + ": creating consumer group '" + cfg.group + "' refused: " + e +
                    (e.rfind("NOAUTH", 0) == 0 ? " (the server needs a password: set the config's password)" : "") +
                    (e.rfind("NOPERM", 0) == 0 ? " (the ACL user lacks rights on this key or command)" : ""));
    }
  }

  // Called first by every operation: after a lost connection, reconnect (AUTH, group).
  void ready() {
    if (!conn.broken()) return;
    conn.reconnect();
    ++stats.reconnects;
    ensure_group();
    log_warn("netqueue: ", where(), ": reconnected after a lost connection (", stats.reconnects, " so far)");
  }

  // Moves a message to <stream>:dead with a reason; fields = the entry's pairs.
  void dead_letter(const std::string& id, const std::string& reason, const std::vector<std::string>& fields) {
    Args a;
    a.add("EVAL").add(kDeadScript).add("2").add(cfg.stream).add(dead_stream).add(cfg.group).add(id).add(reason);
    for (const auto& f : fields) a.add(f);
    Reply r = conn.call(a, "moving a record to the dead-letter stream");
    if (detail::reply_integer(r.get(), where(), "dead-letter script") == 1) {
      ++stats.dead_lettered;
      log_error("netqueue: ", where(), ": record ", id, " moved to ", dead_stream, ": ", reason,
                "; it will not be delivered again");
    }
  }

  // Parses one entry [id, [f, v, ...]]; malformed entries are dead-lettered (false).
  bool parse_entry(const redisReply* e, Message* m) {
    if (!e || e->type != REDIS_REPLY_ARRAY || e->elements != 2 || e->element[0]->type != REDIS_REPLY_STRING)
      throw Error(where() + ": unexpected entry shape in a stream reply: " + detail::describe(e));
    m->id.assign(e->element[0]->str, e->element[0]->len);
    const redisReply* f = e->element[1];
    std::vector<std::string> fields;
    if (f && f->type == REDIS_REPLY_ARRAY)
      for (std::size_t i = 0; i < f->elements; ++i)
        if (f->element[i]->type == REDIS_REPLY_STRING) fields.emplace_back(f->element[i]->str, f->element[i]->len);
    std::string why;
    if (!f || f->type != REDIS_REPLY_ARRAY) {
      why = "entry has no fields";
    } else if (f->elements != 4 || fields.size() != 4 || fields[0] != "t" || fields[2] != "d") {
      why = "malformed record: expected fields [t, d], got " + std::to_string(f->elements / 2) + " field(s)" +
            (fields.empty() ? std::string() : " starting with '" + fields[0].substr(0, 32) + "'");
    } else if (!parse_u64(fields[1].data(), fields[1].size(), &m->tag)) {
      why = "malformed record: tag '" + fields[1].substr(0, 32) + "' is not an unsigned integer";
    }
    if (!why.empty()) {
      dead_letter(m->id, why, fields.size() % 2 == 0 ? fields : std::vector<std::string>{});
      return false;
    }
    m->data = std::move(fields[3]);
    m->deliveries = 1;
    return true;
  }

  // XAUTOCLAIM: takes over records pending longer than claim_idle (a dead consumer's).
  void claim(std::size_t max, std::vector<Message>* out) {
    Args a;
    a.add("XAUTOCLAIM")
        .add(cfg.stream)
        .add(cfg.group)
        .add(cfg.consumer)
        .add_copy(std::to_string(cfg.claim_idle.count()))
        .add(claim_cursor)
        .add("COUNT")
        .add_copy(std::to_string(max));
    Reply r = conn.call(a, "XAUTOCLAIM");
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 2)
      throw Error(where() + ": XAUTOCLAIM: unexpected reply " + detail::describe(r.get()));
    claim_cursor = detail::reply_string(r->element[0], where(), "XAUTOCLAIM cursor");
    if (r->elements >= 3 && r->element[2]->type == REDIS_REPLY_ARRAY && r->element[2]->elements > 0) {
      stats.vanished += r->element[2]->elements;
      log_warn("netqueue: ", where(), ": ", r->element[2]->elements,
               " pending record(s) were deleted by another client before acknowledgement; dropped from the group");
    }
    const redisReply* entries = r->element[1];
    if (entries->type != REDIS_REPLY_ARRAY || entries->elements == 0) return prune_consumers();
    std::vector<Message> got;
    for (std::size_t i = 0; i < entries->elements; ++i) {
      Message m;
      if (parse_entry(entries->element[i], &m)) got.push_back(std::move(m));
    }
    if (got.empty()) return prune_consumers();
    // Delivery counts of the claimed ids (one pipelined XPENDING per id: a range query
    // could be filled by this consumer's own records between them).
    std::vector<Args> cmds(got.size());
    for (std::size_t i = 0; i < got.size(); ++i)
      cmds[i].add("XPENDING").add(cfg.stream).add(cfg.group).add(got[i].id).add(got[i].id).add("1");
    auto replies = conn.pipeline(cmds, "XPENDING");
    std::vector<std::pair<std::string, uint32_t>> counts;
    for (const Reply& pr : replies)
      if (pr->type == REDIS_REPLY_ARRAY && pr->elements == 1) {
        const redisReply* e = pr->element[0];
        if (e->type == REDIS_REPLY_ARRAY && e->elements == 4 && e->element[3]->type == REDIS_REPLY_INTEGER)
          counts.emplace_back(std::string(e->element[0]->str, e->element[0]->len),
                              static_cast<uint32_t>(e->element[3]->integer));
      }
    std::size_t n_claimed = 0;
    std::string tags;
    for (Message& m : got) {
      for (const auto& c : counts)
        if (c.first == m.id) m.deliveries = c.second;
      if (m.deliveries > cfg.max_deliveries) {
        dead_letter(m.id,
                    "delivered " + std::to_string(m.deliveries) + " times without acknowledgement (max_deliveries " +
                        std::to_string(cfg.max_deliveries) + "): its consumers died or hung on it",
                    {"t", std::to_string(m.tag), "d", m.data});
        continue;
      }
      ++stats.claimed;
      ++n_claimed;
      tags += (n_claimed <= 8 ? (n_claimed > 1 ? ", " : "") + std::to_string(m.tag) : n_claimed == 9 ? ", ..." : "");
      out->push_back(std::move(m));
    }
    if (n_claimed > 0)
      log_info("netqueue: ", where(), ": consumer ", cfg.consumer, " claimed ", n_claimed, " record(s) idle over ",
               cfg.claim_idle.count(), " ms (tags ", tags,
               "): their consumer died or stalled; they are delivered again");
    prune_consumers();
  }

  // The group's consumers as XINFO CONSUMERS lists them ("idle": milliseconds since the
  // consumer last read, claimed or was kept alive; -1 where a field is missing).
  struct Consumer {
    std::string name;
    long long pending = -1, idle = -1;
  };
  std::vector<Consumer> consumers() {
    Args a;
    a.add("XINFO").add("CONSUMERS").add(cfg.stream).add(cfg.group);
    Reply r = conn.call(a, "XINFO CONSUMERS");
    std::vector<Consumer> out;
    for (std::size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; ++i) {
      const redisReply* c = r->element[i];
      Consumer info;
      for (std::size_t j = 0; c->type == REDIS_REPLY_ARRAY && j + 1 < c->elements; j += 2) {
        std::string k(c->element[j]->str ? c->element[j]->str : "", c->element[j]->len);
        const redisReply* v = c->element[j + 1];
        if (k == "name" && v->type == REDIS_REPLY_STRING) info.name.assign(v->str, v->len);
        if (k == "pending" && v->type == REDIS_REPLY_INTEGER) info.pending = v->integer;
        if (k == "idle" && v->type == REDIS_REPLY_INTEGER) info.idle = v->integer;
      }
      out.push_back(std::move(info));
    }
    return out;
  }

  // Forgets consumers with nothing pending that have been idle for long (dead evaluators'
  // names); a live one that reads again is re-created by XREADGROUP. Every prune_after.
  void prune_consumers() {
    auto now = Clock::now();
    if (now < next_prune) return;
    next_prune = now + prune_after;
    for (const Consumer& c : consumers()) {
      if (c.name.empty() || c.name == cfg.consumer || c.pending != 0 || c.idle < prune_after.count()) continue;
      Args d;
      d.add("XGROUP").add("DELCONSUMER").add(cfg.stream).add(cfg.group).add(c.name);
      conn.call(d, "XGROUP DELCONSUMER");
      log_info("netqueue: ", where(), ": forgot consumer ", c.name, " (nothing pending, idle ", c.idle, " ms)");
    }
  }

  // XREADGROUP > with BLOCK block_ms (0: do not block).
  void read_new(std::size_t max, long long block_ms, std::vector<Message>* out) {
    Args a;
    a.add("XREADGROUP").add("GROUP").add(cfg.group).add(cfg.consumer).add("COUNT").add_copy(std::to_string(max));
    if (block_ms > 0) a.add("BLOCK").add_copy(std::to_string(block_ms));
    a.add("STREAMS").add(cfg.stream).add(">");
    if (block_ms > 0) conn.set_read_timeout(Millis(block_ms) + cfg.io_timeout);
    Reply r = conn.call(a, "XREADGROUP", false);
    if (block_ms > 0) conn.reset_read_timeout();
    if (r->type == REDIS_REPLY_ERROR) {
      std::string e(r->str, r->len);
      if (e.rfind("NOGROUP", 0) == 0) {  // the server lost the group (restarted without data)
        log_warn("netqueue: ", where(), ": consumer group '", cfg.group,
                 "' is gone (server restarted?); creating it again");
        ensure_group();
        return;
      }
      throw Error(where() + ": XREADGROUP refused: " + e);
    }
    if (r->type == REDIS_REPLY_NIL) return;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 1 || r->element[0]->type != REDIS_REPLY_ARRAY ||
        r->element[0]->elements != 2)
      throw Error(where() + ": XREADGROUP: unexpected reply " + detail::describe(r.get()));
    const redisReply* entries = r->element[0]->element[1];
    for (std::size_t i = 0; entries->type == REDIS_REPLY_ARRAY && i < entries->elements; ++i) {
      Message m;
      if (parse_entry(entries->element[i], &m)) out->push_back(std::move(m));
    }
  }

  std::size_t ack_impl(const std::vector<std::string>& ids, const std::vector<Outgoing>* outputs,
                       const std::string& out_stream, std::vector<bool>* first) {
    ready();
    if (first) first->assign(ids.size(), false);
    for (const auto& id : ids)
      if (!valid_id(id)) throw Error(where() + ": ack: '" + id.substr(0, 64) + "' is not a stream entry id");
    std::size_t total = 0;
    for (std::size_t off = 0; off < ids.size(); off += cfg.batch_records) {
      std::size_t n = std::min<std::size_t>(cfg.batch_records, ids.size() - off);
      Args a;
      a.add("EVAL")
          .add(kAckScript)
          .add("3")
          .add(cfg.stream)
          .add(outputs ? out_stream : cfg.stream)
          .add(cfg.count_hash.empty() ? cfg.stream : cfg.count_hash)
          .add(cfg.group)
          .add_copy(std::to_string(n))
          .add_copy(outputs ? cfg.forward_count_field : std::string());
      for (std::size_t i = 0; i < n; ++i) a.add(ids[off + i]);
      if (outputs)
        for (std::size_t i = 0; i < n; ++i)
          a.add_copy(std::to_string((*outputs)[off + i].tag)).add((*outputs)[off + i].data);
      Reply r = conn.call(a, outputs ? "acknowledge and forward" : "acknowledge");
      if (r->type != REDIS_REPLY_ARRAY || r->elements != n)
        throw Error(where() + ": ack script: unexpected reply " + detail::describe(r.get()));
      for (std::size_t i = 0; i < n; ++i) {
        bool was = r->element[i]->type == REDIS_REPLY_INTEGER && r->element[i]->integer == 1;
        if (first) (*first)[off + i] = was;
        if (was) {
          ++total;
          ++stats.acked;
          if (outputs) ++stats.forwarded;
        } else {
          ++stats.ack_late;
        }
      }
    }
    return total;
  }
};

StreamQueue::StreamQueue(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StreamQueue::StreamQueue(StreamQueue&&) noexcept = default;
StreamQueue& StreamQueue::operator=(StreamQueue&&) noexcept = default;
StreamQueue::~StreamQueue() = default;

StreamQueue StreamQueue::open(const StreamConfig& cfg_in) {
  StreamConfig cfg = cfg_in;
  check_config(cfg);
  if (cfg.consumer.empty()) cfg.consumer = default_consumer();
  return StreamQueue(std::make_unique<Impl>(cfg));
}

std::size_t StreamQueue::push_batch(const std::vector<Outgoing>& records, Millis timeout) {
  Impl& q = *impl_;
  q.ready();
  const auto deadline = Clock::now() + timeout;
  std::size_t done = 0;
  Millis backoff(1);
  const std::size_t max_bytes = 8u << 20;  // one script call carries at most ~8 MiB
  while (done < records.size()) {
    Args a;
    a.add("EVAL").add(kPushScript).add("2").add(q.cfg.stream);
    a.add(q.cfg.count_hash.empty() ? q.cfg.stream : q.cfg.count_hash).add_copy(std::to_string(q.cfg.bound));
    a.add(q.cfg.push_count_field);
    std::size_t n = 0, bytes = 0;
    while (done + n < records.size() && n < q.cfg.batch_records && (n == 0 || bytes < max_bytes)) {
      const Outgoing& r = records[done + n];
      a.add_copy(std::to_string(r.tag)).add(r.data);
      bytes += r.data.size();
      ++n;
    }
    Reply rep = q.conn.call(a, "XADD (push script)");
    long long added = detail::reply_integer(rep.get(), q.where(), "push script");
    done += static_cast<std::size_t>(added);
    q.stats.pushed += static_cast<uint64_t>(added);
    if (added > 0) {
      backoff = Millis(1);
      continue;
    }
    ++q.stats.push_waits;
    auto now = Clock::now();
    if (now >= deadline) {
      std::size_t left = records.size() - done;
      q.stats.push_timeouts += left;
      // A producer that waits in short slices (publish's back-pressure loop) would log every
      // slice: one line, then at most one a minute with the count since.
      ++q.full_unlogged;
      if (now >= q.next_full_log) {
        log_warn(
            "netqueue: ", q.where(), ": stream full (bound ", q.cfg.bound, " unacknowledged records) for ",
            std::chrono::duration_cast<Millis>(timeout).count(), " ms; pushed ", done, " of ", records.size(),
            ", the caller decides about the other ", left,
            q.full_unlogged > 1 ? " (" + std::to_string(q.full_unlogged) + " such waits since the last line)" : "");
        q.full_unlogged = 0;
        q.next_full_log = now + std::chrono::minutes(1);
      }
      return done;
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, Millis(50));
  }
  return done;
}

bool StreamQueue::push(uint64_t tag, const std::string& data, Millis timeout) {
  return push_batch({Outgoing{tag, data}}, timeout) == 1;
}

std::vector<Message> StreamQueue::take(std::size_t max, Millis timeout) {
  Impl& q = *impl_;
  q.ready();
  std::vector<Message> out;
  if (max == 0) return out;
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    auto now = Clock::now();
    if (now >= q.next_claim) {
      q.claim(max, &out);
      q.next_claim = Clock::now() + q.claim_every;
      if (!out.empty()) break;
    }
    now = Clock::now();
    auto until = std::min(deadline, q.next_claim);
    long long block_ms = std::chrono::duration_cast<Millis>(until - now).count();
    q.read_new(max, std::max(0LL, block_ms), &out);
    if (!out.empty() || Clock::now() >= deadline) break;
  }
  q.stats.taken += out.size();
  return out;
}

std::size_t StreamQueue::ack(const std::vector<std::string>& ids, std::vector<bool>* first) {
  return impl_->ack_impl(ids, nullptr, "", first);
}

std::size_t StreamQueue::ack_forward(const std::vector<std::string>& ids, const std::vector<Outgoing>& outputs,
                                     const std::string& out_stream, std::vector<bool>* first) {
  if (outputs.size() != ids.size())
    throw Error(where() + ": ack_forward: " + std::to_string(ids.size()) + " ids but " +
                std::to_string(outputs.size()) + " outputs");
  if (out_stream.empty() || out_stream == impl_->cfg.stream)
    throw Error(where() + ": ack_forward: the output stream must be another stream, got '" + out_stream + "'");
  return impl_->ack_impl(ids, &outputs, out_stream, first);
}

std::size_t StreamQueue::keep_alive(const std::vector<std::string>& ids) {
  Impl& q = *impl_;
  q.ready();
  if (ids.empty()) return 0;
  Args a;
  a.add("EVAL").add(kKeepAliveScript).add("1").add(q.cfg.stream).add(q.cfg.group).add(q.cfg.consumer);
  for (const auto& id : ids) {
    if (!valid_id(id)) throw Error(where() + ": keep_alive: '" + id.substr(0, 64) + "' is not a stream entry id");
    a.add(id);
  }
  Reply r = q.conn.call(a, "keep-alive script");
  return static_cast<std::size_t>(detail::reply_integer(r.get(), q.where(), "keep-alive script"));
}

std::size_t StreamQueue::give_back(const std::vector<std::string>& ids) {
  Impl& q = *impl_;
  q.ready();
  if (ids.empty()) return 0;
  Args a;
  a.add("EVAL").add(kGiveBackScript).add("1").add(q.cfg.stream).add(q.cfg.group).add(q.cfg.consumer);
  a.add_copy(std::to_string(q.cfg.claim_idle.count() + 1));
  for (const auto& id : ids) {
    if (!valid_id(id)) throw Error(where() + ": give_back: '" + id.substr(0, 64) + "' is not a stream entry id");
    a.add(id);
  }
  Reply r = q.conn.call(a, "give-back script");
  // The next take() claims at once (this consumer included), not after claim_every.
  q.next_claim = Clock::now();
  q.claim_cursor = "0-0";
  return static_cast<std::size_t>(detail::reply_integer(r.get(), q.where(), "give-back script"));
}

StreamDepth StreamQueue::depth() {
  Impl& q = *impl_;
  q.ready();
  std::vector<Args> cmds(4);
  cmds[0].add("XLEN").add(q.cfg.stream);
  cmds[1].add("XPENDING").add(q.cfg.stream).add(q.cfg.group);
  cmds[2].add("XLEN").add(q.dead_stream);
  cmds[3].add("XINFO").add("GROUPS").add(q.cfg.stream);
  auto r = q.conn.pipeline(cmds, "reading the stream depth");
  StreamDepth d;
  d.length = static_cast<uint64_t>(detail::reply_integer(r[0].get(), q.where(), "XLEN"));
  if (r[1]->type == REDIS_REPLY_ARRAY && r[1]->elements >= 1)
    d.pending = static_cast<uint64_t>(detail::reply_integer(r[1]->element[0], q.where(), "XPENDING count"));
  d.dead = static_cast<uint64_t>(detail::reply_integer(r[2].get(), q.where(), "XLEN dead"));
  for (std::size_t g = 0; r[3]->type == REDIS_REPLY_ARRAY && g < r[3]->elements; ++g) {
    const redisReply* info = r[3]->element[g];
    bool ours = false;
    long long consumers = 0;
    for (std::size_t i = 0; info->type == REDIS_REPLY_ARRAY && i + 1 < info->elements; i += 2) {
      std::string k(info->element[i]->str ? info->element[i]->str : "", info->element[i]->len);
      const redisReply* v = info->element[i + 1];
      if (k == "name" && v->type == REDIS_REPLY_STRING) ours = std::string(v->str, v->len) == q.cfg.group;
      if (k == "consumers" && v->type == REDIS_REPLY_INTEGER) consumers = v->integer;
    }
    if (ours) d.consumers = static_cast<uint64_t>(consumers);
  }
  return d;
}

uint64_t StreamQueue::live_consumers() {
  Impl& q = *impl_;
  q.ready();
  uint64_t live = 0;
  for (const auto& c : q.consumers())
    if (c.idle >= 0 && c.idle <= q.cfg.claim_idle.count()) ++live;
  return live;
}

std::vector<std::vector<std::string>> StreamQueue::dead_letters(std::size_t max) {
  Impl& q = *impl_;
  q.ready();
  Args a;
  a.add("XRANGE").add(q.dead_stream).add("-").add("+").add("COUNT").add_copy(std::to_string(max));
  Reply r = q.conn.call(a, "XRANGE dead letters");
  std::vector<std::vector<std::string>> out;
  for (std::size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; ++i) {
    const redisReply* e = r->element[i];
    std::vector<std::string> fields;
    if (e->type == REDIS_REPLY_ARRAY && e->elements == 2 && e->element[1]->type == REDIS_REPLY_ARRAY)
      for (std::size_t j = 0; j < e->element[1]->elements; ++j)
        fields.emplace_back(e->element[1]->element[j]->str, e->element[1]->element[j]->len);
    out.push_back(std::move(fields));
  }
  return out;
}

const StreamStats& StreamQueue::stats() const { return impl_->stats; }
const StreamConfig& StreamQueue::config() const { return impl_->cfg; }
std::string StreamQueue::where() const { return impl_->where(); }

}  // namespace kf::netqueue
