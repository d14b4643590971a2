// Shared-memory communicator for ranks on one host (CI, CPU-only runs).
//
// Segment: Header | slot[world][chunk] | result[chunk]. One round of all_reduce moves
// up to `chunk` bytes per rank: every rank copies its piece into its slot (barrier),
// rank r sums its 1/world share of the elements over slots 0..world-1 in rank order
// into result (barrier), every rank copies result back (barrier). Summing each element
// in one fixed order on one rank is what makes every rank's output bitwise identical.
// The barrier is a counter + generation word with futex wake-ups (shared, not private:
// the waiters are different processes); waiters wake every 100 ms to check that the
// other ranks are still alive, and give up after the timeout.
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "kf/common/error.h"
#include "kf/common/log.h"
#include "comm.h"
#include "kf/learner/learner.h"

namespace kf::learner {
namespace {

constexpr uint64_t kMagic = 0x314D4D4F43464B46ULL;  // "KFCOMM1"
constexpr int kMaxRanks = 64;

struct Header {
  uint64_t magic;
  uint32_t world;
  uint32_t pad;
  uint64_t chunk_bytes;
  std::atomic<uint32_t> ready;
  std::atomic<uint32_t> joined;
  std::atomic<uint32_t> arrive;
  std::atomic<uint32_t> generation;  // futex word
  std::atomic<int32_t> pids[kMaxRanks];
};
static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex words must be lock-free");

long futex(std::atomic<uint32_t>* addr, int op, uint32_t val, const timespec* ts) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, val, ts, nullptr, 0);
}

// Gone or a zombie (a dead rank whose parent has not reaped it yet).
bool process_dead(int32_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE* f = std::fopen(path, "r");
  if (!f) return true;
  char buf[512];
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = 0;
  const char* close = std::strrchr(buf, ')');
  return close && close[1] == ' ' && (close[2] == 'Z' || close[2] == 'X');
}

std::size_t header_bytes() { return (sizeof(Header) + 4095) / 4096 * 4096; }

