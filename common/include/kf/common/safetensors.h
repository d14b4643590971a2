// safetensors files: read (mmap, every offset checked against the file length) and write.
// Format: u64 little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, "__metadata__": {...}}
// then the raw data. Used for task parameters/golden data and, later, policy weights.
// A SafetensorsFile is immutable after open; views stay valid while it lives.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace kf {

struct TensorView {
  std::string name;
  std::string dtype;  // "F32", "F16", "BF16", "F64", "I64", "I32", "I16", "I8", "U8", "BOOL"
  std::vector<int64_t> shape;
  const void* data = nullptr;  // into the mapping
  std::size_t nbytes = 0;
};

std::size_t safetensors_dtype_size(const std::string& dtype);  // throws kf::Error for unknown

class SafetensorsFile {
 public:
  // Maps the file and validates the header. Throws kf::Error naming the file and field.
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::vector<TensorView>& tensors() const { return tensors_; }  // in file order
  const TensorView& get(const std::string& name) const;                // throws if absent
  bool has(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  std::size_t size_ = 0;
  std::vector<TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

struct TensorToWrite {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  const void* data;
  std::size_t nbytes;
};

// Writes atomically (temp + rename). Throws kf::Error on I/O failure or a size mismatch.
void safetensors_write(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace kf
