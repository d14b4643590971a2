// The decoder's parts behind CausalLM (kf/policy/policy.h): its HF-named submodules, the KV
// cache the sampler and the engine fill, the RoPE tables, and the memory-lean layer functions
// the submodules run. Private to policy/ (model.cpp defines them; sampler.cpp and engine.cpp
// drive the cache); tests of the layers include this header.
// Threading: as CausalLM: one thread drives a model and its cache at a time.
#pragma once
#include <torch/torch.h>

#include <array>
#include <vector>

#include "kf/policy/policy.h"

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

struct RopeTables {
  torch::Tensor cos, sin;  // [B, T, head_dim] in the compute dtype
};

// Linear and Embedding allocate uninitialised storage in the target dtype/device, so a
// multi-GB model is never materialised in fp32 on the host first.
class LinearImpl : public torch::nn::Module {
 public:
  LinearImpl(int64_t in, int64_t out, bool bias, torch::TensorOptions opts);
  torch::Tensor forward(const torch::Tensor& x);
  bool adapted() const { return lora_A && lora_active; }
  // The adapters' term of forward, (alpha / r) B (A x), in dtype `out` (adapted() only).
  torch::Tensor adapter(const torch::Tensor& x, at::ScalarType out);
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

class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(const ModelConfig& c, torch::TensorOptions opts);
  // mask: bool [B, 1, T, keys] (true = attend); undefined for plain causal attention; or
  // int64 [n] on the CPU, the lengths of the sequences packed into a row (see
  // CausalLMImpl::hidden_packed): causal attention inside each, none across them.
  torch::Tensor forward(const torch::Tensor& x, const RopeTables& rope, const torch::Tensor& mask, KVCache* cache,
                        int64_t layer);
  // q [B, heads, T, head_dim], k and v [B, kv_heads, T, head_dim], before RoPE (with the
  // per-head q/k norms of qwen3): the one place both the model and the engine project.
  std::array<torch::Tensor, 3> project(const torch::Tensor& x);
  Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  RMSNorm q_norm{nullptr}, k_norm{nullptr};  // qwen3 only (ModelConfig::qk_norm)
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

// Memory-lean building blocks of the decoder layer. Each is a custom autograd function
// whose forward gives exactly the plain expression's result, but which keeps fewer
// activations for backward (recomputing cheap elementwise terms there instead):
//  - rms_norm: HF's RMSNorm (variance in fp32, cast back to x's dtype, times w); keeps x and
//    one fp32 scale per row instead of fp32 copies of x;
//  - swiglu_down: down(silu(gate) * up) (down's adapters included); keeps gate and up, not
//    silu(gate) nor the product, which down (its weight's gradient, its adapters) would keep;
//  - rotary: x * cos + rotate_half(x) * sin (x [B, heads, T, D], tables [B, T, D]); keeps
//    only the tables, which every layer shares.
// Without grad mode they take the plain path (no autograd node).
// tests/policy/lean_layers_test.cpp compares their gradients and memory with the plain
// expressions'.
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);
torch::Tensor swiglu_down(const torch::Tensor& gate, const torch::Tensor& up, LinearImpl& down);
torch::Tensor rotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

}  // namespace kf::policy
