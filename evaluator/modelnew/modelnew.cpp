// ModelNew candidates (see modelnew.h): the confined compile step, the Python worker's view
// and spawn, the verdict's named tricks, and the probe.
#include "modelnew.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "kf/common/error.h"
#include "kf/common/fsutil.h"
#include "kf/common/gpu_lock.h"
#include "kf/common/log.h"
#include "attempt.h"  // defines: abi_backend
#include "process.h"  // defines: SpawnSpec, Confinement, run_bounded, pick_env
#include "reward.h"
#include "sandbox.h"
#include "sha256.h"        // defines: sha256_hex
#include "stats.h"         // defines: quantile, paired_speedup_interval
#include "tensor_check.h"  // defines: abi_dtype

#ifdef KF_MN_CUDA
#include <cuda_runtime.h>
#endif

namespace kf::evaluator::modelnew {
namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kViewMn = "/kf/mn";  // worker.py, build_ext.py, mn_common.py
constexpr const char* kViewLib = "/kf/lib/libkf_modelnew_confine.so";
constexpr const char* kViewJob = "/kf/job";  // the compile step's folder (read-only for the worker)
constexpr const char* kViewScratch = "/kf/scratch";
constexpr uint64_t kEvidenceBytes = 1 << 16;
constexpr uid_t kNobody = 65534;

std::string read_text(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
void write_text(const std::string& p, const std::string& s, mode_t mode = 0644) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << s;
  f.close();
  if (!f) throw error_at(p, "cannot write");
  ::chmod(p.c_str(), mode);
}

// A folder of the host is shown in the view at its own path, unless that path is one the
// view hides or makes itself (its private /tmp, /kf, /dev, /proc, /sys) or is not plain
// (a space, a quote: torch's build files do not quote paths): then it is shown at
// /kf/host/<n>. So the interpreter, the toolkit and the scripts are found wherever the
// checkout lives (under /tmp, in a path with spaces, on a read-only file system).
struct Placement {
  std::vector<std::pair<std::string, std::string>> roots;  // (host folder, folder in the view)
  // The path in the view of a host path under one of the roots (else the path itself).
  std::string in_view(const std::string& host) const {
    for (const auto& [h, v] : roots)
      if (host == h || host.rfind(h + "/", 0) == 0) return v + host.substr(h.size());
    return host;
  }
  void add(const std::string& host) {
    for (const auto& [h, v] : roots)
      if (host == h || host.rfind(h + "/", 0) == 0) return;  // covered
    auto under = [&](const char* top) { return host == top || host.rfind(std::string(top) + "/", 0) == 0; };
    bool plain = true;
    for (char ch : host)
      plain = plain && (std::isalnum(static_cast<unsigned char>(ch)) || std::strchr("/._+-", ch) != nullptr);
    const bool moved = !plain || under("/tmp") || under("/kf") || under("/dev") || under("/proc") || under("/sys");
    roots.push_back({host, moved ? "/kf/host/" + std::to_string(roots.size()) : host});
  }
};

// The interpreter's install: what the view must hold for `python -I` to import torch.
struct PythonInstall {
  std::string exe;  // the interpreter as configured (a venv's python is fine), on the host
  Placement place;  // its folders (none under /usr, which the view binds whole)
  std::string view_exe() const { return place.in_view(exe); }
};

std::string real_path(const std::string& p) {
  std::error_code ec;
  const fs::path r = fs::canonical(p, ec);
  return ec ? p : r.string();
}

const PythonInstall& python_install(const std::string& exe) {
  static std::mutex mu;
  static std::map<std::string, PythonInstall> done;
  std::lock_guard<std::mutex> lk(mu);
  auto it = done.find(exe);
  if (it != done.end()) return it->second;
  PythonInstall pi;
  pi.exe = exe;
  SpawnSpec s;
  s.argv = {pi.exe, "-I", "-c",
            "import sys,os,json;print(json.dumps([sys.prefix,sys.base_prefix,os.path.realpath(sys.executable)]+"
            "[p for p in sys.path if p]))"};
  s.env = pick_env({"PATH", "LD_LIBRARY_PATH"});
  BoundedRun r = run_bounded(s, 60, 1 << 16);
  if (!WIFEXITED(r.status) || WEXITSTATUS(r.status) != 0)
    throw Error("modelnew: python '" + pi.exe + "' does not run: " + describe_wait_status(r.status) + " " + r.output);
  std::vector<std::string> cand;
  try {
    for (const auto& p : json::parse(r.output)) cand.push_back(p.get<std::string>());
  } catch (const std::exception& e) {
    throw Error("modelnew: python '" + pi.exe + "': its path list: " + e.what());
  }
  cand[2] = fs::path(cand[2]).parent_path().parent_path().string();  // .../bin/python3 -> ...
  cand.push_back(fs::path(pi.exe).parent_path().parent_path().string());
  std::sort(cand.begin(), cand.end());  // parents before their children
  for (const auto& c : cand) {
    std::error_code ec;
    if (!fs::is_directory(c, ec) || c == "/" || c == "/usr" || c.rfind("/usr/", 0) == 0) continue;
    pi.place.add(c);
  }
  return done.emplace(exe, std::move(pi)).first->second;
}

// The CUDA toolkit load_inline builds with: the configured nvcc's install, by its real path
// (named paths may lead through links the view does not hold: on NVIDIA's packages
// /usr/local/cuda -> /etc/alternatives/cuda -> /usr/local/cuda-X, and the view has no /etc).
// Empty when there is no nvcc.
std::string toolkit_root(const EvalOptions& o) {
  const std::string nvcc = o.compile.nvcc.empty() ? "/usr/local/cuda/bin/nvcc" : o.compile.nvcc;
  if (::access(nvcc.c_str(), X_OK) != 0) return "";
  return fs::path(real_path(nvcc)).parent_path().parent_path().string();
}

// Everything the confined processes see of the host, for one configuration.
struct Setup {
  const PythonInstall* py = nullptr;
  std::string scripts;  // worker.py, build_ext.py, mn_common.py (host folder)
  std::string toolkit;  // CUDA toolkit root on the host ("" without one)
  Placement extra;      // the toolkit, when it is not under /usr or the interpreter's folders
  std::string toolkit_in_view() const { return toolkit.empty() ? "" : extra.in_view(py->place.in_view(toolkit)); }
};

Setup setup_of(const Options& o) {
  Setup st;
  st.py = &python_install(o.python.empty() ? std::string(KF_PYTHON_PATH) : o.python);
  st.scripts = o.scripts_dir.empty() ? std::string(KF_MN_DIR) : o.scripts_dir;
  for (const char* f : {"worker.py", "build_ext.py", "mn_common.py"})
    if (!fsutil::exists(st.scripts + "/" + f)) throw error_at(st.scripts + "/" + f, "missing (modelnew scripts_dir)");
  st.toolkit = toolkit_root(o.eval);
  if (!st.toolkit.empty() && st.toolkit != "/usr" && st.toolkit.rfind("/usr/", 0) != 0 &&
      st.py->place.in_view(st.toolkit) == st.toolkit)
    st.extra.add(st.toolkit);
  // Placement numbers its moved folders from 0: the toolkit's must not meet the interpreter's.
  for (auto& [h, v] : st.extra.roots)
    if (v.rfind("/kf/host/", 0) == 0) v = "/kf/host/t" + v.substr(std::strlen("/kf/host/"));
  return st;
}

// The private view shared by the compile step and the worker: the system (/usr and the /lib*,
// /bin links), the Python install, the CUDA toolkit, our scripts, /dev/{null,zero,random,urandom}.
Confinement base_view(const std::string& mount_point, const Setup& st) {
  Confinement c;
  c.enabled = true;
  c.mount_point = mount_point;
  c.binds.push_back({"/usr", "/usr"});
  for (const char* top : {"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}) {
    struct stat st2;
    if (::lstat(top, &st2) != 0) continue;
    if (S_ISLNK(st2.st_mode)) {
      std::error_code ec;
      c.symlinks.push_back({fs::read_symlink(top, ec).string(), top});
    } else if (S_ISDIR(st2.st_mode)) {
      c.binds.push_back({top, top});
    }
  }
  for (const auto& [h, v] : st.py->place.roots) c.binds.push_back({h, v});
  for (const auto& [h, v] : st.extra.roots) c.binds.push_back({h, v});
  c.binds.push_back({st.scripts, kViewMn});
  for (const char* d : {"/dev/null", "/dev/zero", "/dev/random", "/dev/urandom"})
    c.binds.push_back({d, d, /*writable=*/true, /*devices=*/true});
  c.uid = kNobody;
  c.gid = kNobody;
  return c;
}

std::string view_root(const std::string& cache) {
  const std::string v = cache + "/.mn-view";
  if (!fsutil::make_dirs(v, 0755)) throw error_at(v, std::string("cannot create: ") + std::strerror(errno));
  return v;
}

std::string cache_dir(const EvalOptions& o) {
  std::string c = o.compile.cache_dir;
  if (c.empty()) {
    const char* e = std::getenv("KF_EVAL_CACHE");
    c = e && *e ? e : "/tmp/kf-eval-cache-" + std::to_string(getuid());
  }
  return c;
}

std::string task_spec_json(const tasks::Task& task, tasks::Backend b) {
  json j = json::parse(read_text(task.dir() + "/task.json"));
  json spec;
  spec["task"] = task.name();
  spec["source"] = task.source();
  spec["mode"] = task.mode();
  spec["init_seed"] = j.value("init_seed", 0);
  const auto& be = j["backends"][tasks::backend_name(b)];
  spec["sizes"] = be.contains("sizes") ? be["sizes"] : json::object();
  spec["params"] = json::array();
  std::set<std::string> fl;
  for (const auto& p : task.params(b)) {
    std::string dt = c10::toString(p.dtype);
    // c10 names ("Float") -> torch names ("float32")
    static const std::map<std::string, std::string> names = {
        {"Float", "float32"}, {"Half", "float16"}, {"BFloat16", "bfloat16"}, {"Double", "float64"}, {"Int", "int32"},
        {"Long", "int64"},    {"Short", "int16"},  {"Char", "int8"},         {"Byte", "uint8"},     {"Bool", "bool"}};
    auto it = names.find(dt);
    spec["params"].push_back({{"name", p.name}, {"shape", p.shape}, {"dtype", it == names.end() ? dt : it->second}});
  }
  for (const auto* list : {&task.inputs(b), &task.outputs(b)})
    for (const auto& t : *list)
      if (at::isFloatingType(t.dtype))
        fl.insert(t.dtype == at::kDouble ? "float64" : t.dtype == at::kFloat ? "float32" : "narrow");
  spec["float_dtypes"] = std::vector<std::string>(fl.begin(), fl.end());
  return spec.dump();
}

// Files the confined compile step wrote become the evaluator's (root, plain files and
// folders only), so nothing of the candidate's can change them later.
std::string adopt_tree(const std::string& dir) {
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    const auto st = it->symlink_status(ec);
    if (!fs::is_regular_file(st) && !fs::is_directory(st)) return it->path().string() + " is not a plain file";
    if (geteuid() == 0 && ::lchown(it->path().c_str(), 0, 0) != 0) return "chown " + it->path().string();
    ::chmod(it->path().c_str(), fs::is_directory(st) ? 0755 : 0644);
  }
  if (geteuid() == 0) (void)!::chown(dir.c_str(), 0, 0);
  ::chmod(dir.c_str(), 0755);
  return ec ? ec.message() : "";
}

struct Build {
  CompileResult cr;
  std::string job;  // the job folder on the host
};

constexpr const char* kTritonOnCuda =
    "modelnew: Triton kernels are verified on the CPU backend only (in Triton's interpreter): on CUDA their "
    "compile at the first launch runs ptxas and writes a cache, which the sandbox worker may not";

// A candidate that imports Triton (KernelBench's triton backend).
bool uses_triton(const std::string& source) {
  static const std::regex re(R"((^|\n)\s*(import\s+triton|from\s+triton[\s.]))");
  return std::regex_search(source, re);
}

// The compile step: build_ext.py in the view, the job folder writable at /kf/job.
Build build(const tasks::Task& task, tasks::Backend b, const std::string& source, const Options& o) {
  const auto t0 = Clock::now();
  Build out;
  const std::string cache = cache_dir(o.eval);
  const std::string spec = task_spec_json(task, b);
  const Setup st = setup_of(o);
  const PythonInstall& py = *st.py;
  // The build scripts and the toolkit are part of the key: a changed compile step builds
  // (and fails) afresh.
  const std::string scripts =
      sha256_hex(read_text(st.scripts + "/build_ext.py") + read_text(st.scripts + "/mn_common.py"));
  out.cr.key = sha256_hex("modelnew\n" + std::string(tasks::backend_name(b)) + "\n" + o.eval.compile.cuda_arch + "\n" +
                          py.exe + "\n" + st.toolkit + "\n" + scripts + "\n" + spec + "\n" + source);
  const std::string root = cache + "/modelnew";
  if (!fsutil::make_dirs(root, 0755)) throw error_at(root, std::string("cannot create: ") + std::strerror(errno));
  ::chmod(cache.c_str(), 0755);
  out.job = root + "/" + out.cr.key.substr(0, 32);
  out.cr.so_path = std::string(kViewJob) + "/candidate.py";
  auto seconds = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  if (fsutil::exists(out.job + "/manifest.json") && fsutil::exists(out.job + "/built")) {
    out.cr.ok = true;
    out.cr.cached = true;
    out.cr.seconds = seconds();
    return out;
  }
  if (fsutil::exists(out.job + "/failed")) {
    out.cr.cached = true;
    out.cr.diagnostics = read_text(out.job + "/failed");
    out.cr.timed_out = fsutil::exists(out.job + "/timed_out");
    out.cr.seconds = seconds();
    return out;
  }
  if (b == tasks::Backend::CUDA && uses_triton(source)) {
    // Triton compiles a kernel at its first launch (ptxas, a cache folder): inside the
    // worker, where the sandbox allows neither. Until the compile step builds them, say so;
    // not the candidate's fault, so the learner leaves it out.
    out.cr.environment_failure = true;
    out.cr.diagnostics = kTritonOnCuda;
    out.cr.seconds = seconds();
    return out;
  }
  const std::string work = out.job + ".tmp." + std::to_string(getpid());
  fsutil::remove_tree(work);
  if (!fsutil::make_dirs(work, 0755)) throw error_at(work, std::string("cannot create: ") + std::strerror(errno));
  write_text(work + "/candidate.py", source);
  write_text(work + "/spec.json", spec);
  if (geteuid() == 0 && ::chown(work.c_str(), kNobody, kNobody) != 0)
    throw error_at(work, std::string("chown to nobody: ") + std::strerror(errno));

  SpawnSpec s;
  s.argv = {py.view_exe(), "-I", "-B", std::string(kViewMn) + "/build_ext.py", kViewJob};
  const std::string arch = o.eval.compile.cuda_arch;  // sm_90 -> 9.0
  std::string arch_list = arch.rfind("sm_", 0) == 0 && arch.size() >= 5
                              ? arch.substr(3, arch.size() - 4) + "." + arch.substr(arch.size() - 1)
                              : "9.0";
  // The toolkit by its real path (toolkit_root); without one, torch's own search finds none.
  const std::string cuda_home = st.toolkit_in_view();
  s.env = pick_env({"LD_LIBRARY_PATH"});
  s.env.insert(s.env.end(),
               {"PATH=" + fs::path(py.view_exe()).parent_path().string() +
                    (cuda_home.empty() ? "" : ":" + cuda_home + "/bin") + ":/usr/bin:/bin",
                "HOME=/tmp", "TMPDIR=/tmp", "LANG=C",
                // /usr/bin/c++ and cc lead through /etc/alternatives, which the view does not hold
                "CXX=g++", "CC=gcc", "TORCH_CUDA_ARCH_LIST=" + arch_list, "TORCH_EXTENSIONS_DIR=/tmp/torch_extensions",
                "MAX_JOBS=" + std::to_string(std::max(1, o.eval.compile.jobs > 0 ? o.eval.compile.jobs : 2)),
                "PYTHONDONTWRITEBYTECODE=1", "USER=nobody", "LOGNAME=nobody"});
  if (!cuda_home.empty()) s.env.push_back("CUDA_HOME=" + cuda_home);
  if (b == tasks::Backend::CPU) s.env.push_back("TRITON_INTERPRET=1");
  s.cwd = kViewJob;
  s.confine = base_view(view_root(cache), st);
  s.confine.binds.push_back({work, kViewJob, /*writable=*/true});
  s.confine.tmp_options = "size=2g,mode=1777";
  s.rlimits.push_back({int(RLIMIT_CPU), (unsigned long long)(o.build_timeout_s * 4)});
  BoundedRun r;
  try {
    r = run_bounded(s, o.build_timeout_s, 1 << 16);
  } catch (const std::exception& e) {
    fsutil::remove_tree(work);
    log_error("modelnew: the compile step did not run (", e.what(),
              "); the candidate is scored as an environment failure");
    out.cr.environment_failure = true;
    out.cr.diagnostics = std::string("modelnew compile step: the build did not run: ") + e.what();
    out.cr.seconds = seconds();
    return out;
  }
  out.cr.seconds = seconds();
  const bool ok = WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0;
  std::string why = ok ? adopt_tree(work) : "";
  if (ok && why.empty() && fsutil::exists(work + "/manifest.json")) {
    write_text(work + "/built", "");
    std::error_code ec;
    fs::rename(work, out.job, ec);
    if (ec) fsutil::remove_tree(work);  // another evaluator finished first: use its build
    out.cr.ok = true;
    return out;
  }
  // The candidate's failure: the last lines of the output (the error), then the head.
  std::string diag = r.output;
  if (diag.size() > 4000) diag = diag.substr(0, 1000) + "\n...\n" + diag.substr(diag.size() - 2900);
  if (!why.empty()) diag = "the compile step left " + why + "\n" + diag;
  if (r.timed_out) diag = "the compile step took longer than " + std::to_string(int(o.build_timeout_s)) + " s\n" + diag;
  if (!WIFEXITED(r.status) || (WEXITSTATUS(r.status) != 0 && WEXITSTATUS(r.status) != 1))
    diag = "the compile step ended: " + describe_wait_status(r.status) + "\n" + diag;
  out.cr.diagnostics = diag;
  out.cr.timed_out = r.timed_out;
  fsutil::remove_tree(work);
  if (fsutil::make_dirs(out.job, 0755)) {  // failures are cached too
    write_text(out.job + "/failed", diag);
    if (r.timed_out) write_text(out.job + "/timed_out", "");
  }
  return out;
}

// The worker's spawn: python worker.py in the view, the job read-only at /kf/job, the
// sandbox's scratch at /kf/scratch holding spec.json; the identity comes from the view.
std::function<void(SpawnSpec&)> worker_spawn(const std::string& job, const std::string& spec_json, bool cuda,
                                             const std::string& cache, const Setup& st) {
  return [job, spec_json, cuda, cache, st](SpawnSpec& s) {
    std::string scratch;
    std::vector<std::string> rest;
    for (size_t i = 1; i < s.argv.size(); ++i) {
      if (s.argv[i] == "--scratch" && i + 1 < s.argv.size()) {
        scratch = s.argv[++i];
        rest.insert(rest.end(), {"--scratch", kViewScratch});
      } else if (s.argv[i] != "--no-drop-root" && s.argv[i] != "--own-uid") {  // the view decides both
        rest.push_back(s.argv[i]);
      }
    }
    if (scratch.empty()) throw Error("modelnew: the sandbox passed no --scratch folder");
    write_text(scratch + "/spec.json", spec_json);
    s.argv = {st.py->view_exe(), "-I", "-B", std::string(kViewMn) + "/worker.py"};
    s.argv.insert(s.argv.end(), rest.begin(), rest.end());
    s.argv.push_back("--no-drop-root");  // the view already made the worker nobody
    std::vector<std::string> env;
    for (const auto& e : s.env)
      if (e.rfind("HOME=", 0) != 0 && e.rfind("TMPDIR=", 0) != 0) env.push_back(e);
    env.insert(env.end(), {"HOME=/tmp", "TMPDIR=/tmp", std::string("KF_MN_CONFINE_LIB=") + kViewLib,
                           "PYTHONDONTWRITEBYTECODE=1", "TORCH_EXTENSIONS_DIR=/tmp/torch_extensions",
                           // getpass.getuser() reads these first; else a passwd lookup opens nscd's socket
                           "USER=nobody", "LOGNAME=nobody", "TORCHINDUCTOR_CACHE_DIR=/tmp/inductor"});
    if (!cuda) env.push_back("TRITON_INTERPRET=1");  // Triton kernels run in its interpreter on the CPU
    s.env = env;
    s.cwd = kViewScratch;
    s.confine = base_view(view_root(cache), st);
    s.confine.binds.push_back({KF_MN_CONFINE_LIB, kViewLib});
    s.confine.binds.push_back({job, kViewJob});
    s.confine.binds.push_back({scratch, kViewScratch});
    if (cuda) {
      // The driver's device nodes and the kernel's views it reads (device enumeration).
      std::error_code ec;
      for (const auto& e : fs::directory_iterator("/dev", ec)) {
        const std::string n = e.path().filename().string();
        if (n.rfind("nvidia", 0) == 0 && !e.is_directory(ec))
          s.confine.binds.push_back({e.path().string(), e.path().string(), true, true});
      }
      // cuInit names its threads through /proc/<pid>/task/<tid>/comm and fails (304) when
      // that write fails: the view gets a /proc of its own, listing only the worker. Without
      // one (not root, or Linux < 5.8) the host's /proc is shown read-only, and CUDA fails
      // to start with the worker's diagnosis rather than the worker seeing, writable, the
      // /proc entries of every other worker.
      if (private_proc_supported())
        s.confine.private_proc = true;
      else
        s.confine.binds.push_back({"/proc", "/proc"});
      s.confine.binds.push_back({"/sys", "/sys"});
    } else {
      // torch's cpuinfo (fp16/bf16 kernels pick their ISA with it) reads these.
      for (const char* p : {"/proc/cpuinfo", "/sys/devices/system/cpu"})
        if (fsutil::exists(p)) s.confine.binds.push_back({p, p});
    }
  };
}

// --- the verdict: the worker's named failures (worker.py, rc 101..105)
void name_worker_failure(Result& r) {
  if (r.verdict != Verdict::runtime_error || r.reason.rfind("kf_forward returned 10", 0) != 0) return;
  const int rc = std::atoi(r.reason.c_str() + std::strlen("kf_forward returned "));
  // The worker's own line; the last one wins (the log tail is the worker's stderr).
  const std::string tag = "[modelnew] rc=" + std::to_string(rc) + ": ";
  const auto at = r.diagnostics.rfind(tag);
  std::string why = at == std::string::npos ? "" : r.diagnostics.substr(at + tag.size());
  why = why.substr(0, why.find('\n'));
  if (why.empty()) why = "forward failed (rc " + std::to_string(rc) + ")";
  r.reason = why;
  switch (rc) {
    case 101:
      r.verdict = Verdict::rejected_cheat;
      break;  // side stream
    case 102:
      r.verdict = Verdict::rejected_cheat;
      break;  // fp16/bf16 output
    case 103:
      r.verdict = Verdict::incorrect;
      break;  // output count/shape/dtype
    case 105:
      if (why.find("plain torch.Tensor") != std::string::npos) r.verdict = Verdict::rejected_cheat;
      break;
    default:
      break;  // 104: forward raised
  }
}

// --- the probe
struct Probe {
  std::string error;
  int correct = 0, trials = 0;
  double ref_ms = 0;
  json evidence;
};

at::Tensor view_of(void* p, const tasks::TensorSpec& sp, const at::Device& dev) {
  return at::from_blob(p, sp.shape, at::TensorOptions().dtype(sp.dtype).device(dev));
}

double time_reference_kb(tasks::Reference& ref, const std::vector<at::Tensor>& in, bool cuda, int trials) {
  for (int i = 0; i < 3; ++i) ref.forward(in);
  double sum = 0;
#ifdef KF_MN_CUDA
  if (cuda) {
    cudaDeviceSynchronize();
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    for (int i = 0; i < trials; ++i) {
      cudaEventRecord(a, nullptr);
      ref.forward(in);
      cudaEventRecord(b, nullptr);
      cudaDeviceSynchronize();
      float ms = 0;
      cudaEventElapsedTime(&ms, a, b);
      sum += ms;
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return sum / trials;
  }
#endif
  (void)cuda;
  for (int i = 0; i < trials; ++i) {
    const auto t0 = Clock::now();
    ref.forward(in);
    sum += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  }
  return sum / trials;
}

// time_cpp_reference: also time the task's C++ reference here, KernelBench's way, in this
// process (the alike timing gives the reference's time from a worker instead).
Probe run_probe(const tasks::Task& task, tasks::Backend b, const Build& bd, const Options& o, uint64_t seed,
                bool time_cpp_reference) {
  Probe p;
  const bool cuda = b == tasks::Backend::CUDA;
  const at::Device dev =
      cuda ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(o.eval.device)) : at::Device(at::kCPU);
  tasks::ExactFp32Scope exact;
  auto ref = task.new_reference(b, dev);
  const auto params = ref->params();
  const auto& ins = task.inputs(b);
  const auto& ps = task.params(b);
  const auto& outs = task.outputs(b);
  json spec = json::parse(task_spec_json(task, b));
  spec["probe"] = true;
  spec["evidence_call"] = o.kb_correct_trials;
  spec["kb_trials"] = o.kb_perf_trials;
  SandboxOptions so = o.eval.sandbox;
  so.backend = abi_backend(b);
  so.device = o.eval.device;
  so.threads = o.eval.cpu_threads > 0 ? o.eval.cpu_threads : at::get_num_threads();
  so.slots = 1;
  so.flush_bytes = 0;
  const Setup st = setup_of(o);
  so.worker_path = st.py->exe;
  so.adjust_spawn = worker_spawn(bd.job, spec.dump(), cuda, cache_dir(o.eval), st);
  std::vector<TensorLayout> li, lo;
  for (const auto& s : ins) li.push_back({abi_dtype(s.dtype), s.shape});
  for (const auto& s : ps) li.push_back({abi_dtype(s.dtype), s.shape});
  for (const auto& s : outs) lo.push_back({abi_dtype(s.dtype), s.shape});
  lo.push_back({KF_UINT8, {int64_t(kEvidenceBytes)}});
  auto sb = Sandbox::start(so, li, lo);
  struct Guard {
    Sandbox* s;
    ~Guard() { s->stop(); }
  } guard{sb.get()};
  CallOutcome lc = sb->load(bd.cr.so_path);
  if (!lc.ok()) {
    p.error = "load: " + lc.message;
    return p;
  }
  const at::Device slot_dev = sb->device_resident() ? dev : at::Device(at::kCPU);
  std::unique_ptr<GpuTimingLock> lock;
  if (cuda && o.eval.gpu_lock) lock = std::make_unique<GpuTimingLock>(o.eval.gpu_lock_dir, gpu_lock_key(o.eval.device));
  std::vector<at::Tensor> last;
  for (int i = 0; i < o.kb_correct_trials; ++i) {
    auto x = task.make_inputs(b, seed * 1000003ull + 7919ull * uint64_t(i + 1), dev);
    for (size_t t = 0; t < ins.size(); ++t) view_of(sb->input(0, int(t)), ins[t], slot_dev).copy_(x[t]);
    for (size_t t = 0; t < ps.size(); ++t) view_of(sb->input(0, int(ins.size() + t)), ps[t], slot_dev).copy_(params[t]);
#ifdef KF_MN_CUDA
    if (cuda) cudaDeviceSynchronize();  // the worker's own sync does not wait for this process's copies
#endif
    const bool evidence_call = i + 1 == o.kb_correct_trials;
    const double timeout = evidence_call ? 60 + 200.0 * o.eval.min_call_timeout_s : 10 * o.eval.min_call_timeout_s;
    // The evidence call times forward KernelBench's way: alone on the GPU, as a timed trial.
    std::optional<GpuTimingLock::Hold> hold;
    if (cuda && evidence_call && lock)
      hold.emplace(lock.get(), /*exclusive=*/true,
                   std::chrono::milliseconds(int64_t(o.eval.gpu_lock_timeout_s * 1000)));
    CallOutcome c = sb->run(0, uint32_t(i & 1), false, 0, timeout);
    hold.reset();
    ++p.trials;
    if (!c.ok()) {
      p.error = std::string(outcome_name(c.kind)) + ": " + c.message;
      break;
    }
    auto want = ref->forward(x);
    bool good = want.size() == outs.size();
    for (size_t t = 0; good && t < outs.size(); ++t) {
      at::Tensor got = view_of(const_cast<void*>(sb->output_at_return(0, int(t))), outs[t], slot_dev).to(dev);
      good = at::allclose(got.to(at::kDouble), want[t].to(at::kDouble), o.kb_tol, o.kb_tol);
    }
    p.correct += good ? 1 : 0;
    if (evidence_call) {
      at::Tensor evb = view_of(const_cast<void*>(sb->output_late(0, int(outs.size()))),
                               {"evidence", tasks::Role::Output, {int64_t(kEvidenceBytes)}, at::kByte}, slot_dev)
                           .cpu();
      std::string text(static_cast<const char*>(evb.data_ptr()), kEvidenceBytes);
      text = text.substr(0, text.find('\0'));
      try {
        p.evidence = json::parse(text);
      } catch (const std::exception& e) {
        p.error = std::string("evidence unreadable: ") + e.what();
      }
      last = x;
    }
  }
  if (!last.empty() && time_cpp_reference) {
    std::optional<GpuTimingLock::Hold> hold;
    if (cuda && lock)
      hold.emplace(lock.get(), true, std::chrono::milliseconds(int64_t(o.eval.gpu_lock_timeout_s * 1000)));
    p.ref_ms = time_reference_kb(*ref, last, cuda, o.kb_perf_trials);
  }
  return p;
}

// --- timing alike: the reference and the candidate in Python workers of one kind
//
// The protocol run times its reference in the evaluator (the task's C++ replay, in a
// process with other threads, another allocator history and no worker protocol around
// it) and the candidate in the Python worker: a copy of the reference measured 0.41-0.75x
// there on the CPU (docs/kernelbench.md). Here the task's own Model runs as a ModelNew in a second worker of
// the same kind (same interpreter, view, confinement, threads, cache flush, protocol),
// and the two are called in turn on the same fresh inputs and parameters, each timed by
// the evaluator's clock between the worker's start and end marks. The candidate's outputs
// of these calls are compared with the reference worker's and its inputs must be
// unchanged, so the calls that set the speedup are checked calls too.
struct Alike {
  std::vector<double> ref_ms, cand_ms;
  std::string unavailable;  // why there is no measurement (then the protocol's times stand)
  Verdict verdict = Verdict::ok;
  std::string reason;  // the candidate failed in this run
};

std::string reference_as_modelnew(const tasks::Task& task) {
  return task.source() + "\n\n# KernelForge: the task's own Model, timed as a ModelNew\nModelNew = Model\n";
}

unsigned long long flush_bytes_of(const EvalOptions& o, bool cuda) {
  if (!o.flush_cache) return 0;
  if (o.flush_bytes) return o.flush_bytes;
  if (cuda) return 256ull << 20;
  unsigned long long llc = 32ull << 20;
  for (int idx = 4; idx >= 0; --idx) {
    std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(idx) + "/size");
    std::string v;
    if (f >> v && !v.empty()) {
      llc = std::stoull(v) << (v.back() == 'K' ? 10 : v.back() == 'M' ? 20 : 0);
      break;
    }
  }
  return std::min(2 * llc, 256ull << 20);
}

