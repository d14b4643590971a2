// Rendezvous over a folder (a shared filesystem), the run's control block (one node) or
// the head's Redis server (several nodes; kf::transport::network_rendezvous).
#include <sys/stat.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "comm.h"
#include "kf/common/error.h"
#include "kf/common/run_dir.h"
#include "kf/learner/learner.h"
#include "kf/replay/replay.h"
#include "kf/transport/transport.h"

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

// The network transport's blob rendezvous, as the learner's Rendezvous.
class NetworkRendezvous : public Rendezvous {
 public:
  explicit NetworkRendezvous(std::unique_ptr<transport::BlobRendezvous> rdv) : rdv_(std::move(rdv)) {}
  void put(const std::string& key, const std::string& bytes) override { rdv_->put(key, bytes); }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    return rdv_->get(key, timeout);
  }

 private:
  std::unique_ptr<transport::BlobRendezvous> rdv_;
};

}  // namespace

bool redis_rendezvous_available() { return transport::network_supported(); }

std::unique_ptr<Rendezvous> redis_rendezvous(const RedisRendezvousOptions& o) {
  if (!redis_rendezvous_available())
    throw Error(
        "redis rendezvous: this build has no network transport (hiredis was not found at configure time; run "
        "./setup.sh)");
  transport::ServerAddress server;
  server.host = o.host;
  server.port = o.port;
  server.user = o.user;
  server.password = o.password;
  return std::make_unique<NetworkRendezvous>(
      transport::network_rendezvous(server, o.scope, o.rank, o.world, o.timeout));
}

std::unique_ptr<Rendezvous> file_rendezvous(const std::string& dir) { return std::make_unique<FileRendezvous>(dir); }
std::unique_ptr<Rendezvous> control_rendezvous(replay::ControlBlock& ctl) {
  return std::make_unique<ControlRendezvous>(ctl);
}

}  // namespace kf::learner
