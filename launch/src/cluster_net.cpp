// Several nodes, the Redis side of the launchers (see cluster.h): the head's redis-server,
// the head's watch on it (run state out; nodes' reports, stream depths and the network
// counts in), a node's watch on the head's run state, and a node's reports. Supervision
// only: nothing here reads or writes a candidate, a result, a group or a kernel. Built when
// kf_netqueue is (launch/CMakeLists.txt); cluster_none.cpp stands in for it otherwise.
#include <signal.h>
#include <unistd.h>

#include <mutex>

#include "cluster.h"
#include "kf/common/error.h"
#include "kf/common/log.h"
#include "kf/netqueue/netqueue.h"
#include "supervisor.h"

namespace kf::launch {
namespace {
using namespace std::chrono_literals;

// The head's server as a launcher reaches it: on the head where it listens (its first bind
// address; 0.0.0.0 -> loopback), elsewhere at cluster.redis.host. Short timeouts: these
// calls run in a launcher's main loop.
netqueue::StreamConfig server_of(const ClusterOptions& co, bool on_head) {
  netqueue::StreamConfig sc;
  sc.host = co.host;
  if (on_head && !co.bind.empty())
    sc.host = co.bind.front() == "0.0.0.0" || co.bind.front() == "::" ? "127.0.0.1" : co.bind.front();
  sc.port = co.port;
  sc.password = co.password;
  sc.bound = co.bound;
  sc.claim_idle = co.claim_idle;
  sc.connect_timeout = 1000ms;
  sc.io_timeout = 2000ms;
  return sc;
}

netqueue::StreamConfig on_stream(netqueue::StreamConfig sc, const char* stream, const char* group) {
  sc.stream = stream;
  sc.group = group;
  return sc;
}
}  // namespace

bool cluster_supported() { return true; }

// ---------------------------------------------------------------- head: the server

struct HeadServer::Impl {
  netqueue::RedisServer server;
  std::string bind;
};

HeadServer::HeadServer(const ClusterOptions& co, const RunDir& run) {
  netqueue::ServerOptions so;
  so.bind = co.bind;
  so.port = co.port;
  so.user = "kf";
  so.password = co.password;
  so.dir = run.sub("redis");
  if (so.dir[0] != '/') {  // redis-server resolves its log file against its own folder
    char cwd[4096];
    if (::getcwd(cwd, sizeof cwd)) so.dir = std::string(cwd) + "/" + so.dir;
  }
  std::string bind;
  for (const auto& b : co.bind) bind += (bind.empty() ? "" : ",") + b;
  impl_ = std::make_unique<Impl>(Impl{netqueue::RedisServer::start(so), bind});
}
HeadServer::~HeadServer() { stop(); }
void HeadServer::stop() {
  if (impl_) impl_->server.stop();
}
bool HeadServer::alive() const { return impl_ && impl_->server.pid() > 0 && ::kill(impl_->server.pid(), 0) == 0; }
std::string HeadServer::where() const {
  return "redis-server pid " + std::to_string(impl_->server.pid()) + " on " + impl_->bind + ":" +
         std::to_string(impl_->server.port());
}

// ---------------------------------------------------------------- head: the watch

struct ClusterWatch::Impl {
  ClusterOptions co;
  netqueue::StreamConfig server;
  std::unique_ptr<netqueue::StreamQueue> reports, candidates, results, groups;
  std::unique_ptr<netqueue::KeyStore> store;
  std::string state, state_written;
  Clock::time_point next_poll{}, next_state{}, next_nodes{};
  struct Session {
    std::string role;
    bool done = false;
    Clock::time_point heard{};
  };
  std::map<std::string, NodeSeconds> figures;  // newest per node session
  std::map<std::string, Session> sessions;
  NetworkAccount account;
  bool nodes_seen = false, failing = false, bad_report_logged = false;
  uint64_t errors = 0;

