// What the cluster and serial modes share (see launch_common.h): GPUs, the run's outputs and
// launch state, run names, dead runs' shared memory, sandbox scratch folders.
#include "launch_common.h"

#include <torch/cuda.h>

#include <dirent.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <nlohmann/json.hpp>

#include "kf/common/error.h"
#include "kf/common/log.h"
#include "kf/replay/replay.h"

namespace kf::launch {

int cuda_device_count() { return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0; }

std::vector<std::string> cuda_visible_entries() {
  std::vector<std::string> out;
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  if (!v) return out;
  std::string cur;
  for (char c : std::string(v) + ",") {
    if (c == ',') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else if (c != ' ') {
      cur += c;
    }
  }
  return out;
}

namespace {
std::string utc_stamp() {
  char buf[32];
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

void remove_tree(const std::string& path) {
  ::nftw(
      path.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }, 16,
      FTW_DEPTH | FTW_PHYS);
}

bool others_can_search(const std::string& dir) {
  struct stat st {};
  return ::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & S_IXOTH);
}

void mkdir_searchable(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0711) != 0 && errno != EEXIST)
    throw Error("launch: cannot create scratch folder " + dir + ": " + std::strerror(errno));
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0 && !(st.st_mode & S_IXOTH)) ::chmod(dir.c_str(), (st.st_mode & 07777) | 0011);
}
}  // namespace

void save_run_outputs(replay::RunShm& shm, const RunDir& run, tasks::Backend backend) {
  shm.kernels().save(run.sub("kernels") + "/kernel_db.json");
  const std::string ext = backend == tasks::Backend::CUDA ? ".cu" : ".cpp";
  // best/ is a union with what is already there: a task whose saved best is faster than
  // (or missing from) the database keeps its entry and file.
  nlohmann::json index = nlohmann::json::object();
  const std::string index_path = run.sub("best") + "/index.json";
  if (access(index_path.c_str(), R_OK) == 0) {
    try {
      const auto old = nlohmann::json::parse(read_file(index_path));
      if (old.is_object())
        for (const auto& [task, e] : old.items())
          if (e.is_object() && e.contains("speedup") && e["speedup"].is_number() && e.contains("file")) index[task] = e;
    } catch (const std::exception& e) {
      log_warn("launch: ", index_path, " is unreadable (", e.what(), "); writing a new one from the kernel database");
    }
  }
  for (const auto& task : shm.kernels().tasks()) {
    const auto best = shm.kernels().best(task);
    if (!best) continue;
    if (index.contains(task) && index[task]["speedup"].get<double>() > best->speedup) continue;
    const std::string file = task + ext;
    write_file_atomic(run.sub("best") + "/" + file, best->source);
    index[task] = {{"speedup", best->speedup}, {"policy_version", best->policy_version}, {"file", file}};
  }
  write_file_atomic(index_path, index.dump(1));
}

std::size_t merge_saved_kernels(replay::RunShm& shm, const RunDir& run) {
  const std::string path = run.sub("kernels") + "/kernel_db.json";
  if (access(path.c_str(), R_OK) != 0) return 0;
  const std::size_t before = shm.kernels().stats().entries;
  std::size_t read = 0;
  try {
    read = shm.kernels().load(path);
  } catch (const std::exception& e) {
    const std::string aside = path + ".unreadable-" + utc_stamp();
    if (::rename(path.c_str(), aside.c_str()) == 0)
      log_error("launch: ", path, " cannot be merged (", e.what(), "); moved aside to ", aside,
                " so the run's new database does not overwrite it");
    else
      log_error("launch: ", path, " cannot be merged (", e.what(), ") nor moved aside (", std::strerror(errno),
                "); it will be overwritten at the next save");
    return 0;
  }
  log_info("launch: merged ", path, " (", read, " entries) into the run's kernel database (", before, " -> ",
           shm.kernels().stats().entries, " entries); the checkpoint's own kernel_db.json is added by the learner");
  return read;
}

void check_run_name(const std::string& name, const std::string& key) {
  bool ok = !name.empty() && name.size() <= 100 && name[0] != '.';
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) ok = false;
  if (!ok)
    throw Error(key + ": '" + name +
                "' is not a valid run name (1..100 characters of [A-Za-z0-9._-], not starting "
                "with '.')");
}

