// AtenGraph: runs an imported ATen graph (JSON from tools/import-tasks) through the c10
// dispatcher, op by op, exactly as eager PyTorch dispatches them.
//
// Why an interpreter and not TorchScript: TorchScript is deprecated from torch 2.9, and
// torch.export's graph keeps eager's ops (aten::linear, aten::conv2d, aten::batch_norm),
// so dispatching them one by one gives eager semantics with no graph-level fusion.
// Everything that can be resolved at load time is: operator handles, constant arguments
// (devices already rewritten to the target device), and the step after which each
// intermediate is released (so peak memory matches eager's).
//
// Immutable after construction: run() is const and may be called from several threads.
#pragma once
#include <ATen/core/Generator.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kf::tasks {

class AtenGraph {
 public:
  // `placeholders` names the graph inputs in the order run() receives them.
  // `where` names the file for error messages. Throws kf::Error on anything unknown.
  AtenGraph(const nlohmann::json& nodes, const std::vector<std::string>& placeholders,
            const std::vector<std::string>& outputs, const at::Device& device, const std::string& where);

  // Runs the graph. Random ops draw from `generator` when given (private, seeded), so two
  // threads generating inputs never share RNG state.
  std::vector<c10::IValue> run(std::vector<c10::IValue> inputs, const at::Generator* generator = nullptr) const;

  std::size_t num_ops() const { return steps_.size(); }

 private:
  enum class ArgKind { Const, Slot, TensorList, OptTensorList, Generator };
  struct Arg {
    ArgKind kind = ArgKind::Const;
    c10::IValue value;
    int slot = -1;
    std::vector<int> slots;  // -1 marks a None inside Tensor?[]
  };
  enum class StepKind { Op, GetItem, Const };
  struct Step {
    StepKind kind;
    std::string name;
    std::optional<c10::OperatorHandle> op;
    std::vector<Arg> args;
    std::size_t num_returns = 0;
    int src = -1;       // GetItem source slot
    int64_t index = 0;  // GetItem index
    c10::IValue constant;
    int out = -1;
    std::vector<int> release;  // slots whose last reader is this step
  };

  int slot_of(const std::string& name, const std::string& ctx) const;
  Arg make_arg(const nlohmann::json& v, const c10::Argument& schema_arg, const std::string& ctx);
  c10::IValue to_ivalue(const nlohmann::json& v, const c10::TypePtr& type, const std::string& ctx);

  std::string where_;
  at::Device device_;
  std::map<std::string, int> slots_;
  std::vector<int> input_slots_;
  std::vector<int> output_slots_;
  std::vector<Step> steps_;
  int num_slots_ = 0;
};

}  // namespace kf::tasks
