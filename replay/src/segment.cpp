// ShmSegment: one named POSIX shared-memory segment (Boost.Interprocess shared_memory_object +
// mapped_region) with the header of segment.h; probe() tells a live creator from a dead or hung one.
#include "segment.h"

#include <sys/mman.h>

#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cstring>
#include <random>
#include <thread>

#include "kf/common/error.h"
#include "kf/common/log.h"
#include "shm_util.h"

namespace bip = boost::interprocess;

namespace kf::replay {
using namespace detail;

struct ShmSegment::Impl {
  std::string name;
  bip::mapped_region region;
  bool creator = false;
};

// The free functions of segment.h reach the mapping through this friend.
struct SegmentAccess {
  static ShmSegment::Impl& impl(const ShmSegment& s) { return *s.impl_; }
};

namespace {
std::atomic<uint32_t>* ready_word(SegmentHeader* h) { return reinterpret_cast<std::atomic<uint32_t>*>(&h->ready); }
std::atomic<uint64_t>* heartbeat_word(SegmentHeader* h) {
  return reinterpret_cast<std::atomic<uint64_t>*>(&h->heartbeat_ns);
}

uint64_t random_incarnation() {
  std::random_device rd;
  uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(now_ns());
  return v ? v : 1;
}

bip::map_options_t map_flags(bool prefault) { return prefault ? MAP_POPULATE : bip::default_map_options; }

// Reads just the header of an existing segment (small mapping). False if absent.
bool read_header(const std::string& name, SegmentHeader* out, std::size_t* size) {
  try {
    bip::shared_memory_object shm(bip::open_only, name.c_str(), bip::read_only);
    bip::offset_t sz = 0;
    shm.get_size(sz);
    *size = static_cast<std::size_t>(sz);
    if (*size < kSegmentHeaderBytes) {
      std::memset(out, 0, sizeof *out);
      return true;
    }
    bip::mapped_region r(shm, bip::read_only, 0, sizeof(SegmentHeader));
    std::memcpy(out, r.get_address(), sizeof *out);
    return true;
  } catch (const bip::interprocess_exception&) {
    return false;
  }
}
}  // namespace

ShmSegment::ShmSegment() : impl_(std::make_unique<Impl>()) {}
ShmSegment::~ShmSegment() = default;
ShmSegment::ShmSegment(ShmSegment&&) noexcept = default;
ShmSegment& ShmSegment::operator=(ShmSegment&&) noexcept = default;

void* segment_base(const ShmSegment& s) { return SegmentAccess::impl(s).region.get_address(); }
std::size_t segment_size(const ShmSegment& s) { return SegmentAccess::impl(s).region.get_size(); }
const std::string& ShmSegment::name() const { return impl_->name; }
uint64_t ShmSegment::incarnation() const { return segment_header(*this)->incarnation; }
int32_t ShmSegment::creator_pid() const { return segment_header(*this)->creator_pid; }

SegmentState ShmSegment::probe(const std::string& name, std::chrono::milliseconds stale_after) {
  SegmentHeader h;
  std::size_t size = 0;
  if (!read_header(name, &h, &size)) return SegmentState::Absent;
  if (h.magic != kSegmentMagic) {
    // Creation in progress leaves a zero header for a few microseconds; a header that
    // stays zero belongs to a creator that died before writing it.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (!read_header(name, &h, &size)) return SegmentState::Absent;
    if (h.magic != kSegmentMagic) return SegmentState::Stale;
  }
  if (!proc_alive(h.creator_pid, h.creator_start)) return SegmentState::Stale;
  if (stale_after.count() > 0 && h.heartbeat_ns != 0) {
    int64_t age = now_ns() - static_cast<int64_t>(h.heartbeat_ns);
    if (age > std::chrono::duration_cast<std::chrono::nanoseconds>(stale_after).count()) return SegmentState::Stale;
  }
  return SegmentState::Live;
}

bool ShmSegment::remove(const std::string& name) { return bip::shared_memory_object::remove(name.c_str()); }

ShmSegment create_segment(const std::string& name, SegmentKind kind, std::size_t bytes, const SegmentOptions& opt) {
  check_name(name, "segment name");
  if (bytes < kSegmentHeaderBytes) bytes = kSegmentHeaderBytes;
  SegmentState st = ShmSegment::probe(name, opt.stale_after);
  if (st == SegmentState::Live) {
    SegmentHeader h;
    std::size_t sz;
    read_header(name, &h, &sz);
    throw Error("replay: segment '" + name + "' is live (creator pid " + std::to_string(h.creator_pid) +
                "); stop that run first or use another run name");
  }
  if (st == SegmentState::Stale) {
    log_warn("replay: replacing stale shared-memory segment '", name, "'");
    ShmSegment::remove(name);
  }
  ShmSegment seg;
  auto& im = SegmentAccess::impl(seg);
  im.name = name;
  im.creator = true;
  try {
    bip::shared_memory_object shm(bip::create_only, name.c_str(), bip::read_write, bip::permissions(0600));
    shm.truncate(static_cast<bip::offset_t>(bytes));
    im.region = bip::mapped_region(shm, bip::read_write, 0, bytes, nullptr, map_flags(opt.prefault));
  } catch (const bip::interprocess_exception& e) {
    throw Error("replay: cannot create segment '" + name + "': " + e.what() +
                (e.get_error_code() == bip::already_exists_error ? " (another creator won the race)" : ""));
  }
  SegmentHeader* h = segment_header(seg);
  h->layout_version = kLayoutVersion;
  h->kind = static_cast<uint32_t>(kind);
  h->total_bytes = bytes;
  h->creator_pid = self_pid();
  h->creator_start = self_start();
  h->incarnation = opt.incarnation ? opt.incarnation : random_incarnation();
  h->created_ns = static_cast<uint64_t>(now_ns());
  std::atomic_thread_fence(std::memory_order_release);
  reinterpret_cast<std::atomic<uint64_t>*>(&h->magic)->store(kSegmentMagic, std::memory_order_release);
  return seg;
}

ShmSegment attach_segment(const std::string& name, SegmentKind kind, Timeout wait_ready, bool prefault) {
  check_name(name, "segment name");
  const int64_t deadline = now_ns() + wait_ready.count();
  ShmSegment seg;
  auto& im = SegmentAccess::impl(seg);
  im.name = name;
  for (;;) {
    try {
      bip::shared_memory_object shm(bip::open_only, name.c_str(), bip::read_write);
      bip::offset_t sz = 0;
      shm.get_size(sz);
      if (static_cast<std::size_t>(sz) >= kSegmentHeaderBytes) {
        im.region = bip::mapped_region(shm, bip::read_write, 0, 0, nullptr, map_flags(prefault));
        SegmentHeader* h = segment_header(seg);
        if (ready_word(h)->load(std::memory_order_acquire) == 1) break;
      }
    } catch (const bip::interprocess_exception& e) {
      if (now_ns() >= deadline) throw Error("replay: cannot attach segment '" + name + "': " + e.what());
    }
    if (now_ns() >= deadline) throw Error("replay: segment '" + name + "' not ready in time");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const SegmentHeader* h = segment_header(seg);
  if (h->magic != kSegmentMagic) throw Error("replay: segment '" + name + "': field magic: not a KernelForge segment");
  if (h->layout_version != kLayoutVersion)
    throw Error("replay: segment '" + name + "': field layout_version: " + std::to_string(h->layout_version) +
                ", this build expects " + std::to_string(kLayoutVersion));
  if (h->kind != static_cast<uint32_t>(kind))
    throw Error("replay: segment '" + name + "': field kind: " + std::to_string(h->kind) + ", expected " +
                std::to_string(static_cast<uint32_t>(kind)));
  if (h->total_bytes != segment_size(seg))
    throw Error("replay: segment '" + name + "': field total_bytes disagrees with the mapping size");
  return seg;
}

void mark_segment_ready(ShmSegment& s) {
  beat_segment(s);
  ready_word(segment_header(s))->store(1, std::memory_order_release);
}

void beat_segment(ShmSegment& s) {
  heartbeat_word(segment_header(s))->store(static_cast<uint64_t>(now_ns()), std::memory_order_relaxed);
}

}  // namespace kf::replay
