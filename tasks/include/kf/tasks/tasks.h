// kf/tasks/tasks.h: what other components use of tasks/ (the one public header).
//   Task, Reference, TensorSpec, Backend   an imported task and its reference runner
//   time_reference, backend_device, ...    the one timing protocol for reference forwards
//   read_task_list                         task-name files (tasks/heldout.txt)
//   check_golden                           the C++ reference against Python's saved outputs
//
// A task: one imported reference program (tools/import-tasks wrote its artifact).
//
// The artifact folder <tasks.dir>/<name>/ holds, per backend ("cpu", "cuda"):
//   task.json                 meta: name, level, tags, mode, tolerance, source, per-backend specs
//   <backend>.graph.json      the reference forward as an ATen graph (torch.export)
//   <backend>.inputs.json     the input generator as an ATen graph (make_fx of get_inputs)
//   <backend>.init.json       the parameters' init recipe: Model(*get_init_inputs()) as an ATen graph,
//                             replayed on the CPU from the init seed (bit-identical to Python's init)
//   <backend>.params.safetensors   the parameters the recipe does not give (lifted constants, or all of
//                             them when the init could not be traced); task.json's params_storage says which
//   cpu.golden.safetensors    Python eager inputs/outputs for seed 0 (tests compare against it)
// C++ runs the graphs through the c10 dispatcher: no Python at run time.
//
// Threading: a Task is immutable after load; make_inputs/new_reference may be called
// from any thread. A Reference instance is used by one thread at a time.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kf/common/error.h"

namespace kf::tasks {

enum class Backend { CPU, CUDA };
const char* backend_name(Backend b);          // "cpu" / "cuda"
Backend parse_backend(const std::string& s);  // throws kf::Error
// run.backend: "auto" (CUDA when a GPU is visible), "cpu" or "cuda"; throws kf::Error.
Backend resolve_backend(const std::string& s);

enum class Role { Input, Parameter, Buffer, Output };

struct TensorSpec {
  std::string name;  // inputs: "x0".."xN"; params/buffers: HF-style dotted module path
  Role role;
  std::vector<int64_t> shape;
  c10::ScalarType dtype;
};

struct Tolerance {
  double atol;
  double rtol;
};

class Reference;

class Task {
 public:
  // Loads the artifact folder. Throws kf::Error naming the file and field on bad input.
  static std::shared_ptr<const Task> load(const std::string& artifact_dir);
  // Loads every task under `tasks_dir` (sorted by name). Throws on the first bad artifact.
  static std::vector<std::shared_ptr<const Task>> load_all(const std::string& tasks_dir);

  virtual ~Task() = default;
  virtual const std::string& name() const = 0;
  virtual const std::string& dir() const = 0;
  virtual int level() const = 0;
  virtual const std::vector<std::string>& tags() const = 0;
  virtual const std::string& mode() const = 0;    // "train" or "eval": verified and timed in this mode
  virtual const std::string& source() const = 0;  // the Python reference program (for prompts)
  virtual bool has_backend(Backend b) const = 0;
  virtual std::vector<Backend> backends() const = 0;

  // Kernel ABI order: inputs(b), then params(b) (parameters, then buffers).
  virtual const std::vector<TensorSpec>& inputs(Backend b) const = 0;
  virtual const std::vector<TensorSpec>& params(Backend b) const = 0;
  virtual const std::vector<TensorSpec>& outputs(Backend b) const = 0;
  // Per output: from KF_TOLERANCE if the task set it, else by output dtype.
  virtual Tolerance tolerance(Backend b, std::size_t output_index) const = 0;

