// Compile service (see compile.h): cache lookup, include policy, bounded compiler runs.
#include "kf/evaluator/compile.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tbb/global_control.h>
#include <tbb/task_arena.h>
#include <tbb/task_group.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <regex>
#include <sstream>
#include <thread>

#include "kf/common/error.h"
#include "kf/evaluator/fsutil.h"
#include "kf/common/log.h"
#include "process.h"
#include "sha256.h"

#ifndef KF_ABI_INCLUDE_DIR
#define KF_ABI_INCLUDE_DIR ""
#endif


namespace kf::evaluator {
namespace {

std::string read_text(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
void write_text_atomic(const std::string& p, const std::string& s) {
  const std::string tmp = p + ".tmp." + std::to_string(getpid()) + "." +
                       std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()));
  {
    std::ofstream f(tmp, std::ios::binary);
    f << s;
  }
  if (::rename(tmp.c_str(), p.c_str()) != 0) throw Error("rename " + tmp + ": " + std::strerror(errno));
}

// The first `max_errors` lines that mention "error", then the head of the output, in
// at most `max_bytes`. The first errors are what a policy (or a person) needs.
std::string truncate_diagnostics(const std::string& out, int max_errors, std::size_t max_bytes) {
  std::istringstream in(out);
  std::string line, errors, rest;
  int n = 0;
  while (std::getline(in, line)) {
    if (n < max_errors && line.find("error") != std::string::npos) {
      errors += line + "\n";
      ++n;
    } else if (rest.size() < max_bytes) {
      rest += line + "\n";
    }
  }
  std::string s = errors.empty() ? rest : errors + (rest.empty() ? "" : "--- output:\n" + rest);
  if (s.size() > max_bytes) s = s.substr(0, max_bytes) + "\n[... truncated]";
  return s;
}

}  // namespace

std::string check_source_policy(const std::string& source) {
  static const std::regex inc(R"(^\s*#\s*(include|include_next|import|embed)\s*([<"])([^>"]*)[>"])");
  std::istringstream in(source);
  std::string line;
  int no = 0;
  while (std::getline(in, line)) {
    ++no;
    std::smatch m;
    // The assembler's .incbin pulls arbitrary files into the object at build time. (A
    // split string literal can still spell it; nothing the verifier relies on is in a
    // file, so this only keeps casual file disclosure out of kernels.)
    static const std::regex asm_inc(R"(incbin|\.include\s+\\?")");
    if (std::regex_search(line, asm_inc)) return "line " + std::to_string(no) + ": assembler .incbin/.include is not allowed";
    if (!std::regex_search(line, m, inc)) {
      if (line.find("#embed") != std::string::npos || line.find("__has_embed") != std::string::npos)
        return "line " + std::to_string(no) + ": #embed is not allowed";
      continue;
    }
    const std::string kw = m[1], path = m[3];
    if (kw != "include") return "line " + std::to_string(no) + ": #" + kw + " is not allowed";
    if (!path.empty() && path[0] == '/') return "line " + std::to_string(no) + ": #include of an absolute path is not allowed";
    if (path.find("..") != std::string::npos) return "line " + std::to_string(no) + ": #include with '..' is not allowed";
    if (m[2] == "\"" && path != "kf/kernel.h")
      return "line " + std::to_string(no) + ": only \"kf/kernel.h\" may be included with quotes (use <...> for system headers)";
  }
  return "";
}

static int compile_jobs(int jobs) { return std::max(1, jobs > 0 ? jobs : int(std::thread::hardware_concurrency())); }

struct CompileService::Impl {
  CompileOptions o;
  // Callers wait on futures outside the arena, so every compile needs a worker thread. TBB
  // caps workers at (cores in the affinity mask - 1): zero for a process pinned to one
  // core (the launcher pins CPU evaluators), which would leave compiles queued forever.
  tbb::global_control workers{tbb::global_control::max_allowed_parallelism,
                              static_cast<std::size_t>(compile_jobs(o.jobs)) + 1};
  tbb::task_arena arena;
  tbb::task_group group;
  std::mutex mu;
  std::map<std::string, std::shared_future<CompileResult>> inflight;
  std::map<int, std::string> identity;

