// Pieces both launch modes (cluster and serial) share.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "kf/common/config.h"
#include "kf/common/run_dir.h"
#include "kf/replay/run_shm.h"
#include "kf/tasks/task.h"
#include "run_monitor.h"

namespace kf::launch {

// Visible CUDA devices (0 without a driver or a GPU).
int cuda_device_count();

// The run's readable outputs: kernels/kernel_db.json (the whole database) and
// best/<task>.<cu|cpp> with best/index.json (task -> speedup, policy version, file).
// Each file is written atomically.
void save_run_outputs(replay::RunShm& shm, const RunDir& run, tasks::Backend backend);

// checkpoints/launch_state.json: the monitor's run totals and the elapsed seconds, for
// --resume. load_launch_state() adds a saved state to `monitor` and returns its elapsed
// seconds (0 when there is none; an unreadable file is logged and treated as none).
double load_launch_state(const RunDir& run, RunMonitor& monitor);
void save_launch_state(const RunDir& run, const RunMonitor& monitor, double elapsed_s, const char* when);

}  // namespace kf::launch
