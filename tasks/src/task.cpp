// Loads task artifacts (see kf/tasks/tasks.h for the folder layout) and runs their graphs.
#include "kf/tasks/tasks.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/DeviceAccelerator.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/InferenceMode.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "aten_graph.h"
#include "dtype_names.h"
#include "kf/common/run_dir.h"
#include "kf/common/safetensors.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace kf::tasks {

const char* backend_name(Backend b) { return b == Backend::CPU ? "cpu" : "cuda"; }

Backend parse_backend(const std::string& s) {
  if (s == "cpu") return Backend::CPU;
  if (s == "cuda") return Backend::CUDA;
  throw Error("unknown backend '" + s + "' (cpu or cuda)");
}

Backend resolve_backend(const std::string& s) {
  if (s == "auto") return cuda_available() ? Backend::CUDA : Backend::CPU;
  return parse_backend(s);
}

namespace {

constexpr int kFormatVersion = 1;

json read_json(const std::string& path) {
  try {
    return json::parse(read_file(path));
  } catch (const json::exception& e) {
    throw error_at(path, std::string("not valid JSON: ") + e.what());
  }
}

std::vector<TensorSpec> parse_specs(const json& list, Role default_role, const std::string& ctx) {
  std::vector<TensorSpec> out;
  if (!list.is_array()) throw Error(ctx + ": expected a list of tensor specs");
  for (std::size_t i = 0; i < list.size(); ++i) {
    const json& s = list[i];
    const std::string c = ctx + "[" + std::to_string(i) + "]";
    if (!s.contains("name") || !s.contains("shape") || !s.contains("dtype"))
      throw Error(c + ": needs name, shape and dtype");
    TensorSpec t;
    t.name = s["name"].get<std::string>();
    t.shape = s["shape"].get<std::vector<int64_t>>();
    t.dtype = dtype_from_name(s["dtype"].get<std::string>(), c + ".dtype");
    t.role = default_role;
    if (s.contains("role")) {
      const std::string r = s["role"].get<std::string>();
      if (r == "parameter")
        t.role = Role::Parameter;
      else if (r == "buffer")
        t.role = Role::Buffer;
      else
        throw Error(c + ".role: unknown role '" + r + "'");
    }
    out.push_back(std::move(t));
  }
  return out;
}

void check_tensor(const at::Tensor& t, const TensorSpec& s, const at::Device& device, const std::string& ctx) {
  if (!t.defined()) throw Error(ctx + ": '" + s.name + "' is undefined");
  if (t.scalar_type() != s.dtype)
    throw Error(ctx + ": '" + s.name + "' has dtype " + dtype_name(t.scalar_type()) + ", expected " +
                dtype_name(s.dtype));
  if (t.sizes().vec() != s.shape) throw Error(ctx + ": '" + s.name + "' has the wrong shape");
  if (t.device() != device)
    throw Error(ctx + ": '" + s.name + "' is on " + t.device().str() + ", expected " + device.str());
}

struct GraphInput {
  std::string placeholder;
  bool is_param;
  std::size_t index;
};
struct GraphOutput {
  std::string node;
  int copy_to_param;  // -1: a user output
};

// The three graphs of a backend: forward, the input generator, the parameters' init recipe.
enum class GraphKind { Forward = 0, Inputs = 1, Init = 2 };

struct BackendData {
  std::vector<TensorSpec> inputs, params, outputs;
  std::string graph_file, inputs_file, params_file;
  json graph_json, inputs_json;
  // Compact parameters (task.json params_storage.init): an ATen graph replayed on the CPU from
  // init_seed. init_outputs[k] names the graph value of ABI slot init_slots[k]; the other slots
  // come from params_file.
  std::string init_file;
  json init_json;
  uint64_t init_seed = 0;
  std::vector<std::string> init_outputs;
  std::vector<std::size_t> init_slots;
  std::vector<GraphInput> graph_inputs;
  std::vector<GraphOutput> graph_outputs;
  std::vector<std::string> input_graph_outputs;
};

class ReferenceImpl;

class TaskImpl : public Task, public std::enable_shared_from_this<TaskImpl> {
 public:
  explicit TaskImpl(const std::string& dir);

