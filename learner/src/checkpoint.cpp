#include "checkpoint.h"
#include "kf/learner/learner.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>

#include "kf/common/error.h"
#include "kf/common/log.h"
#include "kf/common/run_dir.h"
#include "kf/policy/policy.h"

namespace kf::learner {
namespace {

constexpr uint64_t P1 = 11400714785074694791ULL, P2 = 14029467366897019727ULL, P3 = 1609587929392839161ULL,
                   P4 = 9650029242287828579ULL, P5 = 2870177450012600261ULL;
inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t rd64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline uint32_t rd32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint64_t round1(uint64_t acc, uint64_t in) { return rotl(acc + in * P2, 31) * P1; }
inline uint64_t merge(uint64_t acc, uint64_t v) { return (acc ^ round1(0, v)) * P1 + P4; }

void fsync_path(const std::string& path, bool dir) {
  const int fd = ::open(path.c_str(), dir ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) throw Error("checkpoint: open " + path + " for fsync: " + std::strerror(errno));
  ::fsync(fd);
  ::close(fd);
}

void write_plain(const std::string& path, const std::string& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw Error("checkpoint: create " + path + ": " + std::strerror(errno));
  std::size_t off = 0;
  while (off < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (w <= 0) {
      ::close(fd);
      throw Error("checkpoint: write " + path + ": " + std::strerror(errno));
    }
    off += static_cast<std::size_t>(w);
  }
  ::fsync(fd);
  ::close(fd);
}

void write_tensors(const std::string& path, const NamedTensors& tensors) {
  std::vector<policy::StWriteSpec> specs;
  for (const auto& [name, t] : tensors)
    specs.push_back({name, policy::safetensors_dtype(t.scalar_type()), t.sizes().vec()});
  policy::st_write(path, specs, [&](std::size_t i, std::string& bytes) {
    const auto cpu = tensors[i].second.detach().to(torch::kCPU).contiguous();
    bytes.assign(static_cast<const char*>(cpu.data_ptr()), cpu.numel() * cpu.element_size());
  });
}

void mkdir_p(const std::string& dir) {
  for (std::size_t i = 1; i <= dir.size(); ++i)
    if (i == dir.size() || dir[i] == '/') ::mkdir(dir.substr(0, i).c_str(), 0755);
}

bool is_dir(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// "step-" + 12 digits exactly: a folder set aside (step-...corrupt-...) is not a checkpoint.
bool is_checkpoint_name(const std::string& n) {
  if (n.size() != 17 || n.rfind("step-", 0) != 0) return false;
  return std::all_of(n.begin() + 5, n.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Checkpoints this process wrote or verified, so keep-N does not re-hash them every time.
std::mutex g_known_mu;
std::set<std::string> g_known_valid;
void remember_valid(const std::string& path) {
  std::lock_guard<std::mutex> l(g_known_mu);
  g_known_valid.insert(path);
}
void forget(const std::string& path) {
  std::lock_guard<std::mutex> l(g_known_mu);
  g_known_valid.erase(path);
}
bool known_valid(const std::string& path) {
  std::lock_guard<std::mutex> l(g_known_mu);
  return g_known_valid.count(path) > 0;
}

void verify_manifest(const std::string& path, bool hashes);

// Valid or not, checked now: a checkpoint this process wrote or verified before gets the
// cheap check (manifest and file sizes), any other the full one (hashes too). A corrupt
// one is set aside and false returned.
bool valid_or_set_aside(const std::string& path) {
  try {
    verify_manifest(path, /*hashes=*/!known_valid(path));
    remember_valid(path);
    return true;
  } catch (const std::exception& e) {
    set_aside_corrupt(path, e.what());
    return false;
  }
}

}  // namespace

uint64_t hash64(const void* data, std::size_t len, uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  const unsigned char* end = p + len;
  uint64_t h;
  if (len >= 32) {
    uint64_t v1 = seed + P1 + P2, v2 = seed + P2, v3 = seed, v4 = seed - P1;
    const unsigned char* limit = end - 32;
    do {
      v1 = round1(v1, rd64(p));
      v2 = round1(v2, rd64(p + 8));
      v3 = round1(v3, rd64(p + 16));
      v4 = round1(v4, rd64(p + 24));
      p += 32;
    } while (p <= limit);
    h = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18);
    h = merge(h, v1);
    h = merge(h, v2);
    h = merge(h, v3);
    h = merge(h, v4);
  } else {
    h = seed + P5;
  }
  h += static_cast<uint64_t>(len);
  while (p + 8 <= end) {
    h ^= round1(0, rd64(p));
    h = rotl(h, 27) * P1 + P4;
    p += 8;
  }
  if (p + 4 <= end) {
    h ^= static_cast<uint64_t>(rd32(p)) * P1;
    h = rotl(h, 23) * P2 + P3;
    p += 4;
  }
  while (p < end) {
    h ^= (*p) * P5;
    h = rotl(h, 11) * P1;
    ++p;
  }
  h ^= h >> 33;
  h *= P2;
  h ^= h >> 29;
  h *= P3;
  h ^= h >> 32;
  return h;
}

uint64_t hash_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  ::fstat(fd, &st);
  if (st.st_size == 0) {
    ::close(fd);
    return hash64(nullptr, 0);
  }
  void* m = ::mmap(nullptr, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) throw Error(path + ": mmap failed: " + std::strerror(errno));
  ::madvise(m, st.st_size, MADV_SEQUENTIAL);
  const uint64_t h = hash64(m, st.st_size);
  ::munmap(m, st.st_size);
  return h;
}

void remove_tree(const std::string& path) {
  ::nftw(
      path.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }, 16,
      FTW_DEPTH | FTW_PHYS);
}

std::string checkpoint_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%012lld", static_cast<long long>(step));
  return buf;
}

