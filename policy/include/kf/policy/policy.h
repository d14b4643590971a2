// kf/policy/policy.h: the policy component's one public header: a Llama/Qwen2-family
// decoder in libtorch, its HF folders (config.json, safetensors, tokenizer.json, chat
// template) and its generators. Sections:
//   torch-free (kf_policy_text; fuzzed in policy/fuzz/):
//     ModelConfig            config.json                     Tokenizer   tokenizer.json BPE
//     ChatTemplate           the model folder's chat template
//     st_parse, StFile, StCheckpoint, st_write   safetensors checkpoints
//   libtorch (kf_policy):
//     CausalLM, LoRA, ParamHooks, chunked_logprobs   the model
//     GpuShare               sharing a GPU with the run's evaluator
//     Policy, load_policy, save_policy, load_weights, save_weights   HF folders
//     Sampler, sample_tokens                         batched generation, KV cache
//     Engine                 the actors' rollout engine (continuous batching, paged KV)
// A torch-free translation unit defines KF_POLICY_TEXT_ONLY before including this header
// (kf_policy_text, kf-render-prompt and the fuzzers do): it then sees the first part only.
#pragma once
#include <cstddef>
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kf/common/safetensors_header.h"

namespace kf::policy {

// --- ModelConfig: the architecture of a Llama/Qwen2-family decoder, read from and written
// to a Hugging Face config.json. Torch-free, so tools and fuzzers can use it.
// Errors are kf::Error naming the file and the field ("config.json: field 'hidden_size': ...").

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
  std::vector<int64_t> eos_token_ids;  // stop ids: config.json's, then generation_config.json's (load_model_config)
  int64_t bos_token_id = -1;
  std::string dtype = "float32";  // as saved ("bfloat16", "float32", ...)
  std::string raw_json;           // the file as read; written back with our fields updated

  // Throws kf::Error (context: the file) when a value is inconsistent.
  void validate(const std::string& context) const;
};

// Parses config.json text; `context` names the file in errors.
ModelConfig parse_model_config(const std::string& json_text, const std::string& context);
// Reads config.json at `path`; a generation_config.json beside it adds its eos_token_id
// (an integer or a list) to eos_token_ids (the sampler's stop ids), after config.json's own,
// without repeats. Errors name the file and field.
ModelConfig load_model_config(const std::string& path);
// The eos_token_id of a generation_config.json text (none when absent or null); `context`
// names the file in errors.
std::vector<int64_t> generation_eos_ids(const std::string& json_text, const std::string& context);
// The config.json text for this config, loadable by HF transformers.
std::string model_config_to_json(const ModelConfig& c);
// Named shapes for random initialisation ("tiny" for tests, "qwen2.5-0.5b" for benchmarks).
// Learner and actors both build from this one table, so their snapshots always agree.
// Throws kf::Error naming learner.init_shape for an unknown name.
ModelConfig named_model_shape(const std::string& name);
void save_model_config(const ModelConfig& c, const std::string& path);

// --- Tokenizer: a Hugging Face tokenizer.json byte-level BPE (GPT-2, Qwen2, Llama 3 style).
// Covers: merges as "a b" or ["a","b"]; added/special tokens split off before
// normalisation/pre-tokenisation (leftmost-longest, lstrip/rstrip/single_word); the
// GPT-2, Qwen2 and Llama 3 split regexes; NFC; ignore_merges; byte-level decoding back
// to the exact bytes. Torch-free (fuzzed: policy/fuzz/).
// Thread safety: immutable after construction; const methods may run concurrently.

class Tokenizer {
 public:
  // Throws kf::Error naming `context` (the file) and the field for anything unsupported
  // (e.g. "tokenizer.json: field 'model.type': 'WordPiece' is not supported").
  static Tokenizer from_json(const std::string& json_text, const std::string& context);
  static Tokenizer from_file(const std::string& path);

  // Token ids for the text; adds no BOS/EOS (callers build prompts explicitly).
  std::vector<int32_t> encode(const std::string& text) const;
  // The exact bytes the ids stand for (HF would replace invalid UTF-8 with U+FFFD).
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;

  int64_t vocab_size() const;  // largest id + 1, added tokens included
  std::optional<int32_t> token_to_id(const std::string& token) const;
  std::string id_to_token(int32_t id) const;  // "" for an unknown id
  bool is_special(int32_t id) const;
  // Writes the tokenizer.json this tokenizer was read from.
  void save(const std::string& path) const;

