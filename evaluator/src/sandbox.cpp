// Sandbox (see sandbox.h): spawn, feed and watch one kf-sandbox-worker.
#include "sandbox.h"

#include <fcntl.h>
#include <poll.h>
#include <seccomp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <dirent.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <thread>

#include "kf/common/error.h"
#include "kf/common/fsutil.h"
#include "kf/common/gpu_lock.h"
#include "kf/common/log.h"
#include "process.h"
#include "worker_openmp.h"
#include "wire/confine.h"
#include "wire/poison.h"
#include "wire/protocol.h"

#ifdef KF_EVAL_CUDA
#include <cuda_runtime.h>
#endif

#ifndef KF_WORKER_PATH_DEFAULT
#define KF_WORKER_PATH_DEFAULT ""
#endif

namespace kf::evaluator {

uint64_t TensorLayout::nbytes() const {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape) n *= uint64_t(d);
  return n;
}

const char* outcome_name(CallOutcome::Kind k) {
  switch (k) {
    case CallOutcome::Ok:
      return "ok";
    case CallOutcome::KernelError:
      return "kernel_error";
    case CallOutcome::Crashed:
      return "crashed";
    case CallOutcome::Timeout:
      return "timeout";
    case CallOutcome::Forbidden:
      return "forbidden_syscall";
    case CallOutcome::MemoryLimit:
      return "memory_limit";
    case CallOutcome::CudaError:
      return "cuda_error";
    case CallOutcome::LoadFailed:
      return "load_failed";
    case CallOutcome::Protocol:
      return "protocol_error";
    case CallOutcome::Environment:
      return "environment";
  }
  return "?";
}

std::string gpu_lock_key(int device) {
#ifdef KF_EVAL_CUDA
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) == cudaSuccess)
    return gpu_lock_key_pci(prop.pciDomainID, prop.pciBusID, prop.pciDeviceID);
  cudaGetLastError();
#endif
  return std::to_string(device);
}

void exec_with_worker_openmp() {
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  if (policy && std::strcmp(policy, "PASSIVE") == 0 && spin && std::strcmp(spin, "0") == 0) return;
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<char*> argv;
  for (size_t i = 0; i < all.size(); i += std::strlen(&all[i]) + 1) argv.push_back(&all[i]);
  argv.push_back(nullptr);
  setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  setenv("GOMP_SPINCOUNT", "0", 1);
  if (argv.size() > 1) execv("/proc/self/exe", argv.data());
  kf::log_warn("evaluator: could not execute itself again with OMP_WAIT_POLICY=PASSIVE (", std::strerror(errno),
               "); the reference's OpenMP threads spin while the candidate's sleep, so timings are biased on a "
               "loaded host");
}

namespace {
using Clock = std::chrono::steady_clock;
double since_ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

uint64_t align_up(uint64_t x) { return (x + proto::kAlign - 1) / proto::kAlign * proto::kAlign; }

long page_size() {
  static long p = sysconf(_SC_PAGESIZE);
  return p;
}

int64_t cpu_ns(clockid_t c) {
  timespec ts{};
  if (clock_gettime(c, &ts) != 0) return 0;
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Threads of a process (its /proc/<pid>/task entries), or -1 if it is gone.
int thread_count(pid_t pid) {
  DIR* d = opendir(("/proc/" + std::to_string(pid) + "/task").c_str());
  if (!d) return -1;
  int n = 0;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n;
}

// CPU time of one thread (its first /proc schedstat field, ns), or 0 if it is gone.
int64_t thread_cpu_ns(pid_t pid, pid_t tid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/schedstat");
  int64_t ns = 0;
  f >> ns;
  return ns;
}

// How long one thread has waited on a run queue (its second /proc schedstat field, ns):
// runnable, but another task had the CPU. 0 if it is gone.
int64_t thread_wait_ns(pid_t pid, pid_t tid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/schedstat");
  int64_t cpu = 0, wait = 0;
  f >> cpu >> wait;
  return wait;
}

// How long the calling thread has waited on a run queue (ns).
int64_t self_wait_ns() {
  std::ifstream f("/proc/thread-self/schedstat");
  int64_t cpu = 0, wait = 0;
  f >> cpu >> wait;
  return wait;
}

// Resident bytes of a process, or 0 if it is gone.
uint64_t rss_bytes(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/statm");
  uint64_t size = 0, resident = 0;
  if (!(f >> size >> resident)) return 0;
  return resident * uint64_t(page_size());
}
}  // namespace

struct Sandbox::Impl {
  SandboxOptions o;
  pid_t pid = -1;
  int memfd = -1, cmd_w = -1, rep_r = -1, log_r = -1;
  char* base = nullptr;
  uint64_t total = 0;           // bytes of the memfd
  char* arena = nullptr;        // device arena (CUDA IPC), or null: tensors in the memfd
  proto::Layout layout_copy{};  // our own copy: the worker can scribble on the shared one
  std::string scratch, log;
  bool dead = true;
  std::string rep_buf;
  clockid_t worker_cpu{};  // the worker's process CPU clock (all its threads)
  int reaped_status = -1;  // set when a stop-wait reaped the worker
  // Between fork and exec the child's resident set is this process's (copy-on-write): its
  // memory is judged only once it runs the worker (seen by name, or by its first reply).
  bool exec_seen = false;
  // Outputs at return: our private copies, taken while the worker is stopped (per slot,
  // per output; device memory with the arena, host memory otherwise).
  std::vector<std::vector<void*>> ret;
  std::vector<char> flush_host;  // CPU: evicts the caches before a call
  uint64_t ret_device_bytes = 0;
#ifdef KF_EVAL_CUDA
  cudaStream_t stream = nullptr;  // ours, non-blocking: independent of torch's streams
  void* flush_dev = nullptr;
  void* probe_dev = nullptr;
#endif

