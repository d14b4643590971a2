// One verification attempt and what the verifier's files share beyond the facade (torch
// side): the ABI backend of a task backend, and the out-of-memory classification that the
// service's retry and evaluate_retrying_oom (out_of_memory.cpp) both use.
#pragma once
#include <string>

#include "kf/evaluator/evaluator.h"

namespace kf::evaluator {

// The kernel ABI's backend code (compile service, sandbox) for a task backend.
inline kf::Backend abi_backend(tasks::Backend b) {
  return b == tasks::Backend::CUDA ? KF_BACKEND_CUDA : KF_BACKEND_CPU;
}

// The worker's harness could not set up (device, buffers, cuBLAS) for want of memory.
bool worker_out_of_memory(const Result& r);

// One verification; `out_of_memory` says why when the GPU ran out of memory (the evaluator
// process's allocation, c10::OutOfMemoryError, or the worker's set-up), else it is empty.
struct Attempt {
  Result result;
  std::string out_of_memory;
};
Attempt evaluate_once(Evaluator& ev, const tasks::Task& task, tasks::Backend backend, const CompileResult& compiled,
                      uint64_t candidate_seed);

}  // namespace kf::evaluator
