// The compiler runs confined: hostile sources that try to read files of the host (include
// tricks, #line, __has_include probes, .incbin, #embed) are rejected, and neither their
// diagnostics nor any object carries a byte of a planted secret. Real g++ and nvcc.
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/capability.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "../../evaluator/src/process.h"
#include "kf/common/error.h"
#include "kf/evaluator/evaluator.h"
#include "test_util.h"

using namespace kf::evaluator;
using namespace kf;
namespace fs = std::filesystem;

namespace {

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
void put(const std::string& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
}
std::vector<std::string> lines_of(const std::string& p) {
  std::vector<std::string> out;
  std::istringstream in(slurp(p));
  for (std::string l; std::getline(in, l);)
    if (l.size() >= 8) out.push_back(l);  // long enough to be a disclosure, not a coincidence
  return out;
}
// Every regular file under `dir` (the cache: objects, failure records).
std::vector<std::string> files_under(const std::string& dir) {
  std::vector<std::string> out;
  FILE* p = popen(("find '" + dir + "' -type f 2>/dev/null").c_str(), "r");
  char buf[4096];
  while (p && fgets(buf, sizeof buf, p)) {
    std::string s(buf);
    if (!s.empty() && s.back() == '\n') s.pop_back();
    out.push_back(s);
  }
  if (p) pclose(p);
  return out;
}
bool have_nvcc(const CompileOptions& o) { return access(o.nvcc.c_str(), X_OK) == 0; }

const std::string kEntry =
    "\nextern \"C\" int kf_forward(kf::Context*, const kf::Tensor*, int, kf::Tensor*, int) { return 0; }\n";

// Secrets planted outside the compiler's view: world-readable, so only the view (not the
// uid) keeps them out. One plain token file, an /etc-like tree, a symlink to the token,
// and a file in the compile cache (where other candidates' objects live).
struct Secrets {
  std::string token, token2, dir, file, link, etc_passwd, cache_file;
  explicit Secrets(const std::string& cache_dir) {
    std::mt19937_64 rng(std::random_device{}());
    char t[40];
    std::snprintf(t, sizeof t, "kfsecret%016llx", (unsigned long long)rng());
    token = t;
    std::snprintf(t, sizeof t, "kfetcsecret%016llx", (unsigned long long)rng());
    token2 = t;
    dir = "/tmp/kf-secret-XXXXXX";
    if (!mkdtemp(dir.data())) std::abort();
    ::chmod(dir.c_str(), 0755);
    file = dir + "/secret.h";
    put(file, token + "\n");
    link = dir + "/link.h";
    if (::symlink(file.c_str(), link.c_str()) != 0) std::abort();
    ::mkdir((dir + "/etc").c_str(), 0755);
    etc_passwd = dir + "/etc/passwd";
    put(etc_passwd, "root:x:0:0:" + token2 + ":/root:/bin/bash\n");
    cache_file = cache_dir + "/zz/other_candidate.h";
    ::mkdir((cache_dir + "/zz").c_str(), 0755);
    put(cache_file, token + "\n");
    for (const auto& f : {file, etc_passwd, cache_file}) ::chmod(f.c_str(), 0644);
  }
};

struct Hostile {
  std::string name, source;
  Backend backend = KF_BACKEND_CPU;
};

std::vector<Hostile> hostile_table(const Secrets& s) {
  const std::string S = s.file;
  std::vector<Hostile> t = {
      {"macro_angle_etc_passwd", "#define P </etc/passwd>\n#include P\n"},
      {"macro_angle_etc_shadow", "#define P </etc/shadow>\n#include P\n"},
      {"macro_quote_secret", "#define P \"" + S + "\"\n#include P\n"},
      {"macro_fake_etc_passwd", "#define P \"" + s.etc_passwd + "\"\n#include P\n"},
      {"macro_other_candidates_cache", "#define P \"" + s.cache_file + "\"\n#include P\n"},
      {"macro_proc_self_root", "#define P </proc/self/root/etc/passwd>\n#include P\n"},
      {"stringised_macro", "#define STR(x) #x\n#define XSTR(x) STR(x)\n#include XSTR(" + S + ")\n"},
      {"line_splice", "#inc\\\nlude \"" + S + "\"\n"},
      {"digraph_include", "%:include \"" + S + "\"\n"},
      {"has_include_probe_secret",
       "#include <kf/kernel.h>\n#if !__has_include(\"" + S + "\")\n#error absent\n#endif\n" + kEntry},
      {"has_include_probe_shadow",
       "#include <kf/kernel.h>\n#if !__has_include(</etc/shadow>)\n#error absent\n#endif\n" + kEntry},
      {"has_include_pasted",  // gets past the text filter
       "#include <kf/kernel.h>\n#define CAT(a, b) a##b\n#if !CAT(__has_, include)(\"" + S +
           "\")\n#error absent\n#endif\n" + kEntry},
      {"pragma_dependency_macro_built",  // gets past the text filter
       "#include <kf/kernel.h>\n#define S_(x) #x\n#define XS(x) S_(x)\n#define P(x) _Pragma(XS(x))\n#define DEP "
       "dependency\n"
       "P(GCC DEP \"" +
           S + "\")\n" + kEntry},
      {"incbin_concatenated", "#include <kf/kernel.h>\nasm(\".inc\" \"bin \\\"" + S + "\\\"\");\n" + kEntry},
      {"incbin_etc_passwd", "#include <kf/kernel.h>\nasm(\".inc\" \"bin \\\"/etc/passwd\\\"\");\n" + kEntry},
      {"incbin_macro_built",
       "#include <kf/kernel.h>\n#define S_(x) #x\n#define INC(f) asm(\".incb\" \"in \" S_(f))\nINC(\"" + S + "\");\n" +
           kEntry},
      {"symlink_absolute", "#define P \"" + s.link + "\"\n#include P\n"},
      {"dotdot_plain", "#include \"../../../../../../../../../.." + S + "\"\n"},
      {"dotdot_macro", "#define P \"../../../../../../../../../.." + S + "\"\n#include P\n"},
      {"pragma_dependency", "#include <kf/kernel.h>\n#pragma GCC dependency \"" + S + "\"\n" + kEntry},
      {"pragma_operator_dependency",
       "#include <kf/kernel.h>\n_Pragma(\"GCC dependency \\\"" + S + "\\\"\")\n" + kEntry},
      {"line_directive_quotes_file", "#line 1 \"" + S + "\"\nint x = undefined_name;\n"},
      {"line_directive_etc_passwd", "#line 1 \"/etc/passwd\"\nint x = undefined_name;\n"},
      {"file_macro_include", "#line 1 \"" + S + "\"\n#include __FILE__\n"},
      {"embed_digraph", "#include <kf/kernel.h>\nconst unsigned char d[] = {\n%:embed \"" + S + "\"\n};\n" + kEntry},
      {"embed_plain", "#include <kf/kernel.h>\nconst unsigned char d[] = {\n#embed \"" + S + "\"\n};\n" + kEntry},
      {"cuda_macro_include", "#define P \"" + S + "\"\n#include P\n", KF_BACKEND_CUDA},
      {"cuda_line_directive", "#line 1 \"" + S + "\"\n__global__ void k() { undefined_name(); }\n", KF_BACKEND_CUDA},
      {"cuda_incbin", "#include <kf/kernel.h>\nasm(\".inc\" \"bin \\\"" + S + "\\\"\");\n" + kEntry, KF_BACKEND_CUDA},
  };
  return t;
}

// Sets the capability sets of this process without CAP_SYS_ADMIN (the mount namespace's).
bool drop_cap_sys_admin() {
  __user_cap_header_struct h{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct d[2];
  if (syscall(SYS_capget, &h, d) != 0) return false;
  d[0].effective &= ~(1u << CAP_SYS_ADMIN);
  d[0].permitted &= ~(1u << CAP_SYS_ADMIN);
  d[0].inheritable &= ~(1u << CAP_SYS_ADMIN);
  return syscall(SYS_capset, &h, d) == 0;
}

}  // namespace

TEST(CompileSandboxTest, HostileSourcesAreRejectedAndDiscloseNothing) {
  CompileOptions o;
  o.cache_dir = test::temp_dir("hostile");
  Secrets sec(o.cache_dir);
  const bool nvcc = have_nvcc(o);
  if (!nvcc) std::printf("nvcc not found at %s: the CUDA rows are skipped\n", o.nvcc.c_str());
  std::vector<std::string> forbidden = lines_of("/etc/passwd");
  for (const auto& l : lines_of("/etc/shadow")) forbidden.push_back(l);
  CompileService cs(o);
  std::vector<Hostile> rows;
  for (const auto& h : hostile_table(sec))
    if (h.backend == KF_BACKEND_CPU || nvcc) rows.push_back(h);
  std::vector<std::string> cpu, cuda;
  for (const auto& h : rows) (h.backend == KF_BACKEND_CPU ? cpu : cuda).push_back(h.source);
  std::vector<CompileResult> rc = cs.compile_all(cpu, KF_BACKEND_CPU), rg;
  if (!cuda.empty()) rg = cs.compile_all(cuda, KF_BACKEND_CUDA);
  std::size_t ic = 0, ig = 0;
  for (const auto& h : rows) {
    const CompileResult& r = h.backend == KF_BACKEND_CPU ? rc[ic++] : rg[ig++];
    SCOPED_TRACE(h.name);
    EXPECT_FALSE(r.ok) << h.name << " compiled: " << r.so_path;
    EXPECT_EQ(r.diagnostics.find(sec.token), std::string::npos) << h.name << " disclosed the secret:\n"
                                                                << r.diagnostics;
    EXPECT_EQ(r.diagnostics.find(sec.token2), std::string::npos) << h.name << " disclosed the fake passwd:\n"
                                                                 << r.diagnostics;
    for (const auto& l : forbidden)
      EXPECT_EQ(r.diagnostics.find(l), std::string::npos)
          << h.name << " disclosed a line of /etc/passwd or /etc/shadow:\n"
          << r.diagnostics;
    std::printf("%-30s %s\n", h.name.c_str(), r.diagnostics.substr(0, r.diagnostics.find('\n')).c_str());
  }
  // No object (or cached failure) anywhere in the cache carries the token.
  for (const auto& f : files_under(o.cache_dir)) {
    if (f == sec.cache_file) continue;
    const std::string b = slurp(f);
    EXPECT_EQ(b.find(sec.token), std::string::npos) << f << " carries the secret";
    EXPECT_EQ(b.find(sec.token2), std::string::npos) << f << " carries the fake passwd";
  }
}

TEST(CompileSandboxTest, HonestCpuSourceCompilesAndLoads) {
  CompileOptions o;
  o.cache_dir = test::temp_dir("honest");
  CompileService cs(o);
  const std::string src = R"(#include <kf/kernel.h>
#include <cmath>
#include <omp.h>
extern "C" int kf_forward(kf::Context*, const kf::Tensor* in, int, kf::Tensor* out, int) {
  const float* x = (const float*)in[0].data; float* y = (float*)out[0].data;
  #pragma omp parallel for
  for (long i = 0; i < in[0].numel(); ++i) y[i] = std::sqrt(x[i]) * 2;
  return 0;
})";
  CompileResult r = cs.compile(src, KF_BACKEND_CPU);
  ASSERT_TRUE(r.ok) << r.diagnostics;
  struct stat st;
  ASSERT_EQ(::lstat(r.so_path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_uid, geteuid()) << "the published object belongs to the evaluator, not to the compiler's user";
  void* h = dlopen(r.so_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(h, nullptr) << dlerror();
  using Fn = int (*)(kf::Context*, const kf::Tensor*, int, kf::Tensor*, int);
  auto fn = reinterpret_cast<Fn>(dlsym(h, "kf_forward"));
  ASSERT_NE(fn, nullptr);
  float x[4] = {1, 4, 9, 16}, y[4] = {0, 0, 0, 0};
  kf::Tensor in{}, out{};
  in.data = x;
  out.data = y;
  in.ndim = out.ndim = 1;
  in.shape[0] = out.shape[0] = 4;
  in.stride[0] = out.stride[0] = 1;
  EXPECT_EQ(fn(nullptr, &in, 1, &out, 1), 0);
  EXPECT_FLOAT_EQ(y[3], 8.0f);
  // Not dlclose'd: that would unmap libgomp under its idle pool threads.
}

TEST(CompileSandboxTest, HonestCudaSourceCompilesAndLoads) {
  CompileOptions o;
  o.cache_dir = test::temp_dir("honestcu");
  if (!have_nvcc(o)) GTEST_SKIP() << "nvcc not found at " << o.nvcc << ": CUDA compile test skipped";
  CompileService cs(o);
  const std::string src = R"(#include <kf/kernel.h>
#include <cuda_runtime.h>
#include <cublas_v2.h>
__global__ void twice(const float* x, float* y, long n) {
  long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2 * x[i];
}
extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int, kf::Tensor* out, int) {
  long n = in[0].numel();
  twice<<<(n + 255) / 256, 256, 0, (cudaStream_t)ctx->stream>>>((const float*)in[0].data, (float*)out[0].data, n);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
})";
  CompileResult r = cs.compile(src, KF_BACKEND_CUDA);
  ASSERT_TRUE(r.ok) << r.diagnostics;
  // Loading needs the CUDA libraries it links (cuBLAS) on the loader's path.
  void* h = dlopen(r.so_path.c_str(), RTLD_LAZY | RTLD_LOCAL);
  if (!h) GTEST_SKIP() << "compiled; not loadable here (" << dlerror() << ")";
  EXPECT_NE(dlsym(h, "kf_forward"), nullptr);
}

