// Several nodes (see cluster.h).
#include "cluster.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "kf/common/error.h"
#include "kf/common/log.h"
#include "kf/evaluator/evaluator.h"
#include "kf/learner/learner.h"
#include "kf/replay/replay.h"
#include "launch_common.h"
#include "supervisor.h"

#ifdef KF_HAVE_NETQUEUE
#include "kf/netqueue/netqueue.h"
#endif

namespace kf::launch {
namespace {
using namespace std::chrono_literals;

std::string host_name() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof buf - 1) != 0 || !buf[0]) return "node";
  return buf;
}

// A numeric IPv4/IPv6 address for `host` (redis-server's bind takes addresses).
std::string numeric_address(const std::string& host, const std::string& key) {
  in6_addr a6;
  in_addr a4;
  if (inet_pton(AF_INET, host.c_str(), &a4) == 1 || inet_pton(AF_INET6, host.c_str(), &a6) == 1) return host;
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || !res)
    throw Error(key + ": cannot resolve '" + host +
                "' to an address (give an IP address, or a name this node resolves)");
  char buf[INET_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, buf, sizeof buf);
  freeaddrinfo(res);
  return buf;
}
}  // namespace

bool cluster_supported() {
#ifdef KF_HAVE_NETQUEUE
  return true;
#else
  return false;
#endif
}

namespace {
// Where the learner ranks run, and whether that can work: ranks on several nodes talk only
// over NCCL (the cpu communicator is one host's /dev/shm segment).
void check_learner_layout(const Config& cfg, const ClusterOptions& o) {
  const std::string R = std::to_string(o.learner_world), k = std::to_string(o.head_learner_ranks);
  if (o.head_learner_ranks > o.learner_world)
    throw error_at(cfg.source(), "cluster.head_learner_ranks: " + k + " is more than learner.dist.ranks (" + R + ")");
  if (o.role == "learners" && !o.learners_split())
    throw error_at(cfg.source(), "cluster.role: learners, but cluster.head_learner_ranks (" + k +
                                     ") leaves no learner rank off the head: " +
                                     (o.learner_world < 2 ? "learner.dist.ranks must be at least 2 (it is " + R + ")"
                                                          : "set it to 1.." + std::to_string(o.learner_world - 1) +
                                                                " (learner.dist.ranks " + R + ")"));
  if (!o.learners_split()) return;
  if (o.role == "all")
    throw error_at(cfg.source(), "cluster.head_learner_ranks: " + k + " of learner.dist.ranks " + R +
                                     " puts learner ranks on other nodes, but cluster.role is all (one node): use "
                                     "cluster.role head with learners nodes, or set it to 0");
  if (o.role == "learners" && o.first_learner_rank() + o.learner_ranks > o.learner_world)
    throw error_at(cfg.source(), "cluster.learner_node_index: learners node " + std::to_string(o.learner_node_index) +
                                     " would run ranks " + std::to_string(o.first_learner_rank()) + ".." +
                                     std::to_string(o.first_learner_rank() + o.learner_ranks - 1) +
                                     ", beyond learner.dist.ranks " + R + " (cluster.head_learner_ranks " + k +
                                     ", cluster.learner_ranks " + std::to_string(o.learner_ranks) + " per node)");
  if (o.role != "head" && o.role != "learners") return;  // evaluator nodes run no learner rank
  // The learner ranks of this node pick a GPU when one is visible (kf-learner --device auto).
  const std::string comm = cfg.get_string("learner.dist.comm");
  const int gpus = cuda_device_count();
  if (gpus == 0 || comm == "cpu" || !learner::nccl_available())
    throw error_at(cfg.source(),
                   "cluster.head_learner_ranks: " + k + " of learner.dist.ranks " + R +
                       " on the head puts learner ranks on several nodes, which needs NCCL on CUDA (here " +
                       (gpus == 0 ? "no GPU is visible on this node, " : "") + "learner.dist.comm " + comm +
                       (learner::nccl_available() ? "" : ", and this build has no NCCL") +
                       "): the cpu communicator is one host's shared memory and cannot cross nodes");
}
}  // namespace

void check_head_actors(const Config& cfg, const std::vector<std::string>& roles) {
  const std::string role = cfg.get_string("cluster.role");
  if (cfg.get_int("cluster.head_actors") != 0 || (role != "head" && role != "all")) return;
  if (role == "all")
    throw error_at(cfg.source(),
                   "cluster.head_actors: 0 on one node (cluster.role all): nothing would sample; it applies to a head "
                   "with actor nodes (cluster.role head, nodes with cluster.role actors), -1 runs actors.count");
  if (!roles.empty() && std::find(roles.begin(), roles.end(), "actors") == roles.end())
    throw error_at(
        cfg.source(),
        "cluster.head_actors: 0, but no node of the run is an actor node (cluster.nodes: no 'actors' entry" +
            std::string(cfg.get_strings("cluster.nodes").empty() ? "; without cluster.nodes --slurm makes "
                                                                   "every node but the head an evaluator node"
                                                                 : "") +
            "): nothing would sample; list actor nodes in cluster.nodes or let the head run actors "
            "(cluster.head_actors -1 or more)");
}

