// Several nodes, the parts without Redis (see cluster.h): the cluster.* options and their
// checks, the Slurm plan, node reports as JSON, and the evaluator and learners nodes'
// supervision loops. The Redis side is in cluster_net.cpp (or cluster_none.cpp).
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

// ---------------------------------------------------------------- node seconds

std::string encode_node_report(const NodeReport& r) {
  const NodeSeconds& s = r.figures;
  return nlohmann::json{{"session", r.session},
                        {"role", r.role},
                        {"done", r.done},
                        {"generate_s", s.generate_s},
                        {"compile_s", s.compile_s},
                        {"verify_s", s.verify_s},
                        {"gpu_wait_s", s.gpu_wait_s},
                        {"verdicts", s.verdicts},
                        {"pushed", s.pushed},
                        {"extraction_failures", s.extraction_failures},
                        {"lag_sum", s.lag_sum}}
      .dump();
}

NodeReport decode_node_report(const std::string& text, const std::string& context) {
  try {
    const auto j = nlohmann::json::parse(text);
    NodeReport r;
    r.figures = {j.at("generate_s").get<double>(),
                 j.at("compile_s").get<double>(),
                 j.at("verify_s").get<double>(),
                 j.at("gpu_wait_s").get<double>(),
                 j.at("verdicts").get<uint64_t>(),
                 j.value("pushed", uint64_t{0}),
                 j.value("extraction_failures", uint64_t{0}),
                 j.value("lag_sum", uint64_t{0})};
    r.session = j.at("session").get<std::string>();
    r.role = j.value("role", std::string());
    r.done = j.value("done", false);
    if (r.session.empty()) throw Error("empty session");
    return r;
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
  log_info("launch: evaluator node ", co.node_name, ": ", n, " evaluator(s) taking candidates from redis at ", co.host,
           ":", co.port, "; logs in ", run.sub("logs"), "; the node ends when the head's server has been gone for ",
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
  NodeReporter reporter(co, "evaluators");
  // The run ends for this node when the head's server is gone (the head stops it last).
  HeadWatch head(co);
  NodeSeconds secs;
  std::vector<uint64_t> offsets(static_cast<std::size_t>(n), 0);
  auto next_read = Clock::now();
  int handled = 0;
  bool failed = false, head_gone = false;
  for (;;) {
    if (Clock::now() >= next_read) {
      next_read = Clock::now() + 250ms;
      for (int i = 0; i < n; ++i)
        add_verdict_seconds(run.sub("metrics") + "/verdicts-" + std::to_string(i) + ".jsonl",
                            &offsets[static_cast<std::size_t>(i)], &secs);
      reporter.report(secs);
      (void)head.run_state();
      if (!head_gone && handled == 0 && head.gone()) {
        head_gone = true;
        log_info("launch: evaluator node ", co.node_name, ": the head's server has not answered for ",
                 co.gone_after.count() / 1000.0,
                 " s (cluster.redis.gone_after_s): the run ended or the head died; the evaluators stop");
        for (auto& w : sup.workers()) w.restart_pending = false;
        sup.signal_role("", SIGTERM);
      }
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
      if (handled > 0 || head_gone) {
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
    if (sup.settled()) break;
    if (Clock::now() >= next_status) {
      log_info("launch: evaluator node ", co.node_name, ": ", sup.states());
      next_status = Clock::now() + std::chrono::milliseconds(static_cast<long long>(status_every * 1000));
    }
    std::this_thread::sleep_for(100ms);
  }
  try {
    clear_scratch(run);
  } catch (const std::exception& e) {
    log_warn("launch: clearing the scratch folders failed: ", e.what());
  }
  log_info("launch: evaluator node ", co.node_name, " finished", failed ? " (an evaluator kept dying)" : "", "; ",
           secs.verdicts, " verdict(s), compile ", secs.compile_s, " s, verify ", secs.verify_s,
           " s (reported to the head as session ", reporter.session(), "); logs in ", run.sub("logs"));
  return failed ? 1 : 0;
}

}  // namespace kf::launch
