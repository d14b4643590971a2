// KeyStore: plain keys on the run's Redis server (binary-safe values), for what several
// nodes read and one node writes: the policy snapshot and the kernel database that the
// head publishes to actor nodes, and the head's run state (docs/cluster.md, "Actor nodes").
//
// Every call reconnects first if the connection broke; errors throw kf::Error naming the
// server ("redis at HOST:PORT: ..."). Keys must lie under the ACL user's prefix (kf:).
// Threading: one object per thread.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kf/netqueue/stream_queue.h"  // StreamConfig: host, port, user, password, timeouts

namespace kf::netqueue {

class KeyStore {
 public:
  // Connects and AUTHs (throws kf::Error naming the server). Uses host, port, user,
  // password, connect_timeout and io_timeout of `cfg`.
  static KeyStore open(const StreamConfig& cfg);
  KeyStore(KeyStore&&) noexcept;
  KeyStore& operator=(KeyStore&&) noexcept;
  ~KeyStore();

  void set(const std::string& key, const std::string& value);
  // Sets several keys in one atomic step (MSET): readers never see one without the other.
  void set_many(const std::vector<std::pair<std::string, std::string>>& kv);
  std::optional<std::string> get(const std::string& key);
  std::string where() const;  // "redis at HOST:PORT"

  struct Impl;

 private:
  explicit KeyStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kf::netqueue