  ~Impl() { shutdown(); }
  char* data() const { return arena ? arena : base; }

  void drain_log() {
    if (log_r < 0) return;
    char buf[4096];
    while (true) {
      ssize_t n = read(log_r, buf, sizeof buf);
      if (n <= 0) break;
      log.append(buf, size_t(n));
      if (log.size() > 16384) log.erase(0, log.size() - 8192);  // keep the tail
    }
  }

  void shutdown() {
    if (pid > 0) {
      kill_and_reap(pid);
      pid = -1;
    }
    dead = true;
    drain_log();
    for (int* fd : {&cmd_w, &rep_r, &log_r, &memfd})
      if (*fd >= 0) {
        close(*fd);
        *fd = -1;
      }
    if (base) {
      munmap(base, total);
      base = nullptr;
    }
#ifdef KF_EVAL_CUDA
    if (arena) {
      // The worker is reaped, so its IPC mapping is gone; a sticky error from the
      // candidate's context cannot reach ours.
      cudaFree(arena);
      for (auto& slot : ret)
        for (void* p : slot) cudaFree(p);
      ret.clear();
      for (void** p : {&flush_dev, &probe_dev})
        if (*p) cudaFree(*p), *p = nullptr;
      if (stream) cudaStreamDestroy(stream), stream = nullptr;
      cudaGetLastError();
      arena = nullptr;
    }
#endif
    for (auto& slot : ret)
      for (void* p : slot) std::free(p);
    ret.clear();
    if (!scratch.empty()) {
      fsutil::remove_tree(scratch);
    }
  }