Alike time_alike(const tasks::Task& task, tasks::Backend b, const Build& cand, const Options& o, uint64_t seed,
                 double est_ms) {
  Alike a;
  const bool cuda = b == tasks::Backend::CUDA;
  const at::Device dev =
      cuda ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(o.eval.device)) : at::Device(at::kCPU);
  Options ro = o;
  Build rb = build(task, b, reference_as_modelnew(task), ro);
  if (!rb.cr.ok) {
    a.unavailable = "the task's Model did not build as a ModelNew: " + rb.cr.diagnostics.substr(0, 300);
    return a;
  }
  tasks::ExactFp32Scope exact;
  auto ref = task.new_reference(b, dev);  // the task's parameters, as the protocol run uses them
  const auto params = ref->params();
  const auto& ins = task.inputs(b);
  const auto& ps = task.params(b);
  const auto& outs = task.outputs(b);
  const Setup st = setup_of(o);
  SandboxOptions so = o.eval.sandbox;
  so.backend = abi_backend(b);
  so.device = o.eval.device;
  so.threads = o.eval.cpu_threads > 0 ? o.eval.cpu_threads : at::get_num_threads();
  so.slots = 1;
  so.flush_bytes = flush_bytes_of(o.eval, cuda);
  so.worker_path = st.py->exe;
  std::vector<TensorLayout> li, lo;
  for (const auto& x : ins) li.push_back({abi_dtype(x.dtype), x.shape});
  for (const auto& x : ps) li.push_back({abi_dtype(x.dtype), x.shape});
  for (const auto& x : outs) lo.push_back({abi_dtype(x.dtype), x.shape});
  json ref_spec = json::parse(task_spec_json(task, b));
  ref_spec["exact_fp32"] = true;  // as the protocol's reference: no TF32
  SandboxOptions rso = so;
  rso.adjust_spawn = worker_spawn(rb.job, ref_spec.dump(), cuda, cache_dir(o.eval), st);
  so.adjust_spawn = worker_spawn(cand.job, task_spec_json(task, b), cuda, cache_dir(o.eval), st);
  // Both workers start before either runs; the reference's first.
  auto rsb = Sandbox::start(rso, li, lo);
  auto csb = Sandbox::start(so, li, lo);
  struct Guard {
    Sandbox* s;
    ~Guard() { s->stop(); }
  } g1{rsb.get()}, g2{csb.get()};
  CallOutcome lr = rsb->load(rb.cr.so_path);
  if (!lr.ok()) {
    a.unavailable = "the reference worker did not load: " + lr.message;
    return a;
  }
  CallOutcome lc = csb->load(cand.cr.so_path);
  if (!lc.ok()) {
    a.verdict = Verdict::runtime_error;
    a.reason = "timing run: load failed: " + lc.message;
    return a;
  }
  const at::Device slot_dev = csb->device_resident() ? dev : at::Device(at::kCPU);
  std::unique_ptr<GpuTimingLock> lock;
  if (cuda && o.eval.gpu_lock) lock = std::make_unique<GpuTimingLock>(o.eval.gpu_lock_dir, gpu_lock_key(o.eval.device));
  const double timeout = std::max(o.eval.min_call_timeout_s, 20.0 * est_ms / 1000.0);
  auto stage = [&](Sandbox& sb, const std::vector<at::Tensor>& x) {
    for (size_t t = 0; t < ins.size(); ++t) view_of(sb.input(0, int(t)), ins[t], slot_dev).copy_(x[t]);
    for (size_t t = 0; t < ps.size(); ++t) view_of(sb.input(0, int(ins.size() + t)), ps[t], slot_dev).copy_(params[t]);
  };
  auto fail = [&](const CallOutcome& c, const std::string& where) {
    a.verdict = c.kind == CallOutcome::Timeout     ? Verdict::timeout
                : c.kind == CallOutcome::Forbidden ? Verdict::rejected_cheat
                                                   : Verdict::runtime_error;
    a.reason = "timing run, " + where + ": " + std::string(outcome_name(c.kind)) + ": " + c.message;
  };
  const int warmup = std::max(1, o.eval.warmup);
  constexpr int kSlowTrials = 3;
  for (int t = 0;; ++t) {
    const int timed = t - warmup;
    if (timed >= 0) {
      const int n = int(a.cand_ms.size());
      const bool slow = o.eval.slow_speedup > 0 && n >= kSlowTrials &&
                        summarize(a.ref_ms).median < o.eval.slow_speedup * summarize(a.cand_ms).median;
      const bool wide =
          summarize(a.ref_ms).spread() > o.eval.max_spread || summarize(a.cand_ms).spread() > o.eval.max_spread;
      if (slow || (n >= o.eval.trials && (!wide || n >= o.eval.max_trials))) break;
    }
    const std::string where = (timed >= 0 ? "timed trial " : "warm-up ") + std::to_string(std::max(timed, t));
    const auto x = task.make_inputs(b, seed * 1000003ull + 104729ull * uint64_t(t + 1), dev);
    stage(*rsb, x);
    stage(*csb, x);
    if (cuda) tasks::synchronize(dev);  // the workers' own syncs do not wait for this process's copies
    std::optional<GpuTimingLock::Hold> hold;
    if (lock) hold.emplace(lock.get(), true, std::chrono::milliseconds(int64_t(o.eval.gpu_lock_timeout_s * 1000)));
    const uint32_t poison = uint32_t(t & 1);
    CallOutcome cr, cc;
    if (t % 2 == 0) {
      cr = rsb->run(0, poison, so.flush_bytes > 0, 0, timeout);
      if (cr.ok()) cc = csb->run(0, poison, so.flush_bytes > 0, 0, timeout);
    } else {
      cc = csb->run(0, poison, so.flush_bytes > 0, 0, timeout);
      if (cc.ok()) cr = rsb->run(0, poison, so.flush_bytes > 0, 0, timeout);
    }
    hold.reset();
    if (!cc.ok() && cc.kind != CallOutcome::Environment && (t % 2 == 1 || cr.ok())) {
      fail(cc, where);
      return a;
    }
    if (!cr.ok() || !cc.ok()) {
      a.unavailable = "the reference worker failed at " + where + ": " + std::string(outcome_name(cr.kind)) + ": " +
                      (cr.ok() ? cc.message : cr.message);
      return a;
    }
    for (size_t i = 0; i < outs.size(); ++i) {
      const at::Tensor got = view_of(const_cast<void*>(csb->output_at_return(0, int(i))), outs[i], slot_dev).to(dev);
      const at::Tensor want = view_of(const_cast<void*>(rsb->output_at_return(0, int(i))), outs[i], slot_dev).to(dev);
      const Compare cmp = compare_outputs(got, want, task.tolerance(b, i), poison);
      if (!cmp.ok || cmp.unwritten > 0) {
        a.verdict = Verdict::incorrect;
        a.reason = "timing run, " + where + ": output " + std::to_string(i) + ": " + std::to_string(cmp.bad) + "/" +
                   std::to_string(cmp.total) + " elements out of tolerance (" + std::to_string(cmp.unwritten) +
                   " unwritten), max abs error " + std::to_string(cmp.max_abs) +
                   ": the candidate computed otherwise in the calls that set its speedup";
        return a;
      }
    }
    for (size_t i = 0; i < ins.size(); ++i)
      if (!at::equal(view_of(csb->input(0, int(i)), ins[i], slot_dev).to(dev), x[i])) {
        a.verdict = Verdict::rejected_cheat;
        a.reason = "timing run, " + where + ": modifies its inputs (input " + std::to_string(i) + ")";
        return a;
      }
    if (timed >= 0) {
      a.ref_ms.push_back(cr.external_ms);
      a.cand_ms.push_back(cc.external_ms);
    }
  }
  return a;
}