  // Fresh inputs for `seed`, drawn with the task's own distributions on `device`.
  // The same (seed, backend, device) gives the same tensors on every run; on CPU they
  // equal Python's get_inputs() after torch.manual_seed(seed).
  virtual std::vector<at::Tensor> make_inputs(Backend b, uint64_t seed, const at::Device& device) const = 0;
  // Parameters and buffers as the task's Model(*get_init_inputs()) made them (ABI order).
  virtual std::vector<at::Tensor> initial_params(Backend b, const at::Device& device) const = 0;
  // A reference runner owning its own copy of the parameters on `device`.
  virtual std::unique_ptr<Reference> new_reference(Backend b, const at::Device& device) const = 0;
};

// The reference computation of one task at one backend's size, on one device.
class Reference {
 public:
  virtual ~Reference() = default;
  // Runs forward with eager semantics (each ATen op dispatched as eager PyTorch does,
  // including train-mode buffer updates). Returns the user outputs.
  virtual std::vector<at::Tensor> forward(const std::vector<at::Tensor>& inputs) = 0;
  // Parameters and buffers in ABI order; replace them (same shapes/dtypes) to re-draw weights.
  virtual const std::vector<at::Tensor>& params() const = 0;
  virtual void set_params(std::vector<at::Tensor> params) = 0;  // throws kf::Error on shape/dtype mismatch
};

// While one exists (in any thread), cuBLAS matmuls and cuDNN convolutions compute in IEEE
// fp32, not TF32: a reference defines the task's exact result. torch lets cuDNN convolutions
// use TF32 by default, and tools/selfsup trains with TF32 cuBLAS in the process that also
// verifies; a TF32 reference differs from an exact fp32 kernel by about 1e-3, ten times the
// tolerance (with TF32, every fp32 corpus convolution was judged incorrect on the H200). The
// process's own setting comes back when the last scope ends; a change made meanwhile is lost.
class ExactFp32Scope {
 public:
  ExactFp32Scope();
  ~ExactFp32Scope();
  ExactFp32Scope(const ExactFp32Scope&) = delete;
  ExactFp32Scope& operator=(const ExactFp32Scope&) = delete;
};

// --- Timing of reference forwards, shared by tools and benchmarks so every number the
// project prints about a reference comes from one protocol:
//   warm-up calls, then per trial: device-wide sync, clock, forward, device-wide sync, clock.
// The device-wide sync means work on any stream is counted.

void synchronize(const at::Device& device);  // cudaDeviceSynchronize for CUDA; no-op on CPU

struct TimingStats {
  std::vector<double> trials_ms;
  double median_ms = 0, p10_ms = 0, p90_ms = 0, min_ms = 0;
};
TimingStats summarize_ms(std::vector<double> trials_ms);

// Times `ref` on `inputs` (already on `device`).
TimingStats time_reference(Reference& ref, const std::vector<at::Tensor>& inputs, const at::Device& device, int warmup,
                           int trials);

// The device a backend runs on in this process ("cuda" uses CUDA device `index`).
// Throws kf::Error if the backend is cuda and no GPU is visible.
at::Device backend_device(Backend b, int index = 0);
bool cuda_available();
// Returns the GPU memory the caching allocator holds but does not use to the driver, so
// other processes on the GPU can have it (after an out-of-memory error). No-op without a GPU.
void release_device_cache();
// Bytes the caching allocator holds on the current CUDA device (in use or cached); 0
// without a GPU. Several evaluators share one GPU: each frees its cache above a limit.
std::size_t device_cache_reserved_bytes();
// The most it held since the last reset_device_cache_peak() (the evaluator's per-verification
// peak, set against its GPU memory claim); 0 / no-op without a GPU.
std::size_t device_cache_peak_reserved_bytes();
void reset_device_cache_peak();

// --- Task lists
// Task-name lists kept in files, such as the held-out split (tasks/heldout.txt): one task
// name per line; '#' starts a comment; blank lines are ignored. Names are folder names
// of imported tasks (letters, digits, '_', '-', '.'), so a typo such as a path or two
// names on one line is an error rather than a name that silently matches nothing.
// Pure functions; any thread.

// The names in `path`, in file order, without duplicates. Throws kf::Error naming the
// file (and the line) when it cannot be read or a line is not a task name.
std::vector<std::string> read_task_list(const std::string& path);

// Parses the text of such a file; `source` names it in errors.
std::vector<std::string> parse_task_list(const std::string& text, const std::string& source);

// --- Golden check: the C++ reference against Python eager PyTorch on the same inputs.
// The importer saved, at CPU size, Python's get_inputs() after torch.manual_seed(golden
// seed) and Model's outputs for them. This regenerates the inputs in C++ from the same
// seed, runs the C++ reference, and reports the differences.

struct GoldenResult {
  bool inputs_equal = false;  // C++ input generator reproduced Python's tensors bit for bit
  double max_rel_error = 0;   // max over outputs of max|cpp - py| / max|py|
  std::vector<double> output_rel_errors;
  std::string problem;  // non-empty: why the comparison could not be made
};

// Throws kf::Error if the artifact has no golden file.
GoldenResult check_golden(const Task& task);

}  // namespace kf::tasks