class ShmComm : public Communicator {
 public:
  ShmComm(const std::string& segment, int rank, int world, std::chrono::milliseconds timeout, std::size_t chunk)
      : seg_(segment), rank_(rank), world_(world), timeout_(timeout) {
    if (world < 1 || world > kMaxRanks || rank < 0 || rank >= world)
      throw Error("learner comm shm:" + segment + ": rank " + std::to_string(rank) + " of world " +
                  std::to_string(world) + " is out of range (world 1.." + std::to_string(kMaxRanks) + ")");
    chunk = std::max<std::size_t>(chunk / 64 * 64, 4096);
    const std::string path = "/" + segment;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    if (rank == 0) {
      ::shm_unlink(path.c_str());  // a stale segment of a dead run
      const int fd = ::shm_open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
      if (fd < 0) throw Error(name() + ": shm_open create failed: " + std::strerror(errno));
      bytes_ = header_bytes() + (world + 1) * chunk;
      if (::ftruncate(fd, static_cast<off_t>(bytes_)) != 0) {
        ::close(fd);
        throw Error(name() + ": ftruncate failed: " + std::strerror(errno));
      }
      map(fd);
      hdr_->magic = kMagic;
      hdr_->world = world;
      hdr_->chunk_bytes = chunk;
      hdr_->ready.store(1, std::memory_order_release);
    } else {
      int fd = -1;
      for (;;) {
        fd = ::shm_open(path.c_str(), O_RDWR, 0600);
        if (fd >= 0) {
          struct stat st {};
          if (::fstat(fd, &st) == 0 && st.st_size >= static_cast<off_t>(header_bytes())) {
            bytes_ = st.st_size;
            map(fd);
            if (hdr_->ready.load(std::memory_order_acquire) == 1) break;
            ::munmap(base_, bytes_);
            base_ = nullptr;
          } else {
            ::close(fd);
          }
        }
        if (std::chrono::steady_clock::now() > deadline)
          throw Error(name() + ": rank 0 did not create the segment within " + std::to_string(timeout.count()) + " ms");
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      if (hdr_->magic != kMagic || hdr_->world != static_cast<uint32_t>(world))
        throw Error(name() + ": segment holds world " + std::to_string(hdr_->world) + ", expected " +
                    std::to_string(world));
    }
    chunk_ = hdr_->chunk_bytes;
    hdr_->pids[rank].store(::getpid());
    hdr_->joined.fetch_add(1);
    barrier_named("join");
    if (rank == 0) ::shm_unlink(path.c_str());  // every rank is mapped now: nothing to leak
  }
  ~ShmComm() override {
    if (base_) ::munmap(base_, bytes_);
  }

  int rank() const override { return rank_; }
  int world() const override { return world_; }
  std::string name() const override {
    return "learner comm shm:" + seg_ + " rank " + std::to_string(rank_) + "/" + std::to_string(world_);
  }

  void all_reduce_sum(torch::Tensor& t) override {
    check(t, "all_reduce");
    if (world_ == 1) return;
    if (t.scalar_type() == torch::kFloat32)
      reduce<float>(t);
    else
      reduce<double>(t);
  }

  void reduce_scatter_sum(torch::Tensor& t) override {
    check_sliced(t, "reduce_scatter", /*any_dtype=*/false);
    if (world_ == 1) return;
    if (t.scalar_type() == torch::kFloat32)
      scatter<float, float>(t);
    else if (t.scalar_type() == torch::kFloat64)
      scatter<double, double>(t);
    else
      scatter<c10::BFloat16, float>(t);
  }

  void all_gather(torch::Tensor& t) override {
    check_sliced(t, "all_gather", /*any_dtype=*/true);
    if (world_ == 1) return;
    auto* p = static_cast<unsigned char*>(t.data_ptr());
    const std::size_t slice = t.numel() / world_ * t.element_size();
    for (std::size_t off = 0; off < slice; off += chunk_) {
      const std::size_t len = std::min(chunk_, slice - off);
      std::memcpy(slot(rank_), p + rank_ * slice + off, len);
      barrier_named("all_gather");
      for (int r = 0; r < world_; ++r)
        if (r != rank_) std::memcpy(p + r * slice + off, slot(r), len);
      barrier_named("all_gather");
    }
  }

  void broadcast(torch::Tensor& t, int root) override {
    check(t, "broadcast");
    if (world_ == 1) return;
    auto* p = static_cast<unsigned char*>(t.data_ptr());
    const std::size_t n = t.numel() * t.element_size();
    for (std::size_t off = 0; off < n; off += chunk_) {
      const std::size_t len = std::min(chunk_, n - off);
      if (rank_ == root) std::memcpy(slot(0), p + off, len);
      barrier_named("broadcast");
      if (rank_ != root) std::memcpy(p + off, slot(0), len);
      barrier_named("broadcast");
    }
  }

  void barrier() override { barrier_named("barrier"); }

 private:
  void map(int fd) {
    base_ = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (base_ == MAP_FAILED) {
      base_ = nullptr;
      throw Error(name() + ": mmap failed: " + std::strerror(errno));
    }
    hdr_ = static_cast<Header*>(base_);
  }
  unsigned char* slot(int r) const { return static_cast<unsigned char*>(base_) + header_bytes() + r * chunk_; }
  unsigned char* result() const { return slot(world_); }

  void check(const torch::Tensor& t, const char* op) const {
    if (!t.device().is_cpu() || !t.is_contiguous() ||
        (t.scalar_type() != torch::kFloat32 && t.scalar_type() != torch::kFloat64))
      throw Error(name() + ": " + op + " needs a contiguous fp32/fp64 CPU tensor");
  }

  void check_sliced(const torch::Tensor& t, const char* op, bool any_dtype) const {
    const auto st = t.scalar_type();
    if (!t.device().is_cpu() || !t.is_contiguous() ||
        (!any_dtype && st != torch::kFloat32 && st != torch::kFloat64 && st != torch::kBFloat16))
      throw Error(name() + ": " + op + " needs a contiguous " + (any_dtype ? "" : "fp32/fp64/bf16 ") + "CPU tensor");
    if (t.numel() % world_ != 0)
      throw Error(name() + ": " + op + " of " + std::to_string(t.numel()) + " elements: not a multiple of world " +
                  std::to_string(world_) + " (pad the buffer)");
  }

  // T: element type, A: accumulator (bf16 sums in fp32, rounded once).
  template <typename T, typename A>
  void scatter(torch::Tensor& t) {
    T* p = t.data_ptr<T>();
    const std::size_t m = t.numel() / world_;                                       // slice length
    const std::size_t per = std::max<std::size_t>(1, chunk_ / sizeof(T) / world_);  // window per slice
    for (std::size_t off = 0; off < m; off += per) {
      const std::size_t len = std::min(per, m - off);
      T* mine = reinterpret_cast<T*>(slot(rank_));
      for (int r = 0; r < world_; ++r) std::memcpy(mine + r * len, p + r * m + off, len * sizeof(T));
      barrier_named("reduce_scatter");
      T* out = p + rank_ * m + off;
      for (std::size_t i = 0; i < len; ++i) {
        A s = static_cast<A>(reinterpret_cast<const T*>(slot(0))[rank_ * len + i]);
        for (int r = 1; r < world_; ++r) s += static_cast<A>(reinterpret_cast<const T*>(slot(r))[rank_ * len + i]);
        out[i] = static_cast<T>(s);
      }
      barrier_named("reduce_scatter");
    }
  }

  template <typename T>
  void reduce(torch::Tensor& t) {
    T* p = t.data_ptr<T>();
    const std::size_t n = t.numel();
    const std::size_t per = chunk_ / sizeof(T);
    for (std::size_t off = 0; off < n; off += per) {
      const std::size_t len = std::min(per, n - off);
      std::memcpy(slot(rank_), p + off, len * sizeof(T));
      barrier_named("all_reduce");
      const std::size_t share = (len + world_ - 1) / world_;
      const std::size_t lo = std::min(len, share * rank_), hi = std::min(len, lo + share);
      T* out = reinterpret_cast<T*>(result());
      for (std::size_t i = lo; i < hi; ++i) {
        T s = reinterpret_cast<const T*>(slot(0))[i];
        for (int r = 1; r < world_; ++r) s += reinterpret_cast<const T*>(slot(r))[i];
        out[i] = s;
      }
      barrier_named("all_reduce");
      std::memcpy(p + off, out, len * sizeof(T));
      barrier_named("all_reduce");
    }
  }

  void barrier_named(const char* op) {
    const uint32_t gen = hdr_->generation.load(std::memory_order_acquire);
    if (hdr_->arrive.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(world_)) {
      hdr_->arrive.store(0, std::memory_order_release);
      hdr_->generation.fetch_add(1, std::memory_order_acq_rel);
      futex(&hdr_->generation, FUTEX_WAKE, INT32_MAX, nullptr);
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    int spins = 0;
    while (hdr_->generation.load(std::memory_order_acquire) == gen) {
      if (++spins < 200) {
        std::this_thread::yield();
        continue;
      }
      const timespec ts{0, 100 * 1000 * 1000};
      futex(&hdr_->generation, FUTEX_WAIT, gen, &ts);
      if (hdr_->generation.load(std::memory_order_acquire) != gen) break;
      for (int r = 0; r < world_; ++r) {
        const int32_t pid = hdr_->pids[r].load();
        if (pid > 0 && process_dead(pid))
          throw Error(name() + ": " + op + ": rank " + std::to_string(r) + " (pid " + std::to_string(pid) +
                      ") died; this rank gives up the collective");
      }
      if (std::chrono::steady_clock::now() - start > timeout_)
        throw Error(name() + ": " + op + ": timed out after " + std::to_string(timeout_.count()) + " ms waiting for " +
                    std::to_string(world_ - hdr_->arrive.load()) + " rank(s)");
    }
  }

  std::string seg_;
  int rank_, world_;
  std::chrono::milliseconds timeout_;
  void* base_ = nullptr;
  std::size_t bytes_ = 0;
  std::size_t chunk_ = 0;
  Header* hdr_ = nullptr;
};

class LocalComm : public Communicator {
 public:
  int rank() const override { return 0; }
  int world() const override { return 1; }
  std::string name() const override { return "learner comm local"; }
  void all_reduce_sum(torch::Tensor&) override {}
  void reduce_scatter_sum(torch::Tensor&) override {}
  void all_gather(torch::Tensor&) override {}
  void broadcast(torch::Tensor&, int) override {}
  void barrier() override {}
};

}  // namespace

void Communicator::all_gather(torch::Tensor& t) {
  const int w = world();
  if (w == 1) return;
  if (!t.is_contiguous() || t.numel() % w != 0)
    throw Error(name() + ": all_gather needs a contiguous tensor whose numel is a multiple of world " +
                std::to_string(w));
  const int64_t m = t.numel() / w;
  auto flat = t.view({-1});
  for (int r = 0; r < w; ++r) {
    auto slice = flat.narrow(0, r * m, m);
    broadcast(slice, r);
  }
}

std::unique_ptr<Communicator> make_local_comm() { return std::make_unique<LocalComm>(); }

std::unique_ptr<Communicator> make_shm_comm(const std::string& segment, int rank, int world,
                                            std::chrono::milliseconds timeout, std::size_t chunk_bytes) {
  return std::make_unique<ShmComm>(segment, rank, world, timeout, chunk_bytes);
}

}  // namespace kf::learner
