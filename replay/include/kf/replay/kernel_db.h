// KernelDb: per task, the verified kernels found so far, with speedup, policy
// version and source, in shared memory so actors (prompts) and evaluators (inserts)
// of all processes see one database.
//
// Queries: best(task) for export; exemplars(task, k) for contrastive prompts, using
// CUDA-L1's bucketed sampling: the task's kernels sorted by speedup are cut into k
// equal-count buckets and one kernel is drawn from each, so a prompt shows slow,
// middling and fast solutions side by side (returned in ascending speedup).
// Dedup: a source identical to one already stored for the task (64-bit content hash,
// then a byte compare) is not stored again; the duplicate is counted.
//
// Capacity and eviction: `capacity` entries of up to `source_bytes` of source. A task
// holds at most `max_per_task`; a full task replaces its slowest kernel only with a
// faster one. A full table evicts the slowest kernel of the task that holds the most
// (never a task's only kernel; if every task holds one, the insert is rejected_full).
// Every rejection and eviction is counted.
//
// Robustness: all access under a robust mutex; an entry becomes visible by one store
// of its state word after its fields and source are written, so a process killed
// mid-insert leaves no half entry. Contract: any thread of any attached process.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kf/replay/segment.h"

namespace kf::replay {

struct KernelDbConfig {
  uint32_t capacity = 2048;
  uint32_t source_bytes = 64 * 1024;
  uint32_t max_per_task = 64;
};

struct KernelEntry {
  std::string task;
  double speedup = 0;
  int64_t policy_version = -1;  // -1: seeded from files
  std::string source;
  uint64_t source_hash = 0;
};

struct KernelDbStats {
  uint64_t entries = 0, inserted = 0, duplicates = 0, rejected_slower = 0, rejected_full = 0, evicted = 0;
  uint64_t too_large = 0, recoveries = 0;
};

enum class InsertOutcome { inserted, duplicate, rejected_slower, rejected_full, too_large };

class KernelDb {
 public:
  static std::size_t segment_bytes(const KernelDbConfig& cfg);
  static KernelDb create(const std::string& name, const KernelDbConfig& cfg, const SegmentOptions& opt = {});
  static KernelDb attach(const std::string& name, Timeout wait_ready = std::chrono::seconds(10));

  // Evaluator: adds a verified kernel. Throws kf::Error for an empty task/source or a
  // task name over 127 chars.
  InsertOutcome insert(const KernelEntry& e);
  std::optional<KernelEntry> best(const std::string& task) const;
  std::vector<KernelEntry> exemplars(const std::string& task, std::size_t k, uint64_t seed) const;
  std::vector<KernelEntry> entries(const std::string& task) const;  // ascending speedup
  std::vector<std::string> tasks() const;
  KernelDbStats stats() const;

  // Seeding: <dir>/<task>/<name>.{cu,cpp,c} with an optional <name>.json
  // {"speedup": 1.3, "policy_version": -1}. Returns how many files were read.
  std::size_t seed_from_dir(const std::string& dir);
  // Persistence: JSON {"format": "kf-kernel-db", "version": 1, "entries": [...]}
  // written atomically. load() validates every entry (including its hash) before
  // inserting any; bad input -> kf::Error naming the file, entry and field.
  void save(const std::string& path) const;
  std::size_t load(const std::string& path);

  const ShmSegment& segment() const { return seg_; }
  struct Header;

 private:
  KernelDb() = default;
  Header* hdr() const;
  ShmSegment seg_;
};

uint64_t kernel_source_hash(const std::string& source);

}  // namespace kf::replay
