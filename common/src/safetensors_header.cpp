#include "kf/common/safetensors_header.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "kf/common/error.h"

namespace kf {
namespace {

// Same cap as the reference implementation: a header is metadata, not data.
constexpr uint64_t kMaxHeader = 100ull << 20;

bool mul_overflows(uint64_t a, uint64_t b, uint64_t& out) {
  if (a != 0 && b > UINT64_MAX / a) return true;
  out = a * b;
  return false;
}

}  // namespace

std::size_t safetensors_element_bytes(const std::string& d) {
  static const std::map<std::string, std::size_t> sizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I64", 8}, {"I32", 4},
      {"I16", 2}, {"I8", 1},  {"U64", 8}, {"U32", 4},  {"U16", 2},     {"U8", 1},      {"BOOL", 1}};
  auto it = sizes.find(d);
  return it == sizes.end() ? 0 : it->second;
}

SafetensorsHeader safetensors_parse(const uint8_t* bytes, std::size_t size, const std::string& ctx) {
  if (size < 8) throw Error(ctx + ": too short for a safetensors header (" + std::to_string(size) + " bytes)");
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | bytes[i];
  if (hlen > size - 8)
    throw Error(ctx + ": field 'header length': " + std::to_string(hlen) + " bytes exceeds the file (" +
                std::to_string(size) + " bytes); truncated or not safetensors");
  if (hlen > kMaxHeader) throw Error(ctx + ": field 'header length': " + std::to_string(hlen) + " bytes is too large");
  SafetensorsHeader h;
  h.data_begin = 8 + hlen;
  const uint64_t data_size = size - h.data_begin;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(bytes + 8, bytes + h.data_begin);
  } catch (const std::exception& e) {
    throw Error(ctx + ": header is not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw Error(ctx + ": header is not a JSON object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string tctx = ctx + ": tensor '" + it.key() + "'";
    if (it.key() == "__metadata__") {
      if (!it->is_object()) throw Error(ctx + ": field '__metadata__': must be an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) throw Error(ctx + ": field '__metadata__." + m.key() + "': must be a string");
        h.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    const auto& e = *it;
    if (!e.is_object()) throw Error(tctx + ": must be an object");
    SafetensorsEntry t;
    t.name = it.key();
    if (!e.contains("dtype") || !e["dtype"].is_string()) throw Error(tctx + ": field 'dtype': missing or not a string");
    t.dtype = e["dtype"].get<std::string>();
    const std::size_t elem = safetensors_element_bytes(t.dtype);
    if (elem == 0) throw Error(tctx + ": field 'dtype': unknown dtype '" + t.dtype + "'");
    if (!e.contains("shape") || !e["shape"].is_array()) throw Error(tctx + ": field 'shape': missing or not a list");
    uint64_t numel = 1;
    for (const auto& d : e["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) throw Error(tctx + ": field 'shape': bad dimension");
      t.shape.push_back(d.get<int64_t>());
      if (mul_overflows(numel, static_cast<uint64_t>(t.shape.back()), numel))
        throw Error(tctx + ": field 'shape': element count overflows");
    }
    uint64_t need = 0;
    if (mul_overflows(numel, elem, need)) throw Error(tctx + ": field 'shape': byte size overflows");
    if (!e.contains("data_offsets") || !e["data_offsets"].is_array() || e["data_offsets"].size() != 2 ||
        !e["data_offsets"][0].is_number_unsigned() || !e["data_offsets"][1].is_number_unsigned())
      throw Error(tctx + ": field 'data_offsets': must be [begin, end] of non-negative integers");
    const uint64_t b = e["data_offsets"][0].get<uint64_t>(), en = e["data_offsets"][1].get<uint64_t>();
    if (b > en || en > data_size)
      throw Error(tctx + ": field 'data_offsets': [" + std::to_string(b) + ", " + std::to_string(en) +
                  "] points outside the data (" + std::to_string(data_size) + " bytes; file truncated?)");
    if (en - b != need)
      throw Error(tctx + ": field 'data_offsets': spans " + std::to_string(en - b) +
                  " bytes but shape and dtype need " + std::to_string(need));
    t.offset = h.data_begin + b;
    t.nbytes = en - b;
    h.tensors.push_back(std::move(t));
  }
  std::sort(h.tensors.begin(), h.tensors.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) { return a.offset < b.offset; });
  for (std::size_t i = 1; i < h.tensors.size(); ++i) {
    const auto& p = h.tensors[i - 1];
    if (p.nbytes > 0 && h.tensors[i].nbytes > 0 && p.offset + p.nbytes > h.tensors[i].offset)
      throw Error(ctx + ": tensor '" + h.tensors[i].name + "': field 'data_offsets': overlaps tensor '" + p.name + "'");
  }
  return h;
}

}  // namespace kf
