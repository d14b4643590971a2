// kf/policy/policy.h: what other components use of the policy: a Llama/Qwen decoder in
// libtorch, its HF folders and generators. Torch-free (KF_POLICY_TEXT_ONLY sees only it):
// ModelConfig, Tokenizer, ChatTemplate, safetensors. libtorch: CausalLM, LoRA, ParamHooks,
// GpuShare, Policy folders, Sampler, Engine. Internals: policy/src/*.h. Errors: kf::Error
// naming the file, field or option. Threading: per section.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kf/common/safetensors_header.h"

namespace kf::policy {

// --- ModelConfig: a decoder's architecture as in HF config.json. Plain values.
struct RopeConfig {
  std::string type = "default";  // "default", "linear" or "llama3"
  double theta = 10000.0;
  double factor = 1.0;                   // linear, llama3
  double low_freq_factor = 1.0;          // llama3
  double high_freq_factor = 4.0;         // llama3
  int64_t original_max_position = 8192;  // llama3
};

struct ModelConfig {
  std::string model_type = "qwen2";  // "qwen2", "qwen3" or "llama"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 32768;
  double rms_norm_eps = 1e-6;
  RopeConfig rope;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;               // qwen2: always; llama, qwen3: attention_bias
  bool o_bias = false;                 // llama, qwen3: attention_bias also biases o_proj
  bool qk_norm = false;                // qwen3: RMSNorm over each head of q and k, before RoPE
  bool mlp_bias = false;               // llama mlp_bias
  std::vector<int64_t> eos_token_ids;  // stop ids: config.json's, then generation_config.json's
  int64_t bos_token_id = -1;
  std::string dtype = "float32";  // as saved ("bfloat16", "float32", ...)
  std::string raw_json;           // the file as read; written back with our fields updated

  void validate(const std::string& context) const;  // kf::Error naming `context` if inconsistent
};

// config.json at `path`, plus the eos_token_id of a generation_config.json beside it.
ModelConfig load_model_config(const std::string& path);
std::string model_config_to_json(const ModelConfig& c);  // loadable by HF transformers
// Random-init shapes ("tiny", "qwen2.5-0.5b", ...): learner and actors share this one table.
ModelConfig named_model_shape(const std::string& name);

// --- Tokenizer: an HF tokenizer.json byte-level BPE.
// Immutable after construction: const methods may run concurrently.
class Tokenizer {
 public:
  static Tokenizer from_json(const std::string& json_text, const std::string& context);
  static Tokenizer from_file(const std::string& path);

  std::vector<int32_t> encode(const std::string& text) const;  // adds no BOS/EOS
  // The exact bytes (HF would replace invalid UTF-8 with U+FFFD).
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;

  int64_t vocab_size() const;  // largest id + 1, added tokens included
  std::optional<int32_t> token_to_id(const std::string& token) const;
  std::string id_to_token(int32_t id) const;  // "" for an unknown id
  bool is_special(int32_t id) const;
  void save(const std::string& path) const;  // the tokenizer.json it was read from

  struct Impl;

 private:
  std::shared_ptr<const Impl> impl_;
};

// For training a vocabulary (stages/): the pieces the pre-tokeniser splits `text` into under
// a Split regex of tokenizer.json (GPT-2, Qwen2, Llama 3), and byte-level BPE's 256 symbols.
std::vector<std::string> pretokenize(const std::string& text, const std::string& split_regex);
std::vector<std::string> byte_level_symbols();

// --- ChatTemplate: a model folder's chat template, rendered exactly as transformers'
// apply_chat_template(..., add_generation_prompt=True) (how: policy/src/chat_template.h).
// Needs jinja2 in $KF_PYTHON (else the build's Python). Const methods may run concurrently.
struct ChatMessage {
  std::string role;  // "system", "user", "assistant", ...
  std::string content;
};

class ChatTemplate {
 public:
  // nullopt: no template. vars_json: more template variables ({"enable_thinking": false}).
  static std::optional<ChatTemplate> load(const std::string& model_dir, const std::string& vars_json = "");
  // One instance per folder and variables, for the life of the process (null: none).
  static std::shared_ptr<const ChatTemplate> for_model(const std::string& model_dir, const std::string& vars_json = "");
  static bool present(const std::string& model_dir);  // reads files only

  std::string render(const std::vector<ChatMessage>& messages) const;

