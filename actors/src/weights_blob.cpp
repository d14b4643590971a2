#include "weights_blob.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "kf/common/error.h"
#include "kf/policy/policy.h"

namespace kf::actors {

namespace {
std::string shape_str(const std::vector<int64_t>& s) {
  std::string o = "[";
  for (std::size_t i = 0; i < s.size(); ++i) o += (i ? "," : "") + std::to_string(s[i]);
  return o + "]";
}

// The LoRA configuration an adapter-only blob declares (rank 0: a full-weights blob).
policy::LoraConfig blob_lora(const std::map<std::string, std::string>& meta, const std::string& context) {
  policy::LoraConfig c;
  auto r = meta.find("kf_lora_rank");
  if (r == meta.end()) return c;
  try {
    c.rank = std::stoll(r->second);
    auto a = meta.find("kf_lora_alpha");
    if (a == meta.end()) throw Error(context + ": metadata kf_lora_rank without kf_lora_alpha");
    c.alpha = std::stod(a->second);
  } catch (const std::logic_error&) {
    throw Error(context + ": metadata kf_lora_rank / kf_lora_alpha is not a number");
  }
  auto t = meta.find("kf_lora_targets");
  if (t == meta.end() || t->second.empty()) throw Error(context + ": metadata kf_lora_targets is missing");
  std::size_t start = 0;
  while (start <= t->second.size()) {
    const auto comma = t->second.find(',', start);
    c.targets.push_back(t->second.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (c.rank < 1 || !(c.alpha > 0)) throw Error(context + ": metadata kf_lora_rank must be >= 1 and kf_lora_alpha > 0");
  return c;
}

// Adapter names and shapes the model would have with LoRA `c` (its own when enabled).
std::map<std::string, std::vector<int64_t>> adapter_shapes(policy::CausalLM& model, const policy::LoraConfig& c) {
  std::map<std::string, std::vector<int64_t>> out;
  for (const auto& p : model->named_parameters()) {
    const auto& n = p.key();
    if (policy::is_lora_param(n) || n.size() < 7 || n.compare(n.size() - 7, 7, ".weight") != 0) continue;
    const auto stem = n.substr(0, n.size() - 7);
    const auto dot = stem.rfind('.');
    const auto proj = stem.substr(dot + 1);
    if (stem.compare(0, 13, "model.layers.") != 0) continue;
    if (std::find(c.targets.begin(), c.targets.end(), proj) == c.targets.end()) continue;
    out[stem + ".lora_A.weight"] = {c.rank, p.value().size(1)};
    out[stem + ".lora_B.weight"] = {p.value().size(0), c.rank};
  }
  return out;
}
// Every tensor of the blob is one the model has (`what` of it), with a known dtype and the
// model's shape, and none of the model's is missing.
void match_tensors(const policy::StHeader& h, const std::map<std::string, std::vector<int64_t>>& want,
                   const std::string& what, const std::string& plural, const std::string& context) {
  std::size_t matched = 0;
  for (const auto& t : h.tensors) {
    auto it = want.find(t.name);
    if (it == want.end()) throw Error(context + ": tensor '" + t.name + "' is not " + what + " of the model");
    policy::dtype_from_name(t.dtype, context + ": tensor '" + t.name + "'");
    if (it->second != t.shape)
      throw Error(context + ": tensor '" + t.name + "': shape " + shape_str(t.shape) + " in the blob, " +
                  shape_str(it->second) + " in the model");
    ++matched;
  }
  if (matched != want.size())
    throw Error(context + ": blob has " + std::to_string(matched) + " of the model's " + std::to_string(want.size()) +
                " " + plural);
}
}  // namespace

BlobCheck check_weights_blob(policy::CausalLM& model, const void* data, std::size_t bytes, const std::string& context) {
  BlobCheck r;
  try {
    const auto h = policy::st_parse(static_cast<const uint8_t*>(data), bytes, context);
    const auto lora = blob_lora(h.metadata, context);
    if (lora.rank > 0) {
      // Adapter-only: the model gets (or has) exactly these adapters; its base stays.
      const auto& own = model->lora();
      if (own.rank > 0 && (own.rank != lora.rank || own.alpha != lora.alpha || own.targets != lora.targets))
        throw Error(context + ": LoRA rank " + std::to_string(lora.rank) + " on other projections or alpha than " +
                    "the adapters loaded before (rank " + std::to_string(own.rank) + ")");
      const auto want = adapter_shapes(model, lora);
      if (want.empty()) throw Error(context + ": the model has none of the LoRA target projections");
      match_tensors(h, want, "an adapter", "adapter tensors", context);
    } else {
      std::map<std::string, std::vector<int64_t>> want;
      for (const auto& p : model->named_parameters()) want[p.key()] = p.value().sizes().vec();
      match_tensors(h, want, "a parameter", "parameters", context);
    }
    auto it = h.metadata.find("kf_version");
    if (it != h.metadata.end()) {
      try {
        r.version = std::stoll(it->second);
      } catch (const std::exception&) {
        throw Error(context + ": metadata kf_version '" + it->second + "' is not an integer");
      }
    }
    r.ok = true;
  } catch (const Error& e) {
    r.error = e.what();
  }
  return r;
}

int64_t load_weights_blob(policy::CausalLM& model, const void* data, std::size_t bytes, const std::string& context) {
  const auto c = check_weights_blob(model, data, bytes, context);
  if (!c.ok) throw Error(c.error);
  const auto h = policy::st_parse(static_cast<const uint8_t*>(data), bytes, context);
  const auto lora = blob_lora(h.metadata, context);
  // First adapter blob: add the adapters (in the model's own dtype and device), unmerged.
  if (lora.rank > 0 && model->lora().rank == 0) model->enable_lora(lora, 0, model->options().dtype().toScalarType());
  torch::NoGradGuard ng;
  auto params = model->named_parameters();
  for (const auto& t : h.tensors) {
    auto* p = params.find(t.name);
    const auto dtype = policy::dtype_from_name(t.dtype, context);
    auto src = torch::from_blob(const_cast<uint8_t*>(static_cast<const uint8_t*>(data)) + t.offset, t.shape,
                                torch::TensorOptions().dtype(dtype));
    p->copy_(src);
  }
  return c.version;
}

std::vector<unsigned char> make_weights_blob(policy::CausalLM& model, int64_t version, torch::ScalarType dtype) {
  torch::NoGradGuard ng;
  nlohmann::json header = nlohmann::json::object();
  uint64_t off = 0;
  std::vector<torch::Tensor> cast;
  const std::size_t es = torch::elementSize(dtype);
  const auto& lora = model->lora();
  for (const auto& p : model->named_parameters()) {
    if (lora.rank > 0 && !policy::is_lora_param(p.key())) continue;  // adapter-only, as the learner publishes
    const uint64_t n = static_cast<uint64_t>(p.value().numel()) * es;
    header[p.key()] = {{"dtype", policy::safetensors_dtype(dtype)},
                       {"shape", p.value().sizes().vec()},
                       {"data_offsets", {off, off + n}}};
    off += n;
    cast.push_back(p.value().detach().to(torch::kCPU, dtype).contiguous());
  }
  header["__metadata__"] = {{"format", "pt"}, {"kf_version", std::to_string(version)}};
  if (lora.rank > 0) {
    std::string targets;
    for (const auto& t : lora.targets) targets += (targets.empty() ? "" : ",") + t;
    char alpha[32];
    std::snprintf(alpha, sizeof alpha, "%.17g", lora.alpha);
    header["__metadata__"]["kf_lora_rank"] = std::to_string(lora.rank);
    header["__metadata__"]["kf_lora_alpha"] = alpha;
    header["__metadata__"]["kf_lora_targets"] = targets;
  }
  std::string hs = header.dump();
  while ((8 + hs.size()) % 8) hs.push_back(' ');
  const uint64_t hlen = hs.size();
  std::vector<unsigned char> blob(8 + hlen + off);
  std::memcpy(blob.data(), &hlen, 8);
  std::memcpy(blob.data() + 8, hs.data(), hlen);
  // nlohmann orders keys alphabetically, but offsets were assigned in parameter order; the
  // data follow that order.
  uint64_t pos = 8 + hlen;
  for (const auto& t : cast) {
    std::memcpy(blob.data() + pos, t.data_ptr(), t.nbytes());
    pos += t.nbytes();
  }
  return blob;
}

}  // namespace kf::actors
