// Pieces both launch modes (cluster and serial) share.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kf/common/config.h"
#include "kf/common/run_dir.h"
#include "kf/replay/replay.h"
#include "kf/tasks/tasks.h"
#include "run_monitor.h"

namespace kf::launch {

// Visible CUDA devices (0 without a driver or a GPU).
int cuda_device_count();
// The entries of the launcher's CUDA_VISIBLE_DEVICES (Slurm's --gres sets it), in order,
// spaces dropped; empty when it is unset or empty.
std::vector<std::string> cuda_visible_entries();

// The run's readable outputs: kernels/kernel_db.json (the whole database) and
// best/<task>.<cu|cpp> with best/index.json (task -> speedup, policy version, file).
// Each file is written atomically.
void save_run_outputs(replay::RunShm& shm, const RunDir& run, tasks::Backend backend);

// checkpoints/launch_state.json: the monitor's run totals and the elapsed seconds, for
// --resume. load_launch_state() adds a saved state to `monitor` and returns its elapsed
// seconds (0 when there is none; an unreadable file is logged and treated as none).
double load_launch_state(const RunDir& run, RunMonitor& monitor);
// policy_version: the newest published snapshot version (-1: none), kept so a learner of a
// resumed run can continue past every version the run ever published. extra: more top-level
// keys (a head's network account).
void save_launch_state(const RunDir& run, const RunMonitor& monitor, double elapsed_s, const char* when,
                       int64_t policy_version = -1, const nlohmann::json& extra = nlohmann::json::object());
// The saved state as it is (an empty object when there is none or it is unreadable).
nlohmann::json read_launch_state(const RunDir& run);

// Resume with a newer kernels/kernel_db.json than the checkpoint it falls back to: the
// file's entries are inserted into the run's database (a union: identical sources are
// not stored twice, a full task keeps its faster kernels), so save_run_outputs() never
// writes fewer entries than the run had. Logs both paths and the counts. Returns the
// entries read (0: no file). A file that cannot be read is moved aside
// (kernel_db.json.unreadable-<time>, logged) rather than overwritten.
std::size_t merge_saved_kernels(replay::RunShm& shm, const RunDir& run);

// The run name as tools/launch accepts it: 1..100 characters of [A-Za-z0-9._-], not
// starting with '.' (it names the run folder; the shared memory is kf.<RunDir::shm_key()>.*).
// Throws kf::Error naming `key`.
void check_run_name(const std::string& name, const std::string& key);

// Shared memory of the run whose RunDir::shm_key() is `key` (/dev/shm/kf.<key>.<part>,
// the creation lock included)
// whose launcher is gone: removed; returns the paths removed (empty: none was there).
// Throws kf::Error naming the pid when the run's launcher is still alive.
// lock_too: also the creation lock file (tools/launch --clean; not while starting a run).
std::vector<std::string> remove_dead_run_shm(const std::string& key, bool lock_too);

// Scratch folders: each evaluator gets TMPDIR=<run>/tmp/evaluator-<id> (the sandbox
// makes its kf-sandbox-* folders there). Its worker runs as `nobody`, so every folder
// on that path must be searchable by others (o+x): scratch_dir() makes the folders with
// mode 0711 and, if a folder above the run is not o+x, uses /tmp/kf-scratch-<RunDir::shm_key()>
// instead (logged once). clear_dir() removes what is inside and returns the count.
std::string scratch_root(const RunDir& run);
std::string scratch_dir(const RunDir& run, const std::string& role, int id);
std::size_t clear_dir(const std::string& dir);
std::size_t clear_scratch(const RunDir& run);  // every worker's scratch folder

}  // namespace kf::launch