// A compiler named through links the view does not show still runs: NVIDIA's packages
// install /usr/local/cuda -> /etc/alternatives/cuda -> /usr/local/cuda-X, and the view has
// no /etc. Here the chain goes through a folder outside every bound root.
TEST(CompileSandboxTest, CompilerNamedThroughLinksOutsideTheViewRuns) {
  CompileOptions o;
  const std::string real_nvcc = o.nvcc;
  const std::string dir = test::temp_dir("linked");
  const std::string tk = dir + "/toolkit/bin", alt = dir + "/alternatives";
  fs::create_directories(tk);
  fs::create_directories(alt);
  char real_cxx[PATH_MAX];
  ASSERT_NE(::realpath(("/usr/bin/" + o.cxx).c_str(), real_cxx), nullptr) << "/usr/bin/" << o.cxx;
  fs::create_symlink(real_cxx, alt + "/cxx");
  fs::create_symlink(alt + "/cxx", tk + "/cxx");
  o.cxx = tk + "/cxx";
  std::vector<Backend> backends = {KF_BACKEND_CPU};
  if (access(real_nvcc.c_str(), X_OK) == 0) {
    char r[PATH_MAX];
    ASSERT_NE(::realpath(real_nvcc.c_str(), r), nullptr);
    fs::create_symlink(r, alt + "/nvcc");
    fs::create_symlink(alt + "/nvcc", tk + "/nvcc");
    o.nvcc = tk + "/nvcc";
    backends.push_back(KF_BACKEND_CUDA);
  } else {
    std::printf("nvcc not found at %s: the CUDA half is skipped\n", real_nvcc.c_str());
  }
  o.cache_dir = dir + "/cache";
  CompileService cs(o);
  for (Backend b : backends) {
    CompileResult r = cs.compile(R"(#include <kf/kernel.h>
extern "C" int kf_forward(kf::Context*, const kf::Tensor*, int, kf::Tensor*, int) { return 0; })",
                                 b);
    EXPECT_TRUE(r.ok) << (b == KF_BACKEND_CUDA ? "nvcc: " : "c++: ") << r.diagnostics;
  }
}

