#include "kf/replay/replay.h"

#include <cstdint>
#include <cstring>
#include <thread>

#include "kf/common/error.h"
#include "segment.h"
#include "shm_util.h"

namespace kf::replay {
using namespace detail;

namespace {
constexpr uint64_t kBufAlign = 2ull << 20;  // 2 MiB: page- and huge-page-aligned buffers
struct BufMeta {
  std::atomic<uint64_t> seq;  // even: stable; odd: being written
  std::atomic<int64_t> version;
  std::atomic<uint64_t> bytes;
};
}  // namespace

struct SnapshotStore::Header {
  uint64_t max_bytes;
  uint64_t buf_off[2];
  alignas(64) pthread_mutex_t writer_mu;
  std::atomic<uint64_t> recoveries;
  alignas(64) std::atomic<int32_t> current;  // -1 until the first publish
  std::atomic<uint64_t> publishes;
  std::atomic<uint64_t> read_retries;
  alignas(64) BufMeta buf[2];
};

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

void parallel_copy(void* dst, const void* src, std::size_t n, int threads) {
  if (threads <= 1 || n < (8u << 20)) {
    std::memcpy(dst, src, n);
    return;
  }
  std::vector<std::thread> pool;
  const std::size_t chunk = align_up((n + threads - 1) / threads, 4096);
  for (int t = 0; t < threads; ++t) {
    std::size_t off = static_cast<std::size_t>(t) * chunk;
    if (off >= n) break;
    std::size_t len = std::min(chunk, n - off);
    pool.emplace_back([=] { std::memcpy(static_cast<char*>(dst) + off, static_cast<const char*>(src) + off, len); });
  }
  for (auto& th : pool) th.join();
}

static std::size_t segment_bytes(const SnapshotConfig& cfg) {
  uint64_t off = align_up(kSegmentHeaderBytes + sizeof(SnapshotStore::Header), kBufAlign);
  return off + 2 * align_up(cfg.max_bytes, kBufAlign);
}

SnapshotStore::Header* SnapshotStore::hdr() const { return static_cast<Header*>(segment_body(seg_)); }
unsigned char* SnapshotStore::buffer(int i) const {
  return static_cast<unsigned char*>(segment_base(seg_)) + hdr()->buf_off[i];
}
uint64_t SnapshotStore::max_bytes() const { return hdr()->max_bytes; }
uint64_t SnapshotStore::publishes() const { return hdr()->publishes.load(); }
uint64_t SnapshotStore::read_retries() const { return hdr()->read_retries.load(); }

SnapshotStore SnapshotStore::create(const std::string& name, const SnapshotConfig& cfg, const SegmentOptions* opt) {
  SegmentOptions o = opt ? *opt : SegmentOptions{};
  o.prefault = o.prefault || cfg.prefault;
  SnapshotStore s;
  s.seg_ = create_segment(name, SegmentKind::Snapshot, segment_bytes(cfg), o);
  Header* h = new (segment_body(s.seg_)) Header();
  h->max_bytes = cfg.max_bytes;
  uint64_t off = align_up(kSegmentHeaderBytes + sizeof(Header), kBufAlign);
  h->buf_off[0] = off;
  h->buf_off[1] = off + align_up(cfg.max_bytes, kBufAlign);
  robust_mutex_init(&h->writer_mu);
  h->current.store(-1);
  for (auto& b : h->buf) b.version.store(-1);
  mark_segment_ready(s.seg_);
  return s;
}

SnapshotStore SnapshotStore::attach(const std::string& name, Timeout wait_ready, bool prefault) {
  SnapshotStore s;
  s.seg_ = attach_segment(name, SegmentKind::Snapshot, wait_ready, prefault);
  if (segment_bytes(SnapshotConfig{s.hdr()->max_bytes}) != segment_size(s.seg_))
    throw Error("replay: snapshot store '" + name + "': field max_bytes disagrees with the segment size");
  return s;
}

void SnapshotStore::publish(int64_t version, const void* data, std::size_t bytes, int threads) {
  Header* h = hdr();
  if (bytes > h->max_bytes)
    throw Error("replay: snapshot store '" + seg_.name() + "': blob of " + std::to_string(bytes) +
                " bytes exceeds max_bytes " + std::to_string(h->max_bytes));
  // The repair is the odd-seq fix below, which every publish does anyway.
  RobustLock lock(&h->writer_mu, "snapshot writer", nullptr, &h->recoveries);
  int cur = h->current.load(std::memory_order_acquire);
  int b = cur == 0 ? 1 : 0;
  BufMeta& m = h->buf[b];
  uint64_t s = m.seq.load(std::memory_order_relaxed);
  uint64_t odd = (s % 2 == 0) ? s + 1 : s + 2;
  m.seq.store(odd, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);  // readers of b see odd before any new byte
  m.version.store(version, std::memory_order_relaxed);
  m.bytes.store(bytes, std::memory_order_relaxed);
  const std::size_t half = bytes / 2;
  parallel_copy(buffer(b), data, half, threads);
  stall_point("snapshot.publish_mid");
  parallel_copy(buffer(b) + half, static_cast<const unsigned char*>(data) + half, bytes - half, threads);
  m.seq.store(odd + 1, std::memory_order_release);
  h->current.store(b, std::memory_order_release);
  h->publishes.fetch_add(1, std::memory_order_relaxed);
}

SnapshotInfo SnapshotStore::latest() const {
  Header* h = hdr();
  int cur = h->current.load(std::memory_order_acquire);
  if (cur < 0) return {};
  return SnapshotInfo{h->buf[cur].version.load(), h->buf[cur].bytes.load()};
}

SnapshotInfo SnapshotStore::read_into(void* dst, std::size_t capacity, const CopyFn& copy, Timeout timeout) const {
  Header* h = hdr();
  const int64_t deadline = now_ns() + timeout.count();
  for (;;) {
    int cur = h->current.load(std::memory_order_acquire);
    if (cur < 0) return {};
    const BufMeta& m = h->buf[cur];
    uint64_t s1 = m.seq.load(std::memory_order_acquire);
    if (s1 % 2 == 0) {
      SnapshotInfo info{m.version.load(std::memory_order_relaxed), m.bytes.load(std::memory_order_relaxed)};
      if (info.bytes > capacity)
        throw Error("replay: snapshot store '" + seg_.name() + "': version " + std::to_string(info.version) + " has " +
                    std::to_string(info.bytes) + " bytes, reader buffer holds " + std::to_string(capacity));
      copy(dst, buffer(cur), info.bytes);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (m.seq.load(std::memory_order_relaxed) == s1) return info;
    }
    h->read_retries.fetch_add(1, std::memory_order_relaxed);
    if (now_ns() >= deadline)
      throw Error("replay: snapshot store '" + seg_.name() +
                  "': no consistent copy within the timeout (publishing too often?)");
  }
}

SnapshotInfo SnapshotStore::read(std::vector<unsigned char>& out, int threads, Timeout timeout) const {
  // Size `out` inside the copy: the blob size is only known under the seqlock.
  return read_into(
      out.data(), SIZE_MAX,
      [&out, threads](void*, const void* s, std::size_t n) {
        out.resize(n);
        parallel_copy(out.data(), s, n, threads);
      },
      timeout);
}

}  // namespace kf::replay
