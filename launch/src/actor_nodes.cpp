// Actor nodes and the head's link to them (see actor_nodes.h).
#include "actor_nodes.h"

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cstring>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "kf/actors/actors.h"
#include "kf/common/error.h"
#include "kf/common/log.h"
#include "kf/replay/replay.h"
#include "launch_common.h"
#include "supervisor.h"

#ifdef KF_HAVE_NETQUEUE
#include "kf/netqueue/netqueue.h"
#endif

namespace kf::launch {
namespace {
using namespace std::chrono_literals;

#ifdef KF_HAVE_NETQUEUE
netqueue::StreamConfig head_stream(const ClusterOptions& co, bool on_head) {
  netqueue::StreamConfig sc;
  sc.host = co.host;
  if (on_head) {  // the head reaches its own server where it listens
    sc.host = co.bind.empty() ? co.host : co.bind.front();
    if (sc.host == "0.0.0.0") sc.host = "127.0.0.1";
  }
  sc.port = co.port;
  sc.password = co.password;
  sc.bound = co.bound;
  sc.stream = kGroupsStream;
  sc.group = "head";
  sc.claim_idle = co.claim_idle;
  return sc;
}

// Weights record: "KFW1", version (i64), size (u64), then the snapshot blob as the learner
// published it into the head's snapshot store (policy/weights_blob format).
std::string weights_record(int64_t version, const std::vector<unsigned char>& blob) {
  std::string s = "KFW1";
  const uint64_t n = blob.size();
  s.append(reinterpret_cast<const char*>(&version), 8);
  s.append(reinterpret_cast<const char*>(&n), 8);
  s.append(reinterpret_cast<const char*>(blob.data()), blob.size());
  return s;
}
#endif

int64_t parse_version(const std::string& s) {
  try {
    return std::stoll(s);
  } catch (...) {
    return -1;
  }
}
}  // namespace

// ---------------------------------------------------------------- head

#ifdef KF_HAVE_NETQUEUE
struct ActorNodeLink::Impl {
  replay::RunShm& shm;
  ClusterOptions co;
  double deadline_s;
  uint64_t group_size;
  netqueue::StreamQueue groups;
  netqueue::KeyStore store;
  netqueue::StreamQueue depth_conn;  // depth() from the launcher's thread (waiting())
  mutable std::mutex mu, depth_mu;
  ActorLinkCounters c;
  std::set<uint64_t> seen;  // group ids opened here (a redelivered entry is a duplicate)
  std::atomic<bool> stop{false};
  std::thread thread;
  bool failing = false;
  std::string state_sent;
  bool nodes_seen = false;  // an actor node set kActorNodesKey
  uint64_t kernels_mark = ~0ull;
  Clock::time_point next_weights{}, next_kernels{}, next_state{}, next_nodes{};

  Impl(replay::RunShm& s, const ClusterOptions& o, double d, int g)
      : shm(s),
        co(o),
        deadline_s(d),
        group_size(static_cast<uint64_t>(g)),
        groups(netqueue::StreamQueue::open(head_stream(o, true))),
        store(netqueue::KeyStore::open(head_stream(o, true))),
        depth_conn(netqueue::StreamQueue::open(head_stream(o, true))) {}

