// The wire protocol between the trusted evaluator and the sandbox worker.
//
// Why this shape: the worker runs untrusted code in its own address space, so nothing
// it says is believed without a check on the evaluator side. Messages are fixed-size
// POD structs over pipes (no parsing of variable data from the worker), tensor data
// lives in one sealed memfd both processes map (the worker cannot shrink it, so the
// evaluator never takes SIGBUS), and the worker never receives reference outputs.
//
// File descriptors in the worker (set up by the evaluator before exec):
//   3: the memfd (read/write mapping)   4: commands (read end)   5: replies (write end)
//   2: stderr (a pipe the evaluator drains into a bounded buffer)
//
// Shared-memory layout: a Layout header at offset 0, then per slot s, per tensor t
// (inputs first, then outputs) regions at the offsets the header gives:
//   in[s][t]     inputs written by the evaluator before OP_RUN; after the call they hold
//                the inputs as the kernel left them (CUDA: copied back from the device)
//   out_ret[s][t]  outputs as they were when kf_forward returned (after device sync)
//   out_late[s][t] outputs again, after the post-return probe delay
// CPU backend: the kernel reads in[s] and writes out_late[s] in place (the live buffers);
// out_ret is a copy taken at return.
// CUDA backend, device arena (the default): the same regions live in one device
// allocation of the evaluator's, shared by CUDA IPC (ipc_handle); the memfd then holds
// only this header. The kernel works on in[s] and out_late[s] in place, the worker copies
// out_late to out_ret at return, and the evaluator reads everything on the device: no
// tensor crosses PCIe, which for GiB-sized GPU tasks is most of an evaluation's time.
// CUDA backend, host staging (fallback when IPC is unavailable): device buffers of the
// worker's own, copied in and out through the memfd.
#pragma once
#include <cstddef>
#include <cstdint>

namespace kf::evaluator::proto {

constexpr uint64_t kMagic = 0x4b464556414c3031ull;  // "KFEVAL01"
constexpr int kMaxTensors = 64;
constexpr int kMaxSlots = 4;
constexpr int kFdShm = 3, kFdCmd = 4, kFdReply = 5;
constexpr std::size_t kAlign = 4096;

struct TensorDesc {
  int32_t dtype;  // kf::DType
  int32_t ndim;
  int64_t shape[8];
  uint64_t nbytes;
};

struct Layout {
  uint64_t magic;
  uint64_t total_bytes;
  int32_t backend;  // kf::Backend
  int32_t n_in, n_out, n_slots;
  TensorDesc in[kMaxTensors];
  TensorDesc out[kMaxTensors];
  uint64_t off_in[kMaxSlots][kMaxTensors];
  uint64_t off_out_ret[kMaxSlots][kMaxTensors];
  uint64_t off_out_late[kMaxSlots][kMaxTensors];
  int32_t device_arena;             // 1: offsets are into the IPC device arena, not the memfd
  uint64_t arena_bytes;
  unsigned char ipc_handle[64];     // cudaIpcMemHandle_t of the arena
  // Worker status written by the SIGSYS handler (the reply pipe may be mid-message).
  volatile int32_t forbidden_syscall;  // -1: none
};

enum Op : uint32_t { OP_LOAD = 1, OP_RUN = 2, OP_QUIT = 3 };

enum Poison : uint32_t { POISON_FF = 0, POISON_5A = 1 };

struct Command {
  uint32_t op;
  uint32_t slot;
  uint32_t poison;          // Poison pattern for outputs and scratch
  uint32_t flush_cache;     // 1: overwrite a cache-sized buffer before the call
  uint64_t probe_us;        // post-return delay before out_late is taken
  char path[1024];          // OP_LOAD: the shared object
};

enum Status : uint32_t {
  ST_OK = 0,
  ST_LOAD_FAILED = 1,     // dlopen/dlsym failed
  ST_KERNEL_ERROR = 2,    // kf_forward returned nonzero
  ST_CUDA_ERROR = 3,      // a CUDA error after the call (the worker exits after replying)
  ST_PROTOCOL = 4,        // bad command
};

// One message per phase of OP_RUN: MARK_START just before the clock starts and MARK_END
// just after it stops, so the evaluator can time the call from outside and catch a
// kernel that tampers with the worker's clock. Then the final REPLY.
enum Kind : uint32_t { K_MARK_START = 1, K_MARK_END = 2, K_REPLY = 3 };

struct Reply {
  uint32_t kind;
  uint32_t status;
  int32_t rc;               // kf_forward's return value
  int32_t threads_before;   // /proc/self/task count just before the call
  int32_t threads_after;    // ... just after return (device synced)
  int32_t threads_late;     // ... after the probe delay
  int64_t elapsed_ns;       // sync; clock; kf_forward; sync; clock
  int64_t presync_ns;       // how long the device sync before the clock took (busy GPU?)
  int64_t idle_cpu_ns;      // CPU used by other threads between the previous reply and this call
  int64_t late_cpu_ns;      // CPU used by other threads during the probe delay
  int64_t call_cpu_ns;      // CPU of the whole process during the call
  // Who used the idle CPU (diagnosis of the between-calls check): the window's wall time
  // and its busiest thread other than the worker's own, by name, and whether that thread
  // existed before the candidate was loaded (the CUDA runtime's) or came after.
  int64_t idle_wall_ns;
  int64_t idle_top_ns;
  int32_t idle_top_preload;
  char idle_top_name[20];
  char msg[512];
};

}  // namespace kf::evaluator::proto
