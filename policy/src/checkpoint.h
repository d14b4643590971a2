// Loading weights into an existing model, behind load_policy (kf/policy/policy.h).
#pragma once
#include <string>

#include "kf/policy/policy.h"

namespace kf::policy {

// Copies every parameter from the checkpoint in `dir` by its HF name, mapping each shard and
// converting dtypes in the copy. kf::Error naming the file and tensor on a missing tensor,
// a shape or dtype mismatch, or an unexpected tensor (rotary inv_freq buffers and a tied
// lm_head are ignored).
void load_weights(CausalLM& model, const std::string& dir);

}  // namespace kf::policy