  struct Impl;

 private:
  std::shared_ptr<const Impl> impl_;
};

// For training a vocabulary that this tokenizer encodes exactly as it was trained
// (stages/ bpe trainer):
// The pieces the pre-tokeniser splits UTF-8 `text` into, in order, under `split_regex`
// (a Split pre-tokenizer's regex as written in tokenizer.json; GPT-2, Qwen2 and Llama 3
// are supported). Throws kf::Error naming the regex when it is not supported.
std::vector<std::string> pretokenize(const std::string& text, const std::string& split_regex);
// Byte-level BPE's byte -> printable character table (GPT-2): the UTF-8 string that
// stands for each of the 256 bytes.
std::vector<std::string> byte_level_symbols();

// --- ChatTemplate: a model folder's chat template (tokenizer_config.json "chat_template", or
// chat_template.jinja beside it, which wins, as in transformers), rendered exactly as
// transformers' apply_chat_template(messages, tokenize=False, add_generation_prompt=True).
//
// Why this shape: chat templates are Jinja programs, and a hand-written Jinja subset in C++
// would drift from what transformers prints. The template is therefore run by jinja2 itself
// (policy/tools/kf_chat_template.py, with transformers' environment: trim_blocks,
// lstrip_blocks, loopcontrols, tojson, raise_exception, strftime_now, the named special
// tokens), but only once per role sequence (e.g. [user] or [system, user]), not once per
// prompt: the script renders sentinel strings in place of the contents and returns the
// literal pieces between them plus, per placed content, whether the template trims it.
// render() joins the pieces around the real contents in C++ (microseconds; the prompt
// fitter re-renders many times per prompt). The script proves the layout exact for that
// role sequence with probe contents. Where the template transforms or branches on the text
// beyond placing and trimming it (Qwen3 strips an earlier turn's <think> block), that role
// sequence is rendered by jinja2 itself instead: one `kf_chat_template.py serve` process per
// object keeps the compiled template and renders each conversation on request (a pipe round
// trip, 0.06 ms on the 2-core machine). A template that branches on a content being empty gets an
// error for an empty content of a laid-out sequence. A layout is cached for the life of the
// object, so a template that prints today's date (Llama 3.x) keeps the date of its first
// rendering.
//
// Python: $KF_PYTHON, else the interpreter the build was configured with; the script: under
// $KF_SOURCE_DIR, else the source tree this was built from. Needs jinja2 (requirements.txt).
// Thread safety: const methods may run concurrently (the layout cache is locked).

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", ...
  std::string content;
};

class ChatTemplate {
 public:
  // The template of `model_dir`, or nullopt when the folder has none. Renders the [user]
  // layout at once, so a template that cannot be rendered exactly fails here: kf::Error
  // naming the file (and the Python or jinja2 failure).
  // `vars_json`: a JSON object of more template variables, as keyword arguments of
  // apply_chat_template (e.g. {"enable_thinking": false}); empty: none.
  static std::optional<ChatTemplate> load(const std::string& model_dir, const std::string& vars_json = "");
  // One shared instance per folder and variables for the process (null when the folder has
  // no template or `model_dir` is empty); the pointer stays valid for the life of the process.
  static std::shared_ptr<const ChatTemplate> for_model(const std::string& model_dir, const std::string& vars_json = "");
  // True when the folder holds a template (chat_template.jinja or a non-null
  // tokenizer_config.json "chat_template"); reads files only.
  static bool present(const std::string& model_dir);

  // The text transformers renders for `messages` with add_generation_prompt=True.
  // kf::Error naming the template for a conversation the template rejects
  // (raise_exception), or an empty content a laid-out sequence branches on.
  std::string render(const std::vector<ChatMessage>& messages) const;

