// KernelDb implementation. Segment layout after the segment header:
//   Header | KEntry[capacity] | source[capacity][source_bytes]
#include "kf/replay/replay.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "kf/common/error.h"
#include "kf/common/log.h"
#include "kf/common/run_dir.h"
#include "segment.h"
#include "shm_util.h"

namespace fs = std::filesystem;

namespace kf::replay {
using namespace detail;

namespace {
struct KEntry {
  std::atomic<uint32_t> state;  // 0 free, 1 valid (stored last)
  uint32_t source_len;
  uint64_t task_hash;
  uint64_t source_hash;
  double speedup;
  int64_t policy_version;
  uint64_t seq;
  char task[128];
};
uint64_t task_hash(const std::string& t) { return hash_bytes(t.data(), t.size(), 0x7461736b); }
uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
}  // namespace

uint64_t kernel_source_hash(const std::string& source) { return hash_bytes(source.data(), source.size(), 0x6b65726e); }

struct KernelDb::Header {
  uint32_t capacity, source_bytes, max_per_task, pad;
  uint64_t entries_off, source_off;
  alignas(64) pthread_mutex_t mu;
  uint64_t next_seq;
  std::atomic<uint64_t> inserted, duplicates, rejected_slower, rejected_full, evicted, too_large, recoveries;
  KEntry* entry(uint32_t i) {
    return reinterpret_cast<KEntry*>(reinterpret_cast<char*>(this) - kSegmentHeaderBytes + entries_off) + i;
  }
  char* source(uint32_t i) {
    return reinterpret_cast<char*>(this) - kSegmentHeaderBytes + source_off + static_cast<uint64_t>(i) * source_bytes;
  }
};

#define KF_KDB_LOCK(h) RobustLock lock_(&(h)->mu, "kernel database", nullptr, &(h)->recoveries)

KernelDb::Header* KernelDb::hdr() const { return static_cast<Header*>(segment_body(seg_)); }

static std::size_t segment_bytes(const KernelDbConfig& cfg) {
  uint64_t off = align_up(kSegmentHeaderBytes + sizeof(KernelDb::Header), 64);
  off = align_up(off + sizeof(KEntry) * cfg.capacity, 4096);
  return off + static_cast<uint64_t>(cfg.source_bytes) * cfg.capacity;
}

KernelDb KernelDb::create(const std::string& name, const KernelDbConfig& cfg, const SegmentOptions* opt) {
  if (cfg.capacity == 0 || cfg.source_bytes == 0 || cfg.max_per_task == 0)
    throw Error("replay: kernel database '" + name + "': capacity, source_bytes and max_per_task must be > 0");
  KernelDb db;
  db.seg_ = create_segment(name, SegmentKind::KernelDb, segment_bytes(cfg), opt ? *opt : SegmentOptions{});
  Header* h = new (segment_body(db.seg_)) Header();
  h->capacity = cfg.capacity;
  h->source_bytes = cfg.source_bytes;
  h->max_per_task = cfg.max_per_task;
  uint64_t off = align_up(kSegmentHeaderBytes + sizeof(Header), 64);
  h->entries_off = off;
  h->source_off = align_up(off + sizeof(KEntry) * cfg.capacity, 4096);
  robust_mutex_init(&h->mu);
  for (uint32_t i = 0; i < cfg.capacity; ++i) new (h->entry(i)) KEntry();
  mark_segment_ready(db.seg_);
  return db;
}

KernelDb KernelDb::attach(const std::string& name, Timeout wait_ready) {
  KernelDb db;
  db.seg_ = attach_segment(name, SegmentKind::KernelDb, wait_ready);
  Header* h = db.hdr();
  if (segment_bytes(KernelDbConfig{h->capacity, h->source_bytes, h->max_per_task}) != segment_size(db.seg_))
    throw Error("replay: kernel database '" + name + "': field capacity/source_bytes disagree with the segment size");
  return db;
}

namespace {
bool same_task(KEntry* e, uint64_t th, const std::string& task) {
  return e->task_hash == th && std::strncmp(e->task, task.c_str(), sizeof e->task) == 0;
}
KernelEntry to_entry(KernelDb::Header* h, uint32_t i) {
  KEntry* e = h->entry(i);
  KernelEntry k;
  k.task.assign(e->task, strnlen(e->task, sizeof e->task));
  k.speedup = e->speedup;
  k.policy_version = e->policy_version;
  k.source.assign(h->source(i), std::min(e->source_len, h->source_bytes));
  k.source_hash = e->source_hash;
  return k;
}
}  // namespace

InsertOutcome KernelDb::insert(const KernelEntry& in) {
  if (in.task.empty() || in.task.size() >= 128)
    throw Error("replay: kernel database: task name '" + in.task + "' must be 1..127 chars");
  if (in.source.empty()) throw Error("replay: kernel database: empty source for task " + in.task);
  Header* h = hdr();
  if (in.source.size() > h->source_bytes) {
    h->too_large.fetch_add(1, std::memory_order_relaxed);
    return InsertOutcome::too_large;
  }
  const uint64_t th = task_hash(in.task), sh = kernel_source_hash(in.source);
  KF_KDB_LOCK(h);
  int64_t free_idx = -1, slowest = -1;
  uint32_t in_task = 0;
  struct TaskCount {
    uint32_t first = 0;   // entries
    int64_t second = -1;  // index of its slowest
  };
  std::map<uint64_t, TaskCount> per_task;  // task hash -> count and slowest entry
  for (uint32_t i = 0; i < h->capacity; ++i) {
    KEntry* e = h->entry(i);
    if (e->state.load(std::memory_order_relaxed) != 1) {
      if (free_idx < 0) free_idx = i;
      continue;
    }
    auto& pt = per_task[e->task_hash];
    ++pt.first;
    if (pt.second < 0 || e->speedup < h->entry(static_cast<uint32_t>(pt.second))->speedup) pt.second = i;
    if (!same_task(e, th, in.task)) continue;
    ++in_task;
    if (e->source_hash == sh && e->source_len == in.source.size() &&
        std::memcmp(h->source(i), in.source.data(), in.source.size()) == 0) {
      h->duplicates.fetch_add(1, std::memory_order_relaxed);
      return InsertOutcome::duplicate;
    }
    if (slowest < 0 || e->speedup < h->entry(static_cast<uint32_t>(slowest))->speedup) slowest = i;
  }
  int64_t target = -1;
  if (in_task >= h->max_per_task) {
    if (in.speedup <= h->entry(static_cast<uint32_t>(slowest))->speedup) {
      h->rejected_slower.fetch_add(1, std::memory_order_relaxed);
      return InsertOutcome::rejected_slower;
    }
    target = slowest;
  } else if (free_idx >= 0) {
    target = free_idx;
  } else {
    uint32_t most = 1;
    for (auto& [hash, pt] : per_task)
      if (pt.first > most) {
        most = pt.first;
        target = pt.second;
      }
    if (target < 0) {
      h->rejected_full.fetch_add(1, std::memory_order_relaxed);
      return InsertOutcome::rejected_full;
    }
  }
  KEntry* e = h->entry(static_cast<uint32_t>(target));
  if (e->state.load(std::memory_order_relaxed) == 1) h->evicted.fetch_add(1, std::memory_order_relaxed);
  e->state.store(0, std::memory_order_release);
  e->task_hash = th;
  e->source_hash = sh;
  e->speedup = in.speedup;
  e->policy_version = in.policy_version;
  e->seq = h->next_seq++;
  std::memset(e->task, 0, sizeof e->task);
  std::memcpy(e->task, in.task.data(), in.task.size());
  e->source_len = static_cast<uint32_t>(in.source.size());
  char* dst = h->source(static_cast<uint32_t>(target));
  std::memcpy(dst, in.source.data(), in.source.size() / 2);
  stall_point("kdb.insert_mid");
  std::memcpy(dst + in.source.size() / 2, in.source.data() + in.source.size() / 2,
              in.source.size() - in.source.size() / 2);
  e->state.store(1, std::memory_order_release);
  h->inserted.fetch_add(1, std::memory_order_relaxed);
  return InsertOutcome::inserted;
}

std::vector<KernelEntry> KernelDb::entries(const std::string& task) const {
  Header* h = hdr();
  const uint64_t th = task_hash(task);
  std::vector<KernelEntry> out;
  {
    KF_KDB_LOCK(h);
    for (uint32_t i = 0; i < h->capacity; ++i) {
      KEntry* e = h->entry(i);
      if (e->state.load(std::memory_order_acquire) == 1 && same_task(e, th, task)) out.push_back(to_entry(h, i));
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const KernelEntry& a, const KernelEntry& b) { return a.speedup < b.speedup; });
  return out;
}

std::optional<KernelEntry> KernelDb::best(const std::string& task) const {
  auto all = entries(task);
  if (all.empty()) return std::nullopt;
  return all.back();
}

std::vector<KernelEntry> KernelDb::exemplars(const std::string& task, std::size_t k, uint64_t seed) const {
  auto all = entries(task);
  if (k == 0) return {};
  if (all.size() <= k) return all;
  std::mt19937_64 rng(seed);
  std::vector<KernelEntry> out;
  const std::size_t n = all.size();
  for (std::size_t b = 0; b < k; ++b) {
    std::size_t lo = b * n / k, hi = (b + 1) * n / k;  // bucket b: [lo, hi), never empty since n > k
    std::uniform_int_distribution<std::size_t> pick(lo, hi - 1);
    out.push_back(all[pick(rng)]);
  }
  return out;
}

std::vector<std::string> KernelDb::tasks() const {
  Header* h = hdr();
  std::vector<std::string> out;
  KF_KDB_LOCK(h);
  for (uint32_t i = 0; i < h->capacity; ++i) {
    KEntry* e = h->entry(i);
    if (e->state.load(std::memory_order_acquire) != 1) continue;
    std::string t(e->task, strnlen(e->task, sizeof e->task));
    if (std::find(out.begin(), out.end(), t) == out.end()) out.push_back(t);
  }
  std::sort(out.begin(), out.end());
  return out;
}

KernelDbStats KernelDb::stats() const {
  Header* h = hdr();
  KernelDbStats s;
  for (uint32_t i = 0; i < h->capacity; ++i) s.entries += h->entry(i)->state.load() == 1;
  s.inserted = h->inserted.load();
  s.duplicates = h->duplicates.load();
  s.rejected_slower = h->rejected_slower.load();
  s.rejected_full = h->rejected_full.load();
  s.evicted = h->evicted.load();
  s.too_large = h->too_large.load();
  s.recoveries = h->recoveries.load();
  return s;
}

std::size_t KernelDb::seed_from_dir(const std::string& dir) {
  if (!fs::is_directory(dir)) throw Error(dir + ": kernel seed folder does not exist");
  std::vector<fs::path> files;
  for (const auto& task_dir : fs::directory_iterator(dir)) {
    if (!task_dir.is_directory()) continue;
    for (const auto& f : fs::directory_iterator(task_dir.path())) {
      auto ext = f.path().extension().string();
      if (f.is_regular_file() && (ext == ".cu" || ext == ".cpp" || ext == ".c")) files.push_back(f.path());
    }
  }
  std::sort(files.begin(), files.end());
  std::vector<KernelEntry> todo;
  for (const auto& f : files) {
    KernelEntry e;
    e.task = f.parent_path().filename().string();
    e.source = read_file(f.string());
    e.speedup = 1.0;
    e.policy_version = -1;
    fs::path meta = f;
    meta.replace_extension(".json");
    if (fs::exists(meta)) {
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(read_file(meta.string()));
      } catch (const nlohmann::json::exception& ex) {
        throw Error(meta.string() + ": not valid JSON: " + ex.what());
      }
      if (j.contains("speedup")) {
        if (!j["speedup"].is_number()) throw Error(meta.string() + ": field speedup: must be a number");
        e.speedup = j["speedup"].get<double>();
      }
      if (j.contains("policy_version")) {
        if (!j["policy_version"].is_number_integer())
          throw Error(meta.string() + ": field policy_version: must be an integer");
        e.policy_version = j["policy_version"].get<int64_t>();
      }
    }
    todo.push_back(std::move(e));
  }
  for (auto& e : todo) insert(e);
  return todo.size();
}

