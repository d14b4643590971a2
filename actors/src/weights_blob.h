// The policy weight blob of the snapshot store, as the learner publishes it
// (SnapshotPublisher, learner/include/kf/learner/learner.h): a safetensors image in memory (u64
// header length, JSON header with HF parameter names, dtype, shape and offsets, then the
// data), metadata "kf_version" = policy version.
//
// Reading is two-phase so a bad snapshot never leaves the model half-updated: check()
// parses the header and matches every tensor against the model (names, shapes, known
// dtypes, none missing or extra) without touching it; load() copies only after check()
// passed. Actors log and ignore a blob that fails check() and keep their old weights.
// An adapter-only blob (LoRA: metadata kf_lora_rank, kf_lora_alpha, kf_lora_targets) holds
// just the adapter tensors: check() matches them against the adapters the model has or
// would get, and the first load() adds those adapters to the model (its dtype, applied
// unmerged: y = W x + (alpha / rank) B A x); the base weights stay as they are.
// make_weights_blob() writes the same format (tests, serial mode); adapter-only for a
// model with adapters.
// Threading: the model must not be in use by another thread during load().
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kf/policy/policy.h"

namespace kf::actors {

struct BlobCheck {
  bool ok = false;
  std::string error;     // names the tensor and what does not match
  int64_t version = -1;  // kf_version metadata (-1 absent)
};

BlobCheck check_weights_blob(policy::CausalLM& model, const void* data, std::size_t bytes, const std::string& context);
// check + copy; throws kf::Error (model untouched) when check fails. Returns the version.
int64_t load_weights_blob(policy::CausalLM& model, const void* data, std::size_t bytes, const std::string& context);
std::vector<unsigned char> make_weights_blob(policy::CausalLM& model, int64_t version,
                                             torch::ScalarType dtype = torch::kFloat32);

}  // namespace kf::actors