  // The worker is gone (or must go): reap it and say why.
  CallOutcome classify_death(CallOutcome out, bool we_killed) {
    // Did it end by itself? (A worker that merely closed its pipes is killed by us below,
    // and that SIGKILL must not read as an outside kill.)
    int status = reaped_status;
    bool ended_itself = status >= 0;
    reaped_status = -1;
    for (int i = 0; !ended_itself && !we_killed && i < 200; ++i) {
      const pid_t w = waitpid(pid, &status, WNOHANG);
      if (w == pid && (WIFEXITED(status) || WIFSIGNALED(status)))
        ended_itself = true;
      else
        usleep(1000);
    }
    if (!ended_itself) status = kill_and_reap(pid);
    pid = -1;
    dead = true;
    drain_log();
    const int nr = base ? reinterpret_cast<proto::Layout*>(base)->forbidden_syscall : -1;
    if (we_killed) return out;
    if (WIFEXITED(status) && WEXITSTATUS(status) == worker::kExitForbidden) {
      out.kind = CallOutcome::Forbidden;
      char* name = nr >= 0 ? seccomp_syscall_resolve_num_arch(SCMP_ARCH_NATIVE, nr) : nullptr;
      out.message = std::string("forbidden system call: ") + (name ? name : ("#" + std::to_string(nr)).c_str()) +
                    " (the sandbox allows no files written, no sockets, no new processes, no exec)";
      free(name);
      return out;
    }
    if (out.kind == CallOutcome::CudaError) return out;  // the worker said why, then exited
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGSYS) {
      // seccomp's trap arrived while SIGSYS was blocked (glibc blocks every signal around
      // posix_spawn/system), so the kernel killed the process before our handler ran.
      out.kind = CallOutcome::Forbidden;
      out.message =
          "forbidden system call, made with signals blocked (as glibc's system()/posix_spawn do before "
          "clone/execve): killed by SIGSYS";
      return out;
    }
    if (ended_itself && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) {
      // Not ours (we_killed is false) and not the candidate's: seccomp denies it SIGKILL to
      // itself and lowered limits. An operator, a supervisor or the OOM killer did it.
      out.kind = CallOutcome::Environment;
      out.message = "the sandbox worker was killed by SIGKILL from outside the evaluator (not the candidate's doing)";
      return out;
    }
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGXCPU) {
      out.kind = CallOutcome::Timeout;
      out.message = "CPU time limit exceeded";
      return out;
    }
    out.kind = CallOutcome::Crashed;
    out.message = "worker " + describe_wait_status(status);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 3) {
      auto p = log.rfind("fatal:");
      if (p != std::string::npos) out.message += ": " + log.substr(p, log.find('\n', p) - p);
    }
    return out;
  }

  // Reads one Reply, watching the clock and the worker's memory. On failure returns
  // false with `out` describing it (the worker is dead afterwards).
  bool wait_reply(proto::Reply& rep, Clock::time_point deadline, CallOutcome& out, Clock::time_point* at = nullptr) {
    const uint64_t rss_limit = o.memory_limit_bytes + total;
    while (true) {
      if (rep_buf.size() >= sizeof(proto::Reply)) {
        exec_seen = true;
        std::memcpy(&rep, rep_buf.data(), sizeof rep);
        rep_buf.erase(0, sizeof rep);
        rep.msg[sizeof rep.msg - 1] = 0;
        if (at) *at = Clock::now();
        return true;
      }
      const auto now = Clock::now();
      if (now >= deadline) {
        out.kind = CallOutcome::Timeout;
        out.message = "wall-clock limit exceeded (killed)";
        out = classify_death(out, true);
        return false;
      }
      const int wait_ms = int(std::min<double>(20.0, since_ms(now, deadline) + 1));
      pollfd pf[2] = {{rep_r, POLLIN, 0}, {log_r, POLLIN, 0}};
      int pr = poll(pf, 2, wait_ms);
      if (pr < 0 && errno != EINTR) {
        out.kind = CallOutcome::Protocol;
        out.message = std::string("poll: ") + std::strerror(errno);
        out = classify_death(out, true);
        return false;
      }
      if (pf[1].revents) drain_log();
      if (pf[0].revents & POLLIN) {
        char buf[sizeof(proto::Reply)];
        ssize_t n = read(rep_r, buf, sizeof buf - rep_buf.size() % sizeof buf);
        if (n > 0) {
          rep_buf.append(buf, size_t(n));
          continue;
        }
        if (n < 0 && errno == EINTR) continue;
      }
      if (pf[0].revents & (POLLHUP | POLLERR) && !(pf[0].revents & POLLIN)) {
        out = classify_death(out, false);
        return false;
      }
      if (pf[0].revents & POLLIN) {  // read returned 0: EOF
        out = classify_death(out, false);
        return false;
      }
      if (!exec_seen) {
        std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
        std::string name;
        exec_seen = std::getline(comm, name) && name.rfind("kf-sandbox-work", 0) == 0;
      }
      const uint64_t rss = exec_seen ? rss_bytes(pid) : 0;
      if (rss > rss_limit) {
        out.kind = CallOutcome::MemoryLimit;
        out.message = "memory limit exceeded: resident " + std::to_string(rss >> 20) + " MiB > " +
                      std::to_string(rss_limit >> 20) + " MiB (killed)";
        out = classify_death(out, true);
        return false;
      }
    }
  }

  // Waits until every thread of the worker has stopped (it raises SIGSTOP after each
  // message that ends a phase). False with `out` set if it died or never stopped.
  bool wait_stop(Clock::time_point deadline, CallOutcome& out) {
    for (int i = 0;; ++i) {
      int st = 0;
      const pid_t w = waitpid(pid, &st, WUNTRACED | WNOHANG);
      if (w == pid && WIFSTOPPED(st)) return true;
      if (w == pid && (WIFEXITED(st) || WIFSIGNALED(st))) {
        reaped_status = st;
        out = classify_death(out, false);
        return false;
      }
      if (w < 0 && errno != EINTR) {
        out.kind = CallOutcome::Protocol;
        out.message = std::string("waitpid: ") + std::strerror(errno);
        out = classify_death(out, true);
        return false;
      }
      if (Clock::now() >= deadline) {
        // The worker's own code raises the stop right after its message; only a worker
        // whose code or signal state the candidate changed fails to.
        out.kind = CallOutcome::Forbidden;
        out.message = "the worker did not stop after its message (its code or signal state was tampered with)";
        out = classify_death(out, true);
        return false;
      }
      if (i % 64 == 63) drain_log();
      if (i < 32)
        sched_yield();
      else
        usleep(i < 256 ? 20 : 200);
    }
  }

  void resume() { kill(pid, SIGCONT); }
  // CPU of the worker's threads other than its main one, dead ones included (read while it
  // is stopped, so exact): the candidate's threads, and the runtime's.
  int64_t process_cpu() const { return cpu_ns(worker_cpu); }
  int64_t others_cpu() const { return cpu_ns(worker_cpu) - thread_cpu_ns(pid, pid); }

  // Before a call, with the worker stopped: poison the outputs and evict the caches here,
  // so that none of it runs in the worker (where it would count as its time or CPU).
  void prepare(int slot, uint32_t poison, bool flush) {
    const proto::Layout& L = layout_copy;
    if (o.backend == KF_BACKEND_CPU) {
      for (int t = 0; t < L.n_out; ++t)
        poison_fill_host(base + L.off_out[slot][t], L.out[t].nbytes, L.out[t].dtype, poison);
      if (flush && !flush_host.empty()) {
        volatile char* f = flush_host.data();
        const char v = char(++flush_round);
        for (size_t i = 0; i < flush_host.size(); i += 64) f[i] = v;
      }
    }
#ifdef KF_EVAL_CUDA
    if (arena) {
      for (int t = 0; t < L.n_out; ++t)
        cudaMemsetAsync(arena + L.off_out[slot][t], poison ? 0x5A : 0xFF, L.out[t].nbytes, stream);  // poison.h
      if (flush && flush_dev) cudaMemsetAsync(flush_dev, int(++flush_round & 0xFF), o.flush_bytes, stream);
      cudaStreamSynchronize(stream);
    }
#endif
  }
  unsigned flush_round = 0;

  // How long a tiny operation of ours takes on the device: it waits behind GPU work the
  // worker's context still has queued or running (contexts share the GPU by time slices).
  double settle_probe_ms() {
#ifdef KF_EVAL_CUDA
    if (arena) {
      const auto t0 = Clock::now();
      cudaMemsetAsync(probe_dev, 0, 256, stream);
      cudaStreamSynchronize(stream);
      return since_ms(t0, Clock::now());
    }
#endif
    return 0;
  }

  // With the worker stopped at return: the outputs into our private memory, after the
  // settle probe (`settle_ms`).
  void snapshot(int slot, double* settle_ms) {
    const proto::Layout& L = layout_copy;
    *settle_ms = settle_probe_ms();
#ifdef KF_EVAL_CUDA
    if (arena) {
      for (int t = 0; t < L.n_out; ++t)
        cudaMemcpyAsync(ret[size_t(slot)][size_t(t)], arena + L.off_out[slot][t], L.out[t].nbytes,
                        cudaMemcpyDeviceToDevice, stream);
      cudaStreamSynchronize(stream);
      return;
    }
#endif
    for (int t = 0; t < L.n_out; ++t)
      std::memcpy(ret[size_t(slot)][size_t(t)], base + L.off_out[slot][t], L.out[t].nbytes);
  }

  unsigned char ipc_handle[64] = {};
  bool alloc_arena(uint64_t bytes, std::string* why) {
#ifdef KF_EVAL_CUDA
    auto fail = [&](const char* what, cudaError_t e) {
      *why = std::string(what) + ": " + cudaGetErrorString(e);
      cudaGetLastError();
      if (arena) cudaFree(arena);
      arena = nullptr;
      return false;
    };
    cudaError_t e = cudaSetDevice(o.device);
    if (e != cudaSuccess) return fail("cudaSetDevice", e);
    if ((e = cudaMalloc(reinterpret_cast<void**>(&arena), std::max<uint64_t>(bytes, 4096))) != cudaSuccess)
      return fail("cudaMalloc", e);
    cudaIpcMemHandle_t h;
    if ((e = cudaIpcGetMemHandle(&h, arena)) != cudaSuccess) return fail("cudaIpcGetMemHandle", e);
    static_assert(sizeof h == sizeof ipc_handle, "IPC handle size");
    std::memcpy(ipc_handle, &h, sizeof h);
    return true;
#else
    (void)bytes;
    *why = "evaluator built without CUDA";
    return false;
#endif
  }

  bool send(const proto::Command& c, CallOutcome& out) {
    const char* p = reinterpret_cast<const char*>(&c);
    size_t n = sizeof c;
    while (n) {
      ssize_t w = write(cmd_w, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        out = classify_death(out, false);
        return false;
      }
      p += w;
      n -= size_t(w);
    }
    return true;
  }
};

