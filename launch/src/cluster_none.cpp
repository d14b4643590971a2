// Several nodes in a build without the Redis queue (hiredis was not found, so kf_netqueue
// was not built; launch/CMakeLists.txt picks this file instead of cluster_net.cpp): the same
// functions, and every role but `all` is refused. cluster_options() already refuses those
// roles with a message naming cluster.role; the constructors here say it again for a caller
// that skipped it.
#include "cluster.h"
#include "kf/common/error.h"

namespace kf::launch {
namespace {
[[noreturn]] void no_redis(const char* what) {
  throw Error(std::string("cluster.role: ") + what +
              " needs the Redis queue, which this build lacks (hiredis was not found; run ./setup.sh)");
}
}  // namespace

bool cluster_supported() { return false; }

struct HeadServer::Impl {};
HeadServer::HeadServer(const ClusterOptions&, const RunDir&) { no_redis("head"); }
HeadServer::~HeadServer() = default;
void HeadServer::stop() {}
bool HeadServer::alive() const { return false; }
std::string HeadServer::where() const { return "none"; }

struct ClusterWatch::Impl {};
ClusterWatch::ClusterWatch(const ClusterOptions&) { no_redis("head"); }
ClusterWatch::~ClusterWatch() = default;
void ClusterWatch::set_run_state(const std::string&) {}
bool ClusterWatch::poll(bool) { return false; }
NetworkAccount ClusterWatch::account() const { return {}; }
std::map<std::string, NodeSeconds> ClusterWatch::node_seconds() const { return {}; }
uint64_t ClusterWatch::reported_verdicts() const { return 0; }
bool ClusterWatch::actor_nodes_seen() const { return false; }
int ClusterWatch::actor_nodes_running() const { return 0; }
uint64_t ClusterWatch::errors() const { return 0; }
std::string ClusterWatch::where() const { return "none"; }

struct HeadWatch::Impl {};
HeadWatch::HeadWatch(const ClusterOptions&) { no_redis("evaluators or actors"); }
HeadWatch::~HeadWatch() = default;
std::string HeadWatch::run_state() { return ""; }
bool HeadWatch::gone() const { return true; }

struct NodeReporter::Impl {
  std::string session;
};
NodeReporter::NodeReporter(const ClusterOptions&, std::string) : impl_(std::make_unique<Impl>()) {}
NodeReporter::~NodeReporter() = default;
const std::string& NodeReporter::session() const { return impl_->session; }
void NodeReporter::report(const NodeSeconds&, bool) {}
bool NodeReporter::finish(const NodeSeconds&) { return false; }

}  // namespace kf::launch
