// RunShmConfig from the run's config (the replay.* keys of config_schema.cpp).
#include "kf/common/config.h"
#include "kf/common/error.h"
#include "kf/replay/replay.h"

namespace kf::replay {
namespace {

uint32_t u32(const Config& c, const std::string& key, uint64_t lo, uint64_t hi) {
  const int64_t v = c.get_int(key);
  if (v < int64_t(lo) || uint64_t(v) > hi)
    throw error_at(c.source(), key + ": " + std::to_string(v) + " is outside [" + std::to_string(lo) + ", " +
                                   std::to_string(hi) + "]");
  return uint32_t(v);
}

}  // namespace

RunShmConfig run_shm_config(const Config& c) {
  RunShmConfig r;
  r.candidates.capacity = u32(c, "replay.candidate_queue.capacity", 2, 1u << 20);
  // The candidate queue's slots hold one handle each (RunShm, kf/replay/replay.h); a candidate's size is
  // bounded by replay.groups.group_bytes. A config that still sizes the slots is refused.
  const char* slot_key = "replay.candidate_queue.slot_bytes";
  for (const auto& k : config_schema())
    if (k.path == slot_key && c.get_int(slot_key) != std::stoll(k.fallback))
      throw error_at(c.source(), std::string(slot_key) +
                                     ": no longer used: the candidate queue carries fixed-size handles and each "
                                     "candidate lives in its replay group (sized by replay.groups.group_bytes); "
                                     "remove the key");
  r.candidates.max_claims = u32(c, "replay.candidate_queue.max_claims", 0, 1000);
  r.replay.capacity = u32(c, "replay.groups.capacity", 1, 1u << 16);
  r.replay.group_bytes = u32(c, "replay.groups.group_bytes", 4096, 1u << 30);
  r.kernels.capacity = u32(c, "replay.kernels.capacity", 1, 1u << 20);
  r.kernels.source_bytes = u32(c, "replay.kernels.source_bytes", 1024, 16u << 20);
  r.kernels.max_per_task = u32(c, "replay.kernels.max_per_task", 1, 1u << 16);
  const int64_t snap = c.get_int("replay.snapshot.max_bytes");
  if (snap < 4096) throw error_at(c.source(), "replay.snapshot.max_bytes: must be at least 4096");
  r.snapshot.max_bytes = uint64_t(snap);
  r.stale_after = std::chrono::milliseconds(u32(c, "replay.stale_after_ms", 100, 86400000));
  return r;
}

}  // namespace kf::replay