  const std::string& name() const override { return name_; }
  const std::string& dir() const override { return dir_; }
  int level() const override { return level_; }
  const std::vector<std::string>& tags() const override { return tags_; }
  const std::string& mode() const override { return mode_; }
  const std::string& source() const override { return source_; }
  bool has_backend(Backend b) const override { return backends_.count(b) > 0; }
  std::vector<Backend> backends() const override {
    std::vector<Backend> out;
    for (const auto& [b, _] : backends_) out.push_back(b);
    return out;
  }
  const std::vector<TensorSpec>& inputs(Backend b) const override { return data(b).inputs; }
  const std::vector<TensorSpec>& params(Backend b) const override { return data(b).params; }
  const std::vector<TensorSpec>& outputs(Backend b) const override { return data(b).outputs; }
  Tolerance tolerance(Backend b, std::size_t i) const override {
    const auto& outs = data(b).outputs;
    if (i >= outs.size()) throw Error(name_ + ": no output " + std::to_string(i));
    if (task_tol_) return *task_tol_;
    auto it = default_tol_.find(dtype_name(outs[i].dtype));
    return it == default_tol_.end() ? Tolerance{0.0, 0.0} : it->second;  // integers and bools: exact
  }
  std::vector<at::Tensor> make_inputs(Backend b, uint64_t seed, const at::Device& device) const override;
  std::vector<at::Tensor> initial_params(Backend b, const at::Device& device) const override;
  std::unique_ptr<Reference> new_reference(Backend b, const at::Device& device) const override;

  const BackendData& data(Backend b) const {
    auto it = backends_.find(b);
    if (it == backends_.end())
      throw Error(name_ + ": task has no '" + backend_name(b) + "' backend (re-import with --backends)");
    return it->second;
  }
  // Refuses (kf::Error naming the task, the bytes and the limit) a backend whose inputs,
  // parameters and outputs alone exceed the memory of `device`.
  void check_fits(Backend b, const at::Device& device) const;
  // Graphs are built once per (backend, device, kind) and shared: AtenGraph::run is const.
  std::shared_ptr<const AtenGraph> graph(Backend b, const at::Device& device, GraphKind kind) const;

 private:
  std::string dir_, name_, mode_, source_;
  int level_ = 1;
  std::vector<std::string> tags_;
  std::optional<Tolerance> task_tol_;
  std::map<std::string, Tolerance> default_tol_;
  std::map<Backend, BackendData> backends_;
  mutable std::mutex mu_;
  mutable std::map<std::tuple<int, std::string, int>, std::shared_ptr<const AtenGraph>> graphs_;
};

class ReferenceImpl : public Reference {
 public:
  ReferenceImpl(std::shared_ptr<const TaskImpl> task, Backend b, const at::Device& device)
      : task_(task),
        backend_(b),
        device_(device),
        graph_(task->graph(b, device, GraphKind::Forward)),
        params_(task->initial_params(b, device)) {}

  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& inputs) override {
    const BackendData& d = task_->data(backend_);
    const std::string ctx = task_->name() + " reference forward";
    if (inputs.size() != d.inputs.size())
      throw Error(ctx + ": takes " + std::to_string(d.inputs.size()) + " inputs, got " + std::to_string(inputs.size()));
    for (std::size_t i = 0; i < inputs.size(); ++i) check_tensor(inputs[i], d.inputs[i], device_, ctx);
    c10::InferenceMode guard;
    std::vector<c10::IValue> bound;
    bound.reserve(d.graph_inputs.size());
    for (const GraphInput& g : d.graph_inputs) bound.emplace_back(g.is_param ? params_[g.index] : inputs[g.index]);
    std::vector<c10::IValue> values = graph_->run(std::move(bound));
    std::vector<at::Tensor> outs;
    for (std::size_t i = 0; i < values.size(); ++i) {
      const GraphOutput& o = d.graph_outputs[i];
      if (o.copy_to_param >= 0)
        params_[o.copy_to_param].copy_(values[i].toTensor());
      else
        outs.push_back(values[i].toTensor());
    }
    return outs;
  }
  const std::vector<at::Tensor>& params() const override { return params_; }
  void set_params(std::vector<at::Tensor> params) override {
    const BackendData& d = task_->data(backend_);
    if (params.size() != d.params.size())
      throw Error(task_->name() + " set_params: expected " + std::to_string(d.params.size()) + " tensors");
    for (std::size_t i = 0; i < params.size(); ++i)
      check_tensor(params[i], d.params[i], device_, task_->name() + " set_params");
    params_ = std::move(params);
  }

 private:
  std::shared_ptr<const TaskImpl> task_;  // a reference keeps its task alive
  Backend backend_;
  at::Device device_;
  std::shared_ptr<const AtenGraph> graph_;
  std::vector<at::Tensor> params_;
};

