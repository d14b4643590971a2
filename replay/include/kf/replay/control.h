// ControlBlock: the run's small shared state: run state (running / draining /
// stopped), a table of registered processes with heartbeats and counters, and
// rendezvous slots for small blobs every rank must agree on (e.g. the 128-byte NCCL
// unique id).
//
// Liveness: a peer is alive while its pid + start time exist and its heartbeat is
// younger than the timeout the caller gives; a dead peer's table entry is reused by
// the next register_process(). Counters are per process, so a dead process's counts
// stay readable after it is gone.
//
// Contract: any thread of any attached process. Registration and rendezvous writes
// take a robust mutex (rare); heartbeats, counters and state are lock-free atomics.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kf/replay/segment.h"

namespace kf::replay {

enum class RunState : uint32_t { starting = 0, running = 1, draining = 2, stopped = 3 };
const char* run_state_name(RunState s);

struct PeerInfo {
  int slot = -1;
  int32_t pid = 0;
  std::string role;
  int32_t id = 0;
  int64_t heartbeat_age_ns = 0;
  bool alive = false;  // process exists (pid + start time)
  bool fresh = false;  // alive and heartbeat within the timeout
  std::vector<uint64_t> counters;
};

class ControlBlock {
 public:
  static constexpr int kMaxProcs = 128;
  static constexpr int kCounters = 12;  // 0-7: meaning chosen by each role (documented there)
  // 8-10 mean the same in every role, in milliseconds: working (actor: generating;
  // evaluator: verifying; learner: training steps, without waiting for groups), compiling
  // (evaluator), waiting for the GPU timing lock (actor, learner). 11 is free.
  static constexpr int kWorkMs = 8, kCompileMs = 9, kGpuWaitMs = 10;
  static constexpr int kRendezvous = 8;
  static constexpr int kRendezvousBytes = 256;

  static std::size_t segment_bytes();
  static ControlBlock create(const std::string& name, const SegmentOptions& opt = {});
  static ControlBlock attach(const std::string& name, Timeout wait_ready = std::chrono::seconds(10));

  RunState state() const;
  void set_state(RunState s);  // wakes wait_state()
  // Blocks until state() != `from` or the timeout passes; returns the state then.
  RunState wait_state_change(RunState from, Timeout timeout) const;

  // Claims a table entry for this process (reusing a dead one). Returns its slot.
  // Throws kf::Error if all kMaxProcs entries belong to live processes.
  int register_process(const std::string& role, int32_t id);
  void unregister_process(int slot);
  void heartbeat(int slot);
  void add_counter(int slot, int counter, uint64_t delta);
  std::vector<PeerInfo> peers(Timeout heartbeat_timeout) const;
  // The newest heartbeat of any live registered process (0: none).
  int64_t newest_heartbeat_ns() const;

  // Rendezvous: put() publishes bytes under a key (<= 31 chars, <= 256 bytes);
  // get() waits up to `timeout` for the key and returns a consistent copy.
  void rendezvous_put(const std::string& key, const void* data, std::size_t len);
  std::optional<std::string> rendezvous_get(const std::string& key, Timeout timeout) const;

  ShmSegment& segment() { return seg_; }
  struct Header;

 private:
  ControlBlock() = default;
  Header* hdr() const;
  ShmSegment seg_;
};

}  // namespace kf::replay