std::vector<std::string> global_functions(const std::string& source) {
  std::vector<std::string> out;
  static const std::regex re(R"(__global__\s+(?:[A-Za-z_][\w:<>,\s\*]*?\s+)?([A-Za-z_]\w*)\s*\()");
  for (std::sregex_iterator it(source.begin(), source.end(), re), end; it != end; ++it) out.push_back((*it)[1]);
  return out;
}

}  // namespace

bool is_modelnew_candidate(const std::string& path) { return fsutil::extension(path) == ".py"; }

bool is_modelnew_source(const std::string& source) {
  // A Python class statement (C++ has no `class X(...):` line ending in a colon) and an import of torch.
  static const std::regex cls(R"((^|\n)class[ \t]+ModelNew[ \t]*(\([^)\n]*\))?[ \t]*:[ \t]*(#[^\n]*)?(\r?\n|$))");
  static const std::regex imp(R"((^|\n)[ \t]*(import[ \t]+torch|from[ \t]+torch[\w.]*[ \t]+import)\b)");
  return std::regex_search(source, cls) && std::regex_search(source, imp);
}

std::function<Result(const tasks::Task&, tasks::Backend, const std::string&, uint64_t)> service_scorer(Evaluator& ev,
                                                                                                       Options opts) {
  opts.probe = false;
  return [&ev, opts](const tasks::Task& task, tasks::Backend b, const std::string& source, uint64_t id) {
    Result r = evaluate(task, b, source, opts, id).result;
    r.reward = ev.reward_model().score(r);  // the run's reward statistics, not a fresh model's
    return r;
  };
}

