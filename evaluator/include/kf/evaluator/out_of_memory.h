#pragma once
// Running out of GPU memory while verifying is the GPU's state (other processes of the run
// hold it), not the candidate's: a verification that hit it is tried again rather than
// scored. The evaluator service retries later without blocking its queue (service.h); the
// one-process stages (tools/selfsup) retry in place through evaluate_retrying_oom.
#include <chrono>
#include <cstdint>
#include <string>

#include "kf/evaluator/evaluator.h"

namespace kf::evaluator {

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

// evaluate(), compiled once and verified up to `attempts` times while the GPU is out of
// memory, the allocator cache freed and delay x try waited between tries. After the last
// try the result is that runtime_error; `gave_up` (if given) is set when that happened.
Result evaluate_retrying_oom(Evaluator& ev, const tasks::Task& task, tasks::Backend backend, const std::string& source,
                             uint64_t candidate_seed, int attempts, std::chrono::milliseconds delay,
                             bool* gave_up = nullptr);

}  // namespace kf::evaluator