// The compiler's view from inside: a probe "compiler" (bash) reports its identity, its
// root folder and what it can reach. The output comes back as diagnostics.
TEST(CompileSandboxTest, CompilerRunsAsNobodyInAPrivateViewWithoutNetwork) {
  CompileOptions o;
  o.cache_dir = test::temp_dir("view");
  Secrets sec(o.cache_dir);
  o.cxx = "/usr/bin/bash";
  o.cxx_flags = {"-c",
                 "echo \"probe uid=$(id -u) gid=$(id -g)\"; echo \"probe root=$(ls / | tr '\\n' ' ')\";"
                 "for p in /etc/passwd /etc /root /home /proc/self /work " +
                     sec.file + " " + o.cache_dir +
                     " " KF_KERNELS_DIR
                     "; do [ -e \"$p\" ] && echo \"probe sees $p\"; done;"
                     "(exec 3<>/dev/tcp/127.0.0.1/22) 2>/dev/null && echo 'probe net=yes' || echo 'probe net=no';"
                     "touch /usr/kf-probe 2>/dev/null && echo 'probe usr=writable' || echo 'probe usr=ro';"
                     "touch /kf-probe 2>/dev/null && echo 'probe root=writable' || echo 'probe rootfs=ro';"
                     "echo \"probe cwd=$(pwd)\"; exit 1",
                 "probe"};
  o.cpu_model_in_key = false;
  CompileService cs(o);
  CompileResult r = cs.compile("int x;\n", KF_BACKEND_CPU);
  ASSERT_FALSE(r.ok);
  const std::string& d = r.diagnostics;
  std::printf("%s", d.c_str());
  if (geteuid() == 0)
    EXPECT_NE(d.find("probe uid=65534 gid=65534"), std::string::npos) << d;
  else
    EXPECT_NE(d.find("probe uid=0"), std::string::npos) << "a user namespace maps the caller to root inside: " << d;
  EXPECT_EQ(d.find("probe sees"), std::string::npos) << "the view holds host files: " << d;
  EXPECT_NE(d.find("probe net=no"), std::string::npos) << d;
  EXPECT_NE(d.find("probe usr=ro"), std::string::npos) << d;
  EXPECT_NE(d.find("probe rootfs=ro"), std::string::npos) << d;
  EXPECT_NE(d.find("probe cwd=/kf/work"), std::string::npos) << d;
  const std::size_t p = d.find("probe root=");
  ASSERT_NE(p, std::string::npos) << d;
  const std::string root = d.substr(p, d.find('\n', p) - p);
  for (const char* absent : {" etc ", " root ", " home ", " work ", " proc ", " sys ", " opt ", " var "})
    EXPECT_EQ((root + " ").find(absent), std::string::npos) << "'" << absent << "' in the view's root: " << root;
  for (const char* present : {"usr", "tmp", "dev", "kf"})
    EXPECT_NE(root.find(present), std::string::npos) << present << " missing from the view's root: " << root;
}