  const std::string& model_dir() const;
  const std::string& source() const;  // the file (and field) the template came from

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

// --- Safetensors: parser, mmap reader, sharded checkpoints, streaming writer. Objects are
// immutable after open; views stay valid while their owner lives.
using StTensorInfo = kf::SafetensorsEntry;
using StHeader = kf::SafetensorsHeader;

// Parses and validates a whole file image (offsets, overlaps, shapes against byte spans).
StHeader st_parse(const uint8_t* data, std::size_t size, const std::string& context);

class StFile {  // one memory-mapped file
 public:
  static std::shared_ptr<StFile> open(const std::string& path);
  ~StFile();
  StFile(const StFile&) = delete;
  StFile& operator=(const StFile&) = delete;
  const std::string& path() const { return path_; }
  const StHeader& header() const { return header_; }
  const StTensorInfo* find(const std::string& name) const;  // nullptr when absent
  const void* data(const StTensorInfo& t) const { return static_cast<const uint8_t*>(map_) + t.offset; }

 private:
  StFile() = default;
  std::string path_;
  void* map_ = nullptr;
  std::size_t size_ = 0;
  StHeader header_;
  std::map<std::string, std::size_t> index_;
};

// A checkpoint directory: model.safetensors, or shards listed by model.safetensors.index.json.
class StCheckpoint {
 public:
  static StCheckpoint open(const std::string& dir);
  struct Entry {
    const StTensorInfo* info;
    const void* data;
    const std::string* file;
  };
  Entry get(const std::string& name) const;  // kf::Error naming the file(s) when absent
  bool has(const std::string& name) const;
  std::vector<std::string> names() const;
  const std::vector<std::shared_ptr<StFile>>& files() const { return files_; }

 private:
  std::string dir_;
  std::vector<std::shared_ptr<StFile>> files_;
  std::map<std::string, std::size_t> where_;  // tensor name -> index into files_
};

// Streaming, atomic writer: `fill` runs once per spec, in order, giving exactly its bytes.
struct StWriteSpec {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
};
using StFill = std::function<void(std::size_t index, std::string& bytes)>;
void st_write(const std::string& path, const std::vector<StWriteSpec>& specs, const StFill& fill,
              const std::map<std::string, std::string>& metadata = {});

}  // namespace kf::policy

#ifndef KF_POLICY_TEXT_ONLY
#include <torch/torch.h>

#include "kf/common/gpu_lock.h"

namespace kf::policy {

// --- CausalLM: the decoder. named_parameters() are the checkpoint's HF tensor names. One
// thread drives a model at a time. Its parts and KV cache: policy/src/layers.h.
struct KVCache;

// LoRA: y = W x + b + (alpha / rank) B (A x), W frozen, B zero at first; adapters are the
// parameters "<projection>.lora_A.weight" / ".lora_B.weight" (PEFT's names).
struct LoraConfig {
  int64_t rank = 0;  // 0: no adapters
  double alpha = 16.0;
  std::vector<std::string> targets;  // q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj
  double scale() const { return rank > 0 ? alpha / static_cast<double>(rank) : 0.0; }
};
bool is_lora_param(const std::string& name);  // ".lora_A." or ".lora_B." in it

class LinearImpl;
class BackboneImpl;
struct RopeTables;

// Log-probs of `targets` [N] under softmax(h [N, H] W^T / temperature), `chunk` rows at a
// time ([N, vocab] is never held). logp is differentiable in h and W; entropy is not.
struct TokenLogprobs {
  torch::Tensor logp, entropy;
};
TokenLogprobs chunked_logprobs(const torch::Tensor& h, const torch::Tensor& weight, const torch::Tensor& targets,
                               double temperature, int64_t chunk);

// Sharded parameters (ZeRO-3): the owner makes layer l whole in pre_forward / pre_backward
// (l = -1: embeddings, norm, head) and may free it in post_forward. Called from the forward
// thread and from the autograd thread.
class ParamHooks {
 public:
  virtual ~ParamHooks() = default;
  virtual void pre_forward(int64_t layer) = 0;
  virtual void post_forward(int64_t layer) = 0;
  virtual void pre_backward(int64_t layer) = 0;
};

class CausalLMImpl : public torch::nn::Module {
 public:
  CausalLMImpl(const ModelConfig& c, torch::TensorOptions opts);  // uninitialised parameters

  // Logits [B, T, V]; attention_mask [B, T] (1 = token) sets positions, masks padding.
  torch::Tensor forward(const torch::Tensor& ids, const torch::Tensor& attention_mask = {});
  // After the final norm, [B, T, H]; with a cache, appends the T tokens to it.
  torch::Tensor hidden(const torch::Tensor& ids, const torch::Tensor& attention_mask, KVCache* cache);
  torch::Tensor logits(const torch::Tensor& hidden_states);  // lm_head (or tied embeddings)
  // A CUDA-graph capturable step: tok [B, 1] at cache.static_slot -> logits [B, V].
  torch::Tensor decode_static(const torch::Tensor& tok, KVCache& cache);

