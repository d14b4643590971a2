// Safetensors for checkpoints: the header parser (st_parse: the one parser of
// kf/common/safetensors_header.h, fuzzed in policy/fuzz/), a read-only mmap of one file, a
// sharded-checkpoint reader (model.safetensors.index.json) and a streaming writer that
// writes one tensor at a time, so a multi-GB model never sits in host memory twice.
// Format: u64 LE header length N, N bytes of JSON {"name": {"dtype", "shape",
// "data_offsets": [b, e]}, "__metadata__": {...}}, then the data.
// Objects are immutable after open; views stay valid while the owner lives.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kf/common/safetensors_header.h"

namespace kf::policy {

// The checkpoint-side names of the one parser's types (kf/common/safetensors_header.h).
using StTensorInfo = kf::SafetensorsEntry;
using StHeader = kf::SafetensorsHeader;

// Bytes per element; 0 for an unknown dtype.
std::size_t st_dtype_size(const std::string& dtype);

// Parses and validates a whole file image: every offset within `size`, no overlaps,
// shapes that match their byte spans without overflow. Throws kf::Error naming `context`
// and the field.
StHeader st_parse(const uint8_t* data, std::size_t size, const std::string& context);

// One read-only, memory-mapped safetensors file.
class StFile {
 public:
  static std::shared_ptr<StFile> open(const std::string& path);
  ~StFile();
  StFile(const StFile&) = delete;
  StFile& operator=(const StFile&) = delete;
  const std::string& path() const { return path_; }
  const StHeader& header() const { return header_; }
  const StTensorInfo* find(const std::string& name) const;  // nullptr when absent
  const void* data(const StTensorInfo& t) const { return static_cast<const uint8_t*>(map_) + t.offset; }

 private:
  StFile() = default;
  std::string path_;
  void* map_ = nullptr;
  std::size_t size_ = 0;
  StHeader header_;
  std::map<std::string, std::size_t> index_;
};

// A checkpoint directory: model.safetensors, or shards listed by model.safetensors.index.json.
class StCheckpoint {
 public:
  static StCheckpoint open(const std::string& dir);
  struct Entry {
    const StTensorInfo* info;
    const void* data;
    const std::string* file;
  };
  // Throws kf::Error naming the file(s) when the tensor is absent.
  Entry get(const std::string& name) const;
  bool has(const std::string& name) const;
  std::vector<std::string> names() const;
  const std::vector<std::shared_ptr<StFile>>& files() const { return files_; }

 private:
  std::string dir_;
  std::vector<std::shared_ptr<StFile>> files_;
  std::map<std::string, std::size_t> where_;  // tensor name -> index into files_
};

// Streaming writer. Tensors are declared up front (so the header can be written), then
// `fill` is called once per tensor, in order, to produce exactly nbytes. Atomic (temp+rename).
struct StWriteSpec {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
};
using StFill = std::function<void(std::size_t index, std::string& bytes)>;
void st_write(const std::string& path, const std::vector<StWriteSpec>& specs, const StFill& fill,
              const std::map<std::string, std::string>& metadata = {});

}  // namespace kf::policy
