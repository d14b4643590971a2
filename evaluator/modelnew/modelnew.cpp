// ModelNew candidates (see modelnew.h): the confined compile step, the Python worker's view
// and spawn, the verdict's named tricks, and the probe.
#include "modelnew.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
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
#include "process.h"  // defines: SpawnSpec, Confinement, run_bounded, pick_env
#include "sandbox.h"
#include "sha256.h"        // defines: sha256_hex
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

// The interpreter's install: what the view must hold for `python -I` to import torch.
struct PythonInstall {
  std::string exe;                 // KF_PYTHON as configured (a venv's python is fine)
  std::vector<std::string> roots;  // folders to bind at their own paths
};

const PythonInstall& python_install() {
  static std::once_flag once;
  static PythonInstall pi;
  static std::string err;
  std::call_once(once, [] {
    pi.exe = KF_PYTHON_PATH;
    SpawnSpec s;
    s.argv = {pi.exe, "-I", "-c",
              "import sys,os,json;print(json.dumps([sys.prefix,sys.base_prefix,os.path.realpath(sys.executable)]+"
              "[p for p in sys.path if p]))"};
    s.env = pick_env({"PATH", "LD_LIBRARY_PATH"});
    BoundedRun r = run_bounded(s, 60, 1 << 16);
    if (!WIFEXITED(r.status) || WEXITSTATUS(r.status) != 0) {
      err = "python '" + pi.exe + "' does not run: " + describe_wait_status(r.status) + " " + r.output;
      return;
    }
    std::vector<std::string> cand;
    try {
      for (const auto& p : json::parse(r.output)) cand.push_back(p.get<std::string>());
    } catch (const std::exception& e) {
      err = std::string("python's path list: ") + e.what();
      return;
    }
    cand[2] = fs::path(cand[2]).parent_path().parent_path().string();  // .../bin/python3 -> ...
    cand.push_back(fs::path(pi.exe).parent_path().parent_path().string());
    std::sort(cand.begin(), cand.end());
    for (const auto& c : cand) {
      std::error_code ec;
      if (!fs::is_directory(c, ec) || c == "/" || c == "/usr" || c.rfind("/usr/", 0) == 0) continue;
      bool covered = false;
      for (const auto& r2 : pi.roots) covered = covered || c == r2 || c.rfind(r2 + "/", 0) == 0;
      if (!covered) pi.roots.push_back(c);
    }
  });
  if (!err.empty()) throw Error("modelnew: " + err);
  return pi;
}