  // log p(ids[:, t+1] | ids[:, :t+1]) at temperature, fp32 [B, T-1]; 0 where masked.
  torch::Tensor token_logprobs(const torch::Tensor& ids, const torch::Tensor& attention_mask = {},
                               double temperature = 1.0);
  // token_logprobs where `wanted` [B, T-1] is set, via chunked_logprobs (0 elsewhere).
  // segments: lengths of sequences packed into one row (B = 1, no mask).
  TokenLogprobs selected_logprobs(const torch::Tensor& ids, const torch::Tensor& attention_mask,
                                  const torch::Tensor& wanted, double temperature, int64_t chunk,
                                  const std::vector<int64_t>& segments = {});
  // Packed sequences in ids [1, T], each as if run alone. [1, T, H].
  torch::Tensor hidden_packed(const torch::Tensor& ids, const std::vector<int64_t>& segments);
  const torch::Tensor& head_weight();  // lm_head.weight, or the tied embeddings

  // Adapters on cfg.targets of every layer, base frozen. Once per model.
  void enable_lora(const LoraConfig& cfg, uint64_t seed, torch::ScalarType adapter_dtype);
  const LoraConfig& lora() const { return lora_; }
  void set_adapters_active(bool on);  // off: the frozen base model
  // HF weights with adapters merged in (W's dtype); the model is unchanged.
  std::map<std::string, torch::Tensor> merged_weights();

  void set_gradient_checkpointing(bool on) { checkpointing_ = on; }
  bool gradient_checkpointing() const { return checkpointing_; }
  // With checkpointing on, recompute only the first n layers (n < 0: all).
  void set_recompute_layers(int64_t n) { recompute_layers_ = n; }
  int64_t recompute_layers() const { return recompute_layers_; }
  // null (default): weights always whole. Must outlive forward and backward.
  void set_param_hooks(ParamHooks* hooks) { hooks_ = hooks; }
  void init_random(uint64_t seed, double std = 0.02);  // HF-style, seeded

  const ModelConfig& config() const { return config_; }
  torch::TensorOptions options() const { return opts_; }
  RopeTables rope(const torch::Tensor& positions) const;  // positions int64 [B, T]

  std::shared_ptr<BackboneImpl> model;  // HF's "model." (src/layers.h)
  std::shared_ptr<LinearImpl> lm_head;  // null when tie_word_embeddings

 private:
  ModelConfig config_;
  torch::TensorOptions opts_;
  torch::Tensor inv_freq_;  // fp32 [head_dim / 2] on the model's device
  bool checkpointing_ = false;
  int64_t recompute_layers_ = -1;
  ParamHooks* hooks_ = nullptr;
  LoraConfig lora_;
  bool recomputes(int64_t layer) const { return recompute_layers_ < 0 || layer < recompute_layers_; }
  torch::Tensor run_layer(int64_t l, const torch::Tensor& x, const RopeTables& r, const torch::Tensor& mask,
                          KVCache* cache, bool ckpt);
};
TORCH_MODULE(CausalLM);

// --- GpuShare: a learner's or actor's GPU work beside the evaluator, which holds the GPU's
// GpuTimingLock exclusively per timed trial: enter() holds it shared, leave() drains the
// device first (docs/architecture.md#sharing-a-gpu). CPU: no-op. One thread per GpuShare.
class GpuShare {
 public:
  GpuShare() = default;  // inactive
  // lock_dir: the evaluator's lock files (empty: $KF_GPU_LOCK_DIR or /tmp).
  GpuShare(torch::Device device, const std::string& lock_dir = "");
  GpuShare(GpuShare&&) = default;
  GpuShare& operator=(GpuShare&&) = default;

  bool active() const { return lock_ != nullptr; }
  void enter();                                    // blocks while a trial runs or waits
  void leave();                                    // synchronize, release (no-op when not held)
  void pause_point();                              // leave() then enter(): lets a trial in
  double wait_seconds() const { return wait_s_; }  // total time waited in enter()
  const std::string& key() const { return key_; }

  class Scope {  // enter() now, leave() at scope exit; null or inactive: no-op
   public:
    explicit Scope(GpuShare* s) : s_(s && s->active() ? s : nullptr) {
      if (s_) s_->enter();
    }
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    GpuShare* s_;
  };

