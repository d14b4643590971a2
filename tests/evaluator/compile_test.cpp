// Compile service: real g++ and nvcc, a fresh cache folder per test.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>

#include "kf/evaluator/evaluator.h"
#include "compile.h"  // check_source_policy
#include "test_util.h"

using namespace kf::evaluator;
using namespace kf;
namespace fs = std::filesystem;

namespace {
CompileOptions fresh_cache(const std::string& tag) {
  CompileOptions o;
  o.cache_dir = test::temp_dir(tag);
  return o;
}
const char* kTiny = R"(#include <kf/kernel.h>
extern "C" int kf_forward(kf::Context*, const kf::Tensor* in, int, kf::Tensor* out, int) {
  const float* x = (const float*)in[0].data; float* y = (float*)out[0].data;
  for (long i = 0; i < in[0].numel(); ++i) y[i] = 2 * x[i];
  return 0;
})";
bool have_nvcc(const CompileOptions& o) { return access(o.nvcc.c_str(), X_OK) == 0; }
}  // namespace

TEST(CompileServiceTest, CompilesAndServesTheSecondCallFromCache) {
  CompileService cs(fresh_cache("cache"));
  CompileResult a = cs.compile(kTiny, KF_BACKEND_CPU);
  ASSERT_TRUE(a.ok) << a.diagnostics;
  EXPECT_FALSE(a.cached);
  EXPECT_TRUE(fs::exists(a.so_path));
  EXPECT_EQ(a.key.size(), 64u);
  CompileResult b = cs.compile(kTiny, KF_BACKEND_CPU);
  ASSERT_TRUE(b.ok);
  EXPECT_TRUE(b.cached);
  EXPECT_EQ(a.key, b.key);
  EXPECT_EQ(a.so_path, b.so_path);
  EXPECT_LT(b.seconds, 0.1);
  // Any change of the source is a different object.
  CompileResult c = cs.compile(std::string(kTiny) + "\n// v2\n", KF_BACKEND_CPU);
  EXPECT_NE(c.key, a.key);
}

TEST(CompileServiceTest, CompileErrorReturnsFirstErrorsNotAnException) {
  CompileService cs(fresh_cache("err"));
  CompileResult r = cs.compile(test::read_kernel("cpu/bad_compile.cpp"), KF_BACKEND_CPU);
  EXPECT_FALSE(r.ok);
  EXPECT_FALSE(r.timed_out);
  EXPECT_NE(r.diagnostics.find("error"), std::string::npos) << r.diagnostics;
  EXPECT_NE(r.diagnostics.find("undefined_helper"), std::string::npos) << r.diagnostics;
  EXPECT_EQ(r.diagnostics.find(cs.options().cache_dir), std::string::npos) << "private paths leak: " << r.diagnostics;
  EXPECT_LE(r.diagnostics.size(), cs.options().max_diagnostics_bytes + 32);
  // The failure is cached too.
  CompileResult again = cs.compile(test::read_kernel("cpu/bad_compile.cpp"), KF_BACKEND_CPU);
  EXPECT_TRUE(again.cached);
  EXPECT_FALSE(again.ok);
}

TEST(CompileServiceTest, TimeLimitKillsTheCompiler) {
  CompileOptions o = fresh_cache("slow");
  o.time_limit_s = 1.0;
  CompileService cs(o);
  // Preprocessor blow-up: 4^13 tokens keep cc1plus busy for many seconds.
  std::string src = "#define A0(x) x x x x\n";
  for (int i = 1; i <= 13; ++i)
    src += "#define A" + std::to_string(i) + "(x) A" + std::to_string(i - 1) + "(A" + std::to_string(i - 1) + "(x))\n";
  src += "A13(;)\n";
  const auto t0 = std::chrono::steady_clock::now();
  CompileResult r = cs.compile(src, KF_BACKEND_CPU);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(r.timed_out) << r.diagnostics;
  EXPECT_LT(s, 5.0);
  EXPECT_EQ(test::child_processes(), 0) << "the compiler outlived its time limit";
}