  void connect() {
    if (!store) store = std::make_unique<netqueue::KeyStore>(netqueue::KeyStore::open(server));
    auto open = [&](std::unique_ptr<netqueue::StreamQueue>& q, const char* stream, const char* group) {
      if (!q)
        q = std::make_unique<netqueue::StreamQueue>(netqueue::StreamQueue::open(on_stream(server, stream, group)));
    };
    open(reports, kNodeSecondsStream, "head");
    open(candidates, netqueue::kCandidatesStream, netqueue::kEvaluatorsGroup);
    open(results, netqueue::kResultsStream, netqueue::kHeadGroup);
    open(groups, netqueue::kGroupsStream, netqueue::kHeadGroup);
  }
  void write_state() {
    const auto now = Clock::now();
    if (state.empty() || (state == state_written && now < next_state)) return;
    store->set(netqueue::kRunStateKey, state);
    state_written = state;
    next_state = now + 1s;
  }
  void look_for_actor_nodes() {
    const auto now = Clock::now();
    if (nodes_seen || now < next_nodes) return;
    next_nodes = now + 1s;
    if (const auto v = store->get(netqueue::kActorNodesKey)) {
      nodes_seen = true;
      log_info("launch: actor node ", *v, " connected to the head's server");
    }
  }
  void take_reports() {
    const auto msgs = reports->take(256, 0ms);
    if (msgs.empty()) return;
    std::vector<std::string> ids;
    for (const auto& m : msgs) {
      ids.push_back(m.id);
      try {
        const NodeReport r = decode_node_report(m.data, std::string(kNodeSecondsStream) + " entry " + m.id);
        figures[r.session].raise_to(r.figures);
        Session& s = sessions[r.session];
        s.role = r.role;
        s.done = s.done || r.done;
        s.heard = Clock::now();
      } catch (const std::exception& e) {
        if (!bad_report_logged)
          log_error("launch: ", e.what(),
                    "; dropped (the time split leaves it out; further ones are dropped silently)");
        bad_report_logged = true;
      }
    }
    reports->ack(ids);
  }
  void read_account() {
    const netqueue::NetworkCounts c = netqueue::network_counts(*store);  // the watch's own connection
    const netqueue::StreamDepth cd = candidates->depth();
    NetworkAccount a;
    a.read = true;
    a.created = c.candidates_published;
    a.scored = c.results_sent;
    a.dead = cd.dead;
    a.dropped = c.dropped;
    a.in_flight = cd.pending;
    a.queued = cd.length > cd.pending ? cd.length - cd.pending : 0;
    a.results_waiting = results->depth().length;
    a.groups_waiting = groups->depth().length;
    a.results_joined = c.results_joined;
    a.results_orphan = c.results_orphan;
    a.results_duplicate = c.results_duplicate;
    a.results_late = c.results_late;
    a.claimed_again = c.claimed_again;
    a.undecodable = c.undecodable;
    a.unqueued = c.unqueued;
    a.members_lost = c.members_lost;
    a.groups_published = c.groups_published;
    a.groups_opened = c.groups_opened;
    a.groups_dropped = c.groups_dropped;
    a.groups_duplicate = c.groups_duplicate;
    a.known_results = c.known_results;
    a.kernels_inserted = c.kernels_inserted;
    account = a;
  }
};

ClusterWatch::ClusterWatch(const ClusterOptions& co) : impl_(std::make_unique<Impl>()) {
  impl_->co = co;
  impl_->server = server_of(co, /*on_head=*/true);
}
ClusterWatch::~ClusterWatch() = default;

void ClusterWatch::set_run_state(const std::string& state) { impl_->state = state; }

bool ClusterWatch::poll(bool now) {
  Impl& m = *impl_;
  if (!now && Clock::now() < m.next_poll) return !m.failing;
  m.next_poll = Clock::now() + 250ms;
  try {
    m.connect();
    m.write_state();
    m.look_for_actor_nodes();
    m.take_reports();
    m.read_account();
    if (m.failing) log_info("launch: ", where(), " answers again");
    m.failing = false;
  } catch (const std::exception& e) {
    ++m.errors;
    if (!m.failing)
      log_error("launch: reading the head's server failed (", message_of(e),
                "); the status keeps its last network figures, retrying");
    m.failing = true;
    m.reports.reset();
    m.candidates.reset();
    m.results.reset();
    m.groups.reset();
    m.store.reset();
    m.next_poll = Clock::now() + 1s;
  }
  return !m.failing;
}

NetworkAccount ClusterWatch::account() const { return impl_->account; }
std::map<std::string, NodeSeconds> ClusterWatch::node_seconds() const { return impl_->figures; }
uint64_t ClusterWatch::reported_verdicts() const {
  uint64_t n = 0;
  for (const auto& [k, v] : impl_->figures) n += v.verdicts;
  return n;
}
bool ClusterWatch::actor_nodes_seen() const { return impl_->nodes_seen; }
int ClusterWatch::actor_nodes_running() const {
  // Nodes report at least every second; one silent for longer than this is gone.
  const auto silent = std::max<Clock::duration>(impl_->co.gone_after, 5s);
  int n = 0;
  for (const auto& [k, s] : impl_->sessions)
    if (s.role == "actors" && !s.done && Clock::now() - s.heard < silent) ++n;
  return n;
}
uint64_t ClusterWatch::errors() const { return impl_->errors; }
std::string ClusterWatch::where() const {
  return "redis at " + impl_->server.host + ":" + std::to_string(impl_->server.port);
}

// ---------------------------------------------------------------- node: the head's state

struct HeadWatch::Impl {
  ClusterOptions co;
  netqueue::StreamConfig server;
  std::unique_ptr<netqueue::KeyStore> store;
  std::string state;
  Clock::time_point next_poll{}, last_answer = Clock::now();
  bool failing = false;
};

HeadWatch::HeadWatch(const ClusterOptions& co) : impl_(std::make_unique<Impl>()) {
  impl_->co = co;
  impl_->server = server_of(co, /*on_head=*/false);
}
HeadWatch::~HeadWatch() = default;

std::string HeadWatch::run_state() {
  Impl& m = *impl_;
  const auto now = Clock::now();
  if (now < m.next_poll) return m.state;
  m.next_poll = now + 500ms;
  try {
    if (!m.store) m.store = std::make_unique<netqueue::KeyStore>(netqueue::KeyStore::open(m.server));
    if (const auto s = m.store->get(netqueue::kRunStateKey)) m.state = *s;
    m.last_answer = Clock::now();
    if (m.failing) log_info("launch: node ", m.co.node_name, ": the head's server answers again");
    m.failing = false;
  } catch (const std::exception& e) {
    if (!m.failing)
      log_warn("launch: node ", m.co.node_name, ": reading the head's run state failed (", message_of(e),
               "); retrying for up to ", m.co.gone_after.count() / 1000.0, " s (cluster.redis.gone_after_s)");
    m.failing = true;
    m.store.reset();
  }
  return m.state;
}

bool HeadWatch::gone() const { return Clock::now() - impl_->last_answer > impl_->co.gone_after; }

// ---------------------------------------------------------------- node: reports

struct NodeReporter::Impl {
  ClusterOptions co;
  std::string role, session;
  std::unique_ptr<netqueue::StreamQueue> q;
  NodeSeconds sent;
  bool any_sent = false, failing = false;
  Clock::time_point next{}, last_sent{};

