// kf-sandbox-worker: runs one untrusted candidate kernel for the evaluator.
//
// Started by the evaluator (sandbox.cpp) with a memfd and two pipes (protocol.h). It
// does its trusted set-up first (maps the tensors, CUDA context, stream, cuBLAS, device
// buffers), then confines itself (confine.h), then dlopens the candidate and serves
// OP_RUN commands until OP_QUIT or EOF. It does not link torch: it starts in tens of
// milliseconds and holds nothing of the reference.
//
// It is one process per candidate: whatever the candidate leaves behind (threads, a
// corrupted heap, a dead CUDA context) dies with it.
//
//   kf-sandbox-worker --backend cpu|cuda --scratch DIR [--device N] [--threads N]
//                     [--cpu-seconds N] [--address-space BYTES] [--scratch-limit BYTES]
//                     [--flush-bytes BYTES] [--no-drop-root]
#include <dirent.h>
#include <dlfcn.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../src/protocol.h"
#include "confine.h"
#include "kf/kernel.h"
#include "poison.h"

#ifdef KF_WORKER_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>
#endif

namespace proto = kf::evaluator::proto;
using kf::evaluator::worker::ConfineOptions;

namespace {

struct Args {
  std::string backend = "cpu", scratch;
  int device = 0, threads = 1;
  long cpu_seconds = 120;
  unsigned long long address_space = 0, scratch_limit = 1ull << 30, flush_bytes = 0;
  bool drop_root = true;
};

[[noreturn]] void die(const std::string& msg, int code = 3) {
  std::fprintf(stderr, "[sandbox pid=%d] fatal: %s\n", getpid(), msg.c_str());
  _exit(code);
}

int64_t now_ns(clockid_t c = CLOCK_MONOTONIC) {
  timespec ts;
  clock_gettime(c, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}
// CPU time of every thread but this one.
int64_t other_threads_cpu_ns() { return now_ns(CLOCK_PROCESS_CPUTIME_ID) - now_ns(CLOCK_THREAD_CPUTIME_ID); }

// Per-thread CPU clocks of this process, by TID (the kernel's encoding of a thread CPU
// clock id, as pthread_getcpuclockid makes it, which works for any thread of the group).
clockid_t thread_cpu_clock(pid_t tid) { return clockid_t((~unsigned(tid) << 3) | 6u); }

struct ThreadCpu {
  pid_t tid;
  int64_t ns;
};
// Every thread but the caller (the worker's main thread), with its CPU time so far.
std::vector<ThreadCpu> other_thread_cpu() {
  std::vector<ThreadCpu> v;
  DIR* d = opendir("/proc/self/task");
  if (!d) return v;
  const pid_t self = pid_t(syscall(SYS_gettid));
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const pid_t tid = pid_t(std::atoi(e->d_name));
    timespec ts;
    if (tid == self || clock_gettime(thread_cpu_clock(tid), &ts) != 0) continue;
    v.push_back({tid, int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec});
  }
  closedir(d);
  return v;
}

// Fills the reply's idle diagnosis: the thread that used the most CPU since `before`.
void busiest_thread(const std::vector<ThreadCpu>& before, const std::vector<pid_t>& preload, proto::Reply& rep) {
  pid_t top = 0;
  int64_t top_ns = 0;
  for (const ThreadCpu& t : other_thread_cpu()) {
    int64_t d = t.ns;
    for (const ThreadCpu& b : before)
      if (b.tid == t.tid) d = t.ns - b.ns;
    if (d > top_ns) top = t.tid, top_ns = d;
  }
  rep.idle_top_ns = top_ns;
  if (!top) return;
  for (pid_t p : preload) rep.idle_top_preload |= p == top;
  const std::string comm = "/proc/self/task/" + std::to_string(top) + "/comm";
  if (FILE* f = std::fopen(comm.c_str(), "r")) {
    if (std::fgets(rep.idle_top_name, sizeof rep.idle_top_name, f)) rep.idle_top_name[std::strcspn(rep.idle_top_name, "\n")] = 0;
    std::fclose(f);
  }
}

int count_threads() {
  DIR* d = opendir("/proc/self/task");
  if (!d) return -1;
  int n = 0;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n;
}

bool write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= size_t(w);
  }
  return true;
}
bool read_all(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n) {
    ssize_t r = read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= size_t(r);
  }
  return true;
}

