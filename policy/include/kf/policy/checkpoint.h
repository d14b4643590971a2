// Loading and saving HF-format model folders: config.json, model.safetensors (or shards +
// model.safetensors.index.json), tokenizer.json.
// Loading maps each shard and copies tensor by tensor into the model's parameters (any
// dtype conversion happens in that copy), so peak memory is the model plus the page cache.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "kf/policy/config.h"
#include "kf/policy/model.h"
#include "kf/policy/tokenizer.h"

namespace kf::policy {

// Copies every parameter from the checkpoint in `dir` by its HF name. Throws kf::Error
// naming the file and tensor on a missing tensor, a shape or dtype mismatch, or an
// unexpected tensor (rotary inv_freq buffers and a tied lm_head are ignored).
void load_weights(CausalLM& model, const std::string& dir);

// Writes config.json and the weights (one file, or shards of at most max_shard_bytes plus
// an index) as HF transformers writes them; a tied lm_head is not written.
void save_weights(CausalLM& model, const std::string& dir, uint64_t max_shard_bytes = 5ull << 30);

// torch dtype for a config's "dtype"/"torch_dtype" string and the safetensors name of one.
torch::ScalarType dtype_from_name(const std::string& name, const std::string& context);
std::string safetensors_dtype(torch::ScalarType t);

// A whole policy folder: config + weights + tokenizer (optional: tokenizer.json may be absent).
struct Policy {
  ModelConfig config;
  CausalLM model{nullptr};
  std::optional<Tokenizer> tokenizer;
};

// Loads `dir` onto `device` in `dtype` (default: bf16 on CUDA, fp32 on CPU). Checks that the
// tokenizer's ids fit the model's vocab_size.
Policy load_policy(const std::string& dir, torch::Device device = torch::kCPU,
                   std::optional<torch::ScalarType> dtype = std::nullopt);
// Writes an HF-loadable folder (config.json, weights, tokenizer.json when present).
void save_policy(const Policy& p, const std::string& dir, uint64_t max_shard_bytes = 5ull << 30);

}  // namespace kf::policy