  const std::string& model_dir() const;
  const std::string& source() const;  // the file (and field) the template came from

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

// Python's str.strip()/lstrip()/rstrip() without arguments (what Jinja's `trim` does): the
// code points for which str.isspace() is true, on UTF-8 text.
std::string py_lstrip(const std::string& s);
std::string py_rstrip(const std::string& s);

// --- Safetensors for checkpoints: the header parser (st_parse: the one parser of
// kf/common/safetensors_header.h, fuzzed in policy/fuzz/), a read-only mmap of one file, a
// sharded-checkpoint reader (model.safetensors.index.json) and a streaming writer that
// writes one tensor at a time, so a multi-GB model never sits in host memory twice.
// Format: u64 LE header length N, N bytes of JSON {"name": {"dtype", "shape",
// "data_offsets": [b, e]}, "__metadata__": {...}}, then the data.
// Objects are immutable after open; views stay valid while the owner lives.

// The checkpoint-side names of the one parser's types (kf/common/safetensors_header.h).
using StTensorInfo = kf::SafetensorsEntry;
using StHeader = kf::SafetensorsHeader;

// Bytes per element; 0 for an unknown dtype.
std::size_t st_dtype_size(const std::string& dtype);

// Parses and validates a whole file image: every offset within `size`, no overlaps,
// shapes that match their byte spans without overflow. Throws kf::Error naming `context`
// and the field.
StHeader st_parse(const uint8_t* data, std::size_t size, const std::string& context);

// One read-only, memory-mapped safetensors file.
class StFile {
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
  // Throws kf::Error naming the file(s) when the tensor is absent.
  Entry get(const std::string& name) const;
  bool has(const std::string& name) const;
  std::vector<std::string> names() const;
  const std::vector<std::shared_ptr<StFile>>& files() const { return files_; }

 private:
  std::string dir_;
  std::vector<std::shared_ptr<StFile>> files_;
  std::map<std::string, std::size_t> where_;  // tensor name -> index into files_
};

// Streaming writer. Tensors are declared up front (so the header can be written), then
// `fill` is called once per tensor, in order, to produce exactly nbytes. Atomic (temp+rename).
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

// --- CausalLM: a Llama/Qwen2-family decoder in libtorch (RMSNorm in fp32, half-split RoPE,
// SwiGLU, grouped-query attention via SDPA, optional q/k/v bias, tied or untied
// embeddings). Submodules carry HF names (model.layers.N.self_attn.q_proj, ...), so
// named_parameters() are exactly the checkpoint's tensor names.
// Threading: one thread drives a model at a time (forward mutates the KV cache it is given).

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

// Log-probs of `targets` under softmax(h W^T / temperature), computed over `chunk` rows at a
// time so [N, vocab] is never held whole (forward keeps only h and one fp32 log-sum-exp per
// row; backward recomputes each chunk's logits). h [N, H], weight [V, H], targets int64 [N].
// The matmul runs in the autocast dtype when autocast is on for h's device, else in the
// weight's dtype; softmax in fp32. logp is differentiable in h and weight; entropy (the
// exact entropy of each row's distribution, fp32 [N]) is not.
// Memory-lean building blocks of the decoder layer. Each is a custom autograd function
// whose forward gives exactly the plain expression's result, but which keeps fewer
// activations for backward (recomputing cheap elementwise terms there instead):
//  - rms_norm: HF's RMSNorm (variance in fp32, cast back to x's dtype, times w); keeps x and
//    one fp32 scale per row instead of fp32 copies of x;
//  - swiglu_down: down(silu(gate) * up) (down's adapters included); keeps gate and up, not
//    silu(gate) nor the product, which down (its weight's gradient, its adapters) would keep;
//  - rotary: x * cos + rotate_half(x) * sin (x [B, heads, T, D], tables [B, T, D]); keeps
//    only the tables, which every layer shares.
// tests/policy/lean_layers_test.cpp compares their gradients with the plain expressions'.
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);
torch::Tensor swiglu_down(const torch::Tensor& gate, const torch::Tensor& up, LinearImpl& down);
torch::Tensor rotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

struct TokenLogprobs {
  torch::Tensor logp, entropy;
};
TokenLogprobs chunked_logprobs(const torch::Tensor& h, const torch::Tensor& weight, const torch::Tensor& targets,
                               double temperature, int64_t chunk);

