// Compile service: candidate source -> shared object, through a content-addressed cache
// and a TBB pool.
//
// The cache key is SHA-256 of (backend, compiler identity, flags, source), so a source
// compiles once per compiler and flag set; failures are cached too (a policy repeats
// itself). Each compile runs in its own process group with a wall-clock limit (the
// whole group is killed), an address-space limit, and bounded output; diagnostics come
// back truncated to the first errors. A compile error is a result, never an exception.
//
// The compiler runs confined (docs/evaluator.md, "Compile service"): as nobody, without
// network, in a private filesystem view holding only the toolchain and system headers
// (/usr), the ABI headers and the job's own folder. Files it opened (its dependency
// output) and files its diagnostics point into must be allowed headers, or the source is
// rejected naming the file. If the confinement cannot be set up the compile fails with
// the reason (and a log line); it never runs unconfined.
//
// Threading: one CompileService may be shared by any number of threads. Identical
// sources submitted concurrently compile once.
#pragma once
#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "kf/kernel.h"

namespace kf::evaluator {

struct CompileOptions {
  std::string cache_dir;    // empty: $KF_EVAL_CACHE or /tmp/kf-eval-cache-<uid>
  std::string cxx = "g++";  // CPU backend compiler
  std::string nvcc = "/usr/local/cuda/bin/nvcc";
  std::string cuda_arch = "sm_90";  // -arch=
  std::vector<std::string> cxx_flags = {"-std=c++17", "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC"};
  std::vector<std::string> cuda_flags = {"-std=c++17", "-O3", "-shared", "-Xcompiler", "-fPIC", "-lcublas"};
  std::string include_dir;                             // folder holding kf/kernel.h (empty: the built-in one)
  double time_limit_s = 60;                            // per compile, wall clock
  unsigned long long memory_limit_bytes = 4ull << 30;  // address space of the compiler
  std::size_t max_diagnostics_bytes = 4000;
  int max_errors = 5;            // first N "error" lines are kept first
  int jobs = 0;                  // parallel compiles (0: hardware threads)
  bool cpu_model_in_key = true;  // -march=native objects are CPU-specific
};

struct CompileResult {
  bool ok = false;
  std::string so_path;      // the shared object (ok only)
  std::string key;          // content address
  std::string diagnostics;  // truncated: first errors, then the head of the output
  bool cached = false;      // served from the cache (no compiler run)
  bool timed_out = false;
  bool rejected_source = false;      // refused by the include policy or the opened-file check
  bool environment_failure = false;  // the compiler did not run (confinement, service error): not the source's fault
  double seconds = 0;                // wall time of this call
};

class CompileService {
 public:
  explicit CompileService(CompileOptions opts);
  ~CompileService();
  CompileService(const CompileService&) = delete;
  CompileService& operator=(const CompileService&) = delete;

  // Blocking compile on the calling thread (still deduplicated and cached).
  CompileResult compile(const std::string& source, Backend backend);
  // Queued on the pool.
  std::shared_future<CompileResult> submit(const std::string& source, Backend backend);
  // All at once on the pool; results in input order.
  std::vector<CompileResult> compile_all(const std::vector<std::string>& sources, Backend backend);

  // The compiler's identity line (part of the cache key), e.g. "g++ (Debian 12.2.0-14) 12.2.0".
  std::string compiler_identity(Backend backend);
  const CompileOptions& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Source checks applied before compiling, a cheap first filter: #include of absolute paths
// or "..", #embed and .incbin are refused. Returns "" if fine. (Macros, digraphs and line
// splices get past any text filter; the compiler's confinement is what holds.)
std::string check_source_policy(const std::string& source);

}  // namespace kf::evaluator
