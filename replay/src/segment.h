// What replay/ does with its segments, internal to replay/: the fixed 512-byte header every
// segment starts with (magic, layout version, kind, creator identity, incarnation, heartbeat,
// ready flag), and creating, attaching and mapping one. Other components only name segments
// (ShmSegment::probe/remove, name, incarnation, creator_pid in kf/replay/replay.h). Bump
// kLayoutVersion when any component's shared layout changes (docs/replay.md "Segments").
//
// Contract: create_segment() is for one process (the creator); attach_segment() for any. A
// ShmSegment object is used by one thread at a time; the memory it maps is shared and its users
// synchronise through the structures they place in it (plain data and offsets, no pointers).
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "kf/replay/replay.h"

namespace kf::replay {

inline constexpr uint64_t kSegmentMagic = 0x3130304D48534B46ULL;  // "KFSHM001"
inline constexpr uint32_t kLayoutVersion = 3;                     // 3: replay group slots carry a held flag
inline constexpr std::size_t kSegmentHeaderBytes = 512;           // components' own headers start here

struct SegmentOptions {
  bool prefault = false;     // MAP_POPULATE: pay page faults at create/attach, not in use
  uint64_t incarnation = 0;  // 0: draw a random one
  // A segment whose creator is alive but whose heartbeat is older than this is stale (a hung
  // launcher). 0 disables the heartbeat rule (only a dead creator is stale).
  std::chrono::milliseconds stale_after{0};
};

enum class SegmentKind : uint32_t { Control = 1, Queue = 2, Replay = 3, KernelDb = 4, Snapshot = 5, Test = 99 };

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
static_assert(sizeof(SegmentHeader) <= kSegmentHeaderBytes, "segment header too big");

// Creates `name` with `bytes` (header included), zero-filled. An existing segment of that name
// that is stale (SegmentOptions::stale_after) is removed and replaced (logged); a live one makes
// this throw kf::Error naming the segment and the live creator pid. Two creators racing: exactly
// one wins (O_EXCL), the other throws.
ShmSegment create_segment(const std::string& name, SegmentKind kind, std::size_t bytes, const SegmentOptions& opt = {});
// Maps an existing segment, waiting up to `wait_ready` for its creator to mark it ready. Throws
// kf::Error if absent, not ready in time, or of the wrong kind, layout version or size.
ShmSegment attach_segment(const std::string& name, SegmentKind kind, Timeout wait_ready, bool prefault = false);

void* segment_base(const ShmSegment& s);
std::size_t segment_size(const ShmSegment& s);
inline SegmentHeader* segment_header(const ShmSegment& s) { return static_cast<SegmentHeader*>(segment_base(s)); }
inline void* segment_body(const ShmSegment& s) { return static_cast<char*>(segment_base(s)) + kSegmentHeaderBytes; }
void mark_segment_ready(ShmSegment& s);  // creator: publish the initialised contents (release)
void beat_segment(ShmSegment& s);        // creator: refresh heartbeat_ns

}  // namespace kf::replay