Sandbox::Sandbox() : impl_(std::make_unique<Impl>()) {}
Sandbox::~Sandbox() = default;

std::unique_ptr<Sandbox> Sandbox::start(const SandboxOptions& opts, const std::vector<TensorLayout>& inputs,
                                        const std::vector<TensorLayout>& outputs) {
  // A write to a dead worker's pipe must be an error code, not a signal that kills us.
  signal(SIGPIPE, SIG_IGN);
  std::unique_ptr<Sandbox> sb(new Sandbox());
  Impl& I = *sb->impl_;
  I.o = opts;
  if (I.o.worker_path.empty()) {
    const char* e = std::getenv("KF_SANDBOX_WORKER");
    I.o.worker_path = e && *e ? e : KF_WORKER_PATH_DEFAULT;
  }
  if (access(I.o.worker_path.c_str(), X_OK) != 0)
    throw error_at("sandbox", "worker binary '" + I.o.worker_path + "' is not executable");
  if (inputs.size() > size_t(proto::kMaxTensors) || outputs.empty() || outputs.size() > size_t(proto::kMaxTensors))
    throw error_at("sandbox", "unsupported tensor count");
  if (I.o.slots < 1 || I.o.slots > proto::kMaxSlots) throw error_at("sandbox", "slots must be 1..4");
  if (I.o.threads <= 0) I.o.threads = int(std::max(1u, std::thread::hardware_concurrency()));

  // --- layout
  proto::Layout& L = I.layout_copy;
  std::memset(&L, 0, sizeof L);
  L.magic = proto::kMagic;
  L.backend = I.o.backend;
  L.n_in = int(inputs.size());
  L.n_out = int(outputs.size());
  L.n_slots = I.o.slots;
  auto desc = [](const TensorLayout& t) {
    proto::TensorDesc d{};
    if (t.shape.size() > 8) throw error_at("sandbox", "more than 8 dimensions");
    d.dtype = t.dtype;
    d.ndim = int(t.shape.size());
    for (size_t i = 0; i < t.shape.size(); ++i) d.shape[i] = t.shape[i];
    d.nbytes = t.nbytes();
    return d;
  };
  for (size_t i = 0; i < inputs.size(); ++i) L.in[i] = desc(inputs[i]);
  for (size_t i = 0; i < outputs.size(); ++i) L.out[i] = desc(outputs[i]);
  uint64_t off = align_up(sizeof(proto::Layout));
  for (int s = 0; s < L.n_slots; ++s) {
    for (int t = 0; t < L.n_in; ++t) L.off_in[s][t] = off, off = align_up(off + std::max<uint64_t>(L.in[t].nbytes, 1));
    for (int t = 0; t < L.n_out; ++t)
      L.off_out[s][t] = off, off = align_up(off + std::max<uint64_t>(L.out[t].nbytes, 1));
  }
  L.total_bytes = off;
  L.forbidden_syscall = -1;
  I.total = off;
  if (I.o.backend == KF_BACKEND_CUDA && I.o.device_arena) {
    // Tensors in one device allocation shared with the worker by CUDA IPC; the memfd keeps
    // only the header. Offsets stay relative to the arena's base (minus the header).
    const uint64_t header = align_up(sizeof(proto::Layout));
    std::string why;
    if (I.alloc_arena(off - header, &why)) {
      for (int s = 0; s < L.n_slots; ++s) {
        for (int t = 0; t < L.n_in; ++t) L.off_in[s][t] -= header;
        for (int t = 0; t < L.n_out; ++t) L.off_out[s][t] -= header;
      }
      L.device_arena = 1;
      L.arena_bytes = off - header;
      std::memcpy(L.ipc_handle, I.ipc_handle, sizeof L.ipc_handle);
      L.total_bytes = header;
      I.total = header;
    } else {
      kf::log_warn("sandbox: CUDA IPC device arena unavailable (", why,
                   "); staging tensors through host memory instead");
    }
  }
  off = I.total;

  // --- our private side: the outputs-at-return copies, cache eviction, the settle probe
  I.ret.assign(size_t(L.n_slots), std::vector<void*>(size_t(L.n_out), nullptr));
#ifdef KF_EVAL_CUDA
  if (I.arena) {
    auto ck = [&](cudaError_t e, const char* what) {
      if (e != cudaSuccess) {
        cudaGetLastError();
        throw error_at("sandbox", std::string(what) + ": " + cudaGetErrorString(e));
      }
    };
    ck(cudaStreamCreateWithFlags(&I.stream, cudaStreamNonBlocking), "cudaStreamCreate");
    for (int s = 0; s < L.n_slots; ++s)
      for (int t = 0; t < L.n_out; ++t) {
        const uint64_t n = std::max<uint64_t>(L.out[t].nbytes, 256);
        ck(cudaMalloc(&I.ret[size_t(s)][size_t(t)], n), "cudaMalloc (outputs at return)");
        I.ret_device_bytes += n;
      }
    ck(cudaMalloc(&I.probe_dev, 256), "cudaMalloc (probe)");
    if (I.o.flush_bytes) ck(cudaMalloc(&I.flush_dev, I.o.flush_bytes), "cudaMalloc (cache flush)");
  }
#endif
  if (!I.arena)
    for (int s = 0; s < L.n_slots; ++s)
      for (int t = 0; t < L.n_out; ++t) {
        I.ret[size_t(s)][size_t(t)] = std::malloc(std::max<uint64_t>(L.out[t].nbytes, 1));
        if (!I.ret[size_t(s)][size_t(t)]) throw error_at("sandbox", "out of host memory for the outputs at return");
      }
  if (I.o.backend == KF_BACKEND_CPU && I.o.flush_bytes) I.flush_host.assign(I.o.flush_bytes, 1);

  // --- sealed shared memory: the worker may write the tensors but never resize the file
  I.memfd = memfd_create("kf-sandbox", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (I.memfd < 0) throw error_at("sandbox", std::string("memfd_create: ") + std::strerror(errno));
  if (ftruncate(I.memfd, off_t(off)) != 0) throw error_at("sandbox", std::string("ftruncate: ") + std::strerror(errno));
  if (fcntl(I.memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    throw error_at("sandbox", std::string("memfd seals: ") + std::strerror(errno));
  void* m = mmap(nullptr, off, PROT_READ | PROT_WRITE, MAP_SHARED, I.memfd, 0);
  if (m == MAP_FAILED) throw error_at("sandbox", std::string("mmap: ") + std::strerror(errno));
  I.base = static_cast<char*>(m);
  std::memcpy(I.base, &L, sizeof L);

  // --- private scratch folder
  std::string root = I.o.scratch_root;
  if (root.empty()) {
    const char* t = std::getenv("TMPDIR");
    root = t && *t ? t : "/tmp";
  }
  std::string tmpl = root + "/kf-sandbox-XXXXXX";
  if (!mkdtemp(tmpl.data())) throw error_at("sandbox", "mkdtemp in " + root + ": " + std::strerror(errno));
  I.scratch = tmpl;
  chmod(I.scratch.c_str(), 0755);

  // --- pipes and the worker process
  int cmd[2], rep[2], lg[2];
  if (pipe2(cmd, O_CLOEXEC) || pipe2(rep, O_CLOEXEC) || pipe2(lg, O_CLOEXEC))
    throw error_at("sandbox", std::string("pipe: ") + std::strerror(errno));
  SpawnSpec s;
  s.argv = {I.o.worker_path, "--backend", I.o.backend == KF_BACKEND_CUDA ? "cuda" : "cpu", "--scratch", I.scratch,
            "--device", std::to_string(I.o.device), "--threads", std::to_string(I.o.threads), "--cpu-seconds",
            std::to_string(I.o.cpu_seconds), "--scratch-limit", std::to_string(I.o.scratch_limit_bytes),
            // The worker evicts caches itself only with host staging (its own device buffers).
            "--flush-bytes", std::to_string(I.o.backend == KF_BACKEND_CUDA && !I.arena ? I.o.flush_bytes : 0)};
  if (I.o.backend == KF_BACKEND_CPU)
    s.argv.insert(s.argv.end(), {"--address-space", std::to_string(I.o.memory_limit_bytes + I.total + (2ull << 30))});
  if (!I.o.drop_root) s.argv.push_back("--no-drop-root");
  // Where it can, the worker sees no other process (the evaluator's threads, the
  // calibration worker, other candidates): their activity would tell it which calls are
  // timed, and their ids are what it would need to slow them.
  static std::atomic<bool> private_proc_failed{false};
  s.private_proc = I.o.private_proc && (I.o.backend == KF_BACKEND_CPU || I.o.private_proc_cuda) && I.o.drop_root &&
                   !private_proc_failed;
  if (s.private_proc && !private_proc_supported()) {
    s.private_proc = false;
    if (!private_proc_failed.exchange(true))
      kf::log_warn(
          "sandbox: workers see the host's processes in /proc (a private /proc needs root and Linux >= 5.8); "
          "verification goes on without it");
  }
  if (s.private_proc) s.argv.push_back("--own-uid");
  s.env = pick_env({"LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"});
  s.env.insert(s.env.end(),
               {"PATH=/usr/bin:/bin", "LANG=C", "HOME=" + I.scratch, "TMPDIR=" + I.scratch,
                "OMP_NUM_THREADS=" + std::to_string(I.o.threads), "OMP_WAIT_POLICY=PASSIVE", "GOMP_SPINCOUNT=0",
                "OMP_DYNAMIC=false", "CUDA_CACHE_DISABLE=1", "CUDA_DEVICE_ORDER=PCI_BUS_ID"});
  s.fds = {{I.memfd, proto::kFdShm}, {cmd[0], proto::kFdCmd}, {rep[1], proto::kFdReply}, {lg[1], 1}, {lg[1], 2}};
  s.cwd = I.scratch;
  if (I.o.adjust_spawn) I.o.adjust_spawn(s);  // the ModelNew worker (sandbox.h)
  try {
    try {
      I.pid = spawn_process(s);
    } catch (const Error& e) {
      // Only a failed private-/proc step (process.cpp names each "... private /proc ...");
      // any other spawn failure is the caller's to see.
      if (!s.private_proc || s.confine.enabled || std::string(e.what()).find("private /proc") == std::string::npos)
        throw;
      // No mount namespace here (a container without CAP_SYS_ADMIN): without it, once.
      if (!private_proc_failed.exchange(true))
        kf::log_warn("sandbox: no private /proc for workers (", e.what(),
                     "); workers see the host's processes from now on, verification goes on");
      s.private_proc = false;
      s.argv.erase(std::remove(s.argv.begin(), s.argv.end(), std::string("--own-uid")), s.argv.end());
      I.pid = spawn_process(s);
    }
  } catch (...) {
    for (int fd : {cmd[0], cmd[1], rep[0], rep[1], lg[0], lg[1]}) close(fd);
    throw;
  }
  close(cmd[0]);
  close(rep[1]);
  close(lg[1]);
  I.cmd_w = cmd[1];
  I.rep_r = rep[0];
  I.log_r = lg[0];
  fcntl(I.log_r, F_SETFL, O_NONBLOCK);
  I.dead = false;
  if (clock_getcpuclockid(I.pid, &I.worker_cpu) != 0) {
    I.shutdown();
    throw error_at("sandbox", "no CPU clock for the worker process");
  }
  return sb;
}

CallOutcome Sandbox::load(const std::string& so_path) {
  Impl& I = *impl_;
  CallOutcome out;
  if (I.dead) return {CallOutcome::Protocol, "sandbox is not running"};
  proto::Command c{};
  c.op = proto::OP_LOAD;
  if (so_path.empty()) return {CallOutcome::LoadFailed, "empty path"};  // would load the empty kernel
  if (so_path.size() >= sizeof c.path) return {CallOutcome::LoadFailed, "path too long"};
  if (I.o.drop_root && geteuid() == 0) {
    // The worker runs as nobody: every folder on the way must be searchable by others
    // and the object readable, or dlopen fails with a bare "Permission denied".
    std::string dir = so_path;
    struct stat st {};
    if (::stat(so_path.c_str(), &st) == 0 && !(st.st_mode & S_IROTH))
      throw error_at(so_path, "not readable by the sandbox user (nobody); make it world-readable");
    while ((dir = dir.substr(0, dir.find_last_of('/'))).size() > 0) {
      if (::stat(dir.c_str(), &st) == 0 && !(st.st_mode & S_IXOTH))
        throw error_at(dir,
                       "folder not searchable by the sandbox user (nobody): put the compile cache under a folder "
                       "with mode o+x (e.g. 0755), not inside a 0700 one");
    }
  }
  std::memcpy(c.path, so_path.c_str(), so_path.size() + 1);
  if (!I.send(c, out)) return out;
  proto::Reply rep;
  if (!I.wait_reply(rep, Clock::now() + std::chrono::milliseconds(int64_t(I.o.start_timeout_s * 1000)), out)) {
    if (out.kind == CallOutcome::Timeout) out.message = "start-up and load did not finish in time (killed)";
    return out;
  }
  if (!I.wait_stop(Clock::now() + std::chrono::seconds(2), out)) return out;
  out.threads_after = thread_count(I.pid);
  if (rep.status != proto::ST_OK) {
    out.kind = CallOutcome::LoadFailed;
    out.message = rep.msg;
  }
  return out;
}

CallOutcome Sandbox::load_empty() {
  Impl& I = *impl_;
  CallOutcome out;
  if (I.dead) return {CallOutcome::Protocol, "sandbox is not running"};
  proto::Command c{};
  c.op = proto::OP_LOAD;  // an empty path: the worker's own empty kernel (protocol.h)
  if (!I.send(c, out)) return out;
  proto::Reply rep;
  if (!I.wait_reply(rep, Clock::now() + std::chrono::milliseconds(int64_t(I.o.start_timeout_s * 1000)), out)) {
    if (out.kind == CallOutcome::Timeout) out.message = "start-up did not finish in time (killed)";
    return out;
  }
  if (!I.wait_stop(Clock::now() + std::chrono::seconds(2), out)) return out;
  if (rep.status != proto::ST_OK) {
    out.kind = CallOutcome::LoadFailed;
    out.message = rep.msg;
  }
  return out;
}

CallOutcome Sandbox::run(int slot, uint32_t poison, bool flush_cache, double /*probe_ms*/, double timeout_s) {
  Impl& I = *impl_;
  CallOutcome out;
  if (I.dead) return {CallOutcome::Protocol, "sandbox is not running"};
  if (slot < 0 || slot >= I.layout_copy.n_slots) return {CallOutcome::Protocol, "bad slot"};
  I.prepare(slot, poison, flush_cache);
  proto::Command c{};
  c.op = proto::OP_RUN;
  c.slot = uint32_t(slot);
  c.poison = poison;
  c.flush_cache = flush_cache ? 1 : 0;
  const auto deadline = Clock::now() + std::chrono::milliseconds(int64_t(timeout_s * 1000));
  if (!I.send(c, out)) return out;

  // --- before the clock: resume, start mark, freeze 0
  out.threads_before = thread_count(I.pid);
  const int64_t others0 = I.others_cpu(), wait0 = thread_wait_ns(I.pid, I.pid), cpu0 = I.process_cpu();
  const int64_t ev0 = self_wait_ns();
  const auto t_resume = Clock::now();
  I.resume();
  proto::Reply start, end;
  Clock::time_point t_start, t_end;
  if (!I.wait_reply(start, deadline, out, &t_start)) return out;
  if (start.kind != proto::K_MARK_START) {
    out.kind = CallOutcome::Protocol;
    out.message = "worker protocol out of order";
    return I.classify_death(out, true);
  }
  if (!I.wait_stop(Clock::now() + std::chrono::seconds(2), out)) return out;
  const auto t_stop0 = Clock::now();
  const int64_t ev1 = self_wait_ns();
  const int64_t others1 = I.others_cpu(), cpu1 = I.process_cpu(), wait1 = thread_wait_ns(I.pid, I.pid);
  out.before_cpu_ms = (cpu1 - cpu0) / 1e6;
  out.idle_cpu_ms = (others1 - others0) / 1e6;
  out.resume_ms = since_ms(t_resume, t_start);
  const double wall_before = since_ms(t_resume, Clock::now());
  out.presync_ms = start.presync_ns / 1e6;

  // --- the call: resume, end mark, freeze 1
  const int64_t c_start = I.process_cpu(), ev2 = self_wait_ns();
  const auto t_go = Clock::now();
  I.resume();
  if (!I.wait_reply(end, deadline, out, &t_end)) return out;
  const int64_t c_end = I.process_cpu();
  if (end.kind != proto::K_MARK_END) {
    out.kind = CallOutcome::Protocol;
    out.message = "worker protocol out of order";
    return I.classify_death(out, true);
  }
  out.rc = end.rc;
  out.elapsed_ms = end.elapsed_ns / 1e6;
  out.external_ms = since_ms(t_go, t_end);
  if (end.status == proto::ST_CUDA_ERROR) {
    end.msg[sizeof end.msg - 1] = 0;
    out.kind = CallOutcome::CudaError;
    out.message = end.msg;
    return I.classify_death(out, false);
  }
  if (!I.wait_stop(Clock::now() + std::chrono::seconds(2), out)) return out;
  const auto t_stop1 = Clock::now();
  out.evaluator_wait_ms = ((ev1 - ev0) + (self_wait_ns() - ev2)) / 1e6;
  const int64_t c_stop1 = I.process_cpu(), wait2 = thread_wait_ns(I.pid, I.pid), others_b = I.others_cpu();
  out.threads_after = thread_count(I.pid);

  // --- with every thread stopped: the evidence
  double settle_ms = 0;
  I.snapshot(slot, &settle_ms);
  // Our clock over the two windows in which the worker ran before its outputs were taken
  // (the stops between them are ours: CPU accounting, with every thread stopped), less the
  // time the worker's main thread waited on a run queue in them (the kernel's schedstat)
  // beyond the CPU its other threads used there: on a loaded host a resumed worker waits
  // for a CPU, which is not the candidate's time, while a main thread kept waiting by the
  // candidate's own busy threads is. Work done anywhere in the windows runs, or blocks the
  // main thread, on this clock.
  auto waited = [](int64_t wait, int64_t others) { return std::max<int64_t>(0, wait - others) / 1e6; };
  out.outside_ms = since_ms(t_resume, t_stop0) - waited(wait1 - wait0, others1 - others0) + since_ms(t_go, t_stop1) -
                   waited(wait2 - wait1, others_b - others1) + settle_ms;

  // --- after return: the worker's own device sync and clean-up, freeze 2
  const int64_t others2 = I.others_cpu();
  const auto t_resume2 = Clock::now();
  I.resume();
  proto::Reply r;
  if (!I.wait_reply(r, std::max(deadline, Clock::now() + std::chrono::seconds(10)), out)) return out;
  if (r.kind != proto::K_REPLY) {
    out.kind = CallOutcome::Protocol;
    out.message = "worker protocol out of order";
    return I.classify_death(out, true);
  }
  r.msg[sizeof r.msg - 1] = 0;
  if (r.status == proto::ST_CUDA_ERROR) {
    out.kind = CallOutcome::CudaError;
    out.message = r.msg;
    return I.classify_death(out, false);
  }
  if (!I.wait_stop(Clock::now() + std::chrono::seconds(2), out)) return out;
  out.threads_late = thread_count(I.pid);
  out.call_cpu_ms = (c_end - c_start) / 1e6;
  // After the clock stopped: everything until freeze 1 (the worker's own part is one
  // write), and what threads other than the worker's main one used after freeze 1.
  const int64_t others3 = I.others_cpu();
  out.late_cpu_ms = ((c_stop1 - c_end) + (others3 - others2)) / 1e6;
  out.outside_cpu_ms = ((others1 - others0) + (others3 - others2)) / 1e6;
  out.idle_wall_ms = wall_before + since_ms(t_resume2, Clock::now());
  // Also after freeze 2: GPU work a thread launched after the worker's second sync would
  // otherwise run beside the evaluator's reference.
  out.gpu_settle_ms = std::max({settle_ms, r.after_sync_ns / 1e6, I.settle_probe_ms()});
  if (r.status == proto::ST_KERNEL_ERROR) {
    out.kind = CallOutcome::KernelError;
    out.message = "kf_forward returned " + std::to_string(out.rc);
  } else if (r.status != proto::ST_OK) {
    out.kind = CallOutcome::Protocol;
    out.message = r.msg;
    return I.classify_death(out, true);
  }
  return out;
}

// Tensor regions: in the device arena when there is one, else in the memfd.
void* Sandbox::input(int s, int t) { return impl_->data() + impl_->layout_copy.off_in[s][t]; }
const void* Sandbox::output_at_return(int s, int t) const { return impl_->ret[size_t(s)][size_t(t)]; }
const void* Sandbox::output_late(int s, int t) const { return impl_->data() + impl_->layout_copy.off_out[s][t]; }
bool Sandbox::device_resident() const { return impl_->arena != nullptr; }
uint64_t Sandbox::device_arena_bytes() const {
  return impl_->arena ? impl_->layout_copy.arena_bytes + impl_->ret_device_bytes : 0;
}
int Sandbox::slots() const { return impl_->layout_copy.n_slots; }
bool Sandbox::alive() const { return !impl_->dead; }
pid_t Sandbox::pid() const { return impl_->pid; }
std::string Sandbox::log_tail() const {
  impl_->drain_log();
  const std::string& l = impl_->log;
  return l.size() > 2000 ? l.substr(l.size() - 2000) : l;
}
const std::string& Sandbox::scratch_dir() const { return impl_->scratch; }
void Sandbox::stop() {
  if (!impl_->dead && impl_->pid > 0) {
    proto::Command c{};
    c.op = proto::OP_QUIT;
    (void)!write(impl_->cmd_w, &c, sizeof c);
  }
  impl_->shutdown();
}

}  // namespace kf::evaluator