void install_in_service(ServiceOptions& so, Evaluator& ev, const Options& opts) {
  so.other_format = is_modelnew_source;
  so.score_other = service_scorer(ev, opts);
}

CompileResult compile(const tasks::Task& task, tasks::Backend b, const std::string& source, const Options& opts) {
  return build(task, b, source, opts).cr;
}

Outcome evaluate(const tasks::Task& task, tasks::Backend b, const std::string& source, const Options& opts,
                 uint64_t candidate_seed) {
  Outcome out;
  const bool cuda = b == tasks::Backend::CUDA;
  Build bd = build(task, b, source, opts);
  EvalOptions eo = opts.eval;
  const Setup st = setup_of(opts);
  eo.sandbox.worker_path = st.py->exe;
  eo.sandbox.adjust_spawn = worker_spawn(bd.job, task_spec_json(task, b), cuda, cache_dir(opts.eval), st);
  // The worker's clock covers forward (with .contiguous() and a device sync) and the copy of
  // the returned tensors into the harness's outputs, as an ABI kernel's covers its writes:
  // the evaluator's clock around the worker bounds it with the same slack.
  Evaluator ev(eo);
  Result& r = out.result;
  r = ev.evaluate_compiled(task, b, bd.cr, candidate_seed);
  if (r.verdict == Verdict::compile_error && r.reason == "compile error")
    r.reason = "compile error (ModelNew compile step)";
  if (bd.cr.environment_failure && bd.cr.diagnostics == kTritonOnCuda) r.reason = kTritonOnCuda;
  name_worker_failure(r);

  // The speedup: reference and candidate timed alike (time_alike), when the protocol passed.
  if (r.verdict == Verdict::ok && opts.time_alike) {
    const auto t_alike = Clock::now();
    Alike a;
    try {
      a = time_alike(task, b, bd, opts, candidate_seed ^ 0x7a11ull, std::max(r.ref_ms.median, r.cand_ms.median));
    } catch (const std::exception& e) {
      a = Alike{};
      a.unavailable = e.what();
    }
    const std::string before = "the protocol run's reference (the task's C++ replay in the evaluator) " +
                               std::to_string(r.ref_ms.median) + " ms, candidate " + std::to_string(r.cand_ms.median) +
                               " ms";
    if (a.verdict != Verdict::ok) {
      r.verdict = a.verdict;
      r.reason = a.reason;
      r.cause = Cause::kernel;
      r.speedup = 0;
      r.checks.push_back({"modelnew.timing_alike", false, a.reason});
    } else if (!a.unavailable.empty() || a.cand_ms.empty()) {
      log_warn("modelnew: ", task.name(), ": reference and candidate could not be timed alike (", a.unavailable,
               "); the protocol run's times stand");
      r.checks.push_back({"modelnew.timing_alike", true, "unavailable (" + a.unavailable + "); " + before});
    } else {
      r.ref_ms = summarize(a.ref_ms);
      r.cand_ms = summarize(a.cand_ms);
      const SpeedupInterval iv = paired_speedup_interval(a.ref_ms, a.cand_ms);
      r.speedup_lo = iv.lo;
      r.speedup_hi = iv.hi;
      r.timing_unstable = r.cand_ms.spread() > opts.eval.max_spread || r.ref_ms.spread() > opts.eval.max_spread;
      // The two calls of a pair run back to back, so the median of the per-pair ratios
      // cancels load that changes between pairs (other processes on a shared host), which
      // moves the ratio of medians by 10-45 % on a loaded 2-core machine.
      std::vector<double> ratios;
      for (size_t i = 0; i < a.cand_ms.size(); ++i) ratios.push_back(a.ref_ms[i] / std::max(a.cand_ms[i], 1e-9));
      out.alike_speedup = quantile(ratios, 0.5);
      r.speedup = r.timing_unstable ? iv.lo : out.alike_speedup;
      char buf[512];
      std::snprintf(buf, sizeof buf,
                    "the task's Model in a Python worker like the candidate's, %zu interleaved pairs by the "
                    "evaluator's clock: reference %.4f ms, candidate %.4f ms (medians), per-pair speedup %.3f, "
                    "95%% interval [%.3f, %.3f]%s; ",
                    a.cand_ms.size(), r.ref_ms.median, r.cand_ms.median, out.alike_speedup, iv.lo, iv.hi,
                    r.timing_unstable ? " (spread too wide: the speedup is the interval's low end)" : "");
      r.checks.push_back({"modelnew.timing_alike", true, buf + before});
    }
    r.verify_s += std::chrono::duration<double>(Clock::now() - t_alike).count();
  }

  const bool loaded = r.verdict == Verdict::ok || r.verdict == Verdict::incorrect ||
                      r.verdict == Verdict::rejected_cheat ||
                      (r.verdict == Verdict::runtime_error && r.reason.rfind("forward raised", 0) == 0);
  if (opts.probe && loaded) {
    Probe p;
    try {
      p = run_probe(task, b, bd, opts, candidate_seed ^ 0x6b62ull, !opts.time_alike);
      // KernelBench's reference time alike too: the task's Model probed in a worker of the
      // same kind on the same inputs (the same seed), its forward timed as the candidate's.
      if (opts.time_alike && p.evidence.is_object()) {
        const Build rb = build(task, b, reference_as_modelnew(task), opts);
        if (!rb.cr.ok) throw Error("the task's Model did not build as a ModelNew: " + rb.cr.diagnostics.substr(0, 300));
        const Probe rp = run_probe(task, b, rb, opts, candidate_seed ^ 0x6b62ull, false);
        if (!rp.error.empty() || !rp.evidence.is_object() || !rp.evidence.contains("kb_time"))
          throw Error("the reference's probe: " + (rp.error.empty() ? "no KernelBench timing" : rp.error));
        p.ref_ms = rp.evidence["kb_time"].value("mean_ms", 0.0);
      }
    } catch (const std::exception& e) {
      p.error = e.what();
      log_warn("modelnew: the probe of ", task.name(), " failed (", e.what(),
               "); the verdict stands without its evidence");
    }
    out.probe_error = p.error;
    out.kb_correct = p.correct;
    out.kb_trials = p.trials;
    out.kb_ref_ms = p.ref_ms;
    if (p.evidence.is_object()) {
      out.probe_ran = true;
      out.evidence_json = p.evidence.dump();
      const json& e = p.evidence;
      if (e.contains("kb_time")) out.kb_cand_ms = e["kb_time"].value("mean_ms", 0.0);
      if (out.kb_cand_ms > 0 && out.kb_ref_ms > 0) out.kb_speedup = out.kb_ref_ms / out.kb_cand_ms;
      if (e.contains("low_precision_ops"))
        for (const auto& s : e["low_precision_ops"]) out.low_precision_ops.push_back(s.get<std::string>());
      std::vector<std::string> called, defined;
      if (e.contains("ext_calls"))
        for (auto it = e["ext_calls"].begin(); it != e["ext_calls"].end(); ++it) {
          defined.push_back(it.key());
          if (it.value().get<long>() > 0) called.push_back(it.key() + " x" + std::to_string(it.value().get<long>()));
        }
      std::vector<std::string> launched;
      const bool have_kernels = cuda && e.contains("cuda_kernels");
      if (have_kernels) {
        const auto globals = global_functions(source);
        for (auto it = e["cuda_kernels"].begin(); it != e["cuda_kernels"].end(); ++it)
          for (const auto& g : globals)
            if (std::regex_search(it.key(), std::regex("\\b" + g + "\\b"))) {
              launched.push_back(it.key() + " x" + std::to_string(it.value().get<long>()));
              break;
            }
      }
      auto join = [](const std::vector<std::string>& v) {
        std::string s;
        for (size_t i = 0; i < v.size() && i < 6; ++i) s += (i ? ", " : "") + v[i];
        return s + (v.size() > 6 ? ", ..." : "");
      };
      if (have_kernels) {
        out.custom_code_ran = !launched.empty();
        out.custom_detail =
            out.custom_code_ran
                ? "custom CUDA kernels launched during forward: " + join(launched)
                : "no kernel of the candidate's __global__ functions ran during forward" +
                      std::string(called.empty() ? "" : " (load_inline functions called: " + join(called) + ")");
      } else {
        out.custom_code_ran = !called.empty();
        out.custom_detail = out.custom_code_ran ? "load_inline functions called during forward: " + join(called)
                            : defined.empty()
                                ? "no load_inline extension: forward uses torch ops only"
                                : "load_inline functions defined but never called during forward: " + join(defined);
      }
      // Triton kernels (KernelBench's triton backend) count as the candidate's own code.
      std::vector<std::string> triton;
      if (e.contains("triton_launches"))
        for (auto it = e["triton_launches"].begin(); it != e["triton_launches"].end(); ++it)
          if (it.value().get<long>() > 0) triton.push_back(it.key() + " x" + std::to_string(it.value().get<long>()));
      if (!triton.empty()) {
        out.custom_detail = "Triton kernels launched during forward: " + join(triton) +
                            (out.custom_code_ran ? "; " + out.custom_detail : std::string());
        out.custom_code_ran = true;
      }
      out.torch_only = !out.custom_code_ran;
      r.checks.push_back({"modelnew.custom_code", true, (out.torch_only ? "torch_only: " : "") + out.custom_detail});
      if (!out.low_precision_ops.empty()) {
        const std::string ops = join(out.low_precision_ops);
        if (r.verdict == Verdict::incorrect) {
          r.verdict = Verdict::rejected_cheat;
          r.reason = "precision downgrade: computes in a narrower float type (" + ops +
                     ") and misses the tolerance: " + r.reason;
        }
        r.checks.push_back({"modelnew.precision", r.verdict != Verdict::rejected_cheat, "ops in fp16/bf16: " + ops});
      }
    } else if (!p.error.empty()) {
      r.checks.push_back({"modelnew.custom_code", true, "unknown: the probe failed: " + p.error});
    }
  }
  r.reward = ev.reward_model().score(r);
  return out;
}