  explicit Impl(CompileOptions opts) : o(std::move(opts)), arena(compile_jobs(o.jobs), /*reserved_for_masters=*/0) {
    if (o.cache_dir.empty()) {
      const char* e = std::getenv("KF_EVAL_CACHE");
      o.cache_dir = e && *e ? e : "/tmp/kf-eval-cache-" + std::to_string(getuid());
    }
    if (o.include_dir.empty()) o.include_dir = KF_ABI_INCLUDE_DIR;
    // The sandbox drops root to nobody, which must still read the objects.
    if (!fsutil::make_dirs(o.cache_dir, 0755)) throw error_at(o.cache_dir, std::string("cannot create: ") + std::strerror(errno));
    ::chmod(o.cache_dir.c_str(), 0755);
  }

  std::string compiler(Backend b) const { return b == KF_BACKEND_CUDA ? o.nvcc : o.cxx; }

  std::string ident(Backend b) {
    {
      std::lock_guard<std::mutex> lk(mu);
      auto it = identity.find(int(b));
      if (it != identity.end()) return it->second;
    }
    SpawnSpec s;
    s.argv = {resolve(compiler(b)), "--version"};
    s.env = pick_env({"PATH", "HOME", "LD_LIBRARY_PATH"});
    BoundedRun r = run_bounded(s, 30, 4096);
    std::string id = r.output;
    if (!WIFEXITED(r.status) || WEXITSTATUS(r.status) != 0)
      throw Error("compiler '" + compiler(b) + "' does not run: " + describe_wait_status(r.status) + " " + r.output);
    if (b == KF_BACKEND_CPU && o.cpu_model_in_key) id += cpu_model();
    std::lock_guard<std::mutex> lk(mu);
    identity[int(b)] = id;
    return id;
  }

  // -march=native makes the object specific to this CPU model: key on it.
  static std::string cpu_model() {
    std::ifstream f("/proc/cpuinfo");
    std::string line;
    while (std::getline(f, line))
      if (line.rfind("model name", 0) == 0) return line;
    return "";
  }

  static std::string resolve(const std::string& prog) {
    if (prog.find('/') != std::string::npos) return prog;
    const char* path = std::getenv("PATH");
    std::istringstream ps(path ? path : "/usr/bin:/bin");
    std::string dir;
    while (std::getline(ps, dir, ':'))
      if (!dir.empty() && access((dir + "/" + prog).c_str(), X_OK) == 0) return dir + "/" + prog;
    return prog;
  }

  std::vector<std::string> flags(Backend b) const {
    std::vector<std::string> f;
    if (b == KF_BACKEND_CUDA) {
      f = o.cuda_flags;
      f.push_back("-arch=" + o.cuda_arch);
    } else {
      f = o.cxx_flags;
    }
    return f;
  }

