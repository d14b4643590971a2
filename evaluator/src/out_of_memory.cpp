// Out of GPU memory while verifying: its classification, one attempt, and the in-place
// retry of the one-process stages (attempt.h; evaluate_retrying_oom in the facade).
#include "attempt.h"

#include <c10/util/Exception.h>

#include <thread>

#include "kf/common/log.h"
#include "kf/tasks/tasks.h"
#include "reward.h"

namespace kf::evaluator {

bool worker_out_of_memory(const Result& r) {
  if (r.verdict != Verdict::runtime_error) return false;
  // The worker's harness sets up (device, buffers, cuBLAS) before it loads the kernel, so
  // these are the GPU's state; cuBLAS fails to create its handle when memory is short.
  return (r.reason.find("fatal: cuda") != std::string::npos && r.reason.find("out of memory") != std::string::npos) ||
         r.reason.find("fatal: cublasCreate failed") != std::string::npos;
}

Attempt evaluate_once(Evaluator& ev, const tasks::Task& task, tasks::Backend backend, const CompileResult& compiled,
                      uint64_t candidate_seed) {
  Attempt a;
  try {
    a.result = ev.evaluate_compiled(task, backend, compiled, candidate_seed);
    if (worker_out_of_memory(a.result)) a.out_of_memory = a.result.reason;
  } catch (const c10::OutOfMemoryError& e) {
    a.out_of_memory = e.what();
    a.result = Result();
    a.result.task = task.name();
    a.result.backend = tasks::backend_name(backend);
    a.result.candidate_key = compiled.key;
    a.result.compile_s = compiled.seconds;
    a.result.verdict = Verdict::runtime_error;
    a.result.reason = "evaluator: out of GPU memory: " + a.out_of_memory.substr(0, a.out_of_memory.find('\n'));
    a.result.reward = ev.reward_model().failure_reward(Verdict::runtime_error);
  }
  return a;
}

Result evaluate_retrying_oom(Evaluator& ev, const tasks::Task& task, tasks::Backend backend, const std::string& source,
                             uint64_t candidate_seed, int attempts, std::chrono::milliseconds delay, bool* gave_up) {
  const CompileResult cr = ev.compiler().compile(source, abi_backend(backend));
  if (gave_up) *gave_up = false;
  for (int attempt = 1;; ++attempt) {
    Attempt a = evaluate_once(ev, task, backend, cr, candidate_seed);
    if (a.out_of_memory.empty()) return std::move(a.result);
    tasks::release_device_cache();
    const std::string why = a.out_of_memory.substr(0, a.out_of_memory.find('\n')).substr(0, 200);
    if (attempt >= attempts) {
      log_error("evaluator: out of GPU memory verifying a ", task.name(), " kernel on ", attempt, " tries (", why,
                "); it is scored runtime_error and the caller goes on");
      if (gave_up) *gave_up = true;
      return std::move(a.result);
    }
    log_warn("evaluator: out of GPU memory verifying a ", task.name(), " kernel (", why,
             "); cache freed, verified again in ", (delay * attempt).count(), " ms (try ", attempt + 1, " of ",
             attempts, ")");
    std::this_thread::sleep_for(delay * attempt);
  }
}

}  // namespace kf::evaluator
