// HF model folders (kf/policy/policy.h: load_policy, save_policy, save_weights; src/checkpoint.h:
// load_weights). Loading maps each shard and copies tensor by tensor into the model's
// parameters (any dtype conversion happens in that copy), so peak memory is the model plus
// the page cache; saving writes shards of at most max_shard_bytes plus an index, as HF
// transformers does. load_policy checks that the tokenizer's ids fit the model's vocab_size.
#include "kf/policy/policy.h"

#include <sys/stat.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "kf/common/error.h"
#include "checkpoint.h"
#include "config.h"

namespace kf::policy {

torch::ScalarType dtype_from_name(const std::string& n, const std::string& ctx) {
  if (n == "F32" || n == "float32") return torch::kFloat32;
  if (n == "BF16" || n == "bfloat16") return torch::kBFloat16;
  if (n == "F16" || n == "float16") return torch::kFloat16;
  if (n == "F64" || n == "float64") return torch::kFloat64;
  if (n == "I64") return torch::kInt64;
  if (n == "I32") return torch::kInt32;
  if (n == "I16") return torch::kInt16;
  if (n == "I8") return torch::kInt8;
  if (n == "U8") return torch::kUInt8;
  if (n == "BOOL") return torch::kBool;
  if (n == "F8_E4M3") return torch::kFloat8_e4m3fn;
  if (n == "F8_E5M2") return torch::kFloat8_e5m2;
  throw Error(ctx + ": dtype '" + n + "' is not supported");
}

std::string safetensors_dtype(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat32:
      return "F32";
    case torch::kBFloat16:
      return "BF16";
    case torch::kFloat16:
      return "F16";
    case torch::kFloat64:
      return "F64";
    default:
      throw Error(std::string("safetensors: cannot write dtype ") + c10::toString(t));
  }
}

namespace {
bool ignorable(const std::string& name, bool tied) {
  const std::string inv = "rotary_emb.inv_freq";
  if (name.size() >= inv.size() && name.compare(name.size() - inv.size(), inv.size(), inv) == 0) return true;
  return tied && name == "lm_head.weight";
}

std::string shape_str(c10::IntArrayRef s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}
}  // namespace

void load_weights(CausalLM& model, const std::string& dir) {
  const StCheckpoint ck = StCheckpoint::open(dir);
  torch::NoGradGuard no_grad;
  std::set<std::string> used;
  const auto& cfg = model->config();
  for (auto& p : model->named_parameters()) {
    const std::string& name = p.key();
    StCheckpoint::Entry e{};
    try {
      e = ck.get(name);  // throws naming the files when missing
    } catch (const Error& missing) {
      const std::vector<int64_t> want(p.value().sizes().begin(), p.value().sizes().end());
      throw Error(std::string(missing.what()) + " (a " + cfg.model_type + " model with this config.json expects it, " +
                  "shape " + shape_str(want) + ")");
    }
    const auto& info = *e.info;
    const std::string ctx = *e.file + ": tensor '" + name + "'";
    auto& dst = p.value();
    const std::vector<int64_t> want(dst.sizes().begin(), dst.sizes().end());
    if (info.shape != want) {
      std::string hint;
      if (name.find("embed_tokens") != std::string::npos || name.find("lm_head") != std::string::npos)
        hint = " (config.json vocab_size=" + std::to_string(cfg.vocab_size) +
               ", hidden_size=" + std::to_string(cfg.hidden_size) + ")";
      throw Error(ctx + ": field 'shape': " + shape_str(info.shape) + " but the config expects " + shape_str(want) +
                  hint);
    }
    const auto src_type = dtype_from_name(info.dtype, ctx + ": field 'dtype'");
    if (!c10::isFloatingType(src_type)) throw Error(ctx + ": field 'dtype': " + info.dtype + " is not a float type");
    // from_blob over the mapping: no host copy; copy_ converts dtype and moves to the device.
    const auto src = torch::from_blob(const_cast<void*>(e.data), info.shape, torch::TensorOptions().dtype(src_type));
    dst.copy_(src);
    used.insert(name);
  }
  for (const auto& n : ck.names()) {
    if (used.count(n) || ignorable(n, cfg.tie_word_embeddings)) continue;
    throw Error(ck.files()[0]->path() + ": tensor '" + n + "' does not belong to a " + cfg.model_type +
                " model with this config.json (unexpected tensor)");
  }
}

