#include "aten_graph.h"

#include <ATen/ATen.h>
#include <ATen/core/jit_type.h>

#include <cmath>
#include <limits>

#include "dtype_names.h"
#include "kf/common/error.h"

namespace kf::tasks {
namespace {

using json = nlohmann::json;

bool is_ref(const json& v) { return v.is_object() && v.contains("n"); }

c10::Scalar json_scalar(const json& v, const std::string& ctx) {
  if (v.is_boolean()) return c10::Scalar(v.get<bool>());
  if (v.is_number_integer()) return c10::Scalar(v.get<int64_t>());
  if (v.is_object() && v.contains("f")) {
    const json& f = v["f"];
    if (f.is_string()) {
      const std::string s = f.get<std::string>();
      if (s == "nan") return c10::Scalar(std::numeric_limits<double>::quiet_NaN());
      if (s == "inf") return c10::Scalar(std::numeric_limits<double>::infinity());
      if (s == "-inf") return c10::Scalar(-std::numeric_limits<double>::infinity());
      throw Error(ctx + ": bad float literal '" + s + "'");
    }
    return c10::Scalar(f.get<double>());
  }
  throw Error(ctx + ": expected a number, got " + v.dump());
}

// A Python number passed where the schema wants a Tensor becomes a "wrapped number":
// a 0-dim CPU tensor that does not take part in type promotion, exactly as eager does.
at::Tensor wrapped_number(const c10::Scalar& s) {
  at::Tensor t;
  if (s.isBoolean())
    t = at::scalar_tensor(s, at::kBool);
  else if (s.isIntegral(false))
    t = at::scalar_tensor(s, at::kLong);
  else
    t = at::scalar_tensor(s, at::kDouble);
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

int64_t enum_value(const json& v, const std::string& ctx) {
  if (v.contains("dtype")) return static_cast<int64_t>(dtype_from_name(v["dtype"].get<std::string>(), ctx));
  if (v.contains("layout")) {
    const std::string l = v["layout"].get<std::string>();
    if (l == "strided") return static_cast<int64_t>(at::kStrided);
    throw Error(ctx + ": unsupported layout '" + l + "'");
  }
  if (v.contains("memory_format")) {
    const std::string m = v["memory_format"].get<std::string>();
    if (m == "contiguous_format") return static_cast<int64_t>(at::MemoryFormat::Contiguous);
    if (m == "preserve_format") return static_cast<int64_t>(at::MemoryFormat::Preserve);
    if (m == "channels_last") return static_cast<int64_t>(at::MemoryFormat::ChannelsLast);
    if (m == "channels_last_3d") return static_cast<int64_t>(at::MemoryFormat::ChannelsLast3d);
    throw Error(ctx + ": unsupported memory format '" + m + "'");
  }
  throw Error(ctx + ": expected an enum value, got " + v.dump());
}

bool is_tensor_type(const c10::TypePtr& t) {
  if (t->kind() == c10::TypeKind::TensorType) return true;
  if (auto o = t->cast<c10::OptionalType>()) return o->getElementType()->kind() == c10::TypeKind::TensorType;
  return false;
}

}  // namespace

AtenGraph::AtenGraph(const json& nodes, const std::vector<std::string>& placeholders,
                     const std::vector<std::string>& outputs, const at::Device& device, const std::string& where)
    : where_(where), device_(device) {
  for (const std::string& p : placeholders) {
    slots_[p] = num_slots_;
    input_slots_.push_back(num_slots_++);
  }
  if (!nodes.is_array()) throw Error(where_ + ": 'nodes' must be a list");
  for (const json& n : nodes) {
    if (!n.is_object() || !n.contains("name")) throw Error(where_ + ": node without a name");
    Step step;
    step.name = n["name"].get<std::string>();
    const std::string ctx = where_ + ": node '" + step.name + "'";
    if (n.contains("getitem")) {
      step.kind = StepKind::GetItem;
      step.src = slot_of(n["getitem"].at(0).get<std::string>(), ctx);
      step.index = n["getitem"].at(1).get<int64_t>();
    } else if (n.contains("const")) {
      step.kind = StepKind::Const;
      const json& c = n["const"];
      const auto dtype = dtype_from_name(c.at("dtype").get<std::string>(), ctx);
      std::vector<int64_t> shape = c.at("shape").get<std::vector<int64_t>>();
      std::vector<double> data = c.at("data").get<std::vector<double>>();
      at::Tensor t = at::tensor(data, at::TensorOptions().dtype(at::kDouble)).to(dtype).reshape(shape);
      step.constant = t.to(device_);
    } else if (n.contains("op")) {
      step.kind = StepKind::Op;
      const std::string op_name = n["op"].get<std::string>();
      const std::string overload = n.value("overload", std::string());
      auto handle = c10::Dispatcher::singleton().findSchema({op_name, overload});
      if (!handle)
        throw Error(ctx + ": operator " + op_name + (overload.empty() ? "" : "." + overload) +
                    " is not registered in this libtorch");
      const c10::FunctionSchema* schema = &handle->schema();
      // Random ops: prefer an overload that takes an explicit generator (thread-safe, private RNG).
      const bool wants_generator = [&] {
        for (const auto& a : schema->arguments())
          if (a.type()->kind() == c10::TypeKind::OptionalType &&
              a.type()->expectRef<c10::OptionalType>().getElementType()->kind() == c10::TypeKind::GeneratorType)
            return true;
        return false;
      }();
      if (!wants_generator) {
        for (const std::string& alt : {overload.empty() ? std::string("generator") : overload + "_generator"}) {
          auto h = c10::Dispatcher::singleton().findSchema({op_name, alt});
          if (h) {
            handle = h;
            schema = &handle->schema();
          }
        }
      }
      step.op = *handle;
      step.num_returns = schema->returns().size();
      const json& args = n.value("args", json::array());
      const json& kwargs = n.value("kwargs", json::object());
      const auto& sargs = schema->arguments();
      std::size_t used_kwargs = 0;
      for (std::size_t i = 0; i < sargs.size(); ++i) {
        const c10::Argument& sa = sargs[i];
        const std::string actx = ctx + " (" + op_name + ") argument '" + sa.name() + "'";
        if (i < args.size() && !sa.kwarg_only()) {
          step.args.push_back(make_arg(args[i], sa, actx));
        } else if (kwargs.contains(sa.name())) {
          step.args.push_back(make_arg(kwargs[sa.name()], sa, actx));
          ++used_kwargs;
        } else if (sa.type()->kind() == c10::TypeKind::OptionalType &&
                   sa.type()->expectRef<c10::OptionalType>().getElementType()->kind() == c10::TypeKind::GeneratorType) {
          Arg g;
          g.kind = ArgKind::Generator;
          step.args.push_back(std::move(g));
        } else if (sa.default_value()) {
          Arg a;
          a.value = *sa.default_value();
          step.args.push_back(std::move(a));
        } else {
          throw Error(actx + " is required but missing");
        }
      }
      if (args.size() > sargs.size()) throw Error(ctx + ": too many positional arguments for " + op_name);
      if (used_kwargs != kwargs.size()) throw Error(ctx + ": keyword argument not in the schema of " + op_name);
    } else {
      throw Error(ctx + ": unknown node kind");
    }
    step.out = slots_[step.name] = num_slots_++;
    steps_.push_back(std::move(step));
  }
  for (const std::string& o : outputs) output_slots_.push_back(slot_of(o, where_ + ": output"));

  // Release each intermediate after its last reader, as Python drops references.
  std::vector<int> last_use(num_slots_, -1);
  auto use = [&](int slot, int step) {
    if (slot >= 0) last_use[slot] = step;
  };
  for (int s = 0; s < static_cast<int>(steps_.size()); ++s) {
    const Step& st = steps_[s];
    use(st.src, s);
    for (const Arg& a : st.args) {
      use(a.slot, s);
      for (int x : a.slots) use(x, s);
    }
  }
  for (int o : output_slots_) last_use[o] = std::numeric_limits<int>::max();
  for (int slot = 0; slot < num_slots_; ++slot)
    if (last_use[slot] >= 0 && last_use[slot] < static_cast<int>(steps_.size()))
      steps_[last_use[slot]].release.push_back(slot);
}

int AtenGraph::slot_of(const std::string& name, const std::string& ctx) const {
  auto it = slots_.find(name);
  if (it == slots_.end()) throw Error(ctx + ": refers to unknown value '" + name + "'");
  return it->second;
}

AtenGraph::Arg AtenGraph::make_arg(const json& v, const c10::Argument& sa, const std::string& ctx) {
  Arg a;
  const c10::TypePtr& type = sa.type();
  if (is_ref(v)) {
    a.kind = ArgKind::Slot;
    a.slot = slot_of(v["n"].get<std::string>(), ctx);
    return a;
  }
  if (auto list = type->cast<c10::ListType>()) {
    const c10::TypePtr& el = list->getElementType();
    if (is_tensor_type(el)) {
      if (!v.is_array()) throw Error(ctx + ": expected a list of tensors");
      a.kind = el->kind() == c10::TypeKind::OptionalType ? ArgKind::OptTensorList : ArgKind::TensorList;
      for (const json& e : v) {
        if (e.is_null() && a.kind == ArgKind::OptTensorList)
          a.slots.push_back(-1);
        else if (is_ref(e))
          a.slots.push_back(slot_of(e["n"].get<std::string>(), ctx));
        else
          throw Error(ctx + ": list element is not a graph value");
      }
      return a;
    }
  }
  a.value = to_ivalue(v, type, ctx);
  return a;
}

c10::IValue AtenGraph::to_ivalue(const json& v, const c10::TypePtr& type, const std::string& ctx) {
  if (v.is_null()) return c10::IValue();
  if (auto opt = type->cast<c10::OptionalType>()) return to_ivalue(v, opt->getElementType(), ctx);
  switch (type->kind()) {
    case c10::TypeKind::TensorType:
      return wrapped_number(json_scalar(v, ctx));
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType:
      if (v.is_object() && !v.contains("f")) return enum_value(v, ctx);
      if (!v.is_number_integer()) throw Error(ctx + ": expected an integer, got " + v.dump());
      return v.get<int64_t>();
    case c10::TypeKind::ScalarTypeType:
    case c10::TypeKind::LayoutType:
    case c10::TypeKind::MemoryFormatType:
      return enum_value(v, ctx);
    case c10::TypeKind::FloatType:
    case c10::TypeKind::SymFloatType:
      return json_scalar(v, ctx).toDouble();
    case c10::TypeKind::BoolType:
    case c10::TypeKind::SymBoolType:
      if (!v.is_boolean()) throw Error(ctx + ": expected a bool, got " + v.dump());
      return v.get<bool>();
    case c10::TypeKind::NumberType:
      return json_scalar(v, ctx);
    case c10::TypeKind::StringType:
      if (!v.is_string()) throw Error(ctx + ": expected a string, got " + v.dump());
      return v.get<std::string>();
    case c10::TypeKind::DeviceObjType:
      // Graphs are recorded on one device; they run on the target device.
      return device_;
    case c10::TypeKind::ListType: {
      const c10::TypePtr& el = type->expectRef<c10::ListType>().getElementType();
      if (!v.is_array()) throw Error(ctx + ": expected a list, got " + v.dump());
      switch (el->kind()) {
        case c10::TypeKind::IntType:
        case c10::TypeKind::SymIntType: {
          c10::List<int64_t> l;
          for (const json& e : v) l.push_back(e.get<int64_t>());
          return l;
        }
        case c10::TypeKind::FloatType: {
          c10::List<double> l;
          for (const json& e : v) l.push_back(json_scalar(e, ctx).toDouble());
          return l;
        }
        case c10::TypeKind::BoolType: {
          c10::List<bool> l;
          for (const json& e : v) l.push_back(e.get<bool>());
          return l;
        }
        default:
          throw Error(ctx + ": unsupported list type " + type->str());
      }
    }
    default:
      throw Error(ctx + ": unsupported argument type " + type->str());
  }
}

std::vector<c10::IValue> AtenGraph::run(std::vector<c10::IValue> inputs, const at::Generator* generator) const {
  if (inputs.size() != input_slots_.size())
    throw Error(where_ + ": graph takes " + std::to_string(input_slots_.size()) + " inputs, got " +
                std::to_string(inputs.size()));
  std::vector<c10::IValue> values(num_slots_);
  for (std::size_t i = 0; i < inputs.size(); ++i) values[input_slots_[i]] = std::move(inputs[i]);
  torch::jit::Stack stack;
  for (const Step& st : steps_) {
    switch (st.kind) {
      case StepKind::Const:
        values[st.out] = st.constant;
        break;
      case StepKind::GetItem: {
        const c10::IValue& src = values[st.src];
        if (src.isTuple())
          values[st.out] = src.toTupleRef().elements().at(st.index);
        else if (src.isList())
          values[st.out] = src.toListRef().at(st.index);
        else
          throw Error(where_ + ": node '" + st.name + "' indexes a value that is not a tuple or list");
        break;
      }
      case StepKind::Op: {
        stack.clear();
        for (const Arg& a : st.args) {
          switch (a.kind) {
            case ArgKind::Const:
              stack.push_back(a.value);
              break;
            case ArgKind::Slot:
              stack.push_back(values[a.slot]);
              break;
            case ArgKind::Generator:
              stack.push_back(generator ? c10::IValue(*generator) : c10::IValue());
              break;
            case ArgKind::TensorList: {
              c10::List<at::Tensor> l;
              l.reserve(a.slots.size());
              for (int s : a.slots) l.push_back(values[s].toTensor());
              stack.push_back(std::move(l));
              break;
            }
            case ArgKind::OptTensorList: {
              c10::List<std::optional<at::Tensor>> l;
              for (int s : a.slots) l.push_back(s < 0 ? std::optional<at::Tensor>() : values[s].toTensor());
              stack.push_back(std::move(l));
              break;
            }
          }
        }
        st.op->callBoxed(&stack);
        if (st.num_returns == 1)
          values[st.out] = std::move(stack[0]);
        else
          values[st.out] = c10::ivalue::Tuple::create(std::move(stack));
        break;
      }
    }
    for (int r : st.release) values[r] = c10::IValue();
  }
  std::vector<c10::IValue> out;
  out.reserve(output_slots_.size());
  for (int o : output_slots_) out.push_back(values[o]);
  return out;
}

}  // namespace kf::tasks
