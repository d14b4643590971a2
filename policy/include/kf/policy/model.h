// CausalLM: a Llama/Qwen2-family decoder in libtorch (RMSNorm in fp32, half-split RoPE,
// SwiGLU, grouped-query attention via SDPA, optional q/k/v bias, tied or untied
// embeddings). Submodules carry HF names (model.layers.N.self_attn.q_proj, ...), so
// named_parameters() are exactly the checkpoint's tensor names.
// Threading: one thread drives a model at a time (forward mutates the KV cache it is given).
#pragma once
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "kf/policy/config.h"

namespace kf::policy {

// Preallocated per-layer keys/values, [B, kv_heads, capacity, head_dim], plus which slots
// hold real tokens (left padding is masked) and each row's next position id.
struct KVCache {
  std::vector<torch::Tensor> k, v;
  torch::Tensor slot_valid;  // bool [B, capacity]
  torch::Tensor next_pos;    // int64 [B]: the RoPE position of each row's next token
  int64_t length = 0;        // slots filled (same for every row)
  int64_t capacity = 0;
  // When defined (device int64 [1]), decode writes at this slot with index_copy_ and attends
  // over the whole capacity: fixed shapes, so a CUDA graph can capture the step.
  torch::Tensor static_slot;
  static KVCache create(const ModelConfig& c, int64_t batch, int64_t capacity, torch::TensorOptions opts);
};

// LoRA (Hu et al. 2021) on chosen projections: y = W x + b + (alpha / rank) * B (A x), with
// the base W frozen, A [rank, in] small random and B [out, rank] zero, so a fresh adapter
// leaves the model's output unchanged. Adapter tensors are ordinary parameters named
// "<projection>.lora_A.weight" / "<projection>.lora_B.weight" (PEFT's names without its
// "base_model.model." prefix), so checkpoints and snapshots carry them by name.
struct LoraConfig {
  int64_t rank = 0;  // 0: no adapters
  double alpha = 16.0;
  std::vector<std::string> targets;  // projection names: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj
  double scale() const { return rank > 0 ? alpha / static_cast<double>(rank) : 0.0; }
};
// True for a LoRA adapter parameter name (".lora_A." or ".lora_B." inside it).
bool is_lora_param(const std::string& name);

// Linear and Embedding that allocate uninitialised storage in the target dtype/device, so a
// multi-GB model is never materialised in fp32 on the host first.
class LinearImpl : public torch::nn::Module {
 public:
  LinearImpl(int64_t in, int64_t out, bool bias, torch::TensorOptions opts);
  torch::Tensor forward(const torch::Tensor& x);
  // Adds trainable adapters of `rank` (A ~ U(-1/sqrt(in), 1/sqrt(in)) from gen, B = 0) in
  // `opts` and freezes weight and bias.
  void add_lora(int64_t rank, double scale, torch::TensorOptions opts, at::Generator& gen);
  torch::Tensor weight, bias;
  std::shared_ptr<LinearImpl> lora_A, lora_B;  // null without adapters
  double lora_scale = 0.0;
  bool lora_active = true;  // false: the base projection alone (reference log-probs)
};
TORCH_MODULE(Linear);

class EmbeddingImpl : public torch::nn::Module {
 public:
  EmbeddingImpl(int64_t vocab, int64_t dim, torch::TensorOptions opts);
  torch::Tensor forward(const torch::Tensor& ids);
  torch::Tensor weight;
};
TORCH_MODULE(Embedding);

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps, torch::TensorOptions opts);
  torch::Tensor forward(const torch::Tensor& x);  // normalises in fp32, as HF does
  torch::Tensor weight;
  double eps;
};
TORCH_MODULE(RMSNorm);

// Log-probs of `targets` under softmax(h W^T / temperature), computed over `chunk` rows at a
// time so [N, vocab] is never held whole (forward keeps only h and one fp32 log-sum-exp per
// row; backward recomputes each chunk's logits). h [N, H], weight [V, H], targets int64 [N].
// The matmul runs in the autocast dtype when autocast is on for h's device, else in the
// weight's dtype; softmax in fp32. logp is differentiable in h and weight; entropy (the
// exact entropy of each row's distribution, fp32 [N]) is not.
struct TokenLogprobs {
  torch::Tensor logp, entropy;
};
TokenLogprobs chunked_logprobs(const torch::Tensor& h, const torch::Tensor& weight, const torch::Tensor& targets,
                               double temperature, int64_t chunk);

struct RopeTables {
  torch::Tensor cos, sin;  // [B, T, head_dim] in the compute dtype
};

class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(const ModelConfig& c, torch::TensorOptions opts);
  // mask: bool [B, 1, T, keys] (true = attend); undefined for plain causal attention; or
  // int64 [n] on the CPU, the lengths of the sequences packed into a row (see
  // CausalLMImpl::hidden_packed): causal attention inside each, none across them.
  torch::Tensor forward(const torch::Tensor& x, const RopeTables& rope, const torch::Tensor& mask, KVCache* cache,
                        int64_t layer);
  Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  int64_t heads, kv_heads, head_dim;
};
TORCH_MODULE(Attention);