  void look_for_nodes();
  void publish_weights();
  void publish_kernels();
  void publish_state();
  void take_groups();
  bool ingest(const replay::ScoredGroup& g);
  void loop();
};

// Whether an actor node has announced itself (checked every second until one has).
void ActorNodeLink::Impl::look_for_nodes() {
  if (nodes_seen) return;
  const auto now = Clock::now();
  if (now < next_nodes) return;
  next_nodes = now + 1s;
  if (const auto v = store.get(kActorNodesKey)) {
    nodes_seen = true;
    // A node that just announced itself waits for both: publish them in this pass, not at
    // the next period of each.
    next_weights = next_kernels = now;
    log_info("launch: actor nodes: ", *v, " connected (the head now publishes weights and kernels for them)");
  }
  std::lock_guard<std::mutex> g(mu);
  c.nodes_seen = nodes_seen;
}

void ActorNodeLink::Impl::publish_weights() {
  const auto now = Clock::now();
  if (now < next_weights) return;
  next_weights = now + 500ms;
  const auto latest = shm.snapshots().latest();
  if (latest.version < 0 || latest.version <= c.weights_version) return;
  // Nothing goes to the store until an actor node has announced itself (a 7 B snapshot is
  // 14 GB: a run without actor nodes must not copy it into the server at every publish).
  if (!nodes_seen) return;  // look_for_nodes
  std::vector<unsigned char> blob;
  const auto info = shm.snapshots().read(blob);
  if (info.version < 0) return;
  // The blob first, then its version: a node that sees the version finds that blob (or a newer one).
  store.set(kWeightsKey, weights_record(info.version, blob));
  store.set(kWeightsVersionKey, std::to_string(info.version));
  log_info("launch: actor nodes: published policy version ", info.version, " (", blob.size(),
           " bytes) to the store for actor nodes");
  std::lock_guard<std::mutex> g(mu);
  c.weights_version = info.version;
}

void ActorNodeLink::Impl::publish_kernels() {
  const auto now = Clock::now();
  if (now < next_kernels) return;
  next_kernels = now + 2s;
  if (!nodes_seen) return;
  const auto st = shm.kernels().stats();
  const uint64_t mark = st.inserted + st.evicted + st.entries;
  if (mark == kernels_mark) return;
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& task : shm.kernels().tasks())
    for (const auto& e : shm.kernels().entries(task))
      arr.push_back(
          {{"task", e.task}, {"speedup", e.speedup}, {"policy_version", e.policy_version}, {"source", e.source}});
  const uint64_t version = ++c.kernels_published;
  store.set(kKernelsKey, arr.dump());
  store.set(kKernelsVersionKey, std::to_string(version));
  kernels_mark = mark;
  log_info("launch: actor nodes: published the kernel database (", arr.size(), " kernel(s), version ", version,
           ") for their exemplars");
}

void ActorNodeLink::Impl::publish_state() {
  const auto now = Clock::now();
  if (now < next_state) return;
  next_state = now + 1s;
  const auto st = shm.control().state();
  const std::string s = st == replay::RunState::running || st == replay::RunState::starting ? "running" : "draining";
  store.set(kRunStateKey, s);
  if (s != state_sent && s == "draining")
    log_info("launch: actor nodes: the run drains; they stop their actors (groups still in ", kGroupsStream,
             " are not opened)");
  state_sent = s;
}