// Inside the view but outside the allowed headers: the dependency output and the
// diagnostics' locations name it, and the source is rejected without its content.
TEST(CompileSandboxTest, FilesOutsideTheAllowedHeadersAreRejectedByName) {
  CompileOptions o;
  o.cache_dir = test::temp_dir("deps");
  CompileService cs(o);
  if (access("/usr/lib/os-release", R_OK) == 0) {
    CompileResult r = cs.compile("#define P </usr/lib/os-release>\n#include P\n", KF_BACKEND_CPU);
    EXPECT_FALSE(r.ok);
    EXPECT_TRUE(r.rejected_source) << r.diagnostics;
    EXPECT_NE(r.diagnostics.find("/usr/lib/os-release"), std::string::npos) << r.diagnostics;
    for (const auto& l : lines_of("/usr/lib/os-release"))
      EXPECT_EQ(r.diagnostics.find(l), std::string::npos) << r.diagnostics;
  }
  // .incbin of a file inside the view: the assembler's dependency output names it (g++,
  // and nvcc's host compile).
  if (access("/usr/lib/os-release", R_OK) == 0) {
    const std::string src = "#include <kf/kernel.h>\nasm(\".inc\" \"bin \\\"/usr/lib/os-release\\\"\");\n" + kEntry;
    std::vector<Backend> backends = {KF_BACKEND_CPU};
    if (have_nvcc(o)) backends.push_back(KF_BACKEND_CUDA);
    for (Backend b : backends) {
      CompileResult r = cs.compile(src, b);
      EXPECT_FALSE(r.ok) << "backend " << int(b) << " embedded a file outside the allowed headers";
      EXPECT_TRUE(r.rejected_source) << r.diagnostics;
      EXPECT_NE(r.diagnostics.find("opened /usr/lib/os-release"), std::string::npos) << r.diagnostics;
    }
  }
  // A header that compiles (CUDA's, outside the CPU backend's allowed set).
  const std::string cuda_hdr = "/usr/local/cuda/include/vector_types.h";
  if (access(cuda_hdr.c_str(), R_OK) == 0) {
    CompileResult r =
        cs.compile("#define P <" + cuda_hdr + ">\n#include P\n#include <kf/kernel.h>\n" + kEntry, KF_BACKEND_CPU);
    EXPECT_FALSE(r.ok) << "compiled with a header outside the allowed set";
    EXPECT_TRUE(r.rejected_source) << r.diagnostics;
    EXPECT_NE(r.diagnostics.find("/usr/local/cuda"), std::string::npos) << r.diagnostics;
  } else {
    std::printf("%s absent: the compiled-header case is skipped\n", cuda_hdr.c_str());
  }
}

