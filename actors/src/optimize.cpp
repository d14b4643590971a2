// tools/optimize's pieces (optimize.h, optimize_prompt): exemplars from a saved kernel database
// or seed folder, the actor's prompt for one task, and .py task import.
#include "kf/actors/actors.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "kf/common/error.h"
#include "kf/common/log.h"
#include "kf/common/run_dir.h"
#include "kf/replay/replay.h"
#include "optimize.h"

extern char** environ;

namespace kf::actors {

namespace {

// POSIX, not std::filesystem: libtorch exports clashing copies of some of its symbols
// (see common/include/kf/common/fsutil.h).
bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}
bool is_file(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}
bool make_dirs(const std::string& p) {
  for (std::size_t i = 1; i <= p.size(); ++i)
    if (i == p.size() || p[i] == '/')
      if (::mkdir(p.substr(0, i).c_str(), 0755) != 0 && errno != EEXIST) return false;
  return !p.empty();
}
std::string file_stem(const std::string& p) {
  const auto slash = p.rfind('/');
  std::string name = slash == std::string::npos ? p : p.substr(slash + 1);
  const auto dot = name.rfind('.');
  return dot == std::string::npos || dot == 0 ? name : name.substr(0, dot);
}

std::string tail_lines(const std::string& text, int n) {
  std::size_t pos = text.size();
  while (pos > 0 && (text[pos - 1] == '\n')) --pos;
  for (int seen = 0; pos > 0; --pos)
    if (text[pos - 1] == '\n' && ++seen == n) break;
  return text.substr(pos);
}

}  // namespace

std::vector<ExemplarIn> load_exemplars(const std::string& path, const std::string& task, std::size_t k, uint64_t seed) {
  if (!exists(path)) throw Error("exemplars: '" + path + "' does not exist (a kernel_db.json or a folder)");
  std::string db_file;
  if (is_file(path))
    db_file = path;
  else if (is_file(path + "/kernel_db.json"))
    db_file = path + "/kernel_db.json";
  else if (is_file(path + "/kernels/kernel_db.json"))
    db_file = path + "/kernels/kernel_db.json";

  // A private database: the same bucketed draw as the actors' (KernelDb::exemplars). The
  // name is unlinked at once, so nothing is left in /dev/shm even if this process dies.
  static std::atomic<uint64_t> counter{0};
  const std::string name = "kfopt." + std::to_string(::getpid()) + "." + std::to_string(counter++) + ".kdb";
  auto db = replay::KernelDb::create(name, replay::KernelDbConfig{});
  replay::ShmSegment::remove(name);
  const std::size_t read = db_file.empty() ? db.seed_from_dir(path) : db.load(db_file);
  log_info("exemplars: ", read, " kernels read from ", db_file.empty() ? path : db_file, ", ", db.entries(task).size(),
           " for task ", task);
  std::vector<ExemplarIn> out;
  if (k == 0) return out;
  for (const auto& e : db.exemplars(task, k, seed)) out.push_back({e.speedup, e.policy_version, "ok", e.source});
  return out;
}

Prompt optimize_prompt(const ActorOptions& o, const ActorPolicy& policy, const tasks::Task& task,
                       std::vector<ExemplarIn> exemplars) {
  // As Actor's constructor and build_task_prompt do.
  const std::string tpl_path =
      resolve_tree_path(o.template_path.empty() ? "configs/prompts/contrastive.txt" : o.template_path);
  const auto tpl = PromptTemplate::load(tpl_path);
  const std::string abi_path =
      resolve_tree_path(o.abi_header_path.empty() ? "evaluator/include/kf/kernel.h" : o.abi_header_path);
  const int64_t context = o.context_tokens > 0 ? o.context_tokens : policy.config.max_position_embeddings;
  if (context <= o.max_new_tokens)
    throw Error("actors.prompt.context_tokens (" + std::to_string(context) +
                ") must exceed actors.sampling.max_new_tokens (" + std::to_string(o.max_new_tokens) + ")");
  if (o.mode != PromptMode::contrastive || o.exemplars <= 0) exemplars.clear();
  if (exemplars.size() > static_cast<std::size_t>(o.exemplars)) {
    // Keep the spread of speedups: an even pick across the ascending list.
    std::vector<ExemplarIn> pick;
    const std::size_t n = exemplars.size(), k = static_cast<std::size_t>(o.exemplars);
    for (std::size_t i = 0; i < k; ++i) pick.push_back(exemplars[i * (n - 1) / std::max<std::size_t>(1, k - 1)]);
    exemplars = std::move(pick);
  }
  PromptOptions po;
  po.mode = o.mode;
  po.max_tokens = static_cast<std::size_t>(context - o.max_new_tokens);
  po.min_exemplar_tokens = static_cast<std::size_t>(o.min_exemplar_tokens);
  po.marker = o.extract.marker;
  po.abi = compact_abi(read_file(abi_path));
  po.chat = policy::ChatTemplate::for_model(o.policy_dir, o.chat_vars);
  return build_prompt(tpl, policy.codec, task_info(task, o.backend), exemplars, po);
}

std::string import_task_file(const std::string& py_file, const std::string& out_dir, tasks::Backend backend,
                             const std::string& python) {
  if (!is_file(py_file)) throw Error("task file '" + py_file + "' does not exist");
  const std::string importer = resolve_tree_path("tasks/importer/kf_import.py");
  if (!is_file(importer))
    throw Error("the task importer tasks/importer/kf_import.py is not found (set KF_SOURCE_DIR to the source tree)");
  if (!make_dirs(out_dir)) throw Error(out_dir + ": cannot create the folder: " + std::strerror(errno));
  const std::string log_path = out_dir + "/import.log";

  std::vector<std::string> args = {
      python, importer, py_file, "--out", out_dir, "--backends", tasks::backend_name(backend)};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  const int err = posix_spawnp(&pid, python.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (err != 0)
    throw Error("importing " + py_file + ": cannot start the importer's python '" + python +
                "': " + std::strerror(err) + " (set KF_PYTHON)");
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  std::string log;
  try {
    log = read_file(log_path);
  } catch (const Error&) {
  }
  const std::string artifact = out_dir + "/" + file_stem(py_file);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || !exists(artifact + "/task.json")) {
    const std::string how = WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status))
                                              : "signal " + std::to_string(WTERMSIG(status));
    throw Error("importing " + py_file + " failed (" + how + ", log " + log_path + "):\n" + tail_lines(log, 6));
  }
  return artifact;
}

}  // namespace kf::actors