  bool send(const NodeSeconds& s, bool done) {
    try {
      if (!q) {
        netqueue::StreamConfig sc = on_stream(server_of(co, /*on_head=*/false), kNodeSecondsStream, "head");
        sc.bound = 4096;
        q = std::make_unique<netqueue::StreamQueue>(netqueue::StreamQueue::open(sc));
      }
      // Cumulative figures: a report that finds the stream full is dropped, the next carries it.
      const bool in = q->push(0, encode_node_report({session, role, s, done}), 100ms);
      if (in) {
        sent = s;
        any_sent = true;
        last_sent = Clock::now();
      }
      failing = false;
      return in;
    } catch (const std::exception& e) {
      q.reset();
      if (!failing)
        log_warn("launch: node ", co.node_name, ": reporting to the head failed (", message_of(e),
                 "); the head's time split misses this node's figures until a report gets through");
      failing = true;
      return false;
    }
  }
};

NodeReporter::NodeReporter(const ClusterOptions& co, std::string role) : impl_(std::make_unique<Impl>()) {
  impl_->co = co;
  impl_->role = std::move(role);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  impl_->session = co.node_name + "/" + std::to_string(::getpid()) + "/" + std::to_string(ms);
}
NodeReporter::~NodeReporter() = default;
const std::string& NodeReporter::session() const { return impl_->session; }

void NodeReporter::report(const NodeSeconds& s, bool force) {
  Impl& m = *impl_;
  const auto now = Clock::now();
  if (!force && now < m.next) return;
  // Unchanged figures go again once a second: the head tells a live node from a gone one.
  if (m.any_sent && s == m.sent && now - m.last_sent < 1s) return;
  m.next = now + 500ms;
  (void)m.send(s, false);
}

bool NodeReporter::finish(const NodeSeconds& s) { return impl_->send(s, true); }

}  // namespace kf::launch
