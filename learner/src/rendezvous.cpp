// Rendezvous over a folder (a shared filesystem), the run's control block (one node) or
// the run's Redis server (several nodes; kf::netqueue::StoreRendezvous).
#include <sys/stat.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "kf/common/error.h"
#include "kf/common/run_dir.h"
#include "kf/learner/learner.h"
#include "kf/replay/replay.h"
#ifdef KF_HAVE_NETQUEUE
#include "kf/netqueue/netqueue.h"
#endif

namespace kf::learner {
namespace {

class FileRendezvous : public Rendezvous {
 public:
  explicit FileRendezvous(std::string dir) : dir_(std::move(dir)) {}
  void put(const std::string& key, const std::string& bytes) override { write_file_atomic(dir_ + "/" + key, bytes); }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    const std::string path = dir_ + "/" + key;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      std::ifstream in(path, std::ios::binary);
      if (in) {
        std::ostringstream os;
        os << in.rdbuf();
        return os.str();
      }
      if (std::chrono::steady_clock::now() > deadline)
        throw Error("rendezvous file " + path + ": not written within " + std::to_string(timeout.count()) + " ms");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

 private:
  std::string dir_;
};

class ControlRendezvous : public Rendezvous {
 public:
  explicit ControlRendezvous(replay::ControlBlock& ctl) : ctl_(ctl) {}
  void put(const std::string& key, const std::string& bytes) override {
    ctl_.rendezvous_put(key, bytes.data(), bytes.size());
  }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    auto v = ctl_.rendezvous_get(key, timeout);
    if (!v)
      throw Error("rendezvous key '" + key + "' in the control block: not put within " +
                  std::to_string(timeout.count()) + " ms");
    return *v;
  }

 private:
  replay::ControlBlock& ctl_;
};

#ifdef KF_HAVE_NETQUEUE
class RedisRendezvous : public Rendezvous {
 public:
  explicit RedisRendezvous(const netqueue::RendezvousConfig& c) : rdv_(c) {}
  void put(const std::string& key, const std::string& bytes) override { rdv_.publish(key, bytes); }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    return rdv_.fetch(key, timeout);
  }

 private:
  netqueue::StoreRendezvous rdv_;
};
#endif

}  // namespace

#ifdef KF_HAVE_NETQUEUE
bool redis_rendezvous_available() { return true; }
std::unique_ptr<Rendezvous> redis_rendezvous(const RedisRendezvousOptions& o) {
  netqueue::RendezvousConfig c;
  c.server.host = o.host;
  c.server.port = o.port;
  c.server.user = o.user;
  c.server.password = o.password;
  c.scope = o.scope;
  c.rank = o.rank;
  c.world = o.world;
  c.timeout = o.timeout;
  return std::make_unique<RedisRendezvous>(c);
}
#else
bool redis_rendezvous_available() { return false; }
std::unique_ptr<Rendezvous> redis_rendezvous(const RedisRendezvousOptions&) {
  throw Error(
      "redis rendezvous: this build has no Redis queue (hiredis was not found at configure time; run ./setup.sh)");
}
#endif

std::unique_ptr<Rendezvous> file_rendezvous(const std::string& dir) { return std::make_unique<FileRendezvous>(dir); }
std::unique_ptr<Rendezvous> control_rendezvous(replay::ControlBlock& ctl) {
  return std::make_unique<ControlRendezvous>(ctl);
}

}  // namespace kf::learner
