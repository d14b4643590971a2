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
//   in[s][t]   inputs written by the evaluator before OP_RUN; after the call they hold the
//              inputs as the kernel left them
//   out[s][t]  the live outputs the kernel writes (poisoned by the evaluator before the call)
// CPU backend: both live in the memfd; the kernel works on them in place.
// CUDA backend, device arena (the default): the same regions live in one device
// allocation of the evaluator's, shared by CUDA IPC (ipc_handle); the memfd then holds
// only this header. Nothing crosses PCIe: for GiB-sized GPU tasks that is most of an
// evaluation's time.
// CUDA backend, host staging (fallback when IPC is unavailable): device buffers of the
// worker's own, copied in and out through the memfd by the worker.
//
// The worker is STOPPED (SIGSTOP, every thread) whenever it is not inside a call, so that
// none of the candidate's code runs while the evaluator stages inputs, runs the
// reference or reads the evidence. One OP_RUN:
//   evaluator: writes inputs, poisons outputs, flushes caches, sends OP_RUN, SIGCONT
//   worker:    device sync, K_MARK_START, raise(SIGSTOP)          <- freeze 0
//   evaluator: reads the CPU used so far (work before the clock), SIGCONT
//   worker:    clock, kf_forward, device sync, clock, K_MARK_END (rc, clock),
//              raise(SIGSTOP)                                   <- freeze 1
//   evaluator: copies the outputs "at return" into its own memory, checks the GPU went
//              idle, SIGCONT
//   worker:    device sync (timed: GPU work the call left behind), scratch freed,
//              K_REPLY, raise(SIGSTOP)                          <- freeze 2
// Outputs at return are therefore captured where the candidate cannot reach them, at a
// moment when none of its code can run.
#pragma once
#include <cstddef>
#include <cstdint>

namespace kf::evaluator::proto {

constexpr uint64_t kMagic = 0x4b464556414c3031ull;  // "KFEVAL01"
constexpr int kMaxTensors = 4096;  // inputs, then parameters and buffers (DenseNet201: over 1,000)
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
  uint64_t off_out[kMaxSlots][kMaxTensors];
  int32_t device_arena;  // 1: offsets are into the IPC device arena, not the memfd
  uint64_t arena_bytes;
  unsigned char ipc_handle[64];  // cudaIpcMemHandle_t of the arena
  // Worker status written by the SIGSYS handler (the reply pipe may be mid-message).
  volatile int32_t forbidden_syscall;  // -1: none
};

enum Op : uint32_t { OP_LOAD = 1, OP_RUN = 2, OP_QUIT = 3 };

enum Poison : uint32_t { POISON_FF = 0, POISON_5A = 1 };

struct Command {
  uint32_t op;
  uint32_t slot;
  uint32_t poison;       // Poison pattern for scratch (host staging: outputs too)
  uint32_t flush_cache;  // host staging only: overwrite a cache-sized buffer before the call
  char path[1024];       // OP_LOAD: the shared object; empty: the worker's own empty kernel
                         // (the evaluator's calibration worker, which loads nothing else)
};

enum Status : uint32_t {
  ST_OK = 0,
  ST_LOAD_FAILED = 1,   // dlopen/dlsym failed
  ST_KERNEL_ERROR = 2,  // kf_forward returned nonzero
  ST_CUDA_ERROR = 3,    // a CUDA error after the call (the worker exits after replying)
  ST_PROTOCOL = 4,      // bad command
};

// Messages of OP_RUN, in order: K_MARK_START just before the clock starts, K_MARK_END
// just after it stops (with rc, the worker's clock and the CUDA status: the evaluator
// times the call from outside too, and catches a worker whose clock lies), then, after the
// evaluator resumed it, K_REPLY. OP_LOAD answers with one K_REPLY.
enum Kind : uint32_t { K_MARK_START = 1, K_MARK_END = 2, K_REPLY = 3 };

struct Reply {
  uint32_t kind;
  uint32_t status;
  int32_t rc;  // kf_forward's return value
  int32_t pad;
  int64_t elapsed_ns;     // sync; clock; kf_forward; sync; clock
  int64_t presync_ns;     // how long the device sync before the clock took (busy GPU?)
  int64_t after_sync_ns;  // K_REPLY: how long the device sync after freeze 1 took
  char msg[512];
};

}  // namespace kf::evaluator::proto
