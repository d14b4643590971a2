// KeyStore (see kf/netqueue/netqueue.h).
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

std::string KeyStore::where() const { return impl_->conn.where(); }

}  // namespace kf::netqueue
