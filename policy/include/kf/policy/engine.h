// Engine: the rollout engine of an actor. It serves many requests (a prompt and n samples
// of it, e.g. a GRPO group) at once:
//   - continuous batching: the running batch is re-formed every `check_every` decode steps;
//     a sequence that ended (EOS, loop, max tokens) leaves it there and a waiting request
//     joins (its prompt is prefilled, its first tokens sampled);
//   - a paged KV cache: per layer one pool of fixed-size blocks (block_size tokens) sized by
//     a memory budget in bytes; each sequence has a block table. A request is admitted only
//     when the pool can hold all of its samples at their longest (prompt + max_new_tokens),
//     so a running sequence never waits for memory and nothing is preempted;
//   - the prompt prefilled once per request: its blocks are shared by the n samples by
//     reference count; the last, partial block is copied on the first write of a sample
//     that does not own it alone (copy-on-write);
//   - attention reads a working copy of the batch's keys and values, gathered from the
//     blocks into logical order once per chunk of check_every steps (each step appends its
//     token to the copy and to the pool): one gather per chunk, contiguous reads per step,
//     at the cost of holding that copy (about the running sequences' KV once more);
//   - on CUDA, the decode step (model forward to logits) is captured as a CUDA graph per
//     (batch bucket, KV-length bucket) and replayed; the batch is padded to its bucket with
//     rows that write to a reserved scratch block. On the CPU the step runs eagerly
//     (padding only when EngineOptions::pad_batch asks for it, which tests use to show
//     that padding does not change results).
// Tokens are drawn by policy::sample_tokens (the Sampler's code: temperature, top-k, top-p,
// padding vocab masked) and each token's log-prob is log softmax(logits / temperature) of
// the full vocabulary, as the learner recomputes it. Randomness comes from one generator
// per engine (EngineOptions::seed): a request's SamplingParams::seed is not used, and with
// temperature > 0 the tokens drawn depend on which requests share the batch. Greedy
// decoding does not depend on the batch (up to float rounding of the attention sums).
// Threading: one thread drives an Engine; the model must not be used concurrently, nor its
// weights changed while requests are in flight (idle() tells when none is).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "kf/policy/gpu_share.h"
#include "kf/policy/model.h"
#include "kf/policy/sampler.h"

namespace kf::policy {

struct EngineOptions {
  int64_t kv_budget_mb = 256;  // the KV pool, all layers, keys and values
  int64_t block_size = 16;     // tokens per KV block
  int64_t max_sequences = 64;  // most sequences in the running batch
  int64_t check_every = 8;     // decode steps between host checks (stops, admission)
  // Batch sizes the step is padded to (ascending); empty: powers of two up to
  // max_sequences. Used on CUDA, and on the CPU when pad_batch is set.
  std::vector<int64_t> batch_buckets;
  bool pad_batch = false;  // CPU: pad to the buckets too (CUDA always pads)
  bool cuda_graph = true;  // CUDA: capture and replay the decode step
  uint64_t seed = 0;
  GpuShare* gpu_share = nullptr;  // held while the engine works, paused at every host check
};

struct EngineRequest {
  uint64_t id = 0;  // the caller's handle, returned with the result
  std::vector<int32_t> prompt;
  int64_t n = 1;  // samples sharing the prompt's prefill
  // temperature, top_p, top_k, max_new_tokens, eos_ids, loop_*, valid_vocab (-1: the
  // model's vocab). stop strings, seed, static_decode, cuda_graph, shared_prefill and
  // gpu_share are not used (the engine's options decide).
  SamplingParams sampling;
};

struct EngineResult {
  uint64_t id = 0;
  std::vector<Completion> completions;  // n, in sample order; text stays empty
  double queued_s = 0;                  // submit -> admission (waiting for a slot or blocks)
  double latency_s = 0;                 // submit -> last sample finished
};

struct EngineStats {
  int64_t blocks_total = 0, blocks_free = 0, blocks_peak_used = 0;
  int64_t block_bytes = 0;  // one block, all layers, K and V
  int64_t decode_steps = 0, decode_rows = 0, padded_rows = 0;
  int64_t prefill_tokens = 0, cow_copies = 0, graphs_captured = 0, graphs_dropped = 0;
  int64_t waiting = 0, running_requests = 0, running_sequences = 0;
};

class Engine {
 public:
  // Allocates the KV pool now (throws kf::Error naming actors.engine.kv_budget_mb when it
  // holds fewer than two blocks, or on bad options).
  Engine(CausalLM model, EngineOptions opts);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request (FIFO). Throws kf::Error for an empty prompt, a token outside the
  // vocab, n < 1, max_new_tokens < 1, stop strings, or a request that could never fit the
  // KV budget (the message says how many MB it needs).
  void submit(EngineRequest r);
  // Admits, prefills and decodes until at least one request has finished, and returns the
  // finished ones (empty only when nothing is queued or running).
  std::vector<EngineResult> step();
  // Runs until every queued request has finished; results in finishing order.
  std::vector<EngineResult> run_all();

  bool idle() const;  // nothing queued or running
  EngineStats stats() const;
  const EngineOptions& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kf::policy
