// The one safetensors header parser. Task artifacts (kf/common/safetensors.h), policy
// checkpoints and weight snapshots (kf/policy/policy.h) all validate through it:
// the header length within the image and under 100 MiB, every tensor's dtype known, its
// shape's element and byte counts free of overflow and equal to its span, every span
// inside the data, no two spans overlapping. Torch-free; over bytes in memory (fuzzed).
// Format: u64 LE header length N, N bytes of JSON {"name": {"dtype", "shape",
// "data_offsets": [b, e]}, "__metadata__": {...}}, then the data.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kf {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // "F32", "BF16", ...
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // absolute, from the start of the image
  uint64_t nbytes = 0;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;  // sorted by offset
  std::map<std::string, std::string> metadata;
  uint64_t data_begin = 0;
};

// Bytes per element of a safetensors dtype; 0 for an unknown one.
std::size_t safetensors_element_bytes(const std::string& dtype);

// Parses and validates a whole image of `size` bytes. Throws kf::Error naming `context`,
// the tensor and the field.
SafetensorsHeader safetensors_parse(const uint8_t* data, std::size_t size, const std::string& context);

}  // namespace kf