// The private view shared by the compile step and the worker: the system (/usr and the /lib*,
// /bin links), the Python install, our scripts, /dev/{null,zero,random,urandom}.
Confinement base_view(const std::string& mount_point) {
  Confinement c;
  c.enabled = true;
  c.mount_point = mount_point;
  c.binds.push_back({"/usr", "/usr"});
  for (const char* top : {"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}) {
    struct stat st;
    if (::lstat(top, &st) != 0) continue;
    if (S_ISLNK(st.st_mode)) {
      std::error_code ec;
      c.symlinks.push_back({fs::read_symlink(top, ec).string(), top});
    } else if (S_ISDIR(st.st_mode)) {
      c.binds.push_back({top, top});
    }
  }
  for (const auto& r : python_install().roots) c.binds.push_back({r, r});
  c.binds.push_back({KF_MN_DIR, kViewMn});
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

// The compile step: build_ext.py in the view, the job folder writable at /kf/job.
Build build(const tasks::Task& task, tasks::Backend b, const std::string& source, const Options& o) {
  const auto t0 = Clock::now();
  Build out;
  const std::string cache = cache_dir(o.eval);
  const std::string spec = task_spec_json(task, b);
  const PythonInstall& py = python_install();
  // The build scripts are part of the key: a changed compile step builds (and fails) afresh.
  static const std::string scripts = sha256_hex(read_text(std::string(KF_MN_DIR) + "/build_ext.py") +
                                                read_text(std::string(KF_MN_DIR) + "/mn_common.py"));
  out.cr.key = sha256_hex("modelnew\n" + std::string(tasks::backend_name(b)) + "\n" + o.eval.compile.cuda_arch + "\n" +
                          py.exe + "\n" + scripts + "\n" + spec + "\n" + source);
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
  const std::string work = out.job + ".tmp." + std::to_string(getpid());
  fsutil::remove_tree(work);
  if (!fsutil::make_dirs(work, 0755)) throw error_at(work, std::string("cannot create: ") + std::strerror(errno));
  write_text(work + "/candidate.py", source);
  write_text(work + "/spec.json", spec);
  if (geteuid() == 0 && ::chown(work.c_str(), kNobody, kNobody) != 0)
    throw error_at(work, std::string("chown to nobody: ") + std::strerror(errno));

  SpawnSpec s;
  s.argv = {py.exe, "-I", "-B", std::string(kViewMn) + "/build_ext.py", kViewJob};
  const std::string arch = o.eval.compile.cuda_arch;  // sm_90 -> 9.0
  std::string arch_list = arch.rfind("sm_", 0) == 0 && arch.size() >= 5
                              ? arch.substr(3, arch.size() - 4) + "." + arch.substr(arch.size() - 1)
                              : "9.0";
  s.env = pick_env({"LD_LIBRARY_PATH"});
  s.env.insert(s.env.end(),
               {"PATH=" + fs::path(py.exe).parent_path().string() + ":/usr/local/cuda/bin:/usr/bin:/bin", "HOME=/tmp",
                "TMPDIR=/tmp", "LANG=C", "CUDA_HOME=/usr/local/cuda",
                // /usr/bin/c++ and cc lead through /etc/alternatives, which the view does not hold
                "CXX=g++", "CC=gcc", "TORCH_CUDA_ARCH_LIST=" + arch_list, "TORCH_EXTENSIONS_DIR=/tmp/torch_extensions",
                "MAX_JOBS=" + std::to_string(std::max(1, o.eval.compile.jobs > 0 ? o.eval.compile.jobs : 2)),
                "PYTHONDONTWRITEBYTECODE=1", "USER=nobody", "LOGNAME=nobody"});
  s.cwd = kViewJob;
  s.confine = base_view(view_root(cache));
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
                                             const std::string& cache) {
  return [job, spec_json, cuda, cache](SpawnSpec& s) {
    std::string scratch;
    std::vector<std::string> rest;
    for (size_t i = 1; i < s.argv.size(); ++i) {
      if (s.argv[i] == "--scratch" && i + 1 < s.argv.size()) {
        scratch = s.argv[++i];
        rest.insert(rest.end(), {"--scratch", kViewScratch});
      } else if (s.argv[i] != "--no-drop-root") {
        rest.push_back(s.argv[i]);
      }
    }
    if (scratch.empty()) throw Error("modelnew: the sandbox passed no --scratch folder");
    write_text(scratch + "/spec.json", spec_json);
    const PythonInstall& py = python_install();
    s.argv = {py.exe, "-I", "-B", std::string(kViewMn) + "/worker.py"};
    s.argv.insert(s.argv.end(), rest.begin(), rest.end());
    s.argv.push_back("--no-drop-root");  // the view already made the worker nobody
    std::vector<std::string> env;
    for (const auto& e : s.env)
      if (e.rfind("HOME=", 0) != 0 && e.rfind("TMPDIR=", 0) != 0) env.push_back(e);
    env.insert(env.end(), {"HOME=/tmp", "TMPDIR=/tmp", std::string("KF_MN_CONFINE_LIB=") + kViewLib,
                           "PYTHONDONTWRITEBYTECODE=1", "TORCH_EXTENSIONS_DIR=/tmp/torch_extensions",
                           // getpass.getuser() reads these first; else a passwd lookup opens nscd's socket
                           "USER=nobody", "LOGNAME=nobody", "TORCHINDUCTOR_CACHE_DIR=/tmp/inductor"});
    s.env = env;
    s.cwd = kViewScratch;
    s.confine = base_view(view_root(cache));
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

Probe run_probe(const tasks::Task& task, tasks::Backend b, const Build& bd, const Options& o, uint64_t seed) {
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
  so.worker_path = python_install().exe;
  so.adjust_spawn = worker_spawn(bd.job, spec.dump(), cuda, cache_dir(o.eval));
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
  if (!last.empty()) {
    std::optional<GpuTimingLock::Hold> hold;
    if (cuda && lock)
      hold.emplace(lock.get(), true, std::chrono::milliseconds(int64_t(o.eval.gpu_lock_timeout_s * 1000)));
    p.ref_ms = time_reference_kb(*ref, last, cuda, o.kb_perf_trials);
  }
  return p;
}

std::vector<std::string> global_functions(const std::string& source) {
  std::vector<std::string> out;
  static const std::regex re(R"(__global__\s+(?:[A-Za-z_][\w:<>,\s\*]*?\s+)?([A-Za-z_]\w*)\s*\()");
  for (std::sregex_iterator it(source.begin(), source.end(), re), end; it != end; ++it) out.push_back((*it)[1]);
  return out;
}

}  // namespace

bool is_modelnew_candidate(const std::string& path) { return fsutil::extension(path) == ".py"; }

CompileResult compile(const tasks::Task& task, tasks::Backend b, const std::string& source, const Options& opts) {
  return build(task, b, source, opts).cr;
}

Outcome evaluate(const tasks::Task& task, tasks::Backend b, const std::string& source, const Options& opts,
                 uint64_t candidate_seed) {
  Outcome out;
  const bool cuda = b == tasks::Backend::CUDA;
  Build bd = build(task, b, source, opts);
  EvalOptions eo = opts.eval;
  eo.sandbox.worker_path = python_install().exe;
  eo.sandbox.adjust_spawn = worker_spawn(bd.job, task_spec_json(task, b), cuda, cache_dir(opts.eval));
  // The worker's clock covers forward (with .contiguous() and a device sync); the copy of the
  // returned tensors into the harness's outputs follows it, inside the evaluator's clock. The
  // slack between the two clocks grows by that copy at a conservative bandwidth (CPU 4 GB/s,
  // CUDA device-to-device 1 TB/s): beyond it, the evaluator's clock times the candidate.
  double out_bytes = 0;
  for (const auto& t : task.outputs(b)) out_bytes += double(TensorLayout{abi_dtype(t.dtype), t.shape}.nbytes());
  eo.timer_slack_ms += out_bytes / (cuda ? 1e12 : 4e9) * 1e3;
  Evaluator ev(eo);
  Result& r = out.result;
  r = ev.evaluate_compiled(task, b, bd.cr, candidate_seed);
  if (r.verdict == Verdict::compile_error && r.reason == "compile error")
    r.reason = "compile error (ModelNew compile step)";
  name_worker_failure(r);

  const bool loaded = r.verdict == Verdict::ok || r.verdict == Verdict::incorrect ||
                      r.verdict == Verdict::rejected_cheat ||
                      (r.verdict == Verdict::runtime_error && r.reason.rfind("forward raised", 0) == 0);
  if (opts.probe && loaded) {
    Probe p;
    try {
      p = run_probe(task, b, bd, opts, candidate_seed ^ 0x6b62ull);
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
