// kf-learner: one data-parallel learner rank.
//   kf-learner CONFIG [--set key=value]... --run NAME [--rank R] [--resume]
//       attached to a run's shared memory (replay, snapshots, control block), with
//       checkpoints in <run.root>/<run.name>/checkpoints;
//   kf-learner CONFIG --synthetic [--run-dir DIR] ...
//       the deterministic synthetic group stream instead of the replay (tests, benchmarks).
// Ranks: learner.dist.ranks processes with --rank 0..R-1. The communicator is NCCL on
// CUDA (the unique id goes through the control block, or --rendezvous DIR, or with
// --rendezvous redis through the run's Redis server: cluster.redis.host/port, password
// in $cluster.redis.password_env, for ranks on several nodes), shared memory on CPU
// (one host only: --rendezvous redis with more than one rank and no NCCL is refused).
// Groups: kf::transport::open_ready_groups picks the run's replay (cluster.role all) or
// the network transport (any other role). With --remote-from K (= cluster.head_learner_ranks),
// ranks K..R-1 run on other nodes: they attach no shared memory, and the network
// transport brings their share from rank 0's take on the head. --synthetic: every rank
// makes its own share of the deterministic synthetic stream instead.
// Rank 0 writes metrics/learner.jsonl + a TensorBoard event file in the run folder
// (attached to a run, or given --run-dir): one line per updated step, and one per 30 s of
// empty steps so a starved learner shows. Prints "STEP {json}" per step with
// --print-steps, and "WEIGHTS_CHECKSUM <hex>" at the end. SIGINT/SIGTERM or the run state
// `stopped` end the loop (agreed by all ranks) with a final checkpoint. --join-until-stopped
// (a head's rank 0): after the last step, go on joining the network into the head's replay
// until the run state is `stopped`. Exit 0 ok, 1 error, 2 usage.
#include <sys/stat.h>

#include "kf/common/cli.h"
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "kf/common/config.h"
#include "kf/common/error.h"
#include "kf/common/log.h"
#include "kf/common/metrics.h"
#include "comm.h"  // make_shm_comm, control_rendezvous, redis_rendezvous (learner/src)
#include "kf/learner/learner.h"
#include "kf/policy/policy.h"
#include "kf/replay/replay.h"
#include "kf/transport/transport.h"

