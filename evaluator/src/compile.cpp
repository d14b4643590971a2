// Compile service (see kf/evaluator/evaluator.h): cache lookup, include policy, bounded compiler runs
// in a confined view (process.h), and the check of the files the compiler opened.
#include "kf/evaluator/evaluator.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tbb/global_control.h>
#include <tbb/task_arena.h>
#include <tbb/task_group.h>

#include <algorithm>
#include <cctype>
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
#include "kf/common/fsutil.h"
#include "kf/common/log.h"
#include "compile.h"
#include "process.h"
#include "sha256.h"

#ifndef KF_ABI_INCLUDE_DIR
#define KF_ABI_INCLUDE_DIR ""
#endif

namespace kf::evaluator {
namespace {

// Where the compiler's view shows the job's own folder and the ABI headers.
const std::string kViewWork = "/kf/work";
const std::string kViewAbi = "/kf/include";
constexpr uid_t kNobody = 65534;

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

// "/a/b/../c/./d" -> "/a/c/d"; relative paths are taken from the job's folder in the view.
std::string lexically_normal(const std::string& path) {
  const std::string p = path.empty() || path[0] != '/' ? kViewWork + "/" + path : path;
  std::vector<std::string> parts;
  std::istringstream in(p);
  std::string part;
  while (std::getline(in, part, '/')) {
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
    } else {
      parts.push_back(part);
    }
  }
  std::string out;
  for (const auto& x : parts) out += "/" + x;
  return out.empty() ? "/" : out;
}

// The prerequisites of a make-style dependency file (-MD -MF, as --MD): every file the
// compiler or assembler opened. Targets ("x.so:") are skipped.
std::vector<std::string> depfile_paths(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  auto flush = [&] {
    if (!cur.empty() && cur.back() != ':') out.push_back(cur);
    cur.clear();
  };
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\\' && i + 1 < text.size()) {
      const char n = text[i + 1];
      if (n == '\n' || n == '\r') {
        ++i;
        flush();
        continue;
      }
      if (n == ' ' || n == '#' || n == '\\') {
        cur += n;
        ++i;
        continue;
      }
    }
    if (c == '$' && i + 1 < text.size() && text[i + 1] == '$') {
      cur += '$';
      ++i;
      continue;
    }
    if (std::isspace(static_cast<unsigned char>(c))) {
      flush();
      continue;
    }
    cur += c;
  }
  flush();
  return out;
}

bool under_roots(const std::string& path, const std::vector<std::string>& roots) {
  const std::string n = lexically_normal(path);
  for (const auto& r : roots)
    if (n.rfind(r, 0) == 0) return true;
  return false;
}