std::string to_json(const Outcome& o, int indent) {
  json j = json::parse(kf::evaluator::to_json(o.result));
  j["torch_only"] = o.probe_ran ? json(o.torch_only) : json(nullptr);
  json m;
  m["probe_ran"] = o.probe_ran;
  m["probe_error"] = o.probe_error;
  m["custom_code_ran"] = o.custom_code_ran;
  m["custom_detail"] = o.custom_detail;
  m["low_precision_ops"] = o.low_precision_ops;
  m["kb_correct"] = o.kb_correct;
  m["kb_trials"] = o.kb_trials;
  m["kb_ref_ms"] = o.kb_ref_ms;
  m["kb_cand_ms"] = o.kb_cand_ms;
  m["kb_speedup"] = o.kb_speedup;
  m["alike_speedup"] = o.alike_speedup;
  m["evidence"] = o.evidence_json.empty() ? json(nullptr) : json::parse(o.evidence_json);
  j["modelnew"] = m;
  return j.dump(indent);
}

std::string to_text(const Outcome& o) {
  std::ostringstream s;
  s << kf::evaluator::to_text(o.result);
  if (o.probe_ran) {
    s << "custom     " << (o.torch_only ? "TORCH ONLY: " : "ran: ") << o.custom_detail << "\n";
    char b[256];
    std::snprintf(b, sizeof b,
                  "kernelbench %d/%d correct (atol=rtol=1e-2); mean ref %.4f ms, candidate %.4f ms, speedup %.3fx\n",
                  o.kb_correct, o.kb_trials, o.kb_ref_ms, o.kb_cand_ms, o.kb_speedup);
    s << b;
  } else if (!o.probe_error.empty()) {
    s << "custom     unknown (probe failed: " << o.probe_error << ")\n";
  }
  return s.str();
}

}  // namespace kf::evaluator::modelnew