TaskImpl::TaskImpl(const std::string& dir) : dir_(dir) {
  const std::string meta_path = dir + "/task.json";
  const json meta = read_json(meta_path);
  try {
    if (meta.value("format", 0) != kFormatVersion)
      throw error_at(meta_path, "field 'format' is " + std::to_string(meta.value("format", 0)) + ", this build reads " +
                                    std::to_string(kFormatVersion) + " (re-run tools/import-tasks)");
    name_ = meta.at("name").get<std::string>();
    level_ = meta.at("level").get<int>();
    tags_ = meta.at("tags").get<std::vector<std::string>>();
    mode_ = meta.at("mode").get<std::string>();
    if (mode_ != "train" && mode_ != "eval") throw error_at(meta_path, "field 'mode' must be train or eval");
    source_ = meta.at("source").get<std::string>();
    if (!meta.at("tolerance").is_null())
      task_tol_ = Tolerance{meta["tolerance"].at("atol").get<double>(), meta["tolerance"].at("rtol").get<double>()};
    for (const auto& [dt, t] : meta.at("default_tolerance").items())
      default_tol_[dt] = Tolerance{t.at("atol").get<double>(), t.at("rtol").get<double>()};
    for (const auto& [bname, b] : meta.at("backends").items()) {
      const Backend backend = parse_backend(bname);
      BackendData d;
      const std::string ctx = meta_path + ": backends." + bname;
      d.inputs = parse_specs(b.at("inputs"), Role::Input, ctx + ".inputs");
      d.params = parse_specs(b.at("params"), Role::Parameter, ctx + ".params");
      d.outputs = parse_specs(b.at("outputs"), Role::Output, ctx + ".outputs");
      d.graph_file = dir + "/" + bname + ".graph.json";
      d.inputs_file = dir + "/" + bname + ".inputs.json";
      d.params_file = dir + "/" + bname + ".params.safetensors";
      d.graph_json = read_json(d.graph_file);
      d.inputs_json = read_json(d.inputs_file);
      if (b.contains("params_storage") && b["params_storage"].contains("init")) {
        d.init_file = dir + "/" + b["params_storage"]["init"].get<std::string>();
        d.init_json = read_json(d.init_file);
        try {
          d.init_seed = d.init_json.at("seed").get<uint64_t>();
          const json& outs = d.init_json.at("outputs");
          if (!outs.is_array() || outs.size() != d.params.size())
            throw error_at(d.init_file, "'outputs' must list one entry per parameter (" +
                                            std::to_string(d.params.size()) + " in task.json)");
          for (std::size_t i = 0; i < outs.size(); ++i) {
            if (outs[i].is_null()) continue;  // this slot is stored in the params file
            d.init_outputs.push_back(outs[i].get<std::string>());
            d.init_slots.push_back(i);
          }
        } catch (const json::exception& e) {
          throw error_at(d.init_file, std::string("malformed init recipe: ") + e.what());
        }
      }
      for (const json& gi : d.graph_json.at("graph_inputs")) {
        GraphInput g{gi.at("placeholder").get<std::string>(), gi.at("kind").get<std::string>() == "param",
                     gi.at("index").get<std::size_t>()};
        if (g.index >= (g.is_param ? d.params.size() : d.inputs.size()))
          throw error_at(d.graph_file, "graph input '" + g.placeholder + "' has an index outside the specs");
        d.graph_inputs.push_back(g);
      }
      std::size_t user_outputs = 0;
      for (const json& go : d.graph_json.at("outputs")) {
        GraphOutput o{go.at("node").get<std::string>(), go.value("copy_to_param", -1)};
        if (o.copy_to_param >= static_cast<int>(d.params.size()))
          throw error_at(d.graph_file, "copy_to_param out of range");
        user_outputs += o.copy_to_param < 0;
        d.graph_outputs.push_back(o);
      }
      if (user_outputs != d.outputs.size())
        throw error_at(d.graph_file, "graph has " + std::to_string(user_outputs) + " outputs, task.json lists " +
                                         std::to_string(d.outputs.size()));
      d.input_graph_outputs = d.inputs_json.at("outputs").get<std::vector<std::string>>();
      if (d.input_graph_outputs.size() != d.inputs.size())
        throw error_at(d.inputs_file, "input generator makes " + std::to_string(d.input_graph_outputs.size()) +
                                          " tensors, task.json lists " + std::to_string(d.inputs.size()));
      backends_[backend] = std::move(d);
    }
  } catch (const json::exception& e) {
    throw error_at(meta_path, std::string("malformed artifact: ") + e.what());
  }
  if (backends_.empty()) throw error_at(meta_path, "no backends");
}