void KernelDb::save(const std::string& path) const {
  nlohmann::json j;
  j["format"] = "kf-kernel-db";
  j["version"] = 1;
  j["entries"] = nlohmann::json::array();
  for (const auto& t : tasks())
    for (const auto& e : entries(t)) {
      char hex[17];
      std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(e.source_hash));
      j["entries"].push_back({{"task", e.task},
                              {"speedup", e.speedup},
                              {"policy_version", e.policy_version},
                              {"hash", hex},
                              {"source", e.source}});
    }
  write_file_atomic(path, j.dump(1));
}

std::size_t KernelDb::load(const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& ex) {
    throw Error(path + ": not valid JSON: " + ex.what());
  }
  if (!j.is_object() || j.value("format", "") != "kf-kernel-db")
    throw Error(path + ": field format: expected \"kf-kernel-db\"");
  if (!j.contains("version") || !j["version"].is_number_integer() || j["version"].get<int>() != 1)
    throw Error(path + ": field version: expected 1");
  if (!j.contains("entries") || !j["entries"].is_array()) throw Error(path + ": field entries: expected an array");
  std::vector<KernelEntry> todo;
  std::size_t n = 0;
  for (const auto& x : j["entries"]) {
    const std::string at = path + ": entries[" + std::to_string(n++) + "]";
    auto need = [&](const char* f, bool ok) {
      if (!x.contains(f) || !ok) throw Error(at + ": field " + f + ": missing or of the wrong type");
    };
    need("task", x.contains("task") && x["task"].is_string());
    need("speedup", x.contains("speedup") && x["speedup"].is_number());
    need("policy_version", x.contains("policy_version") && x["policy_version"].is_number_integer());
    need("source", x.contains("source") && x["source"].is_string());
    need("hash", x.contains("hash") && x["hash"].is_string());
    KernelEntry e;
    e.task = x["task"].get<std::string>();
    e.speedup = x["speedup"].get<double>();
    e.policy_version = x["policy_version"].get<int64_t>();
    e.source = x["source"].get<std::string>();
    if (e.task.empty() || e.task.size() >= 128) throw Error(at + ": field task: must be 1..127 chars");
    if (e.source.empty()) throw Error(at + ": field source: empty");
    if (!std::isfinite(e.speedup)) throw Error(at + ": field speedup: not finite");
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(kernel_source_hash(e.source)));
    if (x["hash"].get<std::string>() != hex) throw Error(at + ": field hash: does not match the source (corrupt file)");
    todo.push_back(std::move(e));
  }
  for (auto& e : todo) insert(e);
  return todo.size();
}

}  // namespace kf::replay
