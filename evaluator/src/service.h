// EvaluatorService's inside (service.cpp): how a step goes, the record and verdict-log line
// it writes per candidate, and the error that tells a source failure from the rest (so that
// kf-evaluator can tell "the head's server is gone" from a fatal error).
//
// A step: claims up to `batch` candidates from the CandidateSource (claims whose group is
// gone or that were scored already are settled inside the source and counted through
// unresolved_gone() / unresolved_scored(): lost_group_gone and counter kEvalLost,
// already_scored); claims held after running out of GPU memory go first once due. Every
// compile of the batch is submitted to the pool at once, so compiles run while the first
// candidate is verified. Each candidate is verified against its task (an unknown task is
// a runtime_error caused by the environment; no code: compile_error with the extraction
// error), then completed with its result record: the source stores it (shm: into the
// candidate's empty result slot in its replay group; network: to kf:results), enters a
// verified kernel by replay::kernel_entry_of (degenerate tasks with speedup 1.0), and only
// then acknowledges the claim, so a kill in between scores it twice, never zero times. A
// result whose group went while it was verified is "not joined" (logged); a late result
// (another evaluator's counts) is logged and counted late. A result the source could not
// store is dropped (counted lost: results_dropped, kEvalLost) with a log line. A stop
// signal gives the rest of the batch back to the source; the destructor gives back claims
// waiting for an out-of-memory retry.
//
// Out of GPU memory is the machine's state, not the kernel's fault (other processes on a
// shared GPU hold memory; the big tasks' input sets take GiBs): when the evaluator's own
// allocation fails (c10::OutOfMemoryError) or the sandbox worker cannot allocate its
// buffers ("fatal: cudaMalloc ...: out of memory"), the allocator cache is emptied and the
// claim is held, verified again after oom_retry_delay x attempt; only after oom_attempts
// tries is it scored runtime_error (environment).
//
// While the service holds claims (the batch, the retries), a keeper thread calls
// source.keep_alive(held) every keep_alive_every: the network source renews them, so a long
// verification is not claimed away as abandoned; the shared-memory source ignores it.
#pragma once
#include <string>

#include "kf/common/error.h"
#include "kf/evaluator/evaluator.h"

namespace kf::evaluator {

// What step() throws when the CandidateSource failed (claim, give_back, drop): the source
// could not reach its queue; for the network source, its server has been gone for
// cluster.redis.gone_after_s. The message names the source (where()).
class SourceError : public Error {
 public:
  using Error::Error;
};

// The replay record of a verdict on candidate `c` (times in microseconds, spread p90-p10),
// with the speedup interval and the timing_unstable / task_degenerate flags;
// exclude_from_training = task_degenerate && !train_on_degenerate_tasks.
replay::Result to_record(const Result& r, const replay::Candidate& c, int evaluator_id,
                         bool train_on_degenerate_tasks = false);

// One line of a verdict log (metrics/verdicts-<id>.jsonl; JSON, no newline): time, task,
// level, policy version, verdict, speedup, reward, compile/verify seconds, the reason's
// first 300 bytes; "probe": true for a learning-curve probe sample. tools/report's
// per-minute windows, per-level table and cheat list come from it.
std::string verdict_json_line(const replay::Candidate& c, const Result& r, int level, int evaluator_id);

}  // namespace kf::evaluator
