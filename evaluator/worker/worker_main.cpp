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
// Between calls it is stopped (protocol.h): it raises SIGSTOP after each message that ends
// a phase, and the evaluator resumes it. Its own clock and messages only time the call and
// say how it ended; what the verdict relies on (outputs at return, CPU accounting, thread
// counts) the evaluator reads itself while the worker is stopped.
//
//   kf-sandbox-worker --backend cpu|cuda --scratch DIR [--device N] [--threads N]
//                     [--cpu-seconds N] [--address-space BYTES] [--scratch-limit BYTES]
//                     [--flush-bytes BYTES] [--no-drop-root]
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
#include <thread>
#include <vector>

#include "wire/protocol.h"
#include "wire/confine.h"
#include "kf/kernel.h"
#include "wire/poison.h"

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
  bool own_uid = false;  // a user of its own, not nobody (with the private /proc)
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
    if (h->cuda)
      cudaFree(p);
    else
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
    if (k == "--backend")
      a.backend = val();
    else if (k == "--scratch")
      a.scratch = val();
    else if (k == "--device")
      a.device = std::stoi(val());
    else if (k == "--threads")
      a.threads = std::stoi(val());
    else if (k == "--cpu-seconds")
      a.cpu_seconds = std::stol(val());
    else if (k == "--address-space")
      a.address_space = std::stoull(val());
    else if (k == "--scratch-limit")
      a.scratch_limit = std::stoull(val());
    else if (k == "--flush-bytes")
      a.flush_bytes = std::stoull(val());
    else if (k == "--no-drop-root")
      a.drop_root = false;
    else if (k == "--own-uid")
      a.own_uid = true;
    else
      die("unknown argument " + k, 2);
  }
  if (a.backend != "cpu" && a.backend != "cuda") die("--backend must be cpu or cuda", 2);
  if (a.scratch.empty()) die("--scratch is required", 2);
  return a;
}