ClusterOptions cluster_options(const Config& cfg) {
  ClusterOptions o;
  o.role = cfg.get_string("cluster.role");
  o.node_name = cfg.get_string("cluster.node_name");
  if (o.node_name.empty()) o.node_name = host_name();
  for (char c : o.node_name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'))
      throw error_at(cfg.source(), "cluster.node_name: '" + o.node_name +
                                       "' may hold only letters, digits, '-', '_' and '.' (it names folders)");
  o.head_evaluators = static_cast<int>(cfg.get_int("cluster.head_evaluators"));
  o.head_actors = static_cast<int>(cfg.get_int("cluster.head_actors"));
  check_head_actors(cfg, cfg.get_strings("cluster.nodes"));
  o.host = cfg.get_string("cluster.redis.host");
  o.port = static_cast<int>(cfg.get_int("cluster.redis.port"));
  o.bound = static_cast<uint64_t>(cfg.get_int("cluster.redis.bound"));
  o.claim_idle = std::chrono::milliseconds(static_cast<long long>(cfg.get_float("cluster.redis.claim_idle_s") * 1000));
  o.gone_after = std::chrono::milliseconds(static_cast<long long>(cfg.get_float("cluster.redis.gone_after_s") * 1000));
  o.password_env = cfg.get_string("cluster.redis.password_env");
  o.learner_world = static_cast<int>(cfg.get_int("learner.dist.ranks"));
  o.head_learner_ranks = static_cast<int>(cfg.get_int("cluster.head_learner_ranks"));
  o.learner_ranks = static_cast<int>(cfg.get_int("cluster.learner_ranks"));
  o.learner_node_index = static_cast<int>(cfg.get_int("cluster.learner_node_index"));
  check_learner_layout(cfg, o);
  if (!o.remote()) return o;
  if (!cluster_supported())
    throw error_at(cfg.source(), "cluster.role: " + o.role +
                                     " needs the Redis queue, and this build has none "
                                     "(hiredis was not found at configure time; run ./setup.sh)");
  if (o.host.empty()) throw error_at(cfg.source(), "cluster.redis.host: empty");
  const char* pw = o.password_env.empty() ? nullptr : std::getenv(o.password_env.c_str());
  if (!pw || !*pw)
    throw error_at(cfg.source(), "cluster.redis.password_env: the environment variable '" + o.password_env +
                                     "' is unset or empty; every node of the run needs the same Redis password there "
                                     "(tools/launch --slurm makes one when it is unset)");
  o.password = pw;
  if (o.password.find_first_of(" \t\r\n") != std::string::npos)
    throw error_at(cfg.source(), "cluster.redis.password_env: the password in $" + o.password_env +
                                     " holds whitespace, which redis-server's config cannot take");
  if (o.role == "head") {
    for (const auto& b : cfg.get_strings("cluster.redis.bind"))
      o.bind.push_back(numeric_address(b, "cluster.redis.bind"));
    if (o.bind.empty()) o.bind.push_back(numeric_address(o.host, "cluster.redis.host"));
  }
  return o;
}

// ---------------------------------------------------------------- Slurm

std::vector<std::string> expand_nodelist(const std::string& list) {
  std::vector<std::string> out;
  auto bad = [&](const std::string& why) { return Error("SLURM_JOB_NODELIST '" + list + "': " + why); };
  std::size_t i = 0;
  while (i < list.size()) {
    // one entry: prefix [ranges] suffix, up to a ',' outside brackets
    std::string prefix;
    while (i < list.size() && list[i] != ',' && list[i] != '[') prefix += list[i++];
    if (i < list.size() && list[i] == '[') {
      const std::size_t close = list.find(']', i);
      if (close == std::string::npos) throw bad("'[' without ']'");
      const std::string ranges = list.substr(i + 1, close - i - 1);
      i = close + 1;
      std::string suffix;
      while (i < list.size() && list[i] != ',') suffix += list[i++];
      if (ranges.empty()) throw bad("empty brackets");
      std::size_t a = 0;
      while (a <= ranges.size()) {
        std::size_t b = ranges.find(',', a);
        if (b == std::string::npos) b = ranges.size();
        const std::string r = ranges.substr(a, b - a);
        const std::size_t dash = r.find('-');
        const std::string lo = r.substr(0, dash), hi = dash == std::string::npos ? lo : r.substr(dash + 1);
        if (lo.empty() || hi.empty() || lo.find_first_not_of("0123456789") != std::string::npos ||
            hi.find_first_not_of("0123456789") != std::string::npos)
          throw bad("range '" + r + "' is not N or N-M");
        const long from = std::stol(lo), to = std::stol(hi);
        if (to < from || to - from > 100000) throw bad("range '" + r + "' runs backwards or is too long");
        for (long n = from; n <= to; ++n) {
          std::string num = std::to_string(n);
          if (num.size() < lo.size()) num.insert(0, lo.size() - num.size(), '0');  // node[01-03]
          out.push_back(prefix + num + suffix);
        }
        a = b + 1;
      }
    } else if (!prefix.empty()) {
      out.push_back(prefix);
    }
    if (i < list.size() && list[i] == ',') ++i;
  }
  if (out.empty()) throw bad("no node names");
  return out;
}

SlurmPlan slurm_plan(const std::function<std::string(const std::string&)>& env,
                     const std::vector<std::string>& node_roles) {
  SlurmPlan p;
  p.job_id = env("SLURM_JOB_ID");
  if (p.job_id.empty())
    throw Error("--slurm: SLURM_JOB_ID is not set; run inside an allocation (sbatch or salloc), or drop --slurm");
  const std::string list = env("SLURM_JOB_NODELIST").empty() ? env("SLURM_NODELIST") : env("SLURM_JOB_NODELIST");
  if (list.empty()) throw Error("--slurm: SLURM_JOB_NODELIST is not set (job " + p.job_id + ")");
  p.hosts = expand_nodelist(list);
  p.nodes = static_cast<int>(p.hosts.size());
  p.in_step = env("KF_SLURM_STEP") == "1";
  if (p.in_step) {
    const std::string id = env("SLURM_NODEID");
    if (id.empty() || id.find_first_not_of("0123456789") != std::string::npos)
      throw Error("--slurm: SLURM_NODEID '" + id + "' is not a node number (job " + p.job_id + ")");
    p.node_id = std::stoi(id);
    if (p.node_id >= p.nodes)
      throw Error("--slurm: SLURM_NODEID " + id + " but SLURM_JOB_NODELIST names " + std::to_string(p.nodes) +
                  " node(s)");
  }
  std::vector<std::string> roles = node_roles;
  if (roles.empty()) {
    roles.assign(static_cast<std::size_t>(p.nodes), "evaluators");
    roles[0] = p.nodes == 1 ? "all" : "head";
  }
  if (static_cast<int>(roles.size()) != p.nodes)
    throw Error("cluster.nodes: " + std::to_string(roles.size()) + " role(s) for the allocation's " +
                std::to_string(p.nodes) + " node(s) (" + list + "); give one per node or leave it empty");
  int heads = 0, head_at = 0;
  for (std::size_t i = 0; i < roles.size(); ++i) {
    if (roles[i] != "head" && roles[i] != "evaluators" && roles[i] != "learners" && roles[i] != "actors" &&
        roles[i] != "all")
      throw Error("cluster.nodes: entry " + std::to_string(i) + " is '" + roles[i] +
                  "'; each is head, evaluators, learners or actors");
    if (roles[i] == "head" || roles[i] == "all") ++heads, head_at = static_cast<int>(i);
  }
  if (heads != 1 || (roles.size() > 1 && roles[static_cast<std::size_t>(head_at)] == "all"))
    throw Error("cluster.nodes: exactly one node must be the head (got " + std::to_string(heads) + ")");
  p.head_host = p.hosts[static_cast<std::size_t>(head_at)];
  p.role = roles[static_cast<std::size_t>(p.node_id)];
  p.roles = roles;
  if (p.in_step) {
    p.sets = {"cluster.role=" + p.role, "cluster.redis.host=" + p.head_host,
              "cluster.node_name=" + p.hosts[static_cast<std::size_t>(p.node_id)]};
    if (p.role == "learners")  // its place among the learners nodes picks its ranks
      p.sets.push_back("cluster.learner_node_index=" +
                       std::to_string(std::count(roles.begin(), roles.begin() + p.node_id, "learners")));
  }
  return p;
}

std::vector<std::string> srun_argv(const SlurmPlan& plan, const std::vector<std::string>& launch_argv) {
  const std::string n = std::to_string(plan.nodes);
  std::vector<std::string> a = {"srun", "--nodes=" + n, "--ntasks=" + n, "--ntasks-per-node=1",
                                // a launcher may exit 1 (its run failed); the others still finish
                                "--kill-on-bad-exit=0", "--export=ALL,KF_SLURM_STEP=1"};
  a.insert(a.end(), launch_argv.begin(), launch_argv.end());
  return a;
}

// ---------------------------------------------------------------- head: the server

#ifdef KF_HAVE_NETQUEUE
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
#else
struct HeadServer::Impl {};
HeadServer::HeadServer(const ClusterOptions&, const RunDir&) {
  throw Error("cluster.role: head needs the Redis queue, which this build lacks (no hiredis)");
}
HeadServer::~HeadServer() = default;
void HeadServer::stop() {}
bool HeadServer::alive() const { return false; }
std::string HeadServer::where() const { return "none"; }
#endif

// ---------------------------------------------------------------- head: the bridge

#ifdef KF_HAVE_NETQUEUE
struct RemoteBridge::Impl {
  replay::RunShm& shm;
  ClusterOptions co;
  bool train_on_degenerate = false;
  netqueue::StreamQueue out, in, reports;
  std::map<std::string, NodeSeconds> node_secs;  // newest report per node session (under mu)
  Clock::time_point next_reports{};
  bool bad_report_logged = false;
  struct Held {
    replay::ShmQueue::Slot claim;
    std::string task, source;
    int64_t policy_version = 0;
    uint64_t group_id = 0;
    uint32_t index_in_group = 0;
  };
  std::map<uint64_t, Held> held;  // candidate id -> its claim in the shm queue (thread only)
  mutable std::mutex mu;
  BridgeCounters c;
  std::atomic<bool> stop{false};
  std::thread thread;
  bool failing = false;

  Impl(replay::RunShm& s, const ClusterOptions& o, bool tod, netqueue::StreamQueue q_out, netqueue::StreamQueue q_in,
       netqueue::StreamQueue q_reports)
      : shm(s),
        co(o),
        train_on_degenerate(tod),
        out(std::move(q_out)),
        in(std::move(q_in)),
        reports(std::move(q_reports)) {}

  std::size_t dead_seen = 0;  // entries of kf:candidates:dead already handled
  std::chrono::steady_clock::time_point next_dead_check{};
  void results_back();
  void candidates_out(bool wait);
  void dead_letters();
  void node_reports();
  void loop();
};

// Evaluator and actor nodes' seconds (NodeReporter): the newest report per session.
void RemoteBridge::Impl::node_reports() {
  const auto now = Clock::now();
  if (now < next_reports) return;
  next_reports = now + 250ms;
  const auto msgs = reports.take(256, 0ms);
  if (msgs.empty()) return;
  std::vector<std::string> ids;
  for (const auto& m : msgs) {
    ids.push_back(m.id);
    try {
      auto [session, secs] = decode_node_report(m.data, std::string(kNodeSecondsStream) + " entry " + m.id);
      std::lock_guard<std::mutex> g(mu);
      node_secs[session].raise_to(secs);
      ++c.reports;
    } catch (const std::exception& e) {
      if (!bad_report_logged)
        log_error("launch: redis bridge: ", e.what(),
                  "; dropped (the time split leaves it out; further ones are "
                  "dropped silently)");
      bad_report_logged = true;
    }
  }
  reports.ack(ids);
}

void RemoteBridge::Impl::results_back() {
  const auto msgs = in.take(256, 50ms);
  if (msgs.empty()) return;
  std::vector<std::string> ids;
  for (const auto& m : msgs) {
    ids.push_back(m.id);
    auto it = held.find(m.tag);
    if (it == held.end()) {
      std::lock_guard<std::mutex> g(mu);
      ++c.duplicates;
      log_warn("launch: redis bridge: a second result for candidate ", m.tag,
               " (it was already scored, or its claim is gone); dropped and counted as a duplicate");
      continue;
    }
    Held& h = it->second;
    replay::Result r;
    try {
      r = replay::decode_result(reinterpret_cast<const unsigned char*>(m.data.data()), m.data.size(),
                                "kf:results entry " + m.id);
    } catch (const std::exception& e) {
      r = replay::Result{};
      r.verdict = replay::Verdict::runtime_error;
      r.cause = replay::Cause::environment;
      r.reason = std::string("the result did not decode: ") + e.what();
      log_error("launch: redis bridge: result of candidate ", m.tag, " did not decode (", e.what(),
                "); scored runtime_error (environment) so that its group completes");
    }
    // Routing comes from the candidate this node holds, not from the network.
    r.candidate_id = m.tag;
    r.group_id = h.group_id;
    r.index_in_group = h.index_in_group;
    // Into the group's empty slot, as a local evaluator writes it (a result whose group is
    // gone is counted orphan by the replay); then the claim is acknowledged.
    bool stored = true;
    try {
      (void)shm.replay().add_result(r);
    } catch (const std::exception& e) {
      stored = false;
      shm.candidates().raw().drop(&h.claim, 1);
      std::lock_guard<std::mutex> g(mu);
      ++c.unstored;
      log_error("launch: redis bridge: storing the result of candidate ", m.tag, " in the replay failed (", e.what(),
                "); the candidate is counted lost (dropped) and its group will hit its deadline");
    }
    if (stored) {
      shm.candidates().raw().release(&h.claim, 1);
      if (r.verdict == replay::Verdict::ok) {
        const double db_speedup = r.task_degenerate ? 1.0 : r.speedup;
        (void)shm.kernels().insert({h.task, db_speedup, h.policy_version, h.source, 0});
      }
      std::lock_guard<std::mutex> g(mu);
      ++c.results;
    }
    held.erase(it);
    std::lock_guard<std::mutex> g(mu);
    c.on_network = held.size();
  }
  in.ack(ids);
}

void RemoteBridge::Impl::candidates_out(bool wait) {
  if (held.size() >= co.bound) return;
  const std::size_t room = std::min<std::size_t>(64, co.bound - held.size());
  std::vector<replay::Candidate> batch;
  std::vector<replay::ShmQueue::Slot> claims;
  // The shm queue holds handles; evaluator nodes cannot reach this node's shared memory, so
  // each candidate is read from its replay group here and sent whole. A handle whose group
  // is gone is counted lost (candidate ledger: dropped) and one already scored is
  // acknowledged, each with a log line (CandidateQueue::claim).
  if (shm.candidates().claim(batch, claims, room, wait ? 50ms : 0ms, "launch: redis bridge") == 0) return;
  std::vector<netqueue::Outgoing> recs;
  for (const auto& cand : batch) {
    std::string bytes(replay::encoded_size(cand), '\0');
    replay::encode(cand, reinterpret_cast<unsigned char*>(bytes.data()));
    recs.push_back({cand.id, std::move(bytes)});
  }
  std::size_t n = 0;
  try {
    n = out.push_batch(recs, 1000ms);
  } catch (...) {
    // Some may have gone in: they come back (if ever) as duplicates of the re-sent ones.
    shm.candidates().raw().give_back(claims.data(), claims.size());
    throw;
  }
  for (std::size_t i = 0; i < n; ++i) {
    const auto& b = batch[i];
    held[b.id] = Held{claims[i], b.task, b.source, b.policy_version, b.group_id, b.index_in_group};
  }
  if (n < batch.size()) shm.candidates().raw().give_back(claims.data() + n, batch.size() - n);
  std::lock_guard<std::mutex> g(mu);
  c.sent += n;
  c.on_network = held.size();
}

// A candidate that killed or hung cluster.redis max deliveries' evaluators is moved to
// kf:candidates:dead by the queue and never comes back: its claim here is dropped
// (counted lost, "dropped", in the candidate account), one line each.
void RemoteBridge::Impl::dead_letters() {
  const auto now = std::chrono::steady_clock::now();
  if (now < next_dead_check) return;
  next_dead_check = now + 2s;
  const uint64_t dead = out.depth().dead;
  if (dead <= dead_seen) return;
  const auto entries = out.dead_letters(static_cast<std::size_t>(dead));
  for (std::size_t i = dead_seen; i < entries.size(); ++i) {
    const auto& f = entries[i];
    std::string reason, tag;
    for (std::size_t k = 0; k + 1 < f.size(); k += 2) {
      if (f[k] == "reason") reason = f[k + 1];
      if (f[k] == "t") tag = f[k + 1];
    }
    uint64_t id = 0;
    try {
      id = std::stoull(tag);
    } catch (...) {
      continue;
    }
    auto it = held.find(id);
    if (it == held.end()) continue;
    shm.candidates().raw().drop(&it->second.claim, 1);
    log_error("launch: redis bridge: candidate ", id, " of ", it->second.task, " was moved to kf:candidates:dead (",
              reason, "); counted lost (dropped), its group completes at its deadline");
    held.erase(it);
    std::lock_guard<std::mutex> g(mu);
    ++c.dead;
    c.on_network = held.size();
  }
  dead_seen = entries.size();
}

void RemoteBridge::Impl::loop() {
  while (!stop.load()) {
    try {
      results_back();
      dead_letters();
      node_reports();
      candidates_out(held.empty());
      if (failing) log_info("launch: redis bridge: the server at ", co.host, ":", co.port, " answers again");
      failing = false;
    } catch (const std::exception& e) {
      {
        std::lock_guard<std::mutex> g(mu);
        ++c.errors;
      }
      if (!failing)
        log_error("launch: redis bridge: ", e.what(),
                  "; candidates on the network keep their claims, retrying every 1 s");
      failing = true;
      std::this_thread::sleep_for(1s);
    }
  }
}

RemoteBridge::RemoteBridge(replay::RunShm& shm, const ClusterOptions& co, bool train_on_degenerate_tasks) {
  netqueue::StreamConfig sc;
  sc.host = co.bind.empty() ? co.host : co.bind.front();  // the head reaches its own server where it listens
  if (sc.host == "0.0.0.0") sc.host = "127.0.0.1";
  sc.port = co.port;
  sc.password = co.password;
  sc.bound = co.bound;
  sc.consumer = "bridge-" + co.node_name;
  netqueue::StreamConfig rc = sc;
  rc.stream = "kf:results";
  rc.group = "replay";
  rc.consumer = "replay-" + co.node_name;
  rc.bound = 1u << 30;  // results are appended by ack_forward; the candidates' bound limits them
  netqueue::StreamConfig nc = rc;
  nc.stream = kNodeSecondsStream;
  nc.group = "head";
  nc.consumer = "head-" + co.node_name;
  impl_ = std::make_unique<Impl>(shm, co, train_on_degenerate_tasks, netqueue::StreamQueue::open(sc),
                                 netqueue::StreamQueue::open(rc), netqueue::StreamQueue::open(nc));
  Impl* m = impl_.get();
  m->thread = std::thread([m] { m->loop(); });
}

RemoteBridge::~RemoteBridge() { stop(); }

void RemoteBridge::stop() {
  if (!impl_ || !impl_->thread.joinable()) return;
  impl_->stop = true;
  impl_->thread.join();
  if (!impl_->held.empty())
    log_warn("launch: redis bridge stopped with ", impl_->held.size(),
             " candidate(s) still on the network (no result came back); the candidate account counts them in flight");
}

BridgeCounters RemoteBridge::counters() const {
  std::lock_guard<std::mutex> g(impl_->mu);
  return impl_->c;
}

bool RemoteBridge::idle() const {
  return counters().on_network == 0 && impl_->shm.candidates().raw().stats().queued == 0;
}

std::map<std::string, NodeSeconds> RemoteBridge::node_seconds() const {
  std::lock_guard<std::mutex> g(impl_->mu);
  return impl_->node_secs;
}

uint64_t RemoteBridge::reported_verdicts() const {
  std::lock_guard<std::mutex> g(impl_->mu);
  uint64_t n = 0;
  for (const auto& [k, v] : impl_->node_secs) n += v.verdicts;
  return n;
}
#else
struct RemoteBridge::Impl {};
RemoteBridge::RemoteBridge(replay::RunShm&, const ClusterOptions&, bool) {
  throw Error("cluster.role: head needs the Redis queue, which this build lacks (no hiredis)");
}
RemoteBridge::~RemoteBridge() = default;
void RemoteBridge::stop() {}
BridgeCounters RemoteBridge::counters() const { return {}; }
bool RemoteBridge::idle() const { return true; }
std::map<std::string, NodeSeconds> RemoteBridge::node_seconds() const { return {}; }
uint64_t RemoteBridge::reported_verdicts() const { return 0; }
#endif

// ---------------------------------------------------------------- node seconds

std::string encode_node_report(const std::string& session, const NodeSeconds& s) {
  return nlohmann::json{{"session", session},     {"generate_s", s.generate_s}, {"compile_s", s.compile_s},
                        {"verify_s", s.verify_s}, {"gpu_wait_s", s.gpu_wait_s}, {"verdicts", s.verdicts}}
      .dump();
}

std::pair<std::string, NodeSeconds> decode_node_report(const std::string& text, const std::string& context) {
  try {
    const auto j = nlohmann::json::parse(text);
    NodeSeconds s{j.at("generate_s").get<double>(), j.at("compile_s").get<double>(), j.at("verify_s").get<double>(),
                  j.at("gpu_wait_s").get<double>(), j.at("verdicts").get<uint64_t>()};
    const std::string session = j.at("session").get<std::string>();
    if (session.empty()) throw Error("empty session");
    return {session, s};
  } catch (const std::exception& e) {
    throw Error(context + ": not a node report (" + e.what() + ")");
  }
}

void add_verdict_seconds(const std::string& path, uint64_t* offset, NodeSeconds* s) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return;
  in.seekg(static_cast<std::streamoff>(*offset));
  std::string chunk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::size_t end = chunk.rfind('\n');
  if (end == std::string::npos) return;  // no complete line yet
  for (std::size_t a = 0, b; a <= end; a = b + 1) {
    b = chunk.find('\n', a);
    if (b == a) continue;
    try {
      const auto j = nlohmann::json::parse(chunk.substr(a, b - a));
      s->compile_s += j.value("compile_s", 0.0);
      s->verify_s += j.value("verify_s", 0.0);
      ++s->verdicts;
    } catch (const std::exception&) {  // a line torn by a killed evaluator: left out
    }
  }
  *offset += end + 1;
}

