// Safetensors checkpoints (kf/policy/policy.h): st_parse over the one header parser of
// kf/common/safetensors_header.h, StFile (a read-only mmap), StCheckpoint (a folder, sharded
// or not) and st_write (declared tensors filled one at a time, temporary file + rename), so a
// multi-GB model never sits in host memory twice.
#include "kf/policy/policy.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kf/common/error.h"
#include "kf/common/safetensors_header.h"
#include "safetensors_format.h"

namespace kf::policy {
// The parsing and validation live in kf/common/safetensors_header.h (one parser for task
// artifacts, checkpoints and snapshots); these are its checkpoint-side names.
std::size_t st_dtype_size(const std::string& d) { return safetensors_element_bytes(d); }

StHeader st_parse(const uint8_t* bytes, std::size_t size, const std::string& ctx) {
  return safetensors_parse(bytes, size, ctx);
}

std::shared_ptr<StFile> StFile::open(const std::string& path) {
  std::shared_ptr<StFile> f(new StFile());
  f->path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw Error(path + ": cannot stat");
  }
  f->size_ = static_cast<std::size_t>(st.st_size);
  if (f->size_ < 8) {
    ::close(fd);
    throw Error(path + ": too short for a safetensors header (" + std::to_string(f->size_) + " bytes)");
  }
  // MAP_PRIVATE read-only: pages come from the page cache, so loading costs no second copy.
  f->map_ = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (f->map_ == MAP_FAILED) {
    f->map_ = nullptr;
    throw Error(path + ": mmap failed: " + std::strerror(errno));
  }
  f->header_ = st_parse(static_cast<const uint8_t*>(f->map_), f->size_, path);
  for (std::size_t i = 0; i < f->header_.tensors.size(); ++i) f->index_[f->header_.tensors[i].name] = i;
  return f;
}

StFile::~StFile() {
  if (map_) ::munmap(map_, size_);
}

const StTensorInfo* StFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

StCheckpoint StCheckpoint::open(const std::string& dir) {
  StCheckpoint c;
  c.dir_ = dir;
  const std::string index_path = dir + "/model.safetensors.index.json";
  std::ifstream idx(index_path);
  if (!idx) {
    c.files_.push_back(StFile::open(dir + "/model.safetensors"));
    for (const auto& t : c.files_[0]->header().tensors) c.where_[t.name] = 0;
    return c;
  }
  std::stringstream ss;
  ss << idx.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str());
  } catch (const std::exception& e) {
    throw Error(index_path + ": not valid JSON: " + e.what());
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw Error(index_path + ": field 'weight_map': missing or not an object");
  std::map<std::string, std::size_t> file_index;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it->is_string()) throw Error(index_path + ": field 'weight_map." + it.key() + "': must be a file name");
    const std::string file = it->get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos || file == "..")
      throw Error(index_path + ": field 'weight_map." + it.key() + "': bad shard name '" + file + "'");
    auto f = file_index.find(file);
    if (f == file_index.end()) {
      c.files_.push_back(StFile::open(dir + "/" + file));
      f = file_index.emplace(file, c.files_.size() - 1).first;
    }
    if (!c.files_[f->second]->find(it.key()))
      throw Error(c.files_[f->second]->path() + ": tensor '" + it.key() + "' listed in " + index_path + " is absent");
    c.where_[it.key()] = f->second;
  }
  return c;
}

bool StCheckpoint::has(const std::string& name) const { return where_.count(name) > 0; }

StCheckpoint::Entry StCheckpoint::get(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) {
    std::string files;
    for (const auto& f : files_) files += (files.empty() ? "" : ", ") + f->path();
    throw Error(files + ": tensor '" + name + "' is missing from the checkpoint");
  }
  const auto& f = files_[it->second];
  const StTensorInfo* info = f->find(name);
  return Entry{info, f->data(*info), &f->path()};
}

std::vector<std::string> StCheckpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [n, i] : where_) out.push_back(n);
  return out;
}

void st_write(const std::string& path, const std::vector<StWriteSpec>& specs, const StFill& fill,
              const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<uint64_t> sizes;
  uint64_t offset = 0;
  for (const auto& s : specs) {
    const std::size_t elem = st_dtype_size(s.dtype);
    if (elem == 0) throw Error(path + ": tensor '" + s.name + "': field 'dtype': unknown dtype '" + s.dtype + "'");
    uint64_t n = elem;
    for (int64_t d : s.shape) n *= static_cast<uint64_t>(d);
    header[s.name] = {{"dtype", s.dtype}, {"shape", s.shape}, {"data_offsets", {offset, offset + n}}};
    sizes.push_back(n);
    offset += n;
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h.push_back(' ');  // keeps the data 8-byte aligned
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error(tmp + ": cannot create");
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(static_cast<uint64_t>(h.size()) >> (8 * i));
    out.write(reinterpret_cast<const char*>(len), 8);
    out.write(h.data(), static_cast<std::streamsize>(h.size()));
    std::string bytes;
    for (std::size_t i = 0; i < specs.size(); ++i) {
      bytes.clear();
      fill(i, bytes);
      if (bytes.size() != sizes[i]) {
        out.close();
        std::remove(tmp.c_str());
        throw Error(path + ": tensor '" + specs[i].name + "': produced " + std::to_string(bytes.size()) +
                    " bytes, expected " + std::to_string(sizes[i]));
      }
      out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    }
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      throw Error(tmp + ": write failed");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw Error(path + ": rename failed: " + std::strerror(errno));
}

}  // namespace kf::policy
