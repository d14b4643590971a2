// SnapshotStore: the learner publishes flat policy weight blobs with a version;
// actors read a consistent copy of the newest one.
//
// Double buffer + per-buffer seqlock: publish() writes the buffer that is NOT the
// current one (its seq odd while writing), then flips `current`. Readers copy the
// current buffer and accept the copy only if its seq did not change, so they never
// see a torn blob and never block the writer; a reader retries only if two publishes
// land during one copy. A writer SIGKILLed mid-publish leaves the other (current)
// buffer intact; the next publisher fixes the odd seq and carries on.
//
// GPU readers: read_into() takes the copy function (e.g. a synchronous
// cudaMemcpy from this host mapping, after cudaHostRegister), and validates the seq
// after it returns, so the same protocol covers device copies.
//
// Contract: one publisher at a time (a robust mutex serialises publishers); any
// number of reader threads/processes. Copies use `threads` threads for big blobs.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kf/replay/segment.h"

namespace kf::replay {

struct SnapshotConfig {
  uint64_t max_bytes = 64ull << 20;  // largest blob
  bool prefault = false;             // MAP_POPULATE at create/attach (no first-touch faults later)
};

struct SnapshotInfo {
  int64_t version = -1;  // -1: nothing published yet
  uint64_t bytes = 0;
};

class SnapshotStore {
 public:
  using CopyFn = std::function<void(void* dst, const void* src, std::size_t n)>;

  static std::size_t segment_bytes(const SnapshotConfig& cfg);
  static SnapshotStore create(const std::string& name, const SnapshotConfig& cfg, const SegmentOptions& opt = {});
  static SnapshotStore attach(const std::string& name, Timeout wait_ready = std::chrono::seconds(10),
                              bool prefault = false);

  // Publishes `bytes` of `data` as `version` (versions should increase). Throws
  // kf::Error if bytes > max_bytes.
  void publish(int64_t version, const void* data, std::size_t bytes, int threads = 1);
  SnapshotInfo latest() const;  // cheap: version and size of the current buffer
  // Copies the newest blob into `out` (resized). Returns its info; version -1 if none.
  // Throws kf::Error if no consistent copy was obtained within `timeout`.
  SnapshotInfo read(std::vector<unsigned char>& out, int threads = 1, Timeout timeout = std::chrono::seconds(30)) const;
  // Same into caller memory of `capacity` bytes with a custom copy (GPU readers).
  SnapshotInfo read_into(void* dst, std::size_t capacity, const CopyFn& copy, Timeout timeout) const;
  uint64_t max_bytes() const;
  uint64_t publishes() const;
  uint64_t read_retries() const;

  const ShmSegment& segment() const { return seg_; }
  struct Header;

 private:
  SnapshotStore() = default;
  Header* hdr() const;
  unsigned char* buffer(int i) const;
  ShmSegment seg_;
};

// Multi-threaded memcpy used by publish/read (exposed for the benchmark).
void parallel_copy(void* dst, const void* src, std::size_t n, int threads);

}  // namespace kf::replay
