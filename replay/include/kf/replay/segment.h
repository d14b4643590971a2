// One named POSIX shared-memory segment (Boost.Interprocess shared_memory_object +
// mapped_region) with a fixed header: magic, layout version, component kind, size,
// the creator's identity (pid + start time), a run incarnation id and a ready flag.
//
// Why a header: workers attach by name only, so the segment itself must say what it
// is, who made it and whether it is finished; a later run with the same name uses the
// creator identity and heartbeat to tell a live segment from a stale one.
//
// Contract: create() is for the launcher (one process); attach() for any process.
// A ShmSegment object is used by one thread at a time; the memory it maps is shared
// and its users synchronise through the structures they place in it. The segment
// holds only plain data and integer offsets, never pointers.
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace kf::replay {

using Timeout = std::chrono::nanoseconds;

enum class SegmentKind : uint32_t { Control = 1, Queue = 2, Replay = 3, KernelDb = 4, Snapshot = 5, Test = 99 };

// The first 512 bytes of every segment. Components place their own header after it
// (at ShmSegment::kHeaderBytes) and record their parameters in `params`.
struct SegmentHeader {
  uint64_t magic;           // kSegmentMagic
  uint32_t layout_version;  // kLayoutVersion
  uint32_t kind;            // SegmentKind
  uint64_t total_bytes;
  int32_t creator_pid;
  uint32_t pad0;
  uint64_t creator_start;  // creator's start time (clock ticks since boot)
  uint64_t incarnation;    // random per creation; ties a run's segments together
  uint64_t created_ns;     // CLOCK_MONOTONIC
  uint64_t heartbeat_ns;   // creator's last heartbeat (0: never beat); atomic access
  uint32_t ready;          // 1 once the creator finished initialising; atomic access
  uint32_t pad1;
  unsigned char params[384];  // component parameters (plain struct)
};

struct SegmentOptions {
  bool prefault = false;     // MAP_POPULATE: pay page faults at create/attach, not in use
  uint64_t incarnation = 0;  // 0: draw a random one
  // A segment whose creator is alive but whose heartbeat is older than this is stale
  // (a hung launcher). 0 disables the heartbeat rule (only a dead creator is stale).
  std::chrono::milliseconds stale_after{0};
};

enum class SegmentState { Absent, Live, Stale };

class ShmSegment {
 public:
  static constexpr std::size_t kHeaderBytes = 512;
  static constexpr uint64_t kSegmentMagic = 0x3130304D48534B46ULL;  // "KFSHM001"
  static constexpr uint32_t kLayoutVersion = 3;  // 3: replay group slots carry a held flag

  // Creates `name` with `bytes` (header included), zero-filled. An existing segment
  // of that name that is stale is removed and replaced (logged); a live one makes
  // this throw kf::Error naming the segment and the live creator pid. Two creators
  // racing: exactly one wins (O_EXCL), the other throws.
  static ShmSegment create(const std::string& name, SegmentKind kind, std::size_t bytes,
                           const SegmentOptions& opt = {});
  // Maps an existing segment, waiting up to `wait_ready` for its creator to mark it
  // ready. Throws kf::Error if absent, not ready in time, or of the wrong kind/version.
  static ShmSegment attach(const std::string& name, SegmentKind kind, Timeout wait_ready, bool prefault = false);
  // Whether `name` exists and whether its creator still lives (see SegmentOptions).
  static SegmentState probe(const std::string& name, std::chrono::milliseconds stale_after = {});
  static bool remove(const std::string& name);  // unlinks; mappings stay valid until unmapped

  ShmSegment();
  ~ShmSegment();
  ShmSegment(ShmSegment&&) noexcept;
  ShmSegment& operator=(ShmSegment&&) noexcept;

  void* base() const;
  std::size_t size() const;
  SegmentHeader* header() const { return static_cast<SegmentHeader*>(base()); }
  void* body() const { return static_cast<char*>(base()) + kHeaderBytes; }
  const std::string& name() const;
  bool is_creator() const;
  uint64_t incarnation() const { return header()->incarnation; }

  void mark_ready();  // creator: publish the initialised contents (release)
  void heartbeat();   // creator: refresh heartbeat_ns

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kf::replay