// Sharded parameters (the learner's ZeRO-3, learner.dist.shard: params): the owner of the
// parameters' storage keeps only a slice of each decoder layer's weights between uses and
// must bring a layer's full weights back before the model touches them. The model calls:
//  - pre_forward(l) before decoder layer l runs forward (l = -1: the embeddings, final norm
//    and head, which hidden() and hidden_packed() need from their start);
//  - post_forward(l) after it (the owner may free layer l's full weights; autograd's saved
//    references keep the tensors, whose storage the owner refills before backward);
//  - pre_backward(l) before layer l's backward: inside LayerCheckpoint's backward
//    (recomputation) before the layer is re-run, else from a hook on the layer output's
//    gradient. Freeing after backward is the owner's (when the layer's gradients are in).
// Calls come from the thread running forward and from the autograd thread in backward.
class ParamHooks {
 public:
  virtual ~ParamHooks() = default;
  virtual void pre_forward(int64_t layer) = 0;
  virtual void post_forward(int64_t layer) = 0;
  virtual void pre_backward(int64_t layer) = 0;
};

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
  bool gradient_checkpointing() const { return checkpointing_; }
  // Selective recomputation: with checkpointing on, only the first n decoder layers are
  // recomputed and the others keep their activations (n < 0, the default: every layer).
  // Each kept layer costs its activations' memory and saves one layer forward in backward.
  void set_recompute_layers(int64_t n) { recompute_layers_ = n; }
  int64_t recompute_layers() const { return recompute_layers_; }
  // Sharded parameters (see ParamHooks); nullptr (the default): the weights are always whole.
  // The hooks must outlive every forward and backward that runs while they are set.
  void set_param_hooks(ParamHooks* hooks) { hooks_ = hooks; }
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
  int64_t recompute_layers_ = -1;
  ParamHooks* hooks_ = nullptr;
  LoraConfig lora_;
  bool recomputes(int64_t layer) const { return recompute_layers_ < 0 || layer < recompute_layers_; }
  // Decoder layer l over x (recomputed in backward when ckpt), with the ParamHooks calls.
  torch::Tensor run_layer(int64_t l, const torch::Tensor& x, const RopeTables& r, const torch::Tensor& mask,
                          KVCache* cache, bool ckpt);
};
TORCH_MODULE(CausalLM);

// --- GpuShare: how a learner or an actor shares its GPU with the run's evaluator.
// The evaluator holds the GPU's GpuTimingLock exclusively around each timed trial. GPU work
// of the other processes runs inside enter()/leave(), which hold the lock shared, and
// leave() drains the device first, so none of their kernels is still running when a trial
// starts (ARCHITECTURE.md: "no other process of the run does GPU work on that GPU while
// it times"). Holds are short (a decode chunk, a micro-batch) so a trial waits little.
// On a CPU device every call is a no-op.
// Threading: one thread at a time per GpuShare (the lock is per open file description).

class GpuShare {
 public:
  GpuShare() = default;  // inactive
  // `lock_dir`: where the evaluator's lock files are (empty: $KF_GPU_LOCK_DIR or /tmp).
  // Throws kf::Error if the lock file cannot be opened.
  GpuShare(torch::Device device, const std::string& lock_dir = "");
  GpuShare(GpuShare&&) = default;
  GpuShare& operator=(GpuShare&&) = default;

  bool active() const { return lock_ != nullptr; }
  void enter();                                    // shared hold; blocks while a trial runs or waits for the GPU
  void leave();                                    // synchronize the device, then release (no-op when not held)
  void pause_point();                              // leave() then enter(): lets a waiting trial run between chunks
  double wait_seconds() const { return wait_s_; }  // total time spent waiting in enter()
  const std::string& key() const { return key_; }

