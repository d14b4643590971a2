// ModelConfig <-> config.json (kf/policy/policy.h, policy/src/config.h), the stop ids of
// generation_config.json, and the named random-init shapes (named_model_shape: kf::Error
// naming learner.init_shape for an unknown name). Errors name the file and the field.
#include "kf/policy/policy.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kf/common/error.h"
#include "config.h"

namespace kf::policy {
namespace {

using nlohmann::json;

std::string field_ctx(const std::string& ctx, const std::string& key) { return ctx + ": field '" + key + "'"; }

int64_t get_int(const json& j, const std::string& key, const std::string& ctx, bool required, int64_t dflt) {
  if (!j.contains(key) || j[key].is_null()) {
    if (required) throw Error(field_ctx(ctx, key) + ": missing (required)");
    return dflt;
  }
  if (!j[key].is_number_integer()) throw Error(field_ctx(ctx, key) + ": must be an integer");
  return j[key].get<int64_t>();
}

double get_double(const json& j, const std::string& key, const std::string& ctx, double dflt) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  if (!j[key].is_number()) throw Error(field_ctx(ctx, key) + ": must be a number");
  return j[key].get<double>();
}

bool get_bool(const json& j, const std::string& key, const std::string& ctx, bool dflt) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  if (!j[key].is_boolean()) throw Error(field_ctx(ctx, key) + ": must be true or false");
  return j[key].get<bool>();
}

void parse_rope(const json& r, const std::string& ctx, RopeConfig& rope) {
  if (!r.is_object()) throw Error(ctx + ": must be an object");
  std::string type = "default";
  for (const char* k : {"rope_type", "type"})
    if (r.contains(k) && r[k].is_string()) type = r[k].get<std::string>();
  if (type != "default" && type != "linear" && type != "llama3")
    throw Error(ctx + ": rope_type '" + type + "' is not supported (default, linear, llama3)");
  rope.type = type;
  rope.theta = get_double(r, "rope_theta", ctx, rope.theta);
  rope.factor = get_double(r, "factor", ctx, rope.factor);
  rope.low_freq_factor = get_double(r, "low_freq_factor", ctx, rope.low_freq_factor);
  rope.high_freq_factor = get_double(r, "high_freq_factor", ctx, rope.high_freq_factor);
  rope.original_max_position = get_int(r, "original_max_position_embeddings", ctx, false, rope.original_max_position);
}

// "eos_token_id" of config.json or generation_config.json: absent or null, an integer, or
// a list of integers.
std::vector<int64_t> eos_ids(const json& j, const std::string& ctx) {
  std::vector<int64_t> ids;
  if (!j.contains("eos_token_id") || j["eos_token_id"].is_null()) return ids;
  const auto& e = j["eos_token_id"];
  if (e.is_number_integer()) {
    ids.push_back(e.get<int64_t>());
  } else if (e.is_array()) {
    for (const auto& x : e) {
      if (!x.is_number_integer()) throw Error(field_ctx(ctx, "eos_token_id") + ": must hold integers");
      ids.push_back(x.get<int64_t>());
    }
  } else {
    throw Error(field_ctx(ctx, "eos_token_id") + ": must be an integer or a list");
  }
  return ids;
}

}  // namespace

void ModelConfig::validate(const std::string& ctx) const {
  auto positive = [&](const char* name, int64_t v) {
    if (v <= 0) throw Error(field_ctx(ctx, name) + ": must be positive, got " + std::to_string(v));
  };
  positive("vocab_size", vocab_size);
  positive("hidden_size", hidden_size);
  positive("intermediate_size", intermediate_size);
  positive("num_hidden_layers", num_hidden_layers);
  positive("num_attention_heads", num_attention_heads);
  positive("num_key_value_heads", num_key_value_heads);
  positive("head_dim", head_dim);
  if (head_dim % 2 != 0) throw Error(field_ctx(ctx, "head_dim") + ": must be even for RoPE");
  if (num_attention_heads % num_key_value_heads != 0)
    throw Error(field_ctx(ctx, "num_key_value_heads") + ": " + std::to_string(num_key_value_heads) +
                " does not divide num_attention_heads " + std::to_string(num_attention_heads));
  if (!(rms_norm_eps > 0)) throw Error(field_ctx(ctx, "rms_norm_eps") + ": must be positive");
  if (!(rope.theta > 0)) throw Error(field_ctx(ctx, "rope_theta") + ": must be positive");
}

