// GpuTimingLock: the exclusive GPU lock of a run's evaluator (docs/architecture.md, "Sharing a
// GPU": no other process of the run does GPU work on that GPU while it times).
//
// The evaluator holds the lock EXCLUSIVELY around each timed trial; learners and actors
// that share the GPU hold it SHARED around their GPU work (a step, a decode burst), so
// they pause while a trial runs and run together otherwise. Built on flock(2) on a file
// per GPU: the kernel drops a dead holder's lock, so a SIGKILLed process can never wedge
// the GPU. A second "turnstile" file gives a waiting timer priority: a new shared holder
// passes the turnstile (a brief exclusive lock) before it takes the shared lock, and the
// timer holds the turnstile while it waits, so a stream of overlapping shared holders
// cannot starve it.
//
// Threading: a GpuTimingLock object is one process's handle; use it from one thread at a
// time (flock locks belong to the open file description). Any number of processes.
#pragma once
#include <chrono>
#include <string>

namespace kf {

class GpuTimingLock {
 public:
  // Lock files live in `dir` (created if missing): kf-gpu<key>.lock and .turnstile.
  // `gpu` names the physical GPU, the same in every process whatever its
  // CUDA_VISIBLE_DEVICES: use gpu_lock_key() (PCI bus id) on CUDA. The int overload
  // uses the ordinal as the key (tests; a single GPU). Empty dir: $KF_GPU_LOCK_DIR, else
  // /tmp. Throws kf::Error naming the file on failure.
  GpuTimingLock(const std::string& dir, const std::string& gpu);
  GpuTimingLock(const std::string& dir, int device) : GpuTimingLock(dir, std::to_string(device)) {}
  ~GpuTimingLock();
  GpuTimingLock(const GpuTimingLock&) = delete;
  GpuTimingLock& operator=(const GpuTimingLock&) = delete;

  // Blocking acquire; false if `timeout` passed first (then nothing is held).
  bool lock_exclusive(std::chrono::milliseconds timeout = std::chrono::hours(1));
  bool lock_shared(std::chrono::milliseconds timeout = std::chrono::hours(1));
  void unlock();
  bool held() const { return held_; }
  const std::string& path() const { return path_; }

  // RAII holder: `Hold h(lock, exclusive)`; held() says whether it got the lock.
  class Hold {
   public:
    Hold(GpuTimingLock* lock, bool exclusive, std::chrono::milliseconds timeout = std::chrono::hours(1));
    ~Hold();
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    bool held() const { return ok_; }

   private:
    GpuTimingLock* lock_;
    bool ok_ = false;
  };

 private:
  bool acquire(int fd, int op, std::chrono::steady_clock::time_point deadline);
  std::string path_, turnstile_path_;
  int fd_ = -1, turnstile_fd_ = -1;
  bool held_ = false;
};

// The lock key of a physical GPU from its PCI location (cudaDeviceProp::pciDomainID,
// pciBusID, pciDeviceID): "dddd:bb:dd.0" in hex. Every process of a run (evaluator,
// learner, actors) derives its key here, so the same GPU gets the same lock whatever
// ordinal CUDA_VISIBLE_DEVICES gives it.
std::string gpu_lock_key_pci(int domain, int bus, int device);

// The per-GPU files every process of a run shares (the timing lock's, the memory claims'):
// `dir`/kf-gpu<key><suffix>, with `dir` empty meaning $KF_GPU_LOCK_DIR, else /tmp (created
// if missing), and the key's ':' and '.' made plain.
std::string gpu_file_path(const std::string& dir, const std::string& gpu, const std::string& suffix);
// Opens (creates) such a file read-write for every uid (mode 0666); throws kf::Error
// naming the file.
int open_gpu_file(const std::string& path);

}  // namespace kf