// Opens one remote group in the head's replay and queues its candidates, as a local actor
// does (actors/src/actor.cpp, finish_group). Returns false when the replay stayed full.
bool ActorNodeLink::Impl::ingest(const replay::ScoredGroup& g) {
  std::vector<replay::Candidate> cands = g.candidates;
  for (auto& cd : cands)  // a member whose prompt is the group's travels without it
    if (cd.prompt_tokens.empty()) cd.prompt_tokens = g.prompt_tokens;
  const auto deadline = std::chrono::duration_cast<replay::Timeout>(std::chrono::duration<double>(deadline_s));
  if (!shm.replay().open_group(cands, deadline, std::chrono::seconds(5))) return false;
  std::vector<uint64_t> lost;
  uint64_t scored = 0, queued = 0, lag_sum = 0;
  for (std::size_t i = 0; i < cands.size(); ++i) {
    const bool missing = i < g.missing.size() && g.missing[i];
    const replay::Result& r = g.results[i];
    if (missing) {
      lost.push_back(cands[i].id);
    } else if (r.evaluator_id != kForwardedEvaluatorId) {
      (void)shm.replay().add_result(r);  // an extraction failure the remote actor scored
      ++scored;
    } else {
      // The handle, as a local actor pushes it: the candidate itself lives in its group.
      timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      cands[i].t_pushed_ns = int64_t(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
      bool ok = false;
      while (!ok && !stop.load()) {
        ok = shm.candidates().push(replay::ref_of(cands[i]), 200ms);
        if (ok) break;
        try {  // a wait for queue room must not hold back the drain notice to the actor nodes
          publish_state();
        } catch (const std::exception&) {  // the loop's next round logs Redis errors
        }
      }
      if (ok) {
        ++queued;
        // The lag a local actor counts when it pushes (counter 7): the newest version here
        // minus the candidate's behaviour policy.
        lag_sum +=
            static_cast<uint64_t>(std::max<int64_t>(0, shm.snapshots().latest().version - cands[i].policy_version));
      } else {
        lost.push_back(cands[i].id);
      }
    }
  }
  if (!lost.empty()) shm.replay().mark_lost(lost);
  std::lock_guard<std::mutex> lk(mu);
  ++c.groups;
  c.candidates_queued += queued;
  c.actor_scored += scored;
  c.lost += lost.size();
  c.lag_sum += lag_sum;
  return true;
}

void ActorNodeLink::Impl::take_groups() {
  if (state_sent != "running") {
    std::this_thread::sleep_for(100ms);
    return;
  }
  // A group is taken once the candidate queue has a free slot; its candidates then wait for
  // the next ones (back-pressure). A local actor waits for room for a whole group before it
  // samples, so a remote group waiting here gets the queue's next slots first, and actor
  // nodes are not starved by the head's own actors.
  auto& q = shm.candidates().raw();
  if (q.stats().free_slots == 0) {
    std::this_thread::sleep_for(20ms);
    return;
  }
  const auto msgs = groups.take(1, 100ms);
  for (const auto& m : msgs) {
    std::vector<replay::ScoredGroup> gs;
    try {
      gs = netqueue::decode_groups(m.data, std::string(kGroupsStream) + " entry " + m.id);
    } catch (const std::exception& e) {
      log_error("launch: actor nodes: ", e.what(), "; the entry is dropped (its candidates never reach the run)");
      std::lock_guard<std::mutex> lk(mu);
      ++c.undecodable;
    }
    for (const auto& g : gs) {
      if (!seen.insert(g.group_id).second) {
        log_warn("launch: actor nodes: group ", g.group_id, " of ", g.task,
                 " came a second time (redelivered); dropped, counted duplicate");
        std::lock_guard<std::mutex> lk(mu);
        ++c.duplicates;
        continue;
      }
      bool opened = false;
      try {
        opened = ingest(g);
      } catch (const std::exception& e) {
        log_error("launch: actor nodes: group ", g.group_id, " of ", g.task, " not opened (", e.what(), "); dropped");
      }
      if (!opened) {
        log_warn("launch: actor nodes: group ", g.group_id, " of ", g.task,
                 " from an actor node not opened (the replay stayed full for 5 s, or it was malformed); dropped");
        std::lock_guard<std::mutex> lk(mu);
        ++c.groups_dropped;
      }
    }
    groups.ack({m.id});  // after the group is in the replay and its candidates queued
  }
}

void ActorNodeLink::Impl::loop() {
  while (!stop.load()) {
    try {
      publish_state();
      look_for_nodes();
      publish_weights();
      publish_kernels();
      take_groups();
      if (failing) log_info("launch: actor nodes: the server at ", co.host, ":", co.port, " answers again");
      failing = false;
    } catch (const std::exception& e) {
      {
        std::lock_guard<std::mutex> g(mu);
        ++c.errors;
      }
      if (!failing) log_error("launch: actor nodes: ", e.what(), "; retrying every 1 s");
      failing = true;
      std::this_thread::sleep_for(1s);
    }
  }
}

ActorNodeLink::ActorNodeLink(replay::RunShm& shm, const ClusterOptions& co, double group_deadline_s, int group_size)
    : impl_(std::make_unique<Impl>(shm, co, group_deadline_s, group_size)) {
  Impl* m = impl_.get();
  m->thread = std::thread([m] { m->loop(); });
}

ActorNodeLink::~ActorNodeLink() { stop(); }

void ActorNodeLink::stop() {
  if (!impl_ || !impl_->thread.joinable()) return;
  impl_->stop = true;
  impl_->thread.join();
  try {  // actor nodes stop sampling at once (the thread, which owns the connection, is gone)
    impl_->store.set(kRunStateKey, "draining");
  } catch (const std::exception&) {
  }
}

ActorLinkCounters ActorNodeLink::counters() const {
  std::lock_guard<std::mutex> g(impl_->mu);
  return impl_->c;
}

uint64_t ActorNodeLink::waiting() const {
  std::lock_guard<std::mutex> g(impl_->depth_mu);
  try {
    return impl_->depth_conn.depth().length;
  } catch (const std::exception&) {
    return 0;
  }
}
#else
struct ActorNodeLink::Impl {};
ActorNodeLink::ActorNodeLink(replay::RunShm&, const ClusterOptions&, double, int) {
  throw Error("cluster.role: head with actor nodes needs the Redis queue, which this build lacks (no hiredis)");
}
ActorNodeLink::~ActorNodeLink() = default;
void ActorNodeLink::stop() {}
ActorLinkCounters ActorNodeLink::counters() const { return {}; }
uint64_t ActorNodeLink::waiting() const { return 0; }
#endif

// ---------------------------------------------------------------- actor node

void preflight_actor_node(const Config& cfg) {
  (void)replay::run_shm_config(cfg);
  const auto ao = actors::actor_options(cfg, 0);
  (void)actors::load_actor_tasks(ao, /*strict=*/true);
  if (access(actors::resolve_tree_path(ao.template_path).c_str(), R_OK) != 0)
    throw Error("actors.prompt.template: cannot read " + ao.template_path);
  check_run_name(cfg.get_string("run.name"), "run.name");
  if (cfg.get_int("actors.count") < 1) throw Error("actors.count: must be >= 1");
  if (ao.device.rfind("cuda", 0) == 0 && cuda_device_count() == 0)
    throw Error("actors.device: " + ao.device + " but no GPU is visible on this actor node (use cpu)");
  (void)cluster_options(cfg);
}

#ifdef KF_HAVE_NETQUEUE
namespace {
// The node's side: what run_actor_node's loop does besides supervising its actors.
struct NodeLink {
  replay::RunShm& shm;
  const ClusterOptions& co;
  std::unique_ptr<netqueue::StreamQueue> out;
  std::unique_ptr<netqueue::KeyStore> store;
  std::vector<netqueue::Outgoing> outbox;  // complete groups not yet in kf:groups
  int64_t weights_version = -1, kernels_version = -1;
  uint64_t forwarded = 0, groups_sent = 0, kernels_inserted = 0, orphans = 0;
  Clock::time_point next_poll{}, last_answer = Clock::now();
  bool failing = false;
  std::string head_state = "running";

  NodeLink(replay::RunShm& s, const ClusterOptions& o) : shm(s), co(o) {}

  void connect() {
    if (!out) out = std::make_unique<netqueue::StreamQueue>(netqueue::StreamQueue::open(head_stream(co, false)));
    if (!store) {
      store = std::make_unique<netqueue::KeyStore>(netqueue::KeyStore::open(head_stream(co, false)));
      store->set(kActorNodesKey, co.node_name);  // the head publishes weights and kernels from now on
    }
  }

  void poll_store() {
    const auto now = Clock::now();
    if (now < next_poll) return;
    next_poll = now + 500ms;
    if (auto s = store->get(kRunStateKey)) head_state = *s;
    if (auto v = store->get(kWeightsVersionKey); v && parse_version(*v) > weights_version) {
      const auto rec = store->get(kWeightsKey);
      int64_t version = -1;
      uint64_t n = 0;
      if (!rec || rec->size() < 20 || rec->compare(0, 4, "KFW1") != 0) {
        log_error("launch: actor node ", co.node_name, ": ", kWeightsKey, " is missing or not a weights record (",
                  rec ? rec->size() : 0, " bytes); the actors keep the weights they have");
        weights_version = parse_version(*v);
        return;
      }
      std::memcpy(&version, rec->data() + 4, 8);
      std::memcpy(&n, rec->data() + 12, 8);
      if (n != rec->size() - 20) {
        log_error("launch: actor node ", co.node_name, ": policy version ", version, " in the store says ", n,
                  " bytes but holds ", rec->size() - 20, "; ignored, the actors keep the weights they have");
        weights_version = parse_version(*v);
        return;
      }
      if (version > weights_version && version > shm.snapshots().latest().version) {
        shm.snapshots().publish(version, rec->data() + 20, n);
        log_info("launch: actor node ", co.node_name, ": policy version ", version, " (", n,
                 " bytes) from the head; the actors load it between groups");
      }
      weights_version = std::max(version, weights_version);
    }
    if (auto v = store->get(kKernelsVersionKey); v && parse_version(*v) > kernels_version) {
      const auto text = store->get(kKernelsKey);
      kernels_version = parse_version(*v);
      if (!text) return;
      std::size_t added = 0, total = 0;
      try {
        for (const auto& e : nlohmann::json::parse(*text)) {
          ++total;
          const auto got =
              shm.kernels().insert({e.at("task").get<std::string>(), e.at("speedup").get<double>(),
                                    e.at("policy_version").get<int64_t>(), e.at("source").get<std::string>(), 0});
          if (got == replay::InsertOutcome::inserted) ++added;
        }
      } catch (const std::exception& ex) {
        log_error("launch: actor node ", co.node_name, ": the head's kernel database in the store did not read (",
                  ex.what(), "); the actors' exemplars stay as they were");
        return;
      }
      kernels_inserted += added;
      log_info("launch: actor node ", co.node_name, ": kernel database version ", kernels_version, " from the head (",
               total, " kernel(s), ", added, " new here) for the actors' exemplars");
    }
  }

  // Candidates the actors queued: marked forwarded in this node's replay (its group is
  // complete once every candidate is), then the claim is released.
  void claim_forwarded() {
    if (!outbox.empty()) return;              // kf:groups is full: the actors wait for queue room
    std::vector<replay::CandidateRef> batch;  // handles: the candidates stay in their groups here
    std::vector<replay::ShmQueue::Slot> claims;
    if (shm.candidates().claim(batch, claims, 64, 0ms) == 0) return;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      replay::Result r;
      r.candidate_id = batch[i].candidate_id;
      r.group_id = batch[i].group_id;
      r.index_in_group = batch[i].index_in_group;
      r.verdict = replay::Verdict::ok;
      r.reason = "forwarded to the head";
      r.evaluator_id = kForwardedEvaluatorId;
      if (shm.replay().add_result(r)) {
        shm.candidates().raw().release(&claims[i], 1);
        ++forwarded;
      } else {
        // Its group is gone here (deadline passed, or evicted): it cannot be sent.
        shm.candidates().raw().drop(&claims[i], 1);
        ++orphans;
        log_warn("launch: actor node ", co.node_name, ": candidate ", batch[i].candidate_id, " of group ",
                 batch[i].group_id,
                 " has no open group on this node any more (its deadline passed); counted lost (dropped)");
      }
    }
  }

  void send_groups() {
    if (outbox.empty()) {
      std::vector<replay::ScoredGroup> ready;
      shm.replay().take_ready(ready, 16, 0, std::numeric_limits<int64_t>::max(), 0ms);
      for (const auto& g : ready) outbox.push_back({g.group_id, netqueue::encode_groups({g})});
    }
    if (outbox.empty()) return;
    const std::size_t n = out->push_batch(outbox, 200ms);
    groups_sent += n;
    outbox.erase(outbox.begin(), outbox.begin() + static_cast<long>(n));
  }

  // One round; false when the head's server has been gone for gone_after.
  bool step() {
    try {
      connect();
      poll_store();
      claim_forwarded();
      send_groups();
      last_answer = Clock::now();
      if (failing) log_info("launch: actor node ", co.node_name, ": the head's server answers again");
      failing = false;
    } catch (const std::exception& e) {
      if (!failing)
        log_error("launch: actor node ", co.node_name, ": ", e.what(), "; retrying every 1 s for up to ",
                  co.gone_after.count() / 1000.0, " s (cluster.redis.gone_after_s)");
      failing = true;
      out.reset();
      store.reset();
      if (Clock::now() - last_answer > co.gone_after) return false;
      std::this_thread::sleep_for(1s);
    }
    return true;
  }
};
}  // namespace
#endif