ModelConfig parse_model_config(const std::string& text, const std::string& ctx) {
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    throw Error(ctx + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw Error(ctx + ": not a JSON object");
  ModelConfig c;
  c.raw_json = text;
  if (!j.contains("model_type") || !j["model_type"].is_string())
    throw Error(field_ctx(ctx, "model_type") + ": missing (required; one of qwen2, qwen3, llama)");
  c.model_type = j["model_type"].get<std::string>();
  if (c.model_type != "qwen2" && c.model_type != "qwen3" && c.model_type != "llama")
    throw Error(field_ctx(ctx, "model_type") + ": '" + c.model_type + "' is not supported (qwen2, qwen3, llama)");
  c.vocab_size = get_int(j, "vocab_size", ctx, true, 0);
  c.hidden_size = get_int(j, "hidden_size", ctx, true, 0);
  c.intermediate_size = get_int(j, "intermediate_size", ctx, true, 0);
  c.num_hidden_layers = get_int(j, "num_hidden_layers", ctx, true, 0);
  c.num_attention_heads = get_int(j, "num_attention_heads", ctx, true, 0);
  c.num_key_value_heads = get_int(j, "num_key_value_heads", ctx, false, c.num_attention_heads);
  const int64_t derived_head_dim = c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0;
  c.head_dim = get_int(j, "head_dim", ctx, false, derived_head_dim);
  if (!j.contains("head_dim") && c.num_attention_heads > 0 && c.hidden_size % c.num_attention_heads != 0)
    throw Error(field_ctx(ctx, "hidden_size") + ": not divisible by num_attention_heads and no head_dim given");
  c.max_position_embeddings = get_int(j, "max_position_embeddings", ctx, false, c.max_position_embeddings);
  c.rms_norm_eps = get_double(j, "rms_norm_eps", ctx, c.rms_norm_eps);
  c.rope.theta = get_double(j, "rope_theta", ctx, c.rope.theta);
  // transformers >= 5 writes rope_parameters; older files use rope_theta + rope_scaling.
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
    parse_rope(j["rope_scaling"], field_ctx(ctx, "rope_scaling"), c.rope);
  if (j.contains("rope_parameters") && !j["rope_parameters"].is_null())
    parse_rope(j["rope_parameters"], field_ctx(ctx, "rope_parameters"), c.rope);
  c.tie_word_embeddings = get_bool(j, "tie_word_embeddings", ctx, false);
  if (c.model_type == "qwen2") {
    c.qkv_bias = true;
    if (get_bool(j, "use_sliding_window", ctx, false))
      throw Error(field_ctx(ctx, "use_sliding_window") + ": sliding-window attention is not supported");
  } else if (c.model_type == "qwen3") {
    // Qwen3: no q/k/v bias unless attention_bias (which biases o_proj too), RMSNorm per head
    // of q and k before RoPE.
    c.qkv_bias = c.o_bias = get_bool(j, "attention_bias", ctx, false);
    c.qk_norm = true;
    if (get_bool(j, "use_sliding_window", ctx, false))
      throw Error(field_ctx(ctx, "use_sliding_window") + ": sliding-window attention is not supported");
  } else {
    c.qkv_bias = c.o_bias = get_bool(j, "attention_bias", ctx, false);
    c.mlp_bias = get_bool(j, "mlp_bias", ctx, false);
  }
  if (j.contains("hidden_act") && j["hidden_act"] != "silu")
    throw Error(field_ctx(ctx, "hidden_act") + ": only 'silu' (SwiGLU) is supported");
  c.eos_token_ids = eos_ids(j, ctx);
  c.bos_token_id = get_int(j, "bos_token_id", ctx, false, -1);
  for (const char* k : {"dtype", "torch_dtype"})
    if (j.contains(k) && j[k].is_string()) {
      c.dtype = j[k].get<std::string>();
      break;
    }
  c.validate(ctx);
  return c;
}

std::vector<int64_t> generation_eos_ids(const std::string& json_text, const std::string& ctx) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const std::exception& e) {
    throw Error(ctx + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw Error(ctx + ": must be a JSON object");
  return eos_ids(j, ctx);
}

ModelConfig load_model_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  ModelConfig c = parse_model_config(ss.str(), path);
  // generation_config.json beside config.json: its eos_token_id are stop ids too (instruct
  // models end a turn with a token config.json does not name, e.g. Qwen2.5's <|im_end|>).
  const auto slash = path.rfind('/');
  const std::string gen =
      (slash == std::string::npos ? std::string() : path.substr(0, slash + 1)) + "generation_config.json";
  std::ifstream gin(gen);
  if (gin) {
    std::stringstream gs;
    gs << gin.rdbuf();
    for (int64_t id : generation_eos_ids(gs.str(), gen)) {
      if (id < 0 || id >= c.vocab_size)
        throw Error(field_ctx(gen, "eos_token_id") + ": " + std::to_string(id) + " is outside the vocabulary (" + path +
                    " field 'vocab_size' is " + std::to_string(c.vocab_size) + ")");
      if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), id) == c.eos_token_ids.end())
        c.eos_token_ids.push_back(id);
    }
  }
  return c;
}