  CompileResult run(const std::string& source, Backend b) {
    const auto t0 = std::chrono::steady_clock::now();
    auto done = [&](CompileResult r) {
      r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return r;
    };
    CompileResult r;
    const std::string policy = check_source_policy(source);
    const std::vector<std::string> fl = flags(b);
    std::string material = std::string(b == KF_BACKEND_CUDA ? "cuda\n" : "cpu\n") + ident(b) + "\n";
    for (const auto& x : fl) material += x + "\n";
    material += "--\n" + source;
    r.key = sha256_hex(material);
    if (!policy.empty()) {
      r.rejected_source = true;
      r.diagnostics = "source rejected: " + policy;
      return done(r);
    }
    const std::string dir = o.cache_dir + "/" + r.key.substr(0, 2);
    const std::string so = dir + "/" + r.key + ".so", fail = dir + "/" + r.key + ".fail";
    if (fsutil::exists(so)) {
      r.ok = r.cached = true;
      r.so_path = so;
      return done(r);
    }
    if (fsutil::exists(fail)) {
      r.cached = true;
      r.diagnostics = read_text(fail);
      r.timed_out = r.diagnostics.rfind("compile timed out", 0) == 0;
      return done(r);
    }
    fsutil::make_dirs(dir, 0755);
    // Each compile works in a private folder (the compiler's temporaries too).
    const std::string work = o.cache_dir + "/work/" + r.key + "." + std::to_string(getpid()) + "." +
                             std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()));
    fsutil::make_dirs(work, 0700);
    const std::string src = work + (b == KF_BACKEND_CUDA ? "/kernel.cu" : "/kernel.cpp");
    write_text_atomic(src, source);
    SpawnSpec s;
    s.argv = {resolve(compiler(b))};
    for (const auto& x : fl) {
      if (x == "-lcublas") continue;  // libraries go after the source
      s.argv.push_back(x);
    }
    const std::string obj = work + "/kernel.so";
    s.argv.insert(s.argv.end(), {"-I", o.include_dir, src, "-o", obj});
    for (const auto& x : fl)
      if (x == "-lcublas") s.argv.push_back(x);
    s.env = pick_env({"PATH", "LD_LIBRARY_PATH", "LANG", "CUDA_HOME", "LIBRARY_PATH"});
    s.env.push_back("TMPDIR=" + work);
    s.env.push_back("HOME=" + work);
    s.cwd = work;
    // nvcc reserves a lot of address space; cc1plus honours the limit.
    if (b == KF_BACKEND_CPU) s.rlimits.push_back({RLIMIT_AS, o.memory_limit_bytes});
    s.rlimits.push_back({RLIMIT_CPU, (unsigned long long)(o.time_limit_s * 2 + 5)});
    s.rlimits.push_back({RLIMIT_FSIZE, 1ull << 30});
    s.rlimits.push_back({RLIMIT_CORE, 0});
    BoundedRun br = run_bounded(s, o.time_limit_s, 1 << 20);
    if (br.timed_out) {
      r.timed_out = true;
      r.diagnostics = "compile timed out after " + std::to_string(int(o.time_limit_s)) + " s\n" +
                      truncate_diagnostics(br.output, o.max_errors, o.max_diagnostics_bytes / 2);
      write_text_atomic(fail, r.diagnostics);
    } else if (!WIFEXITED(br.status) || WEXITSTATUS(br.status) != 0 || !fsutil::exists(obj)) {
      std::string out = br.output;
      // Paths of our private folder mean nothing to the reader.
      for (std::size_t p; (p = out.find(src)) != std::string::npos;) out.replace(p, src.size(), fsutil::filename(src));
      r.diagnostics = truncate_diagnostics(out, o.max_errors, o.max_diagnostics_bytes);
      if (r.diagnostics.empty()) r.diagnostics = "compiler " + describe_wait_status(br.status);
      write_text_atomic(fail, r.diagnostics);
    } else {
      ::chmod(obj.c_str(), 0755);
      if (::rename(obj.c_str(), so.c_str()) != 0)  // atomic publish: readers see all or nothing
        throw Error("rename " + obj + ": " + std::strerror(errno));
      r.ok = true;
      r.so_path = so;
    }
    fsutil::remove_tree(work);
    return done(r);
  }

  std::shared_future<CompileResult> get(const std::string& source, Backend b, bool async) {
    const std::string k = std::to_string(int(b)) + sha256_hex(source);
    std::shared_ptr<std::promise<CompileResult>> prom;
    std::shared_future<CompileResult> fut;
    {
      std::lock_guard<std::mutex> lk(mu);
      auto it = inflight.find(k);
      if (it != inflight.end()) return it->second;
      prom = std::make_shared<std::promise<CompileResult>>();
      fut = prom->get_future().share();
      inflight[k] = fut;
    }
    auto job = [this, prom, source, b, k]() {
      try {
        prom->set_value(run(source, b));
      } catch (const std::exception& e) {
        CompileResult r;
        r.diagnostics = std::string("compile service: ") + e.what();
        prom->set_value(r);
      }
      std::lock_guard<std::mutex> lk(mu);
      inflight.erase(k);
    };
    if (async) arena.execute([&] { group.run(job); });
    else job();
    return fut;
  }
};

CompileService::CompileService(CompileOptions opts) : impl_(std::make_unique<Impl>(std::move(opts))) {}
CompileService::~CompileService() {
  impl_->arena.execute([&] { impl_->group.wait(); });
}

CompileResult CompileService::compile(const std::string& source, Backend backend) {
  return impl_->get(source, backend, false).get();
}
std::shared_future<CompileResult> CompileService::submit(const std::string& source, Backend backend) {
  return impl_->get(source, backend, true);
}
std::vector<CompileResult> CompileService::compile_all(const std::vector<std::string>& sources, Backend backend) {
  std::vector<std::shared_future<CompileResult>> futs;
  for (const auto& s : sources) futs.push_back(submit(s, backend));
  std::vector<CompileResult> out;
  for (auto& f : futs) out.push_back(f.get());
  return out;
}
std::string CompileService::compiler_identity(Backend backend) { return impl_->ident(backend); }
const CompileOptions& CompileService::options() const { return impl_->o; }

}  // namespace kf::evaluator