#ifdef KF_HAVE_NETQUEUE
struct NodeReporter::Impl {
  ClusterOptions co;
  std::string session;
  std::unique_ptr<netqueue::StreamQueue> q;
  NodeSeconds sent;
  bool any_sent = false, failing = false;
  Clock::time_point next{};
};
NodeReporter::NodeReporter(const ClusterOptions& co) : impl_(std::make_unique<Impl>()) {
  impl_->co = co;
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
  if (m.any_sent && s == m.sent) return;
  m.next = now + 500ms;
  try {
    if (!m.q) {
      netqueue::StreamConfig sc;
      sc.host = m.co.host;
      sc.port = m.co.port;
      sc.password = m.co.password;
      sc.stream = kNodeSecondsStream;
      sc.group = "head";
      sc.bound = 4096;
      sc.connect_timeout = 1000ms;
      sc.io_timeout = 2000ms;
      m.q = std::make_unique<netqueue::StreamQueue>(netqueue::StreamQueue::open(sc));
    }
    // Cumulative figures: a report that finds the stream full is dropped, the next carries it.
    if (m.q->push(0, encode_node_report(m.session, s), 100ms)) {
      m.sent = s;
      m.any_sent = true;
    }
    m.failing = false;
  } catch (const std::exception& e) {
    m.q.reset();
    if (!m.failing)
      log_warn("launch: node ", m.co.node_name, ": reporting its seconds to the head failed (", e.what(),
               "); the head's time split misses them until a report gets through");
    m.failing = true;
  }
}
#else
struct NodeReporter::Impl {
  std::string session;
};
NodeReporter::NodeReporter(const ClusterOptions&) : impl_(std::make_unique<Impl>()) {}
NodeReporter::~NodeReporter() = default;
const std::string& NodeReporter::session() const { return impl_->session; }
void NodeReporter::report(const NodeSeconds&, bool) {}
#endif

