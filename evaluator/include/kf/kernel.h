// This header is shown to the policy in every prompt: its layout is part of the prompt.
// clang-format off
// kf/kernel.h: the kernel ABI, the only header a candidate kernel includes.
//
// Plain C++ (no torch, no CUDA headers): nvcc and g++ both compile it, so a candidate
// builds in about a second instead of the ~24 s of torch's load_inline.
//
// A candidate is one source file that defines
//
//   extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in,
//                             kf::Tensor* out, int n_out);
//
// Contract (enforced by the evaluator, see docs/evaluator.md):
// - `in` holds the task's forward inputs (x0..xN) first, then the module's parameters,
//   then its buffers, in the order the task lists them (Task::inputs, Task::params).
//   Inputs are read-only: the evaluator compares them with a private copy after the call.
// - `out` holds the outputs, allocated by the harness with the reference's exact shapes
//   and dtypes, and poisoned before every call (NaN bit patterns for floats, 0xFF.. or
//   0x5A.. for integers). Every element must be written before kf_forward returns.
// - All tensors are dense and row-major (stride[i] = prod(shape[i+1..]), in elements).
//   CPU backend: data are host pointers. CUDA backend: data are device pointers.
// - Work must be complete when kf_forward returns, or be queued on ctx->stream or any
//   other stream of the device: the harness calls cudaDeviceSynchronize() before reading
//   the clock. Host threads must be idle after return; none may be left working.
// - Temporary memory comes from ctx->scratch_alloc (freed by the harness after the call
//   if the candidate does not free it). Its contents are garbage, different every call.
// - Return 0 on success; any other value is reported as a runtime error.
// - The candidate runs in a sandbox: no files, no network, no new processes, no exec.
#ifndef KF_KERNEL_H_
#define KF_KERNEL_H_

#include <stddef.h>
#include <stdint.h>

#define KF_ABI_VERSION 1
#define KF_MAX_DIMS 8

namespace kf {

// Element types. Values are part of the ABI: never renumber.
enum DType : int {
  KF_FLOAT32 = 0,
  KF_FLOAT16 = 1,
  KF_BFLOAT16 = 2,
  KF_FLOAT64 = 3,
  KF_INT32 = 4,
  KF_INT64 = 5,
  KF_INT16 = 6,
  KF_INT8 = 7,
  KF_UINT8 = 8,
  KF_BOOL = 9,
};

inline size_t dtype_size(int dtype) {
  switch (dtype) {
    case KF_FLOAT64: case KF_INT64: return 8;
    case KF_FLOAT32: case KF_INT32: return 4;
    case KF_FLOAT16: case KF_BFLOAT16: case KF_INT16: return 2;
    default: return 1;
  }
}

// A view of one dense tensor. The harness owns the memory.
struct Tensor {
  void* data;
  int64_t shape[KF_MAX_DIMS];
  int64_t stride[KF_MAX_DIMS];  // in elements
  int ndim;
  int dtype;                    // a kf::DType value

  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  size_t nbytes() const { return (size_t)numel() * dtype_size(dtype); }
};

enum Backend : int { KF_BACKEND_CPU = 0, KF_BACKEND_CUDA = 1 };

// What the harness gives the kernel. Fields marked CUDA are null on the CPU backend.
struct Context {
  int abi_version;              // KF_ABI_VERSION
  int backend;                  // a kf::Backend value
  void* stream;                 // CUDA: the cudaStream_t to launch on (cast it)
  void* cublas;                 // CUDA: a cublasHandle_t bound to `stream` (cast it)
  int device;                   // CUDA: device ordinal
  int num_threads;              // CPU: threads the kernel may use (OpenMP default is set to it)
  // Scratch memory of the backend's kind (device memory on CUDA), at least 256-byte
  // aligned; null when the per-call scratch limit would be exceeded.
  void* (*scratch_alloc)(Context* ctx, size_t bytes);
  void (*scratch_free)(Context* ctx, void* ptr);
  void* harness;                // private to the harness
};

}  // namespace kf

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out);

#endif  // KF_KERNEL_H_