std::string write_checkpoint(const std::string& dir, const CheckpointData& data, int64_t keep) {
  mkdir_p(dir);
  // Temp folders of writers that died mid-checkpoint.
  for (const auto& n : list_dir(dir)) {
    if (n.rfind(".tmp-", 0) != 0) continue;
    const auto dash = n.rfind('-');
    const int pid = std::atoi(n.c_str() + dash + 1);
    if (pid > 0 && pid != ::getpid() && ::kill(pid, 0) != 0) {
      log_warn("learner checkpoint: removing ", dir, "/", n, " left by dead writer pid ", pid);
      remove_tree(dir + "/" + n);
    }
  }
  const std::string name = checkpoint_name(data.step);
  const std::string tmp = dir + "/.tmp-" + name + "-" + std::to_string(::getpid());
  remove_tree(tmp);
  if (::mkdir(tmp.c_str(), 0755) != 0) throw Error("checkpoint: mkdir " + tmp + ": " + std::strerror(errno));
  write_tensors(tmp + "/model.safetensors", data.model);
  write_tensors(tmp + "/optimizer.safetensors", data.optimizer);
  if (!data.reference.empty()) write_tensors(tmp + "/reference.safetensors", data.reference);
  write_plain(tmp + "/state.json", data.state_json);
  write_plain(tmp + "/config.json", data.model_config_json);
  if (!data.tokenizer_json.empty()) write_plain(tmp + "/tokenizer.json", data.tokenizer_json);
  if (data.extra) data.extra(tmp);
  nlohmann::json files = nlohmann::json::object();
  for (const auto& n : list_dir(tmp)) {
    const std::string p = tmp + "/" + n;
    struct stat st {};
    ::stat(p.c_str(), &st);
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash_file(p)));
    files[n] = {{"bytes", static_cast<uint64_t>(st.st_size)}, {"xxh64", hex}};
    fsync_path(p, false);
  }
  nlohmann::json manifest = {
      {"format", "kf-learner-checkpoint"}, {"version", 1}, {"step", data.step}, {"files", files}};
  write_plain(tmp + "/MANIFEST.json", manifest.dump(1));
  fsync_path(tmp, true);
  const std::string final_path = dir + "/" + name;
  // A rewrite of the same step (e.g. the final checkpoint) replaces a valid folder; a
  // corrupt one of that step is set aside, never overwritten.
  if (is_dir(final_path) && valid_or_set_aside(final_path)) {
    forget(final_path);
    remove_tree(final_path);
  }
  if (::rename(tmp.c_str(), final_path.c_str()) != 0)
    throw Error("checkpoint: rename " + tmp + " -> " + final_path + ": " + std::strerror(errno));
  fsync_path(dir, true);
  remember_valid(final_path);
  // Keep the newest `keep` VALID checkpoints, the one just written first: a corrupt folder
  // is set aside (not counted as kept), so cleanup never deletes the last good one.
  if (keep > 0) {
    auto all = list_checkpoints(dir);
    int64_t kept = 1;
    for (auto it = all.rbegin(); it != all.rend(); ++it) {
      if (it->path == final_path) continue;
      if (kept < keep) {
        if (valid_or_set_aside(it->path)) ++kept;
        continue;
      }
      forget(it->path);
      remove_tree(it->path);
    }
  }
  return final_path;
}