// No confinement, no compile: a failure in the child's set-up comes back as the reason.
TEST(CompileSandboxTest, ConfinementFailureFailsTheCompileWithTheReason) {
  CompileOptions o;
  o.cache_dir = test::temp_dir("nomount");
  CompileService cs(o);
  cs.compiler_identity(KF_BACKEND_CPU);  // cached: the failure below is the compile's own
  ASSERT_EQ(::rmdir((o.cache_dir + "/.view").c_str()), 0);
  const std::string src = std::string("#include <kf/kernel.h>\n") + kEntry;
  CompileResult r = cs.compile(src, KF_BACKEND_CPU);
  EXPECT_FALSE(r.ok);
  EXPECT_FALSE(r.cached);
  EXPECT_TRUE(r.environment_failure) << "the host's fault, not the source's";
  EXPECT_FALSE(r.rejected_source);
  EXPECT_NE(r.diagnostics.find("did not run"), std::string::npos) << r.diagnostics;
  EXPECT_NE(r.diagnostics.find(".view"), std::string::npos) << r.diagnostics;
  EXPECT_NE(r.diagnostics.find("No such file or directory"), std::string::npos) << r.diagnostics;
  // Not cached: once the host is fixed, the same source compiles.
  ASSERT_EQ(::mkdir((o.cache_dir + "/.view").c_str(), 0755), 0);
  CompileResult again = cs.compile(src, KF_BACKEND_CPU);
  EXPECT_TRUE(again.ok) << again.diagnostics;
  EXPECT_FALSE(again.environment_failure);
}