// --- scratch allocator handed to the kernel through kf::Context
struct Harness {
  bool cuda = false;
  unsigned long long limit = 0, used = 0;
  uint32_t pattern = 0;
  std::vector<std::pair<void*, size_t>> live;
  void* stream = nullptr;
};

void* scratch_alloc(kf::Context* ctx, size_t bytes) {
  auto* h = static_cast<Harness*>(ctx->harness);
  if (bytes == 0 || bytes > h->limit - h->used) return nullptr;
  void* p = nullptr;
  const size_t rounded = (bytes + 255) & ~size_t(255);
  const int fill = h->pattern ? 0x5A : 0xFF;
#ifdef KF_WORKER_CUDA
  if (h->cuda) {
    if (cudaMalloc(&p, rounded) != cudaSuccess) return nullptr;
    cudaMemsetAsync(p, fill, rounded, static_cast<cudaStream_t>(h->stream));
  } else
#endif
  {
    p = std::aligned_alloc(256, rounded);
    if (!p) return nullptr;
    std::memset(p, fill, rounded);  // garbage that differs between calls
  }
  h->used += rounded;
  h->live.emplace_back(p, rounded);
  return p;
}

void release(Harness* h, void* p) {
  for (size_t i = 0; i < h->live.size(); ++i) {
    if (h->live[i].first != p) continue;
#ifdef KF_WORKER_CUDA
    if (h->cuda) cudaFree(p); else
#endif
    std::free(p);
    h->used -= h->live[i].second;
    h->live.erase(h->live.begin() + long(i));
    return;
  }
}
void scratch_free(kf::Context* ctx, void* p) { release(static_cast<Harness*>(ctx->harness), p); }
void release_all(Harness* h) {
  while (!h->live.empty()) release(h, h->live.back().first);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) die("missing value for " + k, 2);
      return argv[++i];
    };
    if (k == "--backend") a.backend = val();
    else if (k == "--scratch") a.scratch = val();
    else if (k == "--device") a.device = std::stoi(val());
    else if (k == "--threads") a.threads = std::stoi(val());
    else if (k == "--cpu-seconds") a.cpu_seconds = std::stol(val());
    else if (k == "--address-space") a.address_space = std::stoull(val());
    else if (k == "--scratch-limit") a.scratch_limit = std::stoull(val());
    else if (k == "--flush-bytes") a.flush_bytes = std::stoull(val());
    else if (k == "--no-drop-root") a.drop_root = false;
    else die("unknown argument " + k, 2);
  }
  if (a.backend != "cpu" && a.backend != "cuda") die("--backend must be cpu or cuda", 2);
  if (a.scratch.empty()) die("--scratch is required", 2);
  return a;
}

