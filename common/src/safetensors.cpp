#include "kf/common/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kf/common/error.h"

namespace kf {

std::size_t safetensors_dtype_size(const std::string& dtype) {
  static const std::map<std::string, std::size_t> sizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4},
      {"I16", 2}, {"I8", 1},  {"U8", 1},  {"BOOL", 1}};
  auto it = sizes.find(dtype);
  if (it == sizes.end()) throw Error("unknown safetensors dtype '" + dtype + "'");
  return it->second;
}

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw error_at(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw error_at(path, "cannot stat");
  }
  f->size_ = static_cast<std::size_t>(st.st_size);
  if (f->size_ < 8) {
    ::close(fd);
    throw error_at(path, "too short for a safetensors header (" + std::to_string(f->size_) + " bytes)");
  }
  f->map_ = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (f->map_ == MAP_FAILED) {
    f->map_ = nullptr;
    throw error_at(path, "mmap failed");
  }
  const auto* bytes = static_cast<const unsigned char*>(f->map_);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > f->size_ - 8)
    throw error_at(path, "header length " + std::to_string(header_len) + " exceeds file size " + std::to_string(f->size_));
  const std::size_t data_begin = 8 + header_len;
  const std::size_t data_size = f->size_ - data_begin;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(reinterpret_cast<const char*>(bytes + 8), reinterpret_cast<const char*>(bytes + data_begin));
  } catch (const std::exception& e) {
    throw error_at(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) throw error_at(path, "header is not a JSON object");
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string ctx = path + ": tensor '" + it.key() + "'";
    if (it.key() == "__metadata__") {
      if (!it->is_object()) throw Error(ctx + ": __metadata__ must be an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) throw Error(ctx + ": metadata value '" + m.key() + "' must be a string");
        f->metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    const auto& e = *it;
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
      throw Error(ctx + ": needs dtype, shape and data_offsets");
    TensorView v;
    v.name = it.key();
    if (!e["dtype"].is_string()) throw Error(ctx + ": field 'dtype' must be a string");
    v.dtype = e["dtype"].get<std::string>();
    std::size_t elem = 0;
    try {
      elem = safetensors_dtype_size(v.dtype);
    } catch (const Error& err) {
      throw Error(ctx + ": field 'dtype': " + err.what());
    }
    if (!e["shape"].is_array()) throw Error(ctx + ": field 'shape' must be a list");
    std::size_t numel = 1;
    for (const auto& d : e["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) throw Error(ctx + ": field 'shape' has a bad dimension");
      v.shape.push_back(d.get<int64_t>());
      // Overflow-checked: a shape whose element count wraps must not pass the size check.
      if (__builtin_mul_overflow(numel, static_cast<std::size_t>(v.shape.back()), &numel))
        throw Error(ctx + ": field 'shape' is too large (element count overflows)");
    }
    const auto& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      throw Error(ctx + ": field 'data_offsets' must be [begin, end]");
    const uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
    if (b > en || en > data_size)
      throw Error(ctx + ": data_offsets [" + std::to_string(b) + ", " + std::to_string(en) + "] outside the data (" +
                  std::to_string(data_size) + " bytes)");
    std::size_t need = 0;
    if (__builtin_mul_overflow(numel, elem, &need)) throw Error(ctx + ": field 'shape' is too large (byte count overflows)");
    if (en - b != need)
      throw Error(ctx + ": data_offsets span " + std::to_string(en - b) + " bytes but shape and dtype need " +
                  std::to_string(numel * elem));
    v.data = bytes + data_begin + b;
    v.nbytes = en - b;
    f->tensors_.push_back(std::move(v));
  }
  std::sort(f->tensors_.begin(), f->tensors_.end(),
            [](const TensorView& a, const TensorView& b) { return a.data < b.data; });
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, size_);
}

bool SafetensorsFile::has(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return true;
  return false;
}

const TensorView& SafetensorsFile::get(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return t;
  throw error_at(path_, "no tensor named '" + name + "'");
}

void safetensors_write(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    std::size_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<std::size_t>(d);
    if (numel * safetensors_dtype_size(t.dtype) != t.nbytes)
      throw error_at(path, "tensor '" + t.name + "': nbytes does not match shape and dtype");
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.nbytes}}};
    offset += t.nbytes;
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8 != 0) h.push_back(' ');  // keep data 8-byte aligned
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw error_at(tmp, "cannot create");
    unsigned char len[8];
    uint64_t n = h.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
    out.write(reinterpret_cast<const char*>(len), 8);
    out.write(h.data(), static_cast<std::streamsize>(h.size()));
    for (const auto& t : tensors) out.write(static_cast<const char*>(t.data), static_cast<std::streamsize>(t.nbytes));
    out.flush();
    if (!out) throw error_at(tmp, "write failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw error_at(path, "rename failed");
}

}  // namespace kf