std::string set_aside_corrupt(const std::string& path, const std::string& why) {
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm);
  std::string to = path + ".corrupt-" + stamp;
  for (int n = 2; ::access(to.c_str(), F_OK) == 0; ++n) to = path + ".corrupt-" + stamp + "-" + std::to_string(n);
  forget(path);
  if (::rename(path.c_str(), to.c_str()) != 0) {
    log_error("learner checkpoint: ", path, " is unusable (", why, ") and could not be renamed to ", to, ": ",
              std::strerror(errno), "; left in place");
    return path;
  }
  log_warn("learner checkpoint: ", path, " is unusable (", why, "); renamed to ", to, " (kept for inspection)");
  return to;
}

std::vector<CheckpointCheck> check_checkpoints(const std::string& dir) {
  std::vector<CheckpointCheck> out;
  auto all = list_checkpoints(dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    CheckpointCheck c{it->path, it->step, ""};
    try {
      verify_checkpoint(it->path);
    } catch (const std::exception& e) {
      c.error = e.what();
    }
    out.push_back(std::move(c));
  }
  return out;
}

void verify_checkpoint(const std::string& path) { verify_manifest(path, true); }

namespace {
void verify_manifest(const std::string& path, bool hashes) {
  const std::string mpath = path + "/MANIFEST.json";
  struct stat st {};
  if (::stat(mpath.c_str(), &st) != 0) throw Error(mpath + ": missing (partial checkpoint)");
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(read_file(mpath));
  } catch (const nlohmann::json::exception& e) {
    throw Error(mpath + ": not valid JSON: " + e.what());
  }
  if (m.value("format", "") != "kf-learner-checkpoint" || !m.contains("files") || !m["files"].is_object())
    throw Error(mpath + ": field 'format'/'files': not a learner checkpoint manifest");
  for (const char* required : {"model.safetensors", "optimizer.safetensors", "state.json", "config.json"})
    if (!m["files"].contains(required)) throw Error(mpath + ": field 'files': lists no " + std::string(required));
  for (const auto& [n, f] : m["files"].items()) {
    const std::string p = path + "/" + n;
    if (::stat(p.c_str(), &st) != 0) throw Error(p + ": missing");
    if (static_cast<uint64_t>(st.st_size) != f.at("bytes").get<uint64_t>())
      throw Error(p + ": size " + std::to_string(st.st_size) + " != manifest " +
                  std::to_string(f.at("bytes").get<uint64_t>()) + " (truncated)");
    if (!hashes) continue;
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash_file(p)));
    if (f.at("xxh64").get<std::string>() != hex)
      throw Error(p + ": xxh64 " + hex + " != manifest " + f.at("xxh64").get<std::string>() + " (corrupt)");
  }
}
}  // namespace

std::vector<CheckpointRef> list_checkpoints(const std::string& dir) {
  std::vector<CheckpointRef> out;
  for (const auto& n : list_dir(dir)) {
    if (!is_checkpoint_name(n) || !is_dir(dir + "/" + n)) continue;
    out.push_back({dir + "/" + n, std::atoll(n.c_str() + 5)});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
  return out;
}

std::optional<CheckpointRef> find_latest_valid(const std::string& dir) {
  auto all = list_checkpoints(dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      verify_checkpoint(it->path);
      remember_valid(it->path);
      return *it;
    } catch (const std::exception& e) {
      const bool more = std::next(it) != all.rend();
      log_warn("learner checkpoint: ", it->path, " is unusable: ", e.what(), "; ",
               more ? "falling back to " + std::next(it)->path : std::string("no older checkpoint left"));
      set_aside_corrupt(it->path, e.what());
    }
  }
  return std::nullopt;
}

std::map<std::string, torch::Tensor> read_tensors(const std::string& file) {
  auto f = policy::StFile::open(file);
  std::map<std::string, torch::Tensor> out;
  for (const auto& t : f->header().tensors) {
    const auto dtype = policy::dtype_from_name(t.dtype, file + ": tensor '" + t.name + "'");
    out[t.name] = torch::from_blob(const_cast<void*>(f->data(t)), t.shape, torch::TensorOptions().dtype(dtype)).clone();
  }
  return out;
}

}  // namespace kf::learner