std::vector<std::string> remove_dead_run_shm(const std::string& key, bool lock_too) {
  const std::string ctl = replay::RunShm::segment_name(key, "ctl");
  if (replay::ShmSegment::probe(ctl) == replay::SegmentState::Live) {
    int32_t pid = 0;
    try {
      pid = replay::ControlBlock::attach(ctl, std::chrono::milliseconds(200)).segment().creator_pid();
    } catch (const std::exception&) {
    }
    throw Error("run '" + key + "': its launcher" + (pid > 0 ? " (pid " + std::to_string(pid) + ")" : std::string()) +
                " is alive; stop it first (Ctrl-C, or SIGTERM to that pid)");
  }
  // kf.<key>.<part> where <part> has no '.': run "a" never takes run "a.b"'s segments.
  std::vector<std::string> removed;
  const std::string prefix = "kf." + key + ".";
  for (const auto& n : list_dir("/dev/shm")) {
    if (n.rfind(prefix, 0) != 0 || n.find('.', prefix.size()) != std::string::npos) continue;
    if (!lock_too && n == prefix + "lock") continue;
    const std::string p = "/dev/shm/" + n;
    if (::unlink(p.c_str()) == 0)
      removed.push_back(p);
    else
      log_warn("launch: cannot remove ", p, ": ", std::strerror(errno));
  }
  return removed;
}

std::string scratch_root(const RunDir& run) {
  // Every folder above the run must let `nobody` through; otherwise a shared /tmp folder.
  std::string abs = run.path();
  if (abs.empty() || abs[0] != '/') {
    char cwd[4096];
    if (::getcwd(cwd, sizeof cwd)) abs = std::string(cwd) + "/" + abs;
  }
  bool ok = true;
  for (std::size_t i = abs.find('/', 1); ok && i != std::string::npos; i = abs.find('/', i + 1))
    ok = others_can_search(abs.substr(0, i));
  if (ok) return run.path() + "/tmp";
  return "/tmp/kf-scratch-" + run.shm_key();  // one per folder, as the shared memory
}

std::string scratch_dir(const RunDir& run, const std::string& role, int id) {
  const std::string root = scratch_root(run);
  if (::access(run.path().c_str(), F_OK) == 0 && root.rfind(run.path(), 0) == 0) {
    struct stat st {};
    if (::stat(run.path().c_str(), &st) == 0 && !(st.st_mode & S_IXOTH))
      ::chmod(run.path().c_str(), (st.st_mode & 07777) | 0011);
  }
  mkdir_searchable(root);
  const std::string dir = root + "/" + role + "-" + std::to_string(id);
  mkdir_searchable(dir);
  return dir;
}

std::size_t clear_dir(const std::string& dir) {
  std::size_t n = 0;
  for (const auto& name : list_dir(dir)) {
    remove_tree(dir + "/" + name);
    ++n;
  }
  return n;
}

std::size_t clear_scratch(const RunDir& run) {
  const std::string root = scratch_root(run);
  std::size_t n = 0;
  for (const auto& w : list_dir(root)) n += clear_dir(root + "/" + w);
  return n;
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

nlohmann::json read_launch_state(const RunDir& run) {
  const std::string p = launch_state_path(run);
  if (access(p.c_str(), R_OK) != 0) return nlohmann::json::object();
  try {
    auto j = nlohmann::json::parse(read_file(p));
    return j.is_object() ? j : nlohmann::json::object();
  } catch (const std::exception&) {
    return nlohmann::json::object();
  }
}

void save_launch_state(const RunDir& run, const RunMonitor& monitor, double elapsed_s, const char* when,
                       int64_t policy_version, const nlohmann::json& extra) {
  nlohmann::json st = monitor.to_json();
  for (auto it = extra.begin(); it != extra.end(); ++it) st[it.key()] = it.value();
  st["elapsed_s"] = elapsed_s;
  // Never lower than what an earlier session saved (a resumed run starts its store empty).
  int64_t newest = policy_version;
  try {
    if (access(launch_state_path(run).c_str(), R_OK) == 0)
      newest = std::max<int64_t>(
          newest, nlohmann::json::parse(read_file(launch_state_path(run))).value("policy_version", int64_t{-1}));
  } catch (const std::exception&) {
  }
  st["policy_version"] = newest;
  st["saved"] = when;
  write_file_atomic(launch_state_path(run), st.dump(1));
}

}  // namespace kf::launch