kf::Tensor make_view(const proto::TensorDesc& d, void* data) {
  kf::Tensor t{};
  t.data = data;
  t.ndim = d.ndim;
  t.dtype = d.dtype;
  int64_t s = 1;
  for (int i = d.ndim - 1; i >= 0; --i) {
    t.shape[i] = d.shape[i];
    t.stride[i] = s;
    s *= d.shape[i];
  }
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  // Die with the evaluator; refuse to run if it is already gone.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() == 1) die("parent gone");
  const Args args = parse(argc, argv);
  const bool cuda = args.backend == "cuda";

  // --- map the shared tensors (the memfd is sealed against shrinking by the evaluator)
  off_t shm_size = lseek(proto::kFdShm, 0, SEEK_END);
  if (shm_size < off_t(sizeof(proto::Layout))) die("shared memory too small");
  void* base = mmap(nullptr, size_t(shm_size), PROT_READ | PROT_WRITE, MAP_SHARED, proto::kFdShm, 0);
  if (base == MAP_FAILED) die(std::string("mmap: ") + std::strerror(errno));
  auto* L = static_cast<proto::Layout*>(base);
  if (L->magic != proto::kMagic || L->total_bytes != uint64_t(shm_size) || L->n_in < 0 || L->n_out < 1 ||
      L->n_in > proto::kMaxTensors || L->n_out > proto::kMaxTensors || L->n_slots < 1 || L->n_slots > proto::kMaxSlots)
    die("bad layout");
  char* B = static_cast<char*>(base);
  L->forbidden_syscall = -1;

  Harness harness;
  harness.cuda = cuda;
  harness.limit = args.scratch_limit;
  kf::Context ctx{};
  ctx.abi_version = KF_ABI_VERSION;
  ctx.backend = cuda ? kf::KF_BACKEND_CUDA : kf::KF_BACKEND_CPU;
  ctx.num_threads = args.threads;
  ctx.device = args.device;
  ctx.scratch_alloc = scratch_alloc;
  ctx.scratch_free = scratch_free;
  ctx.harness = &harness;

  // Per slot, the tensors the kernel sees: host views into shm (CPU) or device buffers (CUDA).
  std::vector<std::vector<kf::Tensor>> ins(L->n_slots), outs(L->n_slots);
  void* flush_buf = nullptr;
  char* dbase = nullptr;  // CUDA: the IPC device arena, if the evaluator shares one
#ifdef KF_WORKER_CUDA
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
#endif
  if (cuda) {
#ifdef KF_WORKER_CUDA
    auto ck = [](cudaError_t e, const char* what) {
      if (e != cudaSuccess) die(std::string(what) + ": " + cudaGetErrorString(e));
    };
    ck(cudaSetDevice(args.device), "cudaSetDevice");
    ck(cudaFree(nullptr), "CUDA context");
    ck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    if (cublasCreate(&cublas) != CUBLAS_STATUS_SUCCESS) die("cublasCreate failed");
    cublasSetStream(cublas, stream);
    ctx.stream = stream;
    ctx.cublas = cublas;
    harness.stream = stream;
    if (L->device_arena) {
      // The evaluator's device arena: the kernel works on it in place (protocol.h).
      cudaIpcMemHandle_t h;
      std::memcpy(&h, L->ipc_handle, sizeof h);
      void* d = nullptr;
      ck(cudaIpcOpenMemHandle(&d, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
      dbase = static_cast<char*>(d);
      for (int s = 0; s < L->n_slots; ++s) {
        for (int t = 0; t < L->n_in; ++t) {
          if (L->off_in[s][t] + L->in[t].nbytes > L->arena_bytes) die("bad layout");
          ins[s].push_back(make_view(L->in[t], dbase + L->off_in[s][t]));
        }
        for (int t = 0; t < L->n_out; ++t) {
          if (L->off_out_late[s][t] + L->out[t].nbytes > L->arena_bytes ||
              L->off_out_ret[s][t] + L->out[t].nbytes > L->arena_bytes)
            die("bad layout");
          outs[s].push_back(make_view(L->out[t], dbase + L->off_out_late[s][t]));
        }
      }
    } else {
      cudaHostRegister(base, size_t(shm_size), cudaHostRegisterDefault);  // pinned copies; optional
      cudaGetLastError();
    }
    for (int s = 0; s < L->n_slots && !L->device_arena; ++s) {
      for (int t = 0; t < L->n_in; ++t) {
        void* p = nullptr;
        ck(cudaMalloc(&p, std::max<size_t>(L->in[t].nbytes, 256)), "cudaMalloc input");
        ins[s].push_back(make_view(L->in[t], p));
      }
      for (int t = 0; t < L->n_out; ++t) {
        void* p = nullptr;
        ck(cudaMalloc(&p, std::max<size_t>(L->out[t].nbytes, 256)), "cudaMalloc output");
        outs[s].push_back(make_view(L->out[t], p));
      }
    }
    if (args.flush_bytes) ck(cudaMalloc(&flush_buf, args.flush_bytes), "cudaMalloc flush");
    ck(cudaDeviceSynchronize(), "init sync");
#else
    die("this worker was built without CUDA");
#endif
  } else {
    for (int s = 0; s < L->n_slots; ++s) {
      for (int t = 0; t < L->n_in; ++t) ins[s].push_back(make_view(L->in[t], B + L->off_in[s][t]));
      for (int t = 0; t < L->n_out; ++t) outs[s].push_back(make_view(L->out[t], B + L->off_out_late[s][t]));
    }
    if (args.flush_bytes) {
      flush_buf = std::aligned_alloc(4096, (args.flush_bytes + 4095) & ~4095ull);
      if (!flush_buf) die("flush buffer");
      std::memset(flush_buf, 1, args.flush_bytes);
    }
  }

  // --- confine, then load untrusted code
  if (chdir(args.scratch.c_str()) != 0) die("chdir scratch: " + std::string(std::strerror(errno)));
  kf::evaluator::worker::install_sigsys_handler(&L->forbidden_syscall);
  ConfineOptions co;
  co.cpu_backend = !cuda;
  co.cpu_seconds = args.cpu_seconds;
  co.address_space_bytes = args.address_space;
  co.drop_root = args.drop_root;
  const std::string cerr = kf::evaluator::worker::confine(co);
  if (!cerr.empty()) die("confinement failed: " + cerr);

  using Forward = int (*)(kf::Context*, const kf::Tensor*, int, kf::Tensor*, int);
  Forward forward = nullptr;
  int64_t last_other_cpu = other_threads_cpu_ns(), last_reply_ns = now_ns();
  std::vector<ThreadCpu> last_thread_cpu = other_thread_cpu();
  std::vector<pid_t> preload;  // threads that existed before the candidate was loaded
  unsigned flush_round = 0;

  proto::Command cmd;
  while (read_all(proto::kFdCmd, &cmd, sizeof cmd)) {
    proto::Reply rep{};
    rep.kind = proto::K_REPLY;
    if (cmd.op == proto::OP_QUIT) break;
    if (cmd.op == proto::OP_LOAD) {
      for (const ThreadCpu& t : other_thread_cpu()) preload.push_back(t.tid);
      cmd.path[sizeof cmd.path - 1] = 0;
      void* h = dlopen(cmd.path, RTLD_NOW | RTLD_LOCAL);
      if (!h) {
        rep.status = proto::ST_LOAD_FAILED;
        std::snprintf(rep.msg, sizeof rep.msg, "dlopen: %s", dlerror());
      } else if (!(forward = reinterpret_cast<Forward>(dlsym(h, "kf_forward")))) {
        rep.status = proto::ST_LOAD_FAILED;
        std::snprintf(rep.msg, sizeof rep.msg, "the shared object defines no extern \"C\" kf_forward");
      }
      rep.threads_after = count_threads();
      last_other_cpu = other_threads_cpu_ns();
      last_thread_cpu = other_thread_cpu();
      last_reply_ns = now_ns();
      if (!write_all(proto::kFdReply, &rep, sizeof rep)) break;
      continue;
    }
    if (cmd.op != proto::OP_RUN || !forward || cmd.slot >= uint32_t(L->n_slots)) {
      rep.status = proto::ST_PROTOCOL;
      std::snprintf(rep.msg, sizeof rep.msg, "bad command");
      write_all(proto::kFdReply, &rep, sizeof rep);
      break;
    }
    const int s = int(cmd.slot);
    harness.pattern = cmd.poison;

    // --- stage: inputs in, outputs poisoned, caches flushed
    if (cuda) {
#ifdef KF_WORKER_CUDA
      if (!dbase)
        for (int t = 0; t < L->n_in; ++t)
          cudaMemcpy(ins[s][t].data, B + L->off_in[s][t], L->in[t].nbytes, cudaMemcpyHostToDevice);
      for (int t = 0; t < L->n_out; ++t)
        cudaMemsetAsync(outs[s][t].data, cmd.poison ? 0x5A : 0xFF, L->out[t].nbytes, stream);  // poison.h patterns
      if (cmd.flush_cache && flush_buf) cudaMemsetAsync(flush_buf, int(++flush_round & 0xFF), args.flush_bytes, stream);
      cudaDeviceSynchronize();
#endif
    } else {
      for (int t = 0; t < L->n_out; ++t)
        kf::evaluator::poison_fill_host(outs[s][t].data, L->out[t].nbytes, L->out[t].dtype, cmd.poison);
      if (cmd.flush_cache && flush_buf) {
        volatile unsigned char* f = static_cast<unsigned char*>(flush_buf);
        const unsigned char v = static_cast<unsigned char>(++flush_round);
        for (size_t i = 0; i < args.flush_bytes; i += 64) f[i] = v;
      }
    }

    // --- the timed call: device-wide sync on both sides, so work on any stream counts
    // CPU used by other threads since the last reply, staging included: work done while
    // the inputs sit in shared memory but before the clock starts is background work.
    rep.idle_cpu_ns = other_threads_cpu_ns() - last_other_cpu;
    rep.idle_wall_ns = now_ns() - last_reply_ns;
    busiest_thread(last_thread_cpu, preload, rep);
    rep.threads_before = count_threads();
    const int64_t ps0 = now_ns();
#ifdef KF_WORKER_CUDA
    if (cuda) cudaDeviceSynchronize();
#endif
    rep.presync_ns = now_ns() - ps0;
    proto::Reply mark{};
    mark.kind = proto::K_MARK_START;
    if (!write_all(proto::kFdReply, &mark, sizeof mark)) break;
    const int64_t cpu0 = now_ns(CLOCK_PROCESS_CPUTIME_ID);
    const int64_t t0 = now_ns();
    rep.rc = forward(&ctx, ins[s].data(), L->n_in, outs[s].data(), L->n_out);
#ifdef KF_WORKER_CUDA
    cudaError_t cerr_call = cuda ? cudaDeviceSynchronize() : cudaSuccess;
#endif
    const int64_t t1 = now_ns();
    rep.call_cpu_ns = now_ns(CLOCK_PROCESS_CPUTIME_ID) - cpu0;
    rep.elapsed_ns = t1 - t0;
    mark.kind = proto::K_MARK_END;
    if (!write_all(proto::kFdReply, &mark, sizeof mark)) break;
    // Snapshot the CPU outputs first: a detached thread still writing them after return
    // must not get the microseconds of the thread count below to finish unseen.
    if (!cuda)
      for (int t = 0; t < L->n_out; ++t) std::memcpy(B + L->off_out_ret[s][t], outs[s][t].data, L->out[t].nbytes);
    rep.threads_after = count_threads();

#ifdef KF_WORKER_CUDA
    if (cuda) {
      if (cerr_call == cudaSuccess) cerr_call = cudaGetLastError();
      if (cerr_call != cudaSuccess) {
        rep.status = proto::ST_CUDA_ERROR;
        std::snprintf(rep.msg, sizeof rep.msg, "CUDA error after kf_forward: %s (%s)", cudaGetErrorName(cerr_call),
                      cudaGetErrorString(cerr_call));
        write_all(proto::kFdReply, &rep, sizeof rep);
        _exit(4);  // the context is unusable; the evaluator starts a fresh worker
      }
      if (dbase) {
        for (int t = 0; t < L->n_out; ++t)
          cudaMemcpy(dbase + L->off_out_ret[s][t], outs[s][t].data, L->out[t].nbytes, cudaMemcpyDeviceToDevice);
      } else {
        for (int t = 0; t < L->n_out; ++t)
          cudaMemcpy(B + L->off_out_ret[s][t], outs[s][t].data, L->out[t].nbytes, cudaMemcpyDeviceToHost);
        for (int t = 0; t < L->n_in; ++t)
          cudaMemcpy(B + L->off_in[s][t], ins[s][t].data, L->in[t].nbytes, cudaMemcpyDeviceToHost);
      }
    }
#endif

    // --- probe: is anything still working after return? First let threads that finished
    // inside the call go to sleep (the kernel folds a running thread's CPU time into the
    // process clock only at ticks and context switches), then measure a quiet window.
    int64_t other_probe_start = other_threads_cpu_ns();
    if (cmd.probe_us) {
      timespec settle{0, 1000000};
      while (nanosleep(&settle, &settle) != 0 && errno == EINTR) {}
      other_probe_start = other_threads_cpu_ns();
      timespec d{time_t(cmd.probe_us / 1000000), long(cmd.probe_us % 1000000) * 1000};
      while (nanosleep(&d, &d) != 0 && errno == EINTR) {}
    }
#ifdef KF_WORKER_CUDA
    if (cuda) {
      cudaDeviceSynchronize();
      if (!dbase)  // with the arena the evaluator reads the live buffer itself
        for (int t = 0; t < L->n_out; ++t)
          cudaMemcpy(B + L->off_out_late[s][t], outs[s][t].data, L->out[t].nbytes, cudaMemcpyDeviceToHost);
      cudaError_t e = cudaGetLastError();
      if (e != cudaSuccess) {
        rep.status = proto::ST_CUDA_ERROR;
        std::snprintf(rep.msg, sizeof rep.msg, "CUDA error after return (deferred work?): %s", cudaGetErrorName(e));
        write_all(proto::kFdReply, &rep, sizeof rep);
        _exit(4);
      }
    }
#endif
    rep.late_cpu_ns = other_threads_cpu_ns() - other_probe_start;
    rep.threads_late = count_threads();
    release_all(&harness);
    if (rep.rc != 0 && rep.status == proto::ST_OK) rep.status = proto::ST_KERNEL_ERROR;
    last_other_cpu = other_threads_cpu_ns();
    last_thread_cpu = other_thread_cpu();
    last_reply_ns = now_ns();
    if (!write_all(proto::kFdReply, &rep, sizeof rep)) break;
  }
  _exit(0);  // skip static destructors of whatever the candidate registered
}