// Root without CAP_SYS_ADMIN (a container without it): unshare fails with EPERM, and the
// spawn says so instead of running the compiler unconfined.
TEST(CompileSandboxTest, WithoutMountPrivilegeTheSpawnFailsAndSaysWhy) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (to drop CAP_SYS_ADMIN and see EPERM)";
  const std::string dir = test::temp_dir("eperm");
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(p[0]);
    std::string msg;
    if (!drop_cap_sys_admin()) {
      msg = "capset failed";
    } else {
      SpawnSpec s;
      s.argv = {"/usr/bin/true"};
      s.confine.enabled = true;
      s.confine.mount_point = dir;
      s.confine.binds.push_back({"/usr", "/usr"});
      try {
        BoundedRun br = run_bounded(s, 10, 4096);
        msg = "ran: " + describe_wait_status(br.status);
      } catch (const Error& e) {
        msg = e.what();
      }
    }
    (void)!write(p[1], msg.data(), msg.size());
    _exit(0);
  }
  close(p[1]);
  std::string msg;
  char buf[1024];
  for (ssize_t n; (n = read(p[0], buf, sizeof buf)) > 0;) msg.append(buf, std::size_t(n));
  close(p[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_NE(msg.find("unshare"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Operation not permitted"), std::string::npos) << msg;
  EXPECT_NE(msg.find("CAP_SYS_ADMIN"), std::string::npos) << msg;
}

// A view with a private /proc (the ModelNew worker's on CUDA: the driver writes its threads'
// names there during cuInit): the child can write its own entries, lists only itself, sees
// neither its parent nor anything else of the host's, and is a user no other process is.
TEST(CompileSandboxTest, PrivateProcInAViewListsOnlyTheChildAndTakesItsThreadNames) {
  if (!private_proc_supported()) GTEST_SKIP() << "a private /proc needs root and Linux >= 5.8 (not here)";
  const std::string dir = test::temp_dir("proc-view");
  SpawnSpec s;
  // Builtins only: a second process (ls, cat) would be listed too.
  s.argv = {"/usr/bin/bash", "-c",
            "echo \"probe uid=$UID pid=$$\" >&2;"
            "echo kf-probe > /proc/thread-self/comm && read -r c < /proc/self/comm && echo \"probe comm=$c\" >&2;"
            "n=0; for d in /proc/[0-9]*; do n=$((n+1)); echo \"probe lists ${d#/proc/}\" >&2; done;"
            "echo \"probe listed=$n\" >&2;"
            "[ -e /proc/$PPID ] && echo 'probe sees its parent' >&2;"
            "[ -e /proc/1 ] && echo 'probe sees pid 1' >&2;"
            "echo x > /proc/sys/kernel/hostname 2>/dev/null && echo 'probe wrote a sysctl' >&2; exit 0"};
  s.confine.enabled = true;
  s.confine.mount_point = dir;
  s.confine.private_proc = true;
  for (const char* top : {"/usr", "/lib", "/lib64", "/bin"}) {
    struct stat st;
    if (::lstat(top, &st) == 0 && S_ISDIR(st.st_mode))
      s.confine.binds.push_back({top, top});
    else if (::lstat(top, &st) == 0 && S_ISLNK(st.st_mode))
      s.confine.symlinks.push_back({fs::read_symlink(top).string(), top});
  }
  s.confine.binds.push_back({"/dev/null", "/dev/null", true, true});
  const BoundedRun br = run_bounded(s, 20, 1 << 16);
  const std::string& d = br.output;
  std::printf("%s", d.c_str());
  ASSERT_TRUE(WIFEXITED(br.status) && WEXITSTATUS(br.status) == 0) << describe_wait_status(br.status) << "\n" << d;
  const auto at = d.find("probe uid=");
  ASSERT_NE(at, std::string::npos) << d;
  unsigned long uid = 0, pid = 0;
  ASSERT_EQ(std::sscanf(d.c_str() + at, "probe uid=%lu pid=%lu", &uid, &pid), 2) << d;
  EXPECT_EQ(uid, 0x40000000ul + pid) << "the child is not a user of its own";
  EXPECT_NE(d.find("probe comm=kf-probe"), std::string::npos) << "the child could not name its thread: " << d;
  EXPECT_NE(d.find("probe listed=1\n"), std::string::npos) << d;
  EXPECT_NE(d.find("probe lists " + std::to_string(pid) + "\n"), std::string::npos) << d;
  EXPECT_EQ(d.find("probe sees"), std::string::npos) << d;
  EXPECT_EQ(d.find("probe wrote"), std::string::npos) << d;
}

// Median of 5 uncached compiles, CPU and CUDA (run by hand with
// --gtest_also_run_disabled_tests; numbers for docs and reports).
TEST(CompileSandboxTest, DISABLED_LatencyMedianOfFive) {
  CompileOptions o;
  o.cache_dir = test::temp_dir("latency");
  CompileService cs(o);
  auto median = [&](const std::string& src, Backend b) {
    std::vector<double> t;
    for (int i = 0; i < 5; ++i) {
      CompileResult r = cs.compile(src + "\n// run " + std::to_string(i) + "\n", b);
      EXPECT_TRUE(r.ok) << r.diagnostics;
      t.push_back(r.seconds);
    }
    std::sort(t.begin(), t.end());
    return t[2];
  };
  cs.compiler_identity(KF_BACKEND_CPU);
  std::printf("cpu  median of 5: %.3f s\n", median(test::read_kernel("cpu/good_matmul.cpp"), KF_BACKEND_CPU));
  if (have_nvcc(o)) {
    cs.compiler_identity(KF_BACKEND_CUDA);
    std::printf("cuda median of 5: %.3f s\n", median(test::read_kernel("cuda/good_gelu.cu"), KF_BACKEND_CUDA));
  }
}
