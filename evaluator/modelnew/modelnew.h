// KernelBench-style ModelNew candidates: a Python module defining `class ModelNew` (torch ops,
// optionally C++/CUDA built with torch.utils.cpp_extension.load_inline), verified under the
// same protocol as ABI kernels (docs/evaluator.md, "ModelNew candidates"; docs/kernelbench.md).
//
//   compile   the module runs once in a confined process (the compiler's private view plus
//             the Python install; no network; nobody) where load_inline builds; cached by
//             content (source, task, backend, interpreter, CUDA arch).
//   verify    Evaluator::evaluate_compiled with a Python sandbox worker (worker.py) that
//             speaks kf-sandbox-worker's protocol under its confinement: every check, stress
//             set, re-drawn parameter set and timed trial of the ABI path.
//   probe     a second, short sandbox run: what ran during forward (calls into load_inline
//             functions; on CUDA the kernels launched, by name), ATen ops computing in a
//             narrower float type, and KernelBench's own protocol (5 input sets at
//             atol = rtol = 1e-2; CUDA events, mean of trials) for candidate and reference.
//
// Threading: evaluate() uses the device's timing (one caller per GPU at a time, as Evaluator).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kf/evaluator/evaluator.h"

namespace kf::evaluator::modelnew {

struct Options {
  EvalOptions eval;              // the ABI path's options (trials, sets, limits, seeds)
  double build_timeout_s = 900;  // the compile step (load_inline of a CUDA extension takes ~30 s)
  bool probe = true;             // run the probe (custom-code evidence, KernelBench protocol)
  // The speedup from the task's Model run as a ModelNew in a Python worker like the
  // candidate's, interleaved with it (false: the protocol run's C++ reference in the
  // evaluator, against which a copy of the reference measures 0.4-0.75x on the CPU).
  bool time_alike = true;
  int kb_correct_trials = 5;  // KernelBench: num_correct_trials
  int kb_perf_trials = 100;   // KernelBench: num_perf_trials
  double kb_tol = 1e-2;       // KernelBench: atol = rtol
  // The interpreter (empty: the build's KF_PYTHON) and the folder of worker.py, build_ext.py
  // and mn_common.py (empty: this source tree's evaluator/modelnew). Either may live
  // anywhere: under /tmp, in a path with spaces, on a read-only file system.
  std::string python, scripts_dir;
};

struct Outcome {
  Result result;  // our protocol's verdict (reason names the trick)
  // Probe: did custom code run during forward?
  bool probe_ran = false;
  std::string probe_error;                     // why the probe gave no evidence (empty: it did)
  bool custom_code_ran = false;                // a load_inline function was called (CPU) / a kernel of the
                                               // candidate's __global__ functions was launched (CUDA)
  bool torch_only = false;                     // !custom_code_ran, with evidence
  std::string custom_detail;                   // which functions / kernels, or what was defined and not used
  std::vector<std::string> low_precision_ops;  // ATen ops with fp16/bf16 results in an fp32 task
  // KernelBench's protocol on the same inputs
  int kb_correct = 0, kb_trials = 0;                     // input sets within kb_tol
  double kb_ref_ms = 0, kb_cand_ms = 0, kb_speedup = 0;  // means of kb_perf_trials
  std::string evidence_json;                             // the worker's raw evidence (untrusted, reported as is)
  // Reference and candidate timed alike (Options::time_alike): the median of the per-pair
  // speedups (result.speedup unless the timing was unstable); 0 when not measured.
  double alike_speedup = 0;
};

// True for a candidate path this module handles (a .py file).
bool is_modelnew_candidate(const std::string& path);

// True for a candidate source in KernelBench's format: Python (an import of torch) defining
// `class ModelNew`. A run's candidates carry no file name: kf-evaluator decides by this.
bool is_modelnew_source(const std::string& source);

// What kf-evaluator installs as ServiceOptions::score_other (other_format: is_modelnew_source):
// a ModelNew source through evaluate() without the probe (its evidence is reported, never
// scored), its reward from `ev`'s reward model (the run's statistics, not a fresh model's).
std::function<Result(const tasks::Task&, tasks::Backend, const std::string&, uint64_t)> service_scorer(Evaluator& ev,
                                                                                                       Options opts);
// Sets so.other_format and so.score_other as above.
void install_in_service(ServiceOptions& so, Evaluator& ev, const Options& opts);

// Compiles, verifies and probes one candidate. Never throws for anything the candidate
// does; throws kf::Error for problems of the task or the installation.
Outcome evaluate(const tasks::Task& task, tasks::Backend backend, const std::string& source, const Options& opts,
                 uint64_t candidate_seed = 0);

// The compile step alone (evaluate() runs it first): ok when every load_inline call the
// module makes at import, in ModelNew.__init__ or on its way through forward was built.
// so_path is the path the worker loads inside its view; diagnostics hold the build's output.
CompileResult compile(const tasks::Task& task, tasks::Backend backend, const std::string& source, const Options& opts);

std::string to_json(const Outcome& o, int indent = -1);  // Result's JSON plus "torch_only" and "modelnew"
std::string to_text(const Outcome& o);

}  // namespace kf::evaluator::modelnew
