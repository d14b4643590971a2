#include "kf/tasks/tasks.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <filesystem>

#include "dtype_names.h"
#include "kf/common/safetensors.h"

namespace kf::tasks {
namespace {
at::Tensor view_of(const TensorView& v, const std::string& file) {
  const auto dtype = dtype_from_safetensors(v.dtype, file + ": tensor '" + v.name + "'");
  return at::from_blob(const_cast<void*>(v.data), v.shape, at::TensorOptions().dtype(dtype));
}
}  // namespace

GoldenResult check_golden(const Task& task) {
  const std::string file = task.dir() + "/cpu.golden.safetensors";
  if (!std::filesystem::exists(file)) throw error_at(file, "no golden file (import with the cpu backend)");
  auto golden = SafetensorsFile::open(file);
  GoldenResult r;
  const uint64_t seed = 0;
  const at::Device cpu(at::kCPU);
  auto inputs = task.make_inputs(Backend::CPU, seed, cpu);
  r.inputs_equal = true;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const std::string name = "in" + std::to_string(i);
    if (!golden->has(name)) {
      r.problem = file + ": missing " + name;
      return r;
    }
    at::Tensor py = view_of(golden->get(name), file);
    if (py.sizes() != inputs[i].sizes() || py.scalar_type() != inputs[i].scalar_type() || !at::equal(py, inputs[i]))
      r.inputs_equal = false;
  }
  auto ref = task.new_reference(Backend::CPU, cpu);
  auto outs = ref->forward(inputs);
  for (std::size_t i = 0; i < outs.size(); ++i) {
    const std::string name = "out" + std::to_string(i);
    if (!golden->has(name)) {
      r.problem = file + ": missing " + name;
      return r;
    }
    at::Tensor py = view_of(golden->get(name), file).to(at::kDouble);
    at::Tensor cc = outs[i].to(at::kDouble);
    if (py.sizes() != cc.sizes()) {
      r.problem = task.name() + ": output " + std::to_string(i) + " shape differs from Python's";
      return r;
    }
    double denom = py.numel() ? py.abs().max().item<double>() : 0.0;
    double diff = py.numel() ? (py - cc).abs().max().item<double>() : 0.0;
    if (std::isnan(diff)) diff = std::numeric_limits<double>::infinity();
    double rel = diff == 0 ? 0 : diff / std::max(denom, 1e-30);
    r.output_rel_errors.push_back(rel);
    r.max_rel_error = std::max(r.max_rel_error, rel);
  }
  return r;
}

}  // namespace kf::tasks
