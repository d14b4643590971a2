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
#include "kf/common/safetensors_header.h"

namespace kf {

std::size_t safetensors_dtype_size(const std::string& dtype) {
  const std::size_t n = safetensors_element_bytes(dtype);
  if (n == 0) throw Error("unknown safetensors dtype '" + dtype + "'");
  return n;
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
  const auto* bytes = static_cast<const uint8_t*>(f->map_);
  SafetensorsHeader h = safetensors_parse(bytes, f->size_, path);  // the one parser
  f->metadata_ = std::move(h.metadata);
  f->tensors_.reserve(h.tensors.size());
  for (auto& t : h.tensors) {
    TensorView v;
    v.name = std::move(t.name);
    v.dtype = std::move(t.dtype);
    v.shape = std::move(t.shape);
    v.data = bytes + t.offset;
    v.nbytes = static_cast<std::size_t>(t.nbytes);
    f->tensors_.push_back(std::move(v));
  }
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
