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

}  // namespace kf::tasks
