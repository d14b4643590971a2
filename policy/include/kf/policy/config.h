// ModelConfig: the architecture of a Llama/Qwen2-family decoder, read from and written
// to a Hugging Face config.json. Torch-free, so tools and fuzzers can use it.
// Errors are kf::Error naming the file and the field ("config.json: field 'hidden_size': ...").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kf::policy {

struct RopeConfig {
  std::string type = "default";  // "default", "linear" or "llama3"
  double theta = 10000.0;
  double factor = 1.0;                   // linear, llama3
  double low_freq_factor = 1.0;          // llama3
  double high_freq_factor = 4.0;         // llama3
  int64_t original_max_position = 8192;  // llama3
};

struct ModelConfig {
  std::string model_type = "qwen2";  // "qwen2" or "llama"
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
  bool qkv_bias = false;               // qwen2: always; llama: attention_bias
  bool o_bias = false;                 // llama attention_bias also biases o_proj
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

}  // namespace kf::policy
