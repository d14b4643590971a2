#include "kf/actors/weights_blob.h"

#include <cstring>
#include <nlohmann/json.hpp>

#include "kf/common/error.h"
#include "kf/policy/checkpoint.h"
#include "kf/policy/safetensors_format.h"

namespace kf::actors {

namespace {
std::string shape_str(const std::vector<int64_t>& s) {
  std::string o = "[";
  for (std::size_t i = 0; i < s.size(); ++i) o += (i ? "," : "") + std::to_string(s[i]);
  return o + "]";
}
}  // namespace

BlobCheck check_weights_blob(policy::CausalLM& model, const void* data, std::size_t bytes, const std::string& context) {
  BlobCheck r;
  try {
    const auto h = policy::st_parse(static_cast<const uint8_t*>(data), bytes, context);
    auto params = model->named_parameters();
    std::size_t matched = 0;
    for (const auto& t : h.tensors) {
      auto* p = params.find(t.name);
      if (!p) throw Error(context + ": tensor '" + t.name + "' is not a parameter of the model");
      policy::dtype_from_name(t.dtype, context + ": tensor '" + t.name + "'");
      if (p->sizes().vec() != t.shape)
        throw Error(context + ": tensor '" + t.name + "': shape " + shape_str(t.shape) + " in the blob, " +
                    shape_str(p->sizes().vec()) + " in the model");
      ++matched;
    }
    if (matched != params.size())
      throw Error(context + ": blob has " + std::to_string(matched) + " of the model's " +
                  std::to_string(params.size()) + " parameters");
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
  for (const auto& p : model->named_parameters()) {
    const uint64_t n = static_cast<uint64_t>(p.value().numel()) * es;
    header[p.key()] = {{"dtype", policy::safetensors_dtype(dtype)},
                       {"shape", p.value().sizes().vec()},
                       {"data_offsets", {off, off + n}}};
    off += n;
    cast.push_back(p.value().detach().to(torch::kCPU, dtype).contiguous());
  }
  header["__metadata__"] = {{"format", "pt"}, {"kf_version", std::to_string(version)}};
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