// ---------------------------------------------------------------- evaluator node

void preflight_evaluator_node(const Config& cfg) {
  (void)evaluator::eval_options(cfg);
  const auto so = evaluator::service_options(cfg);
  if (access(so.tasks_dir.c_str(), R_OK | X_OK) != 0)
    throw error_at(cfg.source(),
                   "tasks.dir: cannot read " + so.tasks_dir + " on this node (evaluators load tasks from it)");
  check_run_name(cfg.get_string("run.name"), "run.name");
  if (cfg.get_int("launch.evaluators") < 0) throw Error("launch.evaluators: must be >= 0");
  (void)cluster_options(cfg);
}

void preflight_learner_node(const Config& cfg) {
  (void)learner::learner_config_from(cfg);
  check_run_name(cfg.get_string("run.name"), "run.name");
  const auto co = cluster_options(cfg);  // the layout, NCCL on CUDA, the password
  const int gpus = cuda_device_count();
  if (co.learner_ranks > gpus)
    throw error_at(cfg.source(), "cluster.learner_ranks: " + std::to_string(co.learner_ranks) + " ranks but " +
                                     std::to_string(gpus) + " visible GPU(s) on this node (one rank per GPU)");
}

int run_learner_node(const Config& cfg, const RunDir& run, const std::string& binary_dir, bool resumed,
                     const std::atomic<int>* signals) {
  const ClusterOptions co = cluster_options(cfg);
  const std::string bin = binary_dir + "/learner/kf-learner";
  if (access(bin.c_str(), X_OK) != 0) throw Error("launch: " + bin + " is not built (run ./setup.sh)");
  // Checkpoint shards go to the head's run folder, which this node must see (a shared file
  // system): wait for the head to create it rather than write shards nobody will read.
  const std::string name = cfg.get_string("run.name");
  const std::string head_dir = cfg.get_string("run.root") + "/" + name;
  const auto deadline = Clock::now() + co.gone_after;
  while (access((head_dir + "/config.yaml").c_str(), R_OK) != 0) {
    if (Clock::now() > deadline)
      throw Error("launch: learners node " + co.node_name + ": the head's run folder " + head_dir +
                  " (its config.yaml) is not visible here after " + std::to_string(co.gone_after.count() / 1000) +
                  " s; learner ranks keep their checkpoint shards there, so the nodes need a shared file system "
                  "(and the head must be started with the same run.name)");
    if (signals && signals->load() > 0) return 1;
    std::this_thread::sleep_for(200ms);
  }
  std::vector<std::string> gpu_ids = cuda_visible_entries();
  for (int g = static_cast<int>(gpu_ids.size()); g < co.learner_ranks; ++g) gpu_ids.push_back(std::to_string(g));
  Supervisor sup;
  const int first = co.first_learner_rank();
  for (int i = 0; i < co.learner_ranks; ++i) {
    WorkerSpec w;
    w.role = "learner";
    w.id = first + i;
    w.argv = {bin,
              run.path() + "/config.yaml",
              "--run",
              name,
              "--run-dir",
              head_dir,
              "--rank",
              std::to_string(first + i),
              "--device",
              "cuda:0",
              "--rendezvous",
              "redis",
              "--remote-from",
              std::to_string(co.head_ranks()),
              "--final-checkpoint"};
    if (resumed) w.argv.push_back("--resume");
    w.env.push_back("CUDA_VISIBLE_DEVICES=" + gpu_ids[static_cast<std::size_t>(i)]);
    w.env.push_back("NCCL_NVLS_ENABLE=0");
    w.log_path = run.sub("logs") + "/learner-" + std::to_string(first + i) + ".out";
    sup.add(w);
  }
  log_info("launch: learners node ", co.node_name, ": learner ranks ", first, "..", first + co.learner_ranks - 1,
           " of ", co.learner_world, " (NCCL; rendezvous and groups through redis at ", co.host, ":", co.port,
           "), checkpoints in ", head_dir, "; logs in ", run.sub("logs"));
  for (std::size_t i = 0; i < sup.workers().size(); ++i) {
    sup.start(i);
    log_info("launch: started ", sup.workers()[i].name(), " pid ", sup.workers()[i].pid);
  }
  int handled = 0;
  bool failed = false;
  for (;;) {
    const int sig = signals ? signals->load() : 0;
    if (sig > handled) {
      handled = sig;
      log_info("launch: stop signal: ",
               sig >= 2 ? "killing the learner ranks now" : "the learner ranks checkpoint and exit");
      sup.signal_role("", sig >= 2 ? SIGKILL : SIGTERM);
    }
    for (const auto& e : sup.reap()) {
      Worker& w = sup.workers()[e.index];
      if (e.ok()) {
        log_info("launch: ", w.name(), " exited normally");
        continue;
      }
      failed = true;
      log_error("launch: ", w.name(), " ", describe_exit(e), " (log ", w.spec.log_path,
                "); not restarted: the run's other ranks cannot go on without it, so the head stops the run "
                "(resume every node with --resume)");
    }
    if (sup.running() == 0) break;
    std::this_thread::sleep_for(100ms);
  }
  log_info("launch: learners node ", co.node_name, " finished", failed ? " (a learner rank failed)" : "", "; logs in ",
           run.sub("logs"));
  return failed ? 1 : 0;
}