class MLPImpl : public torch::nn::Module {
 public:
  MLPImpl(const ModelConfig& c, torch::TensorOptions opts);
  torch::Tensor forward(const torch::Tensor& x);
  Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(MLP);

class DecoderLayerImpl : public torch::nn::Module {
 public:
  DecoderLayerImpl(const ModelConfig& c, torch::TensorOptions opts);
  torch::Tensor forward(const torch::Tensor& x, const RopeTables& rope, const torch::Tensor& mask, KVCache* cache,
                        int64_t layer);
  Attention self_attn{nullptr};
  MLP mlp{nullptr};
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(DecoderLayer);

class BackboneImpl : public torch::nn::Module {  // HF's "model." prefix
 public:
  BackboneImpl(const ModelConfig& c, torch::TensorOptions opts);
  Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers;
  RMSNorm norm{nullptr};
};
TORCH_MODULE(Backbone);

class CausalLMImpl : public torch::nn::Module {
 public:
  // Parameters are allocated (uninitialised) with `opts`: bf16 on CUDA, fp32 on CPU.
  CausalLMImpl(const ModelConfig& c, torch::TensorOptions opts);

  // Logits [B, T, V] for whole sequences, causal attention. attention_mask (optional,
  // [B, T], 1 = token, 0 = padding, left or right) sets positions and masks padding.
  torch::Tensor forward(const torch::Tensor& ids, const torch::Tensor& attention_mask = {});

  // Hidden states after the final norm, [B, T, H]. With a cache, appends T tokens to it
  // (positions from cache.next_pos) and attends to everything cached so far.
  torch::Tensor hidden(const torch::Tensor& ids, const torch::Tensor& attention_mask, KVCache* cache);
  torch::Tensor logits(const torch::Tensor& hidden_states);  // lm_head (or tied embeddings)

  // One decode step with fixed shapes: tok [B, 1] goes to slot cache.static_slot (set by the
  // caller, who also advances cache.length afterwards). Returns fp logits [B, V]. No host
  // syncs and no shape that depends on host values, so it is CUDA-graph capturable.
  torch::Tensor decode_static(const torch::Tensor& tok, KVCache& cache);

  // For GRPO: log p(ids[:, t+1] | ids[:, :t+1]) under softmax(logits / temperature), fp32
  // [B, T-1], differentiable. Positions where attention_mask is 0 get 0.
  torch::Tensor token_logprobs(const torch::Tensor& ids, const torch::Tensor& attention_mask = {},
                               double temperature = 1.0);
  // token_logprobs at the positions where `wanted` ([B, T-1], nonzero: e.g. completion
  // tokens) is set, through chunked_logprobs over `chunk` positions at a time: the
  // [positions x vocab] logits of the prompt are never built. Dense [B, T-1] fp32 results,
  // 0 elsewhere; logp differentiable, entropy not.
  // segments (packed sequences): the lengths of the sequences concatenated into the one
  // row of ids (B = 1, summing to T); attention_mask must then be undefined. See hidden_packed.
  TokenLogprobs selected_logprobs(const torch::Tensor& ids, const torch::Tensor& attention_mask,
                                  const torch::Tensor& wanted, double temperature, int64_t chunk,
                                  const std::vector<int64_t>& segments = {});
  // Training forward of packed sequences: ids [1, T] holds sequences of the given lengths
  // back to back. Each one's RoPE positions restart at 0 and it attends only to itself
  // (causal SDPA per sequence: no [T, T] mask, the fused kernels still apply), so the
  // hidden states equal those of each sequence run alone. Returns [1, T, H].
  torch::Tensor hidden_packed(const torch::Tensor& ids, const std::vector<int64_t>& segments);
  const torch::Tensor& head_weight();  // lm_head.weight, or the tied embeddings

  // LoRA: adds adapters to cfg.targets of every layer and freezes all base parameters.
  // Adapter dtype: fp32 for training (the base may be bf16), the model's for actors.
  // Throws kf::Error naming an unknown target. Once per model.
  void enable_lora(const LoraConfig& cfg, uint64_t seed, torch::ScalarType adapter_dtype);
  const LoraConfig& lora() const { return lora_; }
  void set_adapters_active(bool on);  // off: the frozen base model
  // The HF weights with every adapter merged (W + scale * B A, computed in fp32, cast back
  // to W's dtype) and without adapter tensors; the model itself is unchanged.
  std::map<std::string, torch::Tensor> merged_weights();

  // Recompute each layer in backward instead of keeping its activations.
  void set_gradient_checkpointing(bool on) { checkpointing_ = on; }
  // HF-style init (normal(0, std) weights, zero biases, unit norms), seeded.
  void init_random(uint64_t seed, double std = 0.02);

  const ModelConfig& config() const { return config_; }
  torch::TensorOptions options() const { return opts_; }
  RopeTables rope(const torch::Tensor& positions) const;  // positions int64 [B, T]

  Backbone model{nullptr};
  Linear lm_head{nullptr};  // null when tie_word_embeddings

 private:
  ModelConfig config_;
  torch::TensorOptions opts_;
  torch::Tensor inv_freq_;  // fp32 [head_dim / 2] on the model's device
  bool checkpointing_ = false;
  LoraConfig lora_;
};
TORCH_MODULE(CausalLM);

}  // namespace kf::policy