namespace {
volatile std::sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

// The run's Redis server, as cluster.redis.* and $cluster.redis.password_env name it.
struct RedisServerRef {
  std::string host, password;
  int port = 0;
};
RedisServerRef redis_server_of(const kf::Config& cfg, const char* why) {
  RedisServerRef r;
  r.host = cfg.get_string("cluster.redis.host");
  r.port = static_cast<int>(cfg.get_int("cluster.redis.port"));
  const std::string env = cfg.get_string("cluster.redis.password_env");
  const char* pw = env.empty() ? nullptr : std::getenv(env.c_str());
  if (!pw || !*pw)
    throw kf::Error(std::string("cluster.redis.password_env: ") + why + " needs the run's Redis password in $" + env +
                    ", which is unset or empty");
  r.password = pw;
  return r;
}

// The learner's counts (Learner::counters(), by name) that go to this rank's control-block
// entry, role "learner" (replay::counter names the ids; the launcher's status reads them).
struct ControlCounter {
  kf::replay::counter::Learner id;
  const char* name;
};
constexpr ControlCounter kControlCounters[] = {
    {kf::replay::counter::kLearnerSteps, "steps"},
    {kf::replay::counter::kLearnerGroupsUsed, "groups_used"},
    {kf::replay::counter::kLearnerDroppedStale, "dropped_stale"},
    {kf::replay::counter::kLearnerSkippedEqual, "skipped_equal"},
    {kf::replay::counter::kLearnerTokens, "tokens"},
    {kf::replay::counter::kLearnerEmptySteps, "empty_steps"},
    {kf::replay::counter::kLearnerPublishes, "publishes"},
    {kf::replay::counter::kLearnerCheckpoints, "checkpoints"},
};
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"KernelForge learner rank"};
  std::string config_file, run, run_dir, device = "auto", comm_name, rendezvous, dump;
  std::vector<std::string> sets;
  int rank = 0, remote_from = 0;
  int64_t steps = -1;
  bool synthetic = false, resume = false, keep_shm = false, print_steps = false, final_ckpt = false;
  bool join_until_stopped = false;
  app.add_option("CONFIG", config_file, "run config (YAML)")->required();
  app.add_option("--set", sets, "override key=value");
  app.add_option("--run", run, "run name whose shared memory to attach (kf.<run>.*)");
  app.add_option("--run-dir", run_dir, "run folder (checkpoints/, logs/); default <run.root>/<run.name>");
  app.add_option("--rank", rank, "this rank (0..learner.dist.ranks-1)");
  app.add_option("--device", device, "auto, cpu, cuda or cuda:N (auto: cuda:<rank> when a GPU is visible)");
  app.add_option("--comm-name", comm_name, "shared-memory communicator segment (default kf.<run>.learn)");
  app.add_option("--rendezvous", rendezvous,
                 "NCCL unique id hand-over: a folder (default when no run is attached: the run folder), or "
                 "'redis': the run's Redis server (cluster.redis.*), for ranks on several nodes");
  app.add_option("--remote-from", remote_from,
                 "ranks >= this run on other nodes (cluster.head_learner_ranks): they attach no shared memory and "
                 "get their groups from rank 0 through the network transport (0: every rank is on this node)");
  app.add_option("--steps", steps, "steps to run (overrides learner.steps; 0 runs none)");
  app.add_option("--dump-weights", dump, "rank 0 writes the final weights here (safetensors)");
  app.add_flag("--synthetic", synthetic, "train on the synthetic group stream");
  app.add_flag("--resume", resume, "continue from the newest valid checkpoint");
  app.add_flag("--keep-shm", keep_shm,
               "with --resume: leave the run's replay and kernel DB as they are (a restarted rank of a live run)");
  app.add_flag("--print-steps", print_steps, "print one STEP json line per step");
  app.add_flag("--final-checkpoint", final_ckpt, "checkpoint when the loop ends");
  app.add_flag("--join-until-stopped", join_until_stopped,
               "rank 0 on a head of several nodes: after the last step, go on joining the network's groups and "
               "results into the head's replay until the run state is stopped (the launcher passes it)");
  KF_CLI_PARSE(app, argc, argv);
  try {
    const auto cfg = kf::Config::load(config_file, sets);
    auto lc = kf::learner::learner_config_from(cfg);
    const bool forever = steps < 0 && lc.steps == 0;  // learner.steps 0: until the run stops
    if (steps >= 0) lc.steps = steps;
    const std::string name = run.empty() ? cfg.get_string("run.name") : run;
    const bool run_dir_given = !run_dir.empty();
    if (run_dir.empty()) run_dir = cfg.get_string("run.root") + "/" + name;
    ::mkdir(run_dir.c_str(), 0755);
    ::mkdir((run_dir + "/logs").c_str(), 0755);
    kf::log_init("learner", rank, run_dir + "/logs/learner-" + std::to_string(rank) + ".log");
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);

    torch::Device dev(torch::kCPU);
    if (device == "auto") {
      if (torch::cuda::is_available()) dev = torch::Device(torch::kCUDA, rank % torch::cuda::device_count());
    } else {
      dev = torch::Device(device);
    }
    if (dev.is_cuda() && !dev.has_index()) dev = torch::Device(torch::kCUDA, rank);

    if (remote_from < 0 || (remote_from > 0 && remote_from >= lc.ranks))
      throw kf::Error("--remote-from " + std::to_string(remote_from) + ": must be 1.." + std::to_string(lc.ranks - 1) +
                      " (learner.dist.ranks " + std::to_string(lc.ranks) + "), or 0");
    const bool remote_rank = remote_from > 0 && rank >= remote_from;
    if (remote_from > 0 && !synthetic) {
      // Ranks off the head have no replay: only the network transport reaches them, and it
      // learns from the config which ranks those are.
      if (!kf::transport::network_supported())
        throw kf::Error(
            "--remote-from: this build has no network transport (hiredis was not found at configure time; run "
            "./setup.sh)");
      if (kf::transport::kind_of(cfg) != kf::transport::Kind::network)
        throw kf::error_at(cfg.source(), "cluster.role: 'all' keeps every learner rank on this node; --remote-from " +
                                             std::to_string(remote_from) +
                                             " needs a role of several nodes (head or learners)");
      if (cfg.get_int("cluster.head_learner_ranks") != remote_from)
        throw kf::error_at(cfg.source(),
                           "cluster.head_learner_ranks: " + std::to_string(cfg.get_int("cluster.head_learner_ranks")) +
                               ", but --remote-from " + std::to_string(remote_from) +
                               " (the ranks on other nodes must be the same in both)");
    }
    std::unique_ptr<kf::replay::RunShm> shm;
    if (!run.empty() && !remote_rank) shm = kf::replay::RunShm::attach(run);
    std::string comm_kind = lc.comm;
    if (comm_kind == "auto") comm_kind = dev.is_cuda() && kf::learner::nccl_available() ? "nccl" : "cpu";
    const bool via_redis = rendezvous == "redis";
    // The shared-memory communicator is one host's /dev/shm segment: ranks that meet
    // through Redis (several nodes) can only talk over NCCL.
    if (via_redis && lc.ranks > 1 && comm_kind != "nccl")
      throw kf::Error("learner.dist.comm: '" + lc.comm + "' means the cpu (shared-memory) communicator here (device " +
                      dev.str() +
                      "), which works only among the ranks of one host; ranks on several nodes "
                      "(--rendezvous redis) need learner.dist.comm nccl (or auto) and a CUDA device per rank");
    std::unique_ptr<kf::learner::Communicator> comm;
    std::unique_ptr<kf::learner::Rendezvous> rdv;
    if (comm_kind == "nccl") {
      if (!dev.is_cuda()) throw kf::Error("learner.dist.comm: nccl needs a CUDA device (--device)");
      if (via_redis) {
        const auto srv = redis_server_of(cfg, "--rendezvous redis");
        kf::learner::RedisRendezvousOptions ro;
        ro.host = srv.host;
        ro.port = srv.port;
        ro.password = srv.password;
        ro.scope = name;
        ro.rank = rank;
        ro.world = static_cast<int>(lc.ranks);
        rdv = kf::learner::redis_rendezvous(ro);
        kf::log_info("learner rank ", rank, ": NCCL rendezvous through redis at ", ro.host, ":", ro.port, " (run '",
                     name, "', ", ro.world, " ranks)");
      } else if (shm) {
        rdv = kf::learner::control_rendezvous(shm->control());
      } else {
        rdv = kf::learner::file_rendezvous(rendezvous.empty() ? run_dir : rendezvous);
      }
      comm = kf::learner::make_nccl_comm(rank, static_cast<int>(lc.ranks), dev.index(), *rdv);
    } else if (lc.ranks == 1) {
      comm = kf::learner::make_local_comm();
    } else {
      comm = kf::learner::make_shm_comm(comm_name.empty() ? "kf." + name + ".learn" : comm_name, rank,
                                        static_cast<int>(lc.ranks));
    }

    std::unique_ptr<kf::replay::ReadyGroups> source;
    if (synthetic) {
      kf::learner::SyntheticConfig sc;
      sc.seed = lc.seed + 1;
      sc.vocab = lc.policy.empty() ? kf::learner::model_shape(lc.init_shape).vocab_size : 256;
      auto s = std::make_unique<kf::learner::SyntheticSource>(sc);
      s->groups_per_step_total = lc.groups_per_step;
      source = std::move(s);
    } else {
      // One node (cluster.role all): the run's replay, so the run must be attached. Several
      // nodes: the network transport (it logs where its groups come from, and which ranks
      // rank 0 serves).
      if (!shm && kf::transport::kind_of(cfg) == kf::transport::Kind::shm)
        throw kf::Error("kf-learner: give --run NAME (attach a run) or --synthetic");
      source = kf::transport::open_ready_groups(cfg, shm.get(), rank, static_cast<int>(lc.ranks),
                                                std::chrono::milliseconds(lc.take_timeout_ms));
    }

    kf::learner::LearnerDeps deps;
    deps.comm = comm.get();
    deps.source = source.get();
    deps.snapshots = shm ? &shm->snapshots() : nullptr;
    deps.shm = shm.get();
    deps.checkpoint_dir = run_dir + "/checkpoints";
    deps.device = dev;
    kf::learner::Learner learner(lc, deps);
    if (resume) learner.resume(/*restore_shm=*/!keep_shm);
    // With sharded parameters every rank takes part in the publish (rank 0 writes).
    if (shm || lc.shard == kf::learner::ShardMode::params) learner.publish_snapshot();
    int slot = shm ? shm->control().register_process("learner", rank) : -1;
    // This rank's absolute step (the resumed step included), which the launcher's status
    // shows for rank 0.
    int64_t step_reported = 0;
    auto report_step = [&] {
      if (slot < 0 || learner.steps_done() <= step_reported) return;
      shm->control().add_counter(slot, kf::replay::counter::kLearnerAbsoluteStep,
                                 static_cast<uint64_t>(learner.steps_done() - step_reported));
      step_reported = learner.steps_done();
    };
    report_step();
    // Metrics: rank 0 only (every rank sees the same all-reduced step stats).
    std::unique_ptr<kf::MetricsWriter> metrics;
    if (rank == 0 && (shm || run_dir_given))
      metrics = std::make_unique<kf::MetricsWriter>(run_dir + "/metrics", "learner");
    int64_t empty_steps = 0;  // since the last metrics line
    // Groups since the last metrics line (all ranks): taken, skipped for equal rewards, probes.
    int64_t groups_in = 0, skipped_equal = 0, probe_groups = 0;
    auto last_line = std::chrono::steady_clock::now();
    bool run_stopped = false;
    while (forever || learner.steps_done() < lc.steps) {
      // Every rank must leave at the same step (checkpoint() and the collectives need all
      // of them): the stop decision is all-reduced.
      const auto state = shm ? shm->control().state() : kf::replay::RunState::running;
      // draining: actors stop, the learner still trains on what was scored; stopped: leave.
      const bool local_stop = g_stop || state == kf::replay::RunState::stopped;
      auto flag = torch::full({1}, local_stop ? 1.0 : 0.0, torch::TensorOptions().dtype(torch::kFloat64).device(dev));
      comm->all_reduce_sum(flag);
      if (flag.to(torch::kCPU).item<double>() > 0) {
        run_stopped = true;
        break;
      }
      const auto before = learner.counters();
      const auto st = learner.step();
      if (slot >= 0) {
        for (const auto& c : kControlCounters) {
          const int64_t d = learner.counters().at(c.name) - before.at(c.name);
          if (d > 0) shm->control().add_counter(slot, c.id, static_cast<uint64_t>(d));
        }
        using CB = kf::replay::ControlBlock;
        shm->control().add_counter(slot, CB::kWorkMs, static_cast<uint64_t>((st.seconds - st.take_seconds) * 1e3));
        shm->control().add_counter(slot, CB::kGpuWaitMs, static_cast<uint64_t>(st.gpu_wait_seconds * 1e3));
        report_step();
        shm->control().heartbeat(slot);
      }
      if (metrics) {
        const auto now = std::chrono::steady_clock::now();
        if (!st.updated) ++empty_steps;
        groups_in += st.groups_in;
        skipped_equal += st.skipped_equal;
        probe_groups += st.probe_groups;
        if (st.updated || now - last_line >= std::chrono::seconds(30)) {
          std::vector<std::pair<std::string, double>> m = {{"updated", st.updated ? 1.0 : 0.0},
                                                           {"groups", double(st.groups)},
                                                           {"seconds", st.seconds},
                                                           {"empty_steps", double(empty_steps)},
                                                           {"groups_in", double(groups_in)},
                                                           {"skipped_equal", double(skipped_equal)},
                                                           {"probe_groups", double(probe_groups)}};
          if (st.updated) {
            const auto trained = kf::learner::step_scalars(st);
            m.insert(m.end(), trained.begin(), trained.end());
          }
          try {
            metrics->write(st.step, m);
          } catch (const kf::Error& e) {
            kf::log_warn("learner rank 0: metrics write failed (", e.what(), "); training continues without metrics");
            metrics.reset();
          }
          empty_steps = 0;
          groups_in = skipped_equal = probe_groups = 0;
          last_line = now;
        }
      }
      if (print_steps && rank == 0) {
        nlohmann::json j = {{"step", st.step},
                            {"updated", st.updated},
                            {"loss", st.loss},
                            {"grad_norm", st.grad_norm},
                            {"lr", st.lr},
                            {"groups", st.groups},
                            {"tokens", st.tokens},
                            {"seconds", st.seconds},
                            {"clip_fraction", st.clip_fraction},
                            {"publish_stall_ms", st.publish_stall_ms},
                            {"buckets_in_backward", st.buckets_in_backward}};
        std::printf("STEP %s\n", j.dump().c_str());
        std::fflush(stdout);
      }
    }
    if (run_stopped)
      kf::log_info("learner rank ", rank, ": stop requested (signal or run state); writing a final checkpoint");
    if (final_ckpt || run_stopped) learner.checkpoint();
    // The control-block entry is left registered: its counters stay readable after this
    // process exits, and the next registration reuses it once the pid is gone.
    // Sharded parameters: gathering the whole weights is collective, so every rank takes part
    // (only rank 0 is given --dump-weights).
    if ((!dump.empty() && rank == 0) || lc.shard == kf::learner::ShardMode::params) {
      const auto weights = learner.named_weights();
      std::vector<kf::policy::StWriteSpec> specs;
      std::vector<torch::Tensor> ts;
      for (const auto& [name, t] : weights) {
        specs.push_back({name, "F32", t.sizes().vec()});
        ts.push_back(t.to(torch::kFloat32).contiguous());
      }
      if (!dump.empty() && rank == 0)
        kf::policy::st_write(dump, specs, [&](std::size_t i, std::string& b) {
          b.assign(static_cast<const char*>(ts[i].data_ptr()), ts[i].numel() * 4);
        });
    }
    std::printf("WEIGHTS_CHECKSUM %016llx\n", static_cast<unsigned long long>(learner.weights_checksum()));
    // On a head of several nodes, rank 0 is the one process that joins the network's groups
    // and results into the head's replay (and verified kernels into its kernel database).
    // After its last step the evaluators still score what is queued while the run drains:
    // rank 0 goes on joining until the run is stopped, so that nothing scored then is left
    // in the server (on one node the evaluators write into the replay themselves).
    if (join_until_stopped && !run_stopped && !g_stop && rank == 0 && shm && !synthetic &&
        kf::transport::kind_of(cfg) == kf::transport::Kind::network) {
      kf::log_info(
          "learner rank 0: last step done; joining what the network still scores into the head's replay "
          "until the run stops");
      kf::replay::TakeRequest join;  // no groups: the take only joins
      join.step = learner.steps_done();
      while (!g_stop && shm->control().state() != kf::replay::RunState::stopped) {
        source->take(join);
        if (slot >= 0) shm->control().heartbeat(slot);
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
      source->take(join);  // what came in last
      kf::log_info("learner rank 0: the run stopped; exiting");
    }
    return 0;
  } catch (const std::exception& e) {
    const std::string what = kf::message_of(e);
    // The same step runs out of memory again after a restart: say which keys lower the need.
    const char* hint = what.find("out of memory") != std::string::npos
                           ? " (fewer tokens per micro-batch, learner.micro_batch_tokens, or more recomputed "
                             "layers, learner.recompute_layers, lower the learner's memory; docs/learner-memory.md)"
                           : "";
    kf::log_error("learner rank ", rank, " failed: ", what, hint, "; exiting with status 1");
    return 1;
  }
}
