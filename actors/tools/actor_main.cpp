// kf-actor: one actor process attached to a run (spawned by tools/launch, or by hand).
//   kf-actor --run NAME --config configs/default.yaml --id 0 [--set actors.group_size=4]
//            [--run-dir runs/NAME] [--device cuda:0] [--max-groups N]
// Exit codes: 0 stopped (run drained/stopped, SIGINT/SIGTERM, or --max-groups reached),
// 1 runtime error (also: the group transport would not open), 2 bad config or arguments,
// 3 the run's shared memory is not there.
#include <signal.h>

#include "kf/common/cli.h"
#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kf/actors/actors.h"
#include "kf/common/config.h"
#include "kf/common/error.h"
#include "kf/common/log.h"
#include "kf/transport/transport.h"

namespace {
std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop = true; }
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"KernelForge actor: samples kernels from the current policy"};
  std::string run, config_file, run_dir, device, log_file;
  std::vector<std::string> sets;
  int id = 0;
  long long max_groups = 0;
  double attach_wait_s = 30;
  app.add_option("--run", run, "run name (shared memory kf.<run>.*)")->required();
  app.add_option("--config", config_file, "run config (YAML)")->required();
  app.add_option("--set", sets, "override a config key: key=value");
  app.add_option("--id", id, "actor id");
  app.add_option("--run-dir", run_dir, "run directory (logs/actor-<id>.log, metrics/actor-<id>.jsonl)");
  app.add_option("--device", device, "override actors.device (cpu, cuda, cuda:N)");
  app.add_option("--max-groups", max_groups, "stop after this many groups (0: until the run stops)");
  app.add_option("--log", log_file, "log file (default: <run-dir>/logs/actor-<id>.log)");
  app.add_option("--attach-wait", attach_wait_s, "seconds to wait for the run's shared memory");
  KF_CLI_PARSE(app, argc, argv);

  if (log_file.empty() && !run_dir.empty()) log_file = run_dir + "/logs/actor-" + std::to_string(id) + ".log";
  kf::log_init("actor", id, log_file);
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);

  kf::actors::ActorOptions opts;
  std::optional<kf::Config> cfg;
  try {
    cfg = kf::Config::load(config_file, sets);
    const auto level = cfg->get_string("run.log_level");
    kf::log_set_level(level == "debug"   ? kf::LogLevel::Debug
                      : level == "warn"  ? kf::LogLevel::Warn
                      : level == "error" ? kf::LogLevel::Error
                                         : kf::LogLevel::Info);
    opts = kf::actors::actor_options(*cfg, id);
    if (!device.empty()) opts.device = device;
    if (max_groups > 0) opts.max_groups = max_groups;
    if (!run_dir.empty()) opts.metrics_dir = run_dir + "/metrics";
  } catch (const kf::Error& e) {
    kf::log_error("actor ", id, ": bad configuration: ", e.what(), "; exiting (code 2)");
    return 2;
  }
  std::unique_ptr<kf::replay::RunShm> shm;
  try {
    shm = kf::replay::RunShm::attach(run, std::chrono::milliseconds(static_cast<long long>(attach_wait_s * 1000)));
  } catch (const kf::Error& e) {
    kf::log_error("actor ", id, ": cannot attach to run '", run, "': ", e.what(),
                  "; exiting (code 3), the launcher restarts it once the run exists");
    return 3;
  }
  const std::string who = "actor " + std::to_string(id);
  std::unique_ptr<kf::replay::GroupSink> groups;
  try {
    groups = kf::transport::open_groups(*cfg, shm.get(), who);  // cluster.role: this node's run or the head's
  } catch (const kf::Error& e) {
    kf::log_error(who, ": cannot open where its groups go (cluster.role): ", e.what(),
                  "; exiting (code 1), the launcher restarts it");
    return 1;
  }
  try {
    auto policy = kf::actors::load_actor_policy(opts.policy_dir, opts.init_shape, opts.seed, opts.device);
    auto tasks = kf::actors::load_actor_tasks(opts);
    kf::actors::Actor actor(opts, std::move(policy), std::move(tasks), *shm, std::move(groups));
    actor.run(&g_stop);
    kf::log_info("actor ", id, ": stopped after ", actor.metrics().groups, " groups");
    return 0;
  } catch (const std::exception& e) {
    kf::log_error("actor ", id, ": ", kf::message_of(e), "; exiting (code 1), the launcher restarts it");
    return 1;
  }
}