  // RAII: enter() now, leave() at scope exit (also on exceptions). Null or inactive: no-op.
  class Scope {
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

// The lock key of CUDA device `index` as this process numbers it (its PCI location,
// gpu_lock_key_pci); the ordinal as text in a build without CUDA.
std::string cuda_gpu_lock_key(int index);

// --- Loading and saving HF-format model folders: config.json, model.safetensors (or shards +
// model.safetensors.index.json), tokenizer.json.
// Loading maps each shard and copies tensor by tensor into the model's parameters (any
// dtype conversion happens in that copy), so peak memory is the model plus the page cache.

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

// --- Sampler: batched generation with a preallocated KV cache. Prompts are left-padded into
// one prefill; each decode step samples one token per row (temperature, top-k, top-p,
// padding logits masked) and records its log-prob for the learner's importance ratios.
// Reproducible for a given seed on CPU. Per-row stop: EOS ids, stop strings, a loop (the
// completion ends with one block repeated; see loop_period), max tokens.
// Threading: one thread per Sampler; the model must not be used concurrently.

struct SamplingParams {
  double temperature = 1.0;  // 0 = greedy
  double top_p = 1.0;
  int64_t top_k = 0;  // 0 = off
  int64_t max_new_tokens = 256;
  // Loop stop: a row is done ("loop") once its completion ends with one block of p tokens
  // (p <= loop_max_period) repeated loop_repeats times or more in a row, the repeats
  // spanning at least loop_min_span tokens (so period 1 needs 64 equal tokens by default).
  // The row is cut right after the token that completed the loop (a prefix of what was
  // sampled; a loop that fills the last token is "loop", not "length").
  // loop_repeats: 0 = off, else >= 2.
  int64_t loop_repeats = 0;
  int64_t loop_max_period = 128;
  int64_t loop_min_span = 64;
  std::vector<int64_t> eos_ids;
  std::vector<std::string> stop;  // stop strings (need a tokenizer)
  uint64_t seed = 0;
  // Ids >= valid_vocab (checkpoint padding rows beyond the tokenizer) are never sampled;
  // -1 = the tokenizer's vocab size, or the model's when there is no tokenizer.
  int64_t valid_vocab = -1;
  // Host checks for EOS/stop strings/loops every N steps (each check is a device sync); the
  // result is exact for any N, a larger N only wastes some tokens after a stop.
  int64_t check_every = 8;
  // Decode with fixed shapes (KVCache::static_slot); on CUDA the step is then captured once
  // as a CUDA graph and replayed. Off: the eager, growing-cache path.
  // -1: on CUDA only (on CPU the growing cache is faster), 0: off, 1: on.
  int static_decode = -1;
  bool cuda_graph = true;
  // Every prompt is the same (a GRPO group): prefill one row and copy its KV cache to the
  // others, then decode them together (same decode path, CUDA graphs included).
  bool shared_prefill = false;
  // Shared GPU hold (GpuShare, above) for the whole generation, paused at every host check
  // (every check_every steps), so an evaluator's timed trial can run between chunks.
  GpuShare* gpu_share = nullptr;
};

struct Completion {
  std::vector<int32_t> tokens;  // the completion, the stopping token included
  std::vector<float> logprobs;  // log p(token) under softmax(logits / T), full vocab
  std::string text;             // decoded tokens (empty without a tokenizer)
  std::string finish_reason;    // "eos", "stop", "loop", "length"
};

// The smallest period P in [1, p.loop_max_period] such that `tokens` ends with k >=
// p.loop_repeats repeats of one block of P tokens, k * P >= p.loop_min_span; 0 if none
// (always 0 when p.loop_repeats < 2). Cheap on text that does not loop: each P gives up
// at its first mismatch from the end. The Sampler's loop stop; exposed for tests.
int64_t loop_period(const std::vector<int32_t>& tokens, const SamplingParams& p);

// The logits sample_tokens draws from (temperature > 0): logits [.., V] as fp32 divided by
// the temperature, ids >= valid_vocab (when 0 < valid_vocab < V) and tokens outside top-k /
// top-p set to -inf. log_softmax of it is the distribution a token is sampled from, whose
// log-prob the sampler reports as the behaviour log-prob.
torch::Tensor sampling_logits(const torch::Tensor& logits, const SamplingParams& p, int64_t valid_vocab);

// Samples one token per row from logits [B, V] (fp32). Returns (tokens int64 [B],
// log-probs fp32 [B], of the distribution sampled from: sampling_logits). Runs on the
// logits' device, no host sync. Exposed for tests.
std::pair<torch::Tensor, torch::Tensor> sample_tokens(const torch::Tensor& logits, const SamplingParams& p,
                                                      int64_t valid_vocab, at::Generator& gen);

class Sampler {
 public:
  // tokenizer may be null (then stop strings are not allowed and text stays empty).
  Sampler(CausalLM model, const Tokenizer* tokenizer);
  std::vector<Completion> generate(const std::vector<std::vector<int32_t>>& prompts, const SamplingParams& p);

 private:
  CausalLM model_;
  const Tokenizer* tokenizer_;
};

// --- Engine: the rollout engine of an actor. It serves many requests (a prompt and n samples
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
#endif  // KF_POLICY_TEXT_ONLY
