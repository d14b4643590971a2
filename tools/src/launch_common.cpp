#include "launch_common.h"

#include <torch/cuda.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include "kf/common/error.h"
#include "kf/common/log.h"

namespace kf::launch {

int cuda_device_count() { return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0; }

void save_run_outputs(replay::RunShm& shm, const RunDir& run, tasks::Backend backend) {
  shm.kernels().save(run.sub("kernels") + "/kernel_db.json");
  const std::string ext = backend == tasks::Backend::CUDA ? ".cu" : ".cpp";
  nlohmann::json index = nlohmann::json::object();
  for (const auto& task : shm.kernels().tasks()) {
    const auto best = shm.kernels().best(task);
    if (!best) continue;
    const std::string file = task + ext;
    write_file_atomic(run.sub("best") + "/" + file, best->source);
    index[task] = {{"speedup", best->speedup}, {"policy_version", best->policy_version}, {"file", file}};
  }
  write_file_atomic(run.sub("best") + "/index.json", index.dump(1));
}

namespace {
std::string launch_state_path(const RunDir& run) { return run.sub("checkpoints") + "/launch_state.json"; }
}  // namespace

double load_launch_state(const RunDir& run, RunMonitor& monitor) {
  const std::string p = launch_state_path(run);
  if (access(p.c_str(), R_OK) != 0) return 0;
  try {
    const auto j = nlohmann::json::parse(read_file(p));
    monitor.from_json(j);
    return j.value("elapsed_s", 0.0);
  } catch (const std::exception& e) {
    log_warn("launch: ", p, " is unreadable (", e.what(), "); run totals start from zero, the run goes on");
    return 0;
  }
}

void save_launch_state(const RunDir& run, const RunMonitor& monitor, double elapsed_s, const char* when) {
  nlohmann::json st = monitor.to_json();
  st["elapsed_s"] = elapsed_s;
  st["saved"] = when;
  write_file_atomic(launch_state_path(run), st.dump(1));
}

}  // namespace kf::launch