void save_weights(CausalLM& model, const std::string& dir, uint64_t max_shard_bytes) {
  ::mkdir(dir.c_str(), 0755);
  ModelConfig cfg = model->config();
  const auto type = model->options().dtype().toScalarType();
  cfg.dtype = type == torch::kBFloat16 ? "bfloat16" : type == torch::kFloat16 ? "float16" : "float32";
  save_model_config(cfg, dir + "/config.json");
  struct Item {
    std::string name;
    torch::Tensor t;
    uint64_t bytes;
  };
  std::vector<std::vector<Item>> shards(1);
  uint64_t in_shard = 0, total = 0;
  for (auto& p : model->named_parameters()) {
    const uint64_t bytes = p.value().numel() * p.value().element_size();
    if (!shards.back().empty() && in_shard + bytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back({p.key(), p.value(), bytes});
    in_shard += bytes;
    total += bytes;
  }
  nlohmann::json weight_map = nlohmann::json::object();
  const std::size_t n = shards.size();
  for (std::size_t s = 0; s < n; ++s) {
    char fname[64];
    if (n == 1)
      std::snprintf(fname, sizeof fname, "model.safetensors");
    else
      std::snprintf(fname, sizeof fname, "model-%05zu-of-%05zu.safetensors", s + 1, n);
    std::vector<StWriteSpec> specs;
    for (const auto& it : shards[s]) {
      specs.push_back({it.name, safetensors_dtype(it.t.scalar_type()), it.t.sizes().vec()});
      weight_map[it.name] = fname;
    }
    // One tensor at a time crosses to the host, so writing needs no second model copy.
    st_write(dir + "/" + fname, specs,
             [&](std::size_t i, std::string& bytes) {
               const auto host = shards[s][i].t.detach().to(torch::kCPU).contiguous();
               bytes.assign(static_cast<const char*>(host.data_ptr()), host.numel() * host.element_size());
             },
             {{"format", "pt"}});
  }
  const std::string index = dir + "/model.safetensors.index.json";
  if (n > 1) {
    std::ofstream out(index, std::ios::trunc);
    out << nlohmann::json({{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}).dump(2) << "\n";
    if (!out) throw Error(index + ": write failed");
  } else {
    std::remove(index.c_str());  // a stale index would shadow the single file
  }
}

Policy load_policy(const std::string& dir, torch::Device device, std::optional<torch::ScalarType> dtype) {
  Policy p;
  p.config = load_model_config(dir + "/config.json");
  const auto type = dtype.value_or(device.is_cuda() ? torch::kBFloat16 : torch::kFloat32);
  p.model = CausalLM(p.config, torch::TensorOptions().dtype(type).device(device));
  load_weights(p.model, dir);
  struct stat st {};
  const std::string tok = dir + "/tokenizer.json";
  if (::stat(tok.c_str(), &st) == 0) {
    p.tokenizer = Tokenizer::from_file(tok);
    if (p.tokenizer->vocab_size() > p.config.vocab_size)
      throw Error(tok + ": field 'model.vocab': the tokenizer has " + std::to_string(p.tokenizer->vocab_size()) +
                  " ids but " + dir + "/config.json field 'vocab_size' is " + std::to_string(p.config.vocab_size));
  }
  return p;
}

void save_policy(const Policy& p, const std::string& dir, uint64_t max_shard_bytes) {
  CausalLM m = p.model;
  save_weights(m, dir, max_shard_bytes);
  if (p.tokenizer) p.tokenizer->save(dir + "/tokenizer.json");
}

}  // namespace kf::policy