int empty_forward(kf::Context*, const kf::Tensor*, int, kf::Tensor*, int) { return 0; }

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
          if (L->off_out[s][t] + L->out[t].nbytes > L->arena_bytes) die("bad layout");
          outs[s].push_back(make_view(L->out[t], dbase + L->off_out[s][t]));
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
      for (int t = 0; t < L->n_out; ++t) outs[s].push_back(make_view(L->out[t], B + L->off_out[s][t]));
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
  co.own_uid = args.own_uid;
  // glibc installs its internal signal handlers when a single-threaded process creates its
  // first thread; do that here, so that the candidate's threads need no rt_sigaction
  // (which the confinement forbids).
  std::thread([] {}).join();
  const std::string cerr = kf::evaluator::worker::confine(co);
  if (!cerr.empty()) die("confinement failed: " + cerr);

  using Forward = int (*)(kf::Context*, const kf::Tensor*, int, kf::Tensor*, int);
  Forward forward = nullptr;
  unsigned flush_round = 0;
  // Freeze: every thread of the process stops until the evaluator resumes us (protocol.h).
  // SIGSTOP can be neither caught nor blocked, and the candidate cannot send SIGCONT.
  auto freeze = [] { raise(SIGSTOP); };

  proto::Command cmd;
  while (read_all(proto::kFdCmd, &cmd, sizeof cmd)) {
    proto::Reply rep{};
    rep.kind = proto::K_REPLY;
    if (cmd.op == proto::OP_QUIT) break;
    if (cmd.op == proto::OP_LOAD && cmd.path[0] == 0 && !forward) {
      // The worker's own empty kernel: the evaluator times the protocol's fixed cost with it,
      // in a worker that never loads untrusted code (protocol.h).
      forward = empty_forward;
      if (!write_all(proto::kFdReply, &rep, sizeof rep)) break;
      freeze();
      continue;
    }
    if (cmd.op == proto::OP_LOAD) {
      cmd.path[sizeof cmd.path - 1] = 0;
      void* h = dlopen(cmd.path, RTLD_NOW | RTLD_LOCAL);
      if (!h) {
        rep.status = proto::ST_LOAD_FAILED;
        std::snprintf(rep.msg, sizeof rep.msg, "dlopen: %s", dlerror());
      } else if (!(forward = reinterpret_cast<Forward>(dlsym(h, "kf_forward")))) {
        rep.status = proto::ST_LOAD_FAILED;
        std::snprintf(rep.msg, sizeof rep.msg, "the shared object defines no extern \"C\" kf_forward");
      }
      if (!write_all(proto::kFdReply, &rep, sizeof rep)) break;
      freeze();  // whatever the candidate's constructors started waits for the first call
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

    // --- host staging only (no device arena): the worker's own device buffers. With the
    // arena or on the CPU the evaluator has staged, poisoned and flushed already.
#ifdef KF_WORKER_CUDA
    if (cuda && !dbase) {
      for (int t = 0; t < L->n_in; ++t)
        cudaMemcpy(ins[s][t].data, B + L->off_in[s][t], L->in[t].nbytes, cudaMemcpyHostToDevice);
      for (int t = 0; t < L->n_out; ++t)
        cudaMemsetAsync(outs[s][t].data, cmd.poison ? 0x5A : 0xFF, L->out[t].nbytes, stream);  // poison.h patterns
      if (cmd.flush_cache && flush_buf) cudaMemsetAsync(flush_buf, int(++flush_round & 0xFF), args.flush_bytes, stream);
      cudaDeviceSynchronize();
    }
#else
    (void)flush_round;
    (void)flush_buf;
#endif

    // --- the timed call: device-wide sync on both sides, so work on any stream counts
    const int64_t ps0 = now_ns();
#ifdef KF_WORKER_CUDA
    if (cuda) cudaDeviceSynchronize();
#endif
    proto::Reply mark{};
    mark.kind = proto::K_MARK_START;
    mark.presync_ns = now_ns() - ps0;
    if (!write_all(proto::kFdReply, &mark, sizeof mark)) break;
    freeze();  // freeze 0: the evaluator reads what ran before the clock, then starts it
    const int64_t t0 = now_ns();
    mark.rc = forward(&ctx, ins[s].data(), L->n_in, outs[s].data(), L->n_out);
#ifdef KF_WORKER_CUDA
    cudaError_t cerr_call = cuda ? cudaDeviceSynchronize() : cudaSuccess;
    if (cuda && cerr_call == cudaSuccess) cerr_call = cudaGetLastError();
#endif
    const int64_t t1 = now_ns();
    mark.kind = proto::K_MARK_END;
    mark.elapsed_ns = t1 - t0;
#ifdef KF_WORKER_CUDA
    if (cerr_call != cudaSuccess) {
      mark.status = proto::ST_CUDA_ERROR;
      std::snprintf(mark.msg, sizeof mark.msg, "CUDA error after kf_forward: %s (%s)", cudaGetErrorName(cerr_call),
                    cudaGetErrorString(cerr_call));
      write_all(proto::kFdReply, &mark, sizeof mark);
      _exit(4);  // the context is unusable; the evaluator starts a fresh worker
    }
    if (cuda && !dbase) {  // host staging: the evaluator reads the memfd
      for (int t = 0; t < L->n_out; ++t)
        cudaMemcpy(B + L->off_out[s][t], outs[s][t].data, L->out[t].nbytes, cudaMemcpyDeviceToHost);
      for (int t = 0; t < L->n_in; ++t)
        cudaMemcpy(B + L->off_in[s][t], ins[s][t].data, L->in[t].nbytes, cudaMemcpyDeviceToHost);
    }
#endif
    if (!write_all(proto::kFdReply, &mark, sizeof mark)) break;
    freeze();  // freeze 1: the evaluator takes the outputs at return

    // --- resumed: whatever the call left on the GPU shows in how long this sync takes
    const int64_t as0 = now_ns();
#ifdef KF_WORKER_CUDA
    if (cuda) {
      cudaError_t e = cudaDeviceSynchronize();
      if (e == cudaSuccess) e = cudaGetLastError();
      if (e != cudaSuccess) {
        rep.status = proto::ST_CUDA_ERROR;
        std::snprintf(rep.msg, sizeof rep.msg, "CUDA error after return (deferred work?): %s", cudaGetErrorName(e));
        write_all(proto::kFdReply, &rep, sizeof rep);
        _exit(4);
      }
    }
#endif
    rep.after_sync_ns = now_ns() - as0;
    release_all(&harness);
    rep.rc = mark.rc;
    if (rep.rc != 0) rep.status = proto::ST_KERNEL_ERROR;
    if (!write_all(proto::kFdReply, &rep, sizeof rep)) break;
    freeze();  // freeze 2: stopped until the next command
  }
  _exit(0);  // skip static destructors of whatever the candidate registered
}