std::shared_ptr<const AtenGraph> TaskImpl::graph(Backend b, const at::Device& device, GraphKind kind) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto key = std::make_tuple(static_cast<int>(b), device.str(), static_cast<int>(kind));
  auto it = graphs_.find(key);
  if (it != graphs_.end()) return it->second;
  const BackendData& d = data(b);
  std::shared_ptr<const AtenGraph> g;
  const std::string& file = kind == GraphKind::Inputs ? d.inputs_file
                            : kind == GraphKind::Init ? d.init_file
                                                      : d.graph_file;
  try {
    if (kind == GraphKind::Inputs) {
      g = std::make_shared<AtenGraph>(d.inputs_json.at("nodes"), std::vector<std::string>{}, d.input_graph_outputs,
                                      device, d.inputs_file);
    } else if (kind == GraphKind::Init) {
      g = std::make_shared<AtenGraph>(d.init_json.at("nodes"), std::vector<std::string>{}, d.init_outputs, device,
                                      d.init_file);
    } else {
      std::vector<std::string> placeholders, outputs;
      for (const GraphInput& gi : d.graph_inputs) placeholders.push_back(gi.placeholder);
      for (const GraphOutput& go : d.graph_outputs) outputs.push_back(go.node);
      g = std::make_shared<AtenGraph>(d.graph_json.at("nodes"), placeholders, outputs, device, d.graph_file);
    }
  } catch (const json::exception& e) {
    throw error_at(file, std::string("malformed graph: ") + e.what());
  }
  graphs_[key] = g;
  return g;
}

std::size_t spec_bytes(const std::vector<TensorSpec>& specs) {
  std::size_t n = 0;
  for (const auto& s : specs) {
    std::size_t e = c10::elementSize(s.dtype);
    for (int64_t d : s.shape) e *= static_cast<std::size_t>(std::max<int64_t>(d, 0));
    n += e;
  }
  return n;
}

// Total memory of a device (0: unknown). KF_TASK_MEMORY_LIMIT_BYTES overrides it (e.g.
// to leave room for other processes on the machine).
std::size_t device_memory_bytes(const at::Device& device) {
  if (const char* v = std::getenv("KF_TASK_MEMORY_LIMIT_BYTES"); v && *v) return std::strtoull(v, nullptr, 10);
  if (device.is_cpu()) {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? static_cast<std::size_t>(pages) * static_cast<std::size_t>(page) : 0;
  }
  static std::mutex mu;
  static std::map<int, std::size_t> totals;
  std::lock_guard<std::mutex> lk(mu);
  const int idx = device.has_index() ? device.index() : 0;
  auto it = totals.find(idx);
  if (it != totals.end()) return it->second;
  std::size_t total = 0;
  try {
    total = at::accelerator::getMemoryInfo(static_cast<c10::DeviceIndex>(idx)).second;
  } catch (const std::exception&) {
    total = 0;  // unknown: no check
  }
  totals[idx] = total;
  return total;
}

void TaskImpl::check_fits(Backend b, const at::Device& device) const {
  const BackendData& d = data(b);
  const std::size_t in = spec_bytes(d.inputs), par = spec_bytes(d.params), out = spec_bytes(d.outputs);
  const std::size_t need = in + par + out, limit = device_memory_bytes(device);
  if (limit == 0 || need <= limit) return;
  auto gib = [](std::size_t x) { return std::to_string(static_cast<double>(x) / (1ull << 30)).substr(0, 6); };
  throw Error(name_ + " [" + backend_name(b) + "]: the task needs " + std::to_string(need) + " bytes (" + gib(need) +
              " GiB: inputs " + std::to_string(in) + ", parameters " + std::to_string(par) + ", outputs " +
              std::to_string(out) + ") but " + device.str() + " has " + std::to_string(limit) + " bytes (" +
              gib(limit) +
              " GiB; memory estimate, KF_TASK_MEMORY_LIMIT_BYTES overrides it): it cannot run here "
              "(re-import it with smaller sizes)");
}

std::vector<at::Tensor> TaskImpl::make_inputs(Backend b, uint64_t seed, const at::Device& device) const {
  check_fits(b, device);
  auto g = graph(b, device, GraphKind::Inputs);
  at::Generator gen = device.is_cuda() ? at::detail::getCUDAHooks().getNewGenerator(device.index())
                                       : at::make_generator<at::CPUGeneratorImpl>(seed);
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(seed);
  }
  c10::InferenceMode guard;
  std::vector<c10::IValue> values = g->run({}, &gen);
  std::vector<at::Tensor> out;
  const BackendData& d = data(b);
  for (std::size_t i = 0; i < values.size(); ++i) {
    at::Tensor t = values[i].toTensor().contiguous();
    check_tensor(t, d.inputs[i], device, dir_ + ": input generator");
    out.push_back(std::move(t));
  }
  return out;
}