 private:
  std::unique_ptr<GpuTimingLock> lock_;
  torch::Device device_{torch::kCPU};
  std::string key_;
  double wait_s_ = 0;
};

// The lock key (PCI location) of CUDA device `index`.
std::string cuda_gpu_lock_key(int index);

// --- HF model folders (config.json, safetensors shards, tokenizer.json). Loading copies
// tensor by tensor from the mapped shards: peak memory is the model plus the page cache.
struct Policy {
  ModelConfig config;
  CausalLM model{nullptr};
  std::optional<Tokenizer> tokenizer;  // absent without tokenizer.json
};
// dtype default: bf16 on CUDA, fp32 on CPU.
Policy load_policy(const std::string& dir, torch::Device device = torch::kCPU,
                   std::optional<torch::ScalarType> dtype = std::nullopt);
void save_policy(const Policy& p, const std::string& dir, uint64_t max_shard_bytes = 5ull << 30);
// config.json and the weights; a tied lm_head is not written.
void save_weights(CausalLM& model, const std::string& dir, uint64_t max_shard_bytes = 5ull << 30);
torch::ScalarType dtype_from_name(const std::string& name, const std::string& context);
std::string safetensors_dtype(torch::ScalarType t);

// --- Sampler: batched generation, each token's log-prob recorded (the learner's importance
// ratios). Reproducible per seed on the CPU. One thread; the model is not shared meanwhile.
struct SamplingParams {
  double temperature = 1.0;  // 0 = greedy
  double top_p = 1.0;
  int64_t top_k = 0;  // 0 = off
  int64_t max_new_tokens = 256;
  // Loop stop: a block of <= loop_max_period tokens repeated >= loop_repeats times (0 = off),
  // spanning >= loop_min_span tokens, ends the completion.
  int64_t loop_repeats = 0;
  int64_t loop_max_period = 128;
  int64_t loop_min_span = 64;
  std::vector<int64_t> eos_ids;
  std::vector<std::string> stop;  // stop strings (need a tokenizer)
  uint64_t seed = 0;
  int64_t valid_vocab = -1;       // ids >= it are never sampled; -1: the tokenizer's vocab
  int64_t check_every = 8;        // decode steps between host checks for stops
  int static_decode = -1;         // fixed-shape decode: -1 on CUDA only, 0 off, 1 on
  bool cuda_graph = true;         // static decode on CUDA: capture the step, replay it
  bool shared_prefill = false;    // all prompts equal (a GRPO group): prefill one row
  GpuShare* gpu_share = nullptr;  // held for the generation, paused at every host check
};

struct Completion {
  std::vector<int32_t> tokens;  // the stopping token included
  std::vector<float> logprobs;  // log p(token) under softmax(logits / T), full vocab
  std::string text;             // decoded tokens (empty without a tokenizer)
  std::string finish_reason;    // "eos", "stop", "loop", "length"
};

// The logits a token is drawn from: fp32 / temperature, masked ids at -inf (top-k, top-p,
// >= valid_vocab); their log_softmax is the reported behaviour log-prob.
torch::Tensor sampling_logits(const torch::Tensor& logits, const SamplingParams& p, int64_t valid_vocab);

class Sampler {
 public:
  Sampler(CausalLM model, const Tokenizer* tokenizer);  // null tokenizer: no stop strings, no text
  std::vector<Completion> generate(const std::vector<std::vector<int32_t>>& prompts, const SamplingParams& p);

 private:
  CausalLM model_;
  const Tokenizer* tokenizer_;
};

// --- Engine: an actor's rollout engine: continuous batching of requests (a prompt, n
// samples), a paged KV cache, CUDA-graph decode (design: policy/src/engine.cpp). Tokens are
// drawn as the Sampler draws them, from one generator per engine: with temperature > 0 they
// depend on the batch. One thread drives it; change weights only when idle().
struct EngineOptions {
  int64_t kv_budget_mb = 256;          // the KV pool, all layers, keys and values
  int64_t block_size = 16;             // tokens per KV block
  int64_t max_sequences = 64;          // most sequences in the running batch
  int64_t check_every = 8;             // decode steps between host checks (stops, admission)
  std::vector<int64_t> batch_buckets;  // padded batch sizes; empty: powers of two
  bool pad_batch = false;              // CPU: pad to the buckets too (CUDA always pads)
  bool cuda_graph = true;              // CUDA: capture and replay the decode step
  uint64_t seed = 0;
  GpuShare* gpu_share = nullptr;  // held while the engine works, paused at every host check
};

struct EngineRequest {
  uint64_t id = 0;  // the caller's handle, returned with the result
  std::vector<int32_t> prompt;
  int64_t n = 1;  // samples sharing the prompt's prefill
  // Used: temperature, top_p, top_k, max_new_tokens, eos_ids, loop_*, valid_vocab.
  SamplingParams sampling;
};

struct EngineResult {
  uint64_t id = 0;
  std::vector<Completion> completions;  // n, in sample order; text stays empty
  double queued_s = 0;                  // submit -> admission
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
  // Allocates the KV pool now (kf::Error when it holds fewer than two blocks).
  Engine(CausalLM model, EngineOptions opts);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // FIFO. kf::Error for a bad request or one that can never fit the KV budget.
  void submit(EngineRequest r);
  // Until a request finishes; the finished ones (empty only when idle()).
  std::vector<EngineResult> step();
  std::vector<EngineResult> run_all();  // until every request has finished, in finishing order

  bool idle() const;  // nothing queued or running
  EngineStats stats() const;
  const EngineOptions& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kf::policy
#endif  // KF_POLICY_TEXT_ONLY