int run_evaluator_node(const Config& cfg, const RunDir& run, const std::string& binary_dir,
                       const std::atomic<int>* signals) {
  const ClusterOptions co = cluster_options(cfg);
  const int gpus =
      tasks::resolve_backend(cfg.get_string("run.backend")) == tasks::Backend::CUDA ? cuda_device_count() : 0;
  int n = static_cast<int>(cfg.get_int("launch.evaluators"));
  if (n == 0) n = gpus > 0 ? gpus : 1;
  const std::string bin = binary_dir + "/evaluator/kf-evaluator";
  if (access(bin.c_str(), X_OK) != 0) throw Error("launch: " + bin + " is not built (run ./setup.sh)");
  // The GPUs this node may use: the launcher's CUDA_VISIBLE_DEVICES (Slurm's --gres sets
  // it), else 0..gpus-1. Evaluator i gets entry i mod their count.
  std::vector<std::string> gpu_ids = cuda_visible_entries();
  if (gpu_ids.empty())
    for (int g = 0; g < gpus; ++g) gpu_ids.push_back(std::to_string(g));
  Supervisor sup;
  for (int i = 0; i < n; ++i) {
    WorkerSpec w;
    w.role = "evaluator";
    w.id = i;
    w.argv = {bin, "--remote",  "--config", run.path() + "/config.yaml", "--id", std::to_string(i), "--device",
              "0", "--run-dir", run.path()};
    if (gpus > 0) w.env.push_back("CUDA_VISIBLE_DEVICES=" + gpu_ids[static_cast<std::size_t>(i) % gpu_ids.size()]);
    w.env.push_back("TMPDIR=" + scratch_dir(run, "evaluator", i));
    w.log_path = run.sub("logs") + "/evaluator-" + std::to_string(i) + ".out";
    sup.add(w);
  }
  log_info("launch: evaluator node ", co.node_name, ": ", n, " remote evaluator(s) taking candidates from redis at ",
           co.host, ":", co.port, "; logs in ", run.sub("logs"),
           "; the node ends when the head's server has been "
           "gone for ",
           co.gone_after.count() / 1000.0, " s");
  for (int i = 0; i < n; ++i) {
    sup.start(static_cast<std::size_t>(i));
    log_info("launch: started ", sup.workers()[static_cast<std::size_t>(i)].name(), " pid ",
             sup.workers()[static_cast<std::size_t>(i)].pid);
  }
  const int max_restarts = static_cast<int>(cfg.get_int("launch.max_restarts"));
  const double backoff = cfg.get_float("launch.restart_backoff_s");
  const double status_every = cfg.get_float("launch.status_every_s");
  auto next_status = Clock::now() + std::chrono::milliseconds(static_cast<long long>(status_every * 1000));
  // The head's time split: the compile and verify seconds of this node's verdict lines.
  NodeReporter reporter(co);
  NodeSeconds secs;
  std::vector<uint64_t> offsets(static_cast<std::size_t>(n), 0);
  auto next_read = Clock::now();
  int handled = 0;
  bool failed = false;
  for (;;) {
    if (Clock::now() >= next_read) {
      next_read = Clock::now() + 250ms;
      for (int i = 0; i < n; ++i)
        add_verdict_seconds(run.sub("metrics") + "/verdicts-" + std::to_string(i) + ".jsonl",
                            &offsets[static_cast<std::size_t>(i)], &secs);
      reporter.report(secs);
    }
    const int sig = signals ? signals->load() : 0;
    if (sig > handled) {
      handled = sig;
      for (auto& w : sup.workers()) w.restart_pending = false;
      if (sig >= 2) {
        log_error("launch: second stop signal: killing the evaluators now");
        sup.signal_role("", SIGKILL);
      } else {
        log_info(
            "launch: stop signal: evaluators finish the candidate in hand and exit; what they hold "
            "unfinished goes to other evaluators after cluster.redis.claim_idle_s");
        sup.signal_role("", SIGTERM);
      }
    }
    for (const auto& e : sup.reap()) {
      Worker& w = sup.workers()[e.index];
      if (e.ok()) {
        log_info("launch: ", w.name(), " exited normally");
        continue;
      }
      if (handled > 0) {
        log_warn("launch: ", w.name(), " ", describe_exit(e), " while stopping");
        continue;
      }
      if (sup.schedule_restart(e.index, max_restarts, backoff)) {
        log_error("launch: ", w.name(), " ", w.last_exit, " (log ", w.spec.log_path, "); restart ", w.deaths, " of ",
                  max_restarts, "; what it held goes to other evaluators after cluster.redis.claim_idle_s");
      } else {
        failed = true;
        log_error("launch: ", w.name(), " died ", w.deaths, " times (last: ", w.last_exit, ", log ", w.spec.log_path,
                  "); giving up on it, the node's other evaluators go on");
      }
    }
    for (std::size_t i : sup.start_due())
      log_info("launch: restarted ", sup.workers()[i].name(), " as pid ", sup.workers()[i].pid);
    bool pending = false;
    for (const auto& w : sup.workers()) pending = pending || w.restart_pending;
    if (sup.running() == 0 && !pending) break;
    if (Clock::now() >= next_status) {
      std::string st;
      for (const auto& w : sup.workers())
        st += (st.empty() ? "" : ", ") + w.name() +
              (w.running()  ? " up"
               : w.finished ? " done"
                            : " down") +
              (w.deaths ? " (" + std::to_string(w.deaths) + " restarts)" : "");
      log_info("launch: evaluator node ", co.node_name, ": ", st);
      next_status = Clock::now() + std::chrono::milliseconds(static_cast<long long>(status_every * 1000));
    }
    std::this_thread::sleep_for(100ms);
  }
  try {
    clear_scratch(run);
  } catch (const std::exception& e) {
    log_warn("launch: clearing the scratch folders failed: ", e.what());
  }
  log_info("launch: evaluator node ", co.node_name, " finished", failed ? " (an evaluator kept dying)" : "",
           "; logs in ", run.sub("logs"));
  return failed ? 1 : 0;
}

}  // namespace kf::launch