std::vector<at::Tensor> TaskImpl::initial_params(Backend b, const at::Device& device) const {
  check_fits(b, device);
  const BackendData& d = data(b);
  std::vector<at::Tensor> out(d.params.size());
  if (d.params.empty()) return out;
  if (!d.init_file.empty()) {
    // The init recipe runs on the CPU from its seed, as torch.manual_seed(seed) then
    // Model(*get_init_inputs()) ran in Python: same ops, same generator, same bits.
    const at::Device cpu(at::kCPU);
    auto g = graph(b, cpu, GraphKind::Init);
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(d.init_seed);
    at::NoGradGuard no_grad;
    std::vector<c10::IValue> values = g->run({}, &gen);
    std::vector<const void*> seen;
    for (std::size_t k = 0; k < values.size(); ++k) {
      at::Tensor t = values[k].toTensor().contiguous();
      // Two slots must never share storage (the evaluator re-draws them one by one).
      if (std::find(seen.begin(), seen.end(), t.data_ptr()) != seen.end()) t = t.clone();
      seen.push_back(t.data_ptr());
      const TensorSpec& s = d.params[d.init_slots[k]];
      if (t.scalar_type() != s.dtype || t.sizes().vec() != s.shape)
        throw error_at(d.init_file, "output '" + d.init_outputs[k] + "' for '" + s.name +
                                        "' does not match task.json's shape/dtype");
      out[d.init_slots[k]] = device.is_cpu() ? t : t.to(device);
    }
  }
  std::shared_ptr<SafetensorsFile> file;
  for (std::size_t i = 0; i < d.params.size(); ++i) {
    if (out[i].defined()) continue;
    if (!file) file = SafetensorsFile::open(d.params_file);
    const TensorSpec& s = d.params[i];
    const TensorView& v = file->get(s.name);
    const auto dtype = dtype_from_safetensors(v.dtype, d.params_file + ": tensor '" + s.name + "'");
    if (dtype != s.dtype || v.shape != s.shape)
      throw error_at(d.params_file, "tensor '" + s.name + "' does not match task.json's shape/dtype");
    at::Tensor t = at::from_blob(const_cast<void*>(v.data), v.shape, at::TensorOptions().dtype(dtype)).clone();
    out[i] = device.is_cpu() ? t : t.to(device);
  }
  return out;
}

std::unique_ptr<Reference> TaskImpl::new_reference(Backend b, const at::Device& device) const {
  return std::make_unique<ReferenceImpl>(shared_from_this(), b, device);
}

}  // namespace

std::shared_ptr<const Task> Task::load(const std::string& artifact_dir) {
  if (!fs::is_directory(artifact_dir)) throw error_at(artifact_dir, "task artifact folder does not exist");
  return std::make_shared<TaskImpl>(artifact_dir);
}

std::vector<std::shared_ptr<const Task>> Task::load_all(const std::string& tasks_dir) {
  if (!fs::is_directory(tasks_dir))
    throw error_at(tasks_dir, "task folder does not exist (run tools/import-tasks, or ./setup.sh)");
  std::vector<std::string> dirs;
  for (const auto& e : fs::directory_iterator(tasks_dir))
    if (e.is_directory() && fs::exists(e.path() / "task.json")) dirs.push_back(e.path().string());
  std::sort(dirs.begin(), dirs.end());
  std::vector<std::shared_ptr<const Task>> out;
  for (const auto& d : dirs) out.push_back(load(d));
  return out;
}

namespace {
std::mutex g_fp32_mu;
int g_fp32_scopes = 0;
bool g_saved_tf32_cublas = false, g_saved_tf32_cudnn = false;
}  // namespace

ExactFp32Scope::ExactFp32Scope() {
  std::lock_guard<std::mutex> lk(g_fp32_mu);
  if (g_fp32_scopes++ > 0) return;
  auto& ctx = at::globalContext();
  g_saved_tf32_cublas = ctx.allowTF32CuBLAS();
  g_saved_tf32_cudnn = ctx.allowTF32CuDNN();
  ctx.setAllowTF32CuBLAS(false);
  ctx.setAllowTF32CuDNN(false);
}

ExactFp32Scope::~ExactFp32Scope() {
  std::lock_guard<std::mutex> lk(g_fp32_mu);
  if (--g_fp32_scopes > 0) return;
  auto& ctx = at::globalContext();
  ctx.setAllowTF32CuBLAS(g_saved_tf32_cublas);
  ctx.setAllowTF32CuDNN(g_saved_tf32_cudnn);
}

}  // namespace kf::tasks