int run_actor_node(const Config& cfg, const RunDir& run, const std::string& worker_config,
                   const std::string& binary_dir, const std::atomic<int>* signals) {
#ifndef KF_HAVE_NETQUEUE
  (void)cfg, (void)run, (void)worker_config, (void)binary_dir, (void)signals;
  throw Error("cluster.role: actors needs the Redis queue, which this build lacks (no hiredis)");
#else
  const ClusterOptions co = cluster_options(cfg);
  const std::string bin = binary_dir + "/actors/kf-actor";
  if (access(bin.c_str(), X_OK) != 0) throw Error("launch: " + bin + " is not built (run ./setup.sh)");
  if (replay::RunShm::probe(run.shm_key()) == replay::SegmentState::Stale) {
    const auto removed = remove_dead_run_shm(run.shm_key(), /*lock_too=*/false);
    if (!removed.empty())
      log_warn("launch: actor node ", co.node_name, ": removed the shared memory its dead launcher left (",
               removed.size(), " part(s)); the groups it had not sent yet are gone (the head never counted them)");
  }
  auto shm = replay::RunShm::create(run.shm_key(), replay::run_shm_config(cfg));
  NodeLink link(*shm, co);
  const int n = static_cast<int>(cfg.get_int("actors.count"));
  Supervisor sup;
  for (int i = 0; i < n; ++i) {
    WorkerSpec w;
    w.role = "actor";
    w.id = i;
    // The learning-curve probe is the head's actor 0's alone (docs/metrics.md): a node's
    // actor 0 would probe the same versions again into the same run folder.
    w.argv = {bin,           "--run", run.shm_key(),         "--config",
              worker_config, "--id",  std::to_string(i),     "--run-dir",
              run.path(),    "--set", "actors.probe.every=0"};
    w.log_path = run.sub("logs") + "/actor-" + std::to_string(i) + ".out";
    sup.add(w);
  }
  log_info("launch: actor node ", co.node_name, ": ", n, " actor(s) on this node's replay segment; groups go to ",
           kGroupsStream, " on redis at ", co.host, ":", co.port, ", weights and kernels come from there; logs in ",
           run.sub("logs"));
  for (std::size_t i = 0; i < sup.workers().size(); ++i) {
    sup.start(i);
    log_info("launch: started ", sup.workers()[i].name(), " pid ", sup.workers()[i].pid);
  }
  shm->control().set_state(replay::RunState::running);
  // The head's time split: this node's actors' generating and GPU-wait seconds.
  NodeReporter reporter(co);
  CounterTotals totals;
  auto node_seconds = [&] {
    totals.update(shm->control().peers(std::chrono::hours(1)));
    NodeSeconds s;
    s.generate_s = 1e-3 * static_cast<double>(totals.sum("actor", replay::ControlBlock::kWorkMs));
    s.gpu_wait_s = 1e-3 * static_cast<double>(totals.sum("actor", replay::ControlBlock::kGpuWaitMs));
    return s;
  };
  auto next_report = Clock::now();
  const int max_restarts = static_cast<int>(cfg.get_int("launch.max_restarts"));
  const double backoff = cfg.get_float("launch.restart_backoff_s");
  const double status_every = cfg.get_float("launch.status_every_s");
  auto next_status = Clock::now();
  int handled = 0;
  bool failed = false, stopping = false;
  std::string why;
  auto stop_actors = [&](const std::string& reason) {
    if (stopping) return;
    stopping = true;
    why = reason;
    for (auto& w : sup.workers()) w.restart_pending = false;
    shm->control().set_state(replay::RunState::draining);
    log_info("launch: actor node ", co.node_name, ": ", reason, "; the actors stop");
  };
  for (;;) {
    shm->heartbeat();
    const int sig = signals ? signals->load() : 0;
    if (sig > handled) {
      handled = sig;
      stop_actors("stop signal");
      if (sig >= 2) sup.signal_role("", SIGKILL);
    }
    for (const auto& e : sup.reap()) {
      Worker& w = sup.workers()[e.index];
      if (e.ok()) {
        log_info("launch: ", w.name(), " exited normally");
        continue;
      }
      try {
        const std::size_t freed = shm->candidates().raw().reap() + shm->replay().reap();
        if (freed) log_warn("launch: freed ", freed, " queue slots / replay groups held by dead ", w.name());
      } catch (const std::exception& ex) {
        log_error("launch: reclaiming what ", w.name(), " held failed: ", ex.what());
      }
      if (stopping) continue;
      if (sup.schedule_restart(e.index, max_restarts, backoff)) {
        log_error("launch: ", w.name(), " ", w.last_exit, " (log ", w.spec.log_path, "); restart ", w.deaths, " of ",
                  max_restarts);
      } else {
        failed = true;
        log_error("launch: ", w.name(), " died ", w.deaths, " times (last: ", w.last_exit, "); giving up on it");
      }
    }
    for (std::size_t i : sup.start_due())
      log_info("launch: restarted ", sup.workers()[i].name(), " as pid ", sup.workers()[i].pid);
    if (!link.step()) {
      stop_actors("the head's server has not answered for cluster.redis.gone_after_s (" +
                  std::to_string(co.gone_after.count() / 1000) + " s): the run ended or the head died");
      sup.signal_role("", SIGTERM);
    }
    if (link.head_state != "running" && !stopping) stop_actors("the head's run drains");
    if (Clock::now() >= next_report) {
      next_report = Clock::now() + 250ms;
      reporter.report(node_seconds());
    }
    bool pending = false;
    for (const auto& w : sup.workers()) pending = pending || w.restart_pending;
    if (sup.running() == 0 && !pending) break;
    if (!stopping && Clock::now() >= next_status) {
      log_info("launch: actor node ", co.node_name, ": ", link.groups_sent, " group(s) sent, ", link.forwarded,
               " candidate(s), policy version ", link.weights_version, ", ", link.outbox.size(), " waiting for room");
      next_status = Clock::now() + std::chrono::milliseconds(static_cast<long long>(status_every * 1000));
    }
    std::this_thread::sleep_for(stopping ? 100ms : 20ms);
  }
  // The actors are gone: what is complete still goes (the head drops it if it drains).
  const auto until = Clock::now() + 2s;
  while (Clock::now() < until && link.step() && !link.outbox.empty()) {
  }
  const NodeSeconds secs = node_seconds();
  if (!link.failing) reporter.report(secs, /*force=*/true);  // the head's server still answers
  const auto l = shm->candidate_ledger();
  log_info("launch: actor node ", co.node_name, " finished (", why.empty() ? "every actor exited" : why,
           "): ", link.groups_sent, " group(s) sent to the head, ", link.forwarded, " candidate(s) forwarded, ",
           link.orphans, " lost here (group gone), ", link.outbox.size(),
           " group(s) never sent; candidates of this node: created ", l.created, " = forwarded ", l.scored, " + lost ",
           l.lost(), " + queued ", l.queued, " + in flight ", l.in_flight, "; generate ", secs.generate_s,
           " s, GPU wait ", secs.gpu_wait_s, " s (reported to the head as session ", reporter.session(), ")");
  shm->shutdown();
  return failed ? 1 : 0;
#endif
}

}  // namespace kf::launch