std::string model_config_to_json(const ModelConfig& c) {
  json j = json::object();
  if (!c.raw_json.empty()) {
    try {
      j = json::parse(c.raw_json);
    } catch (...) {
      j = json::object();
    }
  }
  j["model_type"] = c.model_type;
  j["architectures"] = {c.model_type == "qwen2"   ? "Qwen2ForCausalLM"
                        : c.model_type == "qwen3" ? "Qwen3ForCausalLM"
                                                  : "LlamaForCausalLM"};
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (c.model_type == "llama") {
    j["attention_bias"] = c.qkv_bias;
    j["mlp_bias"] = c.mlp_bias;
  }
  if (c.model_type == "qwen3") j["attention_bias"] = c.qkv_bias;
  json rope = {{"rope_type", c.rope.type}, {"rope_theta", c.rope.theta}};
  if (c.rope.type != "default") rope["factor"] = c.rope.factor;
  if (c.rope.type == "llama3") {
    rope["low_freq_factor"] = c.rope.low_freq_factor;
    rope["high_freq_factor"] = c.rope.high_freq_factor;
    rope["original_max_position_embeddings"] = c.rope.original_max_position;
  }
  j["rope_parameters"] = rope;  // transformers >= 5
  j.erase("rope_scaling");
  j["rope_theta"] = c.rope.theta;  // older readers
  if (!c.eos_token_ids.empty()) {
    if (c.eos_token_ids.size() == 1)
      j["eos_token_id"] = c.eos_token_ids[0];
    else
      j["eos_token_id"] = c.eos_token_ids;
  }
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  j["dtype"] = c.dtype;
  j.erase("torch_dtype");
  return j.dump(2);
}

void save_model_config(const ModelConfig& c, const std::string& path) {
  std::ofstream out(path, std::ios::trunc);
  if (!out) throw Error(path + ": cannot create");
  out << model_config_to_json(c) << "\n";
  if (!out) throw Error(path + ": write failed");
}

ModelConfig named_model_shape(const std::string& name) {
  // A config.json path (configs/shapes/): the exact shape of a Hugging Face model, random init.
  if (name.size() > 5 && name.compare(name.size() - 5, 5, ".json") == 0) return load_model_config(name);
  ModelConfig c;
  c.model_type = "qwen2";
  c.qkv_bias = true;
  c.rope.theta = 1e6;
  c.rms_norm_eps = 1e-6;
  c.eos_token_ids = {0};
  if (name == "tiny") {
    c.vocab_size = 256;
    c.hidden_size = 64;
    c.intermediate_size = 128;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 16;
    c.max_position_embeddings = 4096;
    c.tie_word_embeddings = false;
  } else if (name == "qwen2.5-0.5b") {
    c.vocab_size = 151936;
    c.hidden_size = 896;
    c.intermediate_size = 4864;
    c.num_hidden_layers = 24;
    c.num_attention_heads = 14;
    c.num_key_value_heads = 2;
    c.head_dim = 64;
    c.max_position_embeddings = 32768;
    c.tie_word_embeddings = true;
    c.eos_token_ids = {151643, 151645};
  } else {
    throw Error("learner.init_shape: unknown model shape '" + name + "' (tiny, qwen2.5-0.5b, or a config.json path)");
  }
  c.validate("learner.init_shape " + name);
  return c;
}

}  // namespace kf::policy