TEST(CompileServiceTest, IncludePolicyRefusesFileDisclosure) {
  EXPECT_EQ(check_source_policy("#include <kf/kernel.h>\n#include <cmath>\n#include \"kf/kernel.h\"\n"), "");
  EXPECT_NE(check_source_policy("#include \"/etc/passwd\"\n"), "");
  EXPECT_NE(check_source_policy("#include </etc/shadow>\n"), "");
  EXPECT_NE(check_source_policy("#  include \"../../secret.h\"\n"), "");
  EXPECT_NE(check_source_policy("#include \"other.h\"\n"), "");
  EXPECT_NE(check_source_policy("#embed \"/dev/zero\"\n"), "");
  EXPECT_NE(check_source_policy("asm(\".incbin \\\"/etc/passwd\\\"\");\n"), "");
  EXPECT_NE(check_source_policy("asm(\".include \\\"/etc/passwd\\\"\");\n"), "");
  EXPECT_NE(check_source_policy("#if __has_include(</etc/shadow>)\n#endif\n"), "");
  EXPECT_NE(check_source_policy("#pragma GCC  dependency \"/etc/passwd\"\n"), "");
  EXPECT_NE(check_source_policy("_Pragma(\"GCC dependency \\\"/etc/passwd\\\"\")\n"), "");
  EXPECT_EQ(check_source_policy("struct S { bool include; } s; int f() { return s.include ? 1 : 0; }\n"), "");
  CompileService cs(fresh_cache("policy"));
  CompileResult r = cs.compile("#include \"/etc/passwd\"\n", KF_BACKEND_CPU);
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(r.rejected_source);
}

TEST(CompileServiceTest, PoolCompilesInParallelAndDeduplicates) {
  CompileService cs(fresh_cache("pool"));
  std::vector<std::string> srcs;
  for (int i = 0; i < 4; ++i) srcs.push_back(std::string(kTiny) + "\n// variant " + std::to_string(i % 3) + "\n");
  auto rs = cs.compile_all(srcs, KF_BACKEND_CPU);
  ASSERT_EQ(rs.size(), 4u);
  for (const auto& r : rs) EXPECT_TRUE(r.ok) << r.diagnostics;
  EXPECT_EQ(rs[0].key, rs[3].key);  // same source: one object
  EXPECT_NE(rs[0].key, rs[1].key);
  EXPECT_NE(rs[1].key, rs[2].key);
}

TEST(CompileServiceTest, EveryCudaCorpusKernelCompilesWithNvcc) {
  CompileOptions o = fresh_cache("nvcc");
  if (!have_nvcc(o)) GTEST_SKIP() << "nvcc not found at " << o.nvcc << ": CUDA compile test skipped";
  CompileService cs(o);
  std::vector<std::string> names, srcs;
  for (const auto& e : fs::directory_iterator(test::kernels_dir() + "/cuda"))
    if (e.path().extension() == ".cu") {
      names.push_back(e.path().filename().string());
      srcs.push_back(test::read_kernel("cuda/" + e.path().filename().string()));
    }
  ASSERT_GE(srcs.size(), 8u);
  auto rs = cs.compile_all(srcs, KF_BACKEND_CUDA);
  for (size_t i = 0; i < rs.size(); ++i) {
    EXPECT_TRUE(rs[i].ok) << names[i] << ": " << rs[i].diagnostics;
    std::printf("nvcc %-28s %.2f s\n", names[i].c_str(), rs[i].seconds);
  }
}

TEST(CompileServiceTest, EveryCpuCorpusKernelCompiles) {
  CompileService cs(fresh_cache("gxx"));
  std::vector<std::string> names, srcs;
  for (const auto& e : fs::directory_iterator(test::kernels_dir() + "/cpu"))
    if (e.path().extension() == ".cpp" && e.path().filename() != "bad_compile.cpp") {
      names.push_back(e.path().filename().string());
      srcs.push_back(test::read_kernel("cpu/" + e.path().filename().string()));
    }
  auto rs = cs.compile_all(srcs, KF_BACKEND_CPU);
  for (size_t i = 0; i < rs.size(); ++i) EXPECT_TRUE(rs[i].ok) << names[i] << ": " << rs[i].diagnostics;
}