// The first file that a diagnostic is located in ("file:12:3: error", "file(12): error",
// "In file included from file:3,") and that lies outside `roots`; "" if none. A compiler
// quotes lines of the file it reports on, so such output must not leave the service.
std::string outside_location(const std::string& output, const std::vector<std::string>& roots) {
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line)) {
    std::size_t b = line.find_first_not_of(" \t");
    if (b == std::string::npos) continue;
    std::string l = line.substr(b);
    for (const char* pre : {"In file included from ", "from "})
      if (l.rfind(pre, 0) == 0) l = l.substr(std::strlen(pre));
    const std::size_t e = l.find_first_of(":(");
    if (e == 0 || e == std::string::npos || e + 1 >= l.size()) continue;
    if (!std::isdigit(static_cast<unsigned char>(l[e + 1]))) continue;
    const std::string file = l.substr(0, e);
    if (file[0] == '<' || file.find_first_of(" \t|") != std::string::npos) continue;
    if (!under_roots(file, roots)) return file;
  }
  return "";
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
    if (std::regex_search(line, asm_inc))
      return "line " + std::to_string(no) + ": assembler .incbin/.include is not allowed";
    // File probes: whether a file exists, or is newer than the source.
    static const std::regex probe(R"(__has_include|GCC\s+dependency)");
    if (std::regex_search(line, m, probe))
      return "line " + std::to_string(no) + ": " + (m.str(0)[0] == '_' ? "__has_include" : "#pragma GCC dependency") +
             " is not allowed (it probes files)";
    if (!std::regex_search(line, m, inc)) {
      if (line.find("#embed") != std::string::npos || line.find("__has_embed") != std::string::npos)
        return "line " + std::to_string(no) + ": #embed is not allowed";
      continue;
    }
    const std::string kw = m[1], path = m[3];
    if (kw != "include") return "line " + std::to_string(no) + ": #" + kw + " is not allowed";
    if (!path.empty() && path[0] == '/')
      return "line " + std::to_string(no) + ": #include of an absolute path is not allowed";
    if (path.find("..") != std::string::npos)
      return "line " + std::to_string(no) + ": #include with '..' is not allowed";
    if (m[2] == "\"" && path != "kf/kernel.h")
      return "line " + std::to_string(no) +
             ": only \"kf/kernel.h\" may be included with quotes (use <...> for system headers)";
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
    if (!fsutil::make_dirs(o.cache_dir, 0755))
      throw error_at(o.cache_dir, std::string("cannot create: ") + std::strerror(errno));
    ::chmod(o.cache_dir.c_str(), 0755);
    // The compiler's private root is a tmpfs mounted here, in the compiler's own mount
    // namespace only (so concurrent compiles share this empty folder).
    view_root = o.cache_dir + "/.view";
    if (!fsutil::make_dirs(view_root, 0755))
      throw error_at(view_root, std::string("cannot create: ") + std::strerror(errno));
  }

  std::string view_root;

  // The compiler's view: the toolchain and system headers (/usr, the /lib* and /bin
  // links, a compiler installed elsewhere), the ABI headers, the job's folder, a private
  // /tmp and /dev/{null,zero,random,urandom}. No /etc, /proc, /home, /root, project tree,
  // cache or other jobs; no network; uid nobody (root callers).
  Confinement view(Backend b, const std::string& work) const {
    Confinement c;
    c.enabled = true;
    c.mount_point = view_root;
    c.binds.push_back({"/usr", "/usr"});
    for (const char* top : {"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}) {
      struct stat st;
      if (::lstat(top, &st) != 0) continue;
      if (S_ISLNK(st.st_mode)) {
        char buf[PATH_MAX];
        const ssize_t n = ::readlink(top, buf, sizeof buf - 1);
        if (n > 0) c.symlinks.push_back({std::string(buf, std::size_t(n)), top});
      } else if (S_ISDIR(st.st_mode)) {
        c.binds.push_back({top, top});
      }
    }
    for (const std::string& root : compiler_roots(b))
      if (root != "/usr" && root.rfind("/usr/", 0) != 0) c.binds.push_back({root, root});
    c.binds.push_back({o.include_dir, kViewAbi});
    if (!work.empty()) c.binds.push_back({work, kViewWork, /*writable=*/true});
    for (const char* d : {"/dev/null", "/dev/zero", "/dev/random", "/dev/urandom"})
      c.binds.push_back({d, d, /*writable=*/true, /*devices=*/true});
    c.uid = kNobody;
    c.gid = kNobody;
    return c;
  }

  // The install folder of the compiler (".../bin/nvcc" -> "..."), as named and as resolved.
  std::vector<std::string> compiler_roots(Backend b) const {
    std::vector<std::string> out;
    const std::string named = resolve(compiler(b));
    char real[PATH_MAX];
    for (const std::string& p : {named, std::string(::realpath(named.c_str(), real) ? real : named.c_str())}) {
      std::string d = lexically_normal(p);
      for (int up = 0; up < 2 && d.size() > 1; ++up) d = d.substr(0, std::max<std::size_t>(1, d.rfind('/')));
      if (d.size() > 1 && std::find(out.begin(), out.end(), d) == out.end()) out.push_back(d);
    }
    return out;
  }

  // Where the files a compile may open live, as prefixes of paths in the view.
  std::vector<std::string> allowed_roots(Backend b) const {
    std::vector<std::string> r = {"/usr/include/", "/usr/lib/gcc/", "/usr/local/include/", kViewAbi + "/",
                                  kViewWork + "/"};
    for (const auto& x : compiler_roots(b))  // e.g. /usr/local/cuda (its headers and libraries)
      if (x != "/usr") r.push_back(x + "/");
    return r;
  }

  std::string compiler(Backend b) const { return b == KF_BACKEND_CUDA ? o.nvcc : o.cxx; }

  // The compiler's file as run inside the view: its real path. A named path may pass through
  // links the view does not show (/usr/local/cuda -> /etc/alternatives/cuda -> ...: no /etc
  // inside), while the real file lies under a bound root (compiler_roots binds it).
  std::string executable(Backend b) const {
    const std::string named = resolve(compiler(b));
    char real[PATH_MAX];
    return ::realpath(named.c_str(), real) ? std::string(real) : named;
  }

  std::string ident(Backend b) {
    {
      std::lock_guard<std::mutex> lk(mu);
      auto it = identity.find(int(b));
      if (it != identity.end()) return it->second;
    }
    SpawnSpec s;
    s.argv = {executable(b), "--version"};
    s.env = pick_env({"PATH", "LD_LIBRARY_PATH"});
    s.env.push_back("HOME=/tmp");
    s.cwd = "/tmp";
    s.confine = view(b, "");
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
    // "confined": objects built before the compiler ran confined are never served.
    std::string material = std::string(b == KF_BACKEND_CUDA ? "cuda\n" : "cpu\n") + "confined\n" + ident(b) + "\n";
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
    // Each compile works in a private folder (the compiler's temporaries too), which the
    // compiler sees as /kf/work and owns (it runs as nobody).
    const std::string work = o.cache_dir + "/work/" + r.key + "." + std::to_string(getpid()) + "." +
                             std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()));
    fsutil::make_dirs(work, 0700);
    if (geteuid() == 0 && ::chown(work.c_str(), kNobody, kNobody) != 0)
      throw error_at(work, std::string("chown to nobody: ") + std::strerror(errno));
    const std::string name = b == KF_BACKEND_CUDA ? "kernel.cu" : "kernel.cpp";
    write_text_atomic(work + "/" + name, source);
    const std::string vsrc = kViewWork + "/" + name, vobj = kViewWork + "/kernel.so", vdep = kViewWork + "/kernel.d",
                      vasdep = kViewWork + "/kernel.as.d";
    // The commands. g++ compiles and links in one run. nvcc compiles (-c), then links: its
    // device-link stub runs the assembler again, which would overwrite the assembler's
    // dependency output (--MD, the files .incbin read) of the candidate's own code.
    const std::string cc = executable(b), vo = kViewWork + "/kernel.o";
    std::vector<std::vector<std::string>> steps;
    std::vector<std::string> a = {cc};
    for (const auto& x : fl)
      if (x != "-lcublas" && !(b == KF_BACKEND_CUDA && x == "-shared"))
        a.push_back(x);  // libraries go after the source
    // The files it opens: headers (-MD) and what the assembler read.
    a.insert(a.end(), {"-MD", "-MF", vdep});
    if (b == KF_BACKEND_CPU) {
      a.insert(a.end(), {"-Wa,--MD," + vasdep, "-I", kViewAbi, vsrc, "-o", vobj});
      for (const auto& x : fl)
        if (x == "-lcublas") a.push_back(x);
      steps.push_back(a);
    } else {
      a.insert(a.end(), {"-Xcompiler=-Wa\\,--MD\\," + vasdep, "-I", kViewAbi, "-c", vsrc, "-o", vo});
      steps.push_back(a);
      std::vector<std::string> link = {cc};
      for (const auto& x : fl)
        if (x != "-lcublas") link.push_back(x);
      link.insert(link.end(), {vo, "-o", vobj});
      for (const auto& x : fl)
        if (x == "-lcublas") link.push_back(x);
      steps.push_back(link);
    }
    SpawnSpec s;
    s.env = pick_env({"PATH", "LD_LIBRARY_PATH", "LANG", "CUDA_HOME", "LIBRARY_PATH"});
    s.env.push_back("TMPDIR=" + kViewWork);
    s.env.push_back("HOME=" + kViewWork);
    s.cwd = kViewWork;
    s.confine = view(b, work);
    // nvcc reserves a lot of address space; cc1plus honours the limit.
    if (b == KF_BACKEND_CPU) s.rlimits.push_back({RLIMIT_AS, o.memory_limit_bytes});
    s.rlimits.push_back({RLIMIT_CPU, (unsigned long long)(o.time_limit_s * 2 + 5)});
    s.rlimits.push_back({RLIMIT_FSIZE, 1ull << 30});
    s.rlimits.push_back({RLIMIT_CORE, 0});
    BoundedRun br;
    try {
      std::string output;
      double left = o.time_limit_s;
      for (const auto& argv : steps) {
        s.argv = argv;
        br = run_bounded(s, left, 1 << 20);
        output += br.output;
        left -= br.seconds;
        if (br.timed_out || !WIFEXITED(br.status) || WEXITSTATUS(br.status) != 0) break;
      }
      br.output = output;
    } catch (const Error& e) {
      // Never an unconfined compile: the candidate fails, and nothing is cached (the host,
      // not the source, is at fault).
      log_error("compile service: the compiler could not be started confined (", e.what(), "); candidate ",
                r.key.substr(0, 12), " gets compile_error, not cached; compiles fail until the host allows it");
      r.diagnostics = std::string("compile service: the compiler did not run: ") + e.what();
      r.environment_failure = true;
      fsutil::remove_tree(work);
      return done(r);
    }
    // Every file the compiler opened, and every file its diagnostics are located in, must
    // lie in the allowed headers; otherwise the source is rejected and its output dropped.
    const std::vector<std::string> roots = allowed_roots(b);
    std::string outside, how = "the compiler opened ";
    for (const std::string& dep : {work + "/kernel.d", work + "/kernel.as.d"}) {
      for (const auto& f : depfile_paths(read_no_follow(dep)))
        if (!under_roots(f, roots)) {
          outside = lexically_normal(f);
          break;
        }
      if (!outside.empty()) break;
    }
    if (outside.empty()) {
      outside = outside_location(br.output, roots);
      how = "a diagnostic points into ";
    }
    const std::string obj = work + "/kernel.so";
    if (!outside.empty()) {
      r.rejected_source = true;
      r.diagnostics = "source rejected: " + how + outside +
                      ", outside the allowed headers (the ABI header, system and CUDA headers)";
      write_text_atomic(fail, r.diagnostics);
    } else if (br.timed_out) {
      r.timed_out = true;
      r.diagnostics = "compile timed out after " + std::to_string(int(o.time_limit_s)) + " s\n" +
                      truncate_diagnostics(strip_view_paths(br.output), o.max_errors, o.max_diagnostics_bytes / 2);
      write_text_atomic(fail, r.diagnostics);
    } else if (!WIFEXITED(br.status) || WEXITSTATUS(br.status) != 0 || !fsutil::exists(obj)) {
      r.diagnostics = truncate_diagnostics(strip_view_paths(br.output), o.max_errors, o.max_diagnostics_bytes);
      if (r.diagnostics.empty()) r.diagnostics = "compiler " + describe_wait_status(br.status);
      write_text_atomic(fail, r.diagnostics);
    } else {
      // The object was written by nobody: take it over (root), as a plain file only.
      const int fd = ::open(obj.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
      struct stat st;
      if (fd < 0 || ::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        if (fd >= 0) ::close(fd);
        fsutil::remove_tree(work);
        throw Error("compiled object " + obj + " is not a plain file");
      }
      if (geteuid() == 0) (void)!::fchown(fd, 0, 0);
      ::fchmod(fd, 0755);
      ::close(fd);
      if (::rename(obj.c_str(), so.c_str()) != 0)  // atomic publish: readers see all or nothing
        throw Error("rename " + obj + ": " + std::strerror(errno));
      r.ok = true;
      r.so_path = so;
    }
    fsutil::remove_tree(work);
    return done(r);
  }

  // A file the compiler wrote, read without following a link it may have planted.
  static std::string read_no_follow(const std::string& p) {
    const int fd = ::open(p.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return "";
    std::string out;
    char buf[8192];
    ssize_t n;
    while (out.size() < (16u << 20) && (n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, std::size_t(n));
    ::close(fd);
    return out;
  }

  // Paths of the view mean nothing to the reader: "/kf/work/kernel.cpp" -> "kernel.cpp".
  static std::string strip_view_paths(std::string out) {
    const std::string w = kViewWork + "/";
    for (std::size_t p; (p = out.find(w)) != std::string::npos;) out.erase(p, w.size());
    return out;
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
        log_error("compile service: ", e.what(), "; the candidate gets compile_error");
        CompileResult r;
        r.diagnostics = std::string("compile service: ") + e.what();
        r.environment_failure = true;
        prom->set_value(r);
      }
      std::lock_guard<std::mutex> lk(mu);
      inflight.erase(k);
    };
    if (async)
      arena.execute([&] { group.run(job); });
    else
      job();
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
