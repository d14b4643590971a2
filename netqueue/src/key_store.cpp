// KeyStore (see kf/netqueue/netqueue.h): plain keys and hash counters.
#include "kf/netqueue/netqueue.h"

#include "conn.h"
#include "kf/common/error.h"

namespace kf::netqueue {

using detail::Args;
using detail::Conn;

struct KeyStore::Impl {
  Conn conn;
  explicit Impl(const StreamConfig& c) : conn(c.host, c.port, c.user, c.password, c.connect_timeout, c.io_timeout) {}
  Conn& live() {
    if (conn.broken()) conn.reconnect();
    return conn;
  }
};

KeyStore::KeyStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
KeyStore::KeyStore(KeyStore&&) noexcept = default;
KeyStore& KeyStore::operator=(KeyStore&&) noexcept = default;
KeyStore::~KeyStore() = default;

KeyStore KeyStore::open(const StreamConfig& cfg) { return KeyStore(std::make_unique<Impl>(cfg)); }

void KeyStore::set(const std::string& key, const std::string& value) {
  Args a;
  a.add("SET").add(key).add(value);
  (void)impl_->live().call(a, "SET");
}

void KeyStore::set_many(const std::vector<std::pair<std::string, std::string>>& kv) {
  if (kv.empty()) return;
  Args a;
  a.add("MSET");
  for (const auto& [k, v] : kv) a.add(k).add(v);
  (void)impl_->live().call(a, "MSET");
}

std::optional<std::string> KeyStore::get(const std::string& key) {
  Args a;
  a.add("GET").add(key);
  auto r = impl_->live().call(a, "GET");
  if (r->type == REDIS_REPLY_NIL) return std::nullopt;
  return detail::reply_string(r.get(), impl_->conn.where(), "GET");
}

void KeyStore::add(const std::string& key, const std::vector<std::pair<std::string, int64_t>>& deltas) {
  if (deltas.empty()) return;
  std::vector<Args> cmds(deltas.size());
  for (std::size_t i = 0; i < deltas.size(); ++i)
    cmds[i].add("HINCRBY").add(key).add(deltas[i].first).add_copy(std::to_string(deltas[i].second));
  (void)impl_->live().pipeline(cmds, "HINCRBY");
}

std::vector<std::pair<std::string, int64_t>> KeyStore::counts(const std::string& key) {
  Args a;
  a.add("HGETALL").add(key);
  auto r = impl_->live().call(a, "HGETALL");
  std::vector<std::pair<std::string, int64_t>> out;
  for (std::size_t i = 0; r->type == REDIS_REPLY_ARRAY && i + 1 < r->elements; i += 2) {
    const std::string f = detail::reply_string(r->element[i], impl_->conn.where(), "HGETALL field");
    const std::string v = detail::reply_string(r->element[i + 1], impl_->conn.where(), "HGETALL value");
    try {
      std::size_t used = 0;
      const long long n = std::stoll(v, &used);
      if (used == v.size()) out.emplace_back(f, n);
    } catch (const std::exception&) {  // not a counter: left out
    }
  }
  return out;
}

std::string KeyStore::where() const { return impl_->conn.where(); }

}  // namespace kf::netqueue
