#include "checkpoint.h"
#include "kf/learner/learner.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "kf/common/config.h"
#include "kf/common/error.h"
#include "kf/common/log.h"
#include "kf/common/run_dir.h"
#include "kf/policy/policy.h"

namespace kf::learner {
namespace {
bool exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

std::string parent(const std::string& p) {
  std::string s = p;
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  const auto slash = s.rfind('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : s.substr(0, slash);
}

// Where the starting model's tokenizer_config.json is: the checkpoint's own copy, else
// --base-model, else the folder the run's config.yaml names in learner.policy (the run
// folder is the checkpoint's grandparent: runs/<name>/checkpoints/step-N). "" if none.
std::string tokenizer_files_dir(const std::string& ckpt_path, const std::string& base_model) {
  if (exists(ckpt_path + "/tokenizer_config.json")) return ckpt_path;
  char buf[PATH_MAX];
  const std::string ckpt = ::realpath(ckpt_path.c_str(), buf) ? std::string(buf) : ckpt_path;
  if (!base_model.empty()) {
    if (!exists(base_model + "/tokenizer_config.json"))
      throw Error("export: --base-model " + base_model + ": no tokenizer_config.json there");
    return base_model;
  }
  const std::string run_config = parent(parent(ckpt)) + "/config.yaml";
  if (!exists(run_config)) return "";
  std::string policy;
  try {
    policy = Config::load(run_config).get_string("learner.policy");
  } catch (const Error& e) {
    log_warn("export: cannot read learner.policy from ", run_config, " (", e.what(),
             "); the export gets a plain tokenizer_config.json");
    return "";
  }
  if (policy.empty()) return "";  // a random-init run: no starting model
  if (!exists(policy + "/tokenizer_config.json")) {
    log_warn("export: the run started from ", policy, " (", run_config, " learner.policy), which has no ",
             "tokenizer_config.json now; the export gets a plain one (pass --base-model to name the folder)");
    return "";
  }
  return policy;
}
struct CheckpointLora {
  policy::LoraConfig config;  // rank 0: not a LoRA checkpoint
  std::string base_model;     // the run's learner.policy ("" for a random-init base)
  bool base_in_checkpoint = false;
};

CheckpointLora checkpoint_lora(const std::string& ckpt) {
  CheckpointLora out;
  const std::string file = ckpt + "/state.json";
  try {
    const auto state = nlohmann::json::parse(read_file(file));
    if (!state.contains("lora")) return out;
    const auto& l = state.at("lora");
    out.config.rank = l.at("rank").get<int64_t>();
    out.config.alpha = l.at("alpha").get<double>();
    out.config.targets = l.at("targets").get<std::vector<std::string>>();
    out.base_model = l.value("base_model", std::string());
    out.base_in_checkpoint = l.value("base_in_checkpoint", false);
  } catch (const nlohmann::json::exception& e) {
    throw Error(file + ": field \"lora\": " + e.what());
  }
  return out;
}

// The checkpoint's LoRA model in fp32 on the CPU: base weights, adapters from `weights`.
policy::CausalLM lora_model(const std::string& ckpt, const policy::ModelConfig& cfg, const CheckpointLora& lora,
                            const std::map<std::string, torch::Tensor>& weights, const std::string& base_override) {
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  policy::CausalLM m{nullptr};
  if (lora.base_in_checkpoint) {
    m = policy::CausalLM(cfg, f32);
  } else {
    const std::string base = base_override.empty() ? lora.base_model : base_override;
    if (base.empty() || !exists(base + "/config.json"))
      throw Error("export: " + ckpt + " holds LoRA adapters only and its base model folder '" + base +
                  "' (state.json lora.base_model) has no config.json; pass --base-model");
    m = policy::load_policy(base, torch::kCPU, torch::kFloat32).model;
    if (m->config().hidden_size != cfg.hidden_size || m->config().num_hidden_layers != cfg.num_hidden_layers ||
        m->config().vocab_size != cfg.vocab_size)
      throw Error("export: base model " + base + " does not have the shape of " + ckpt + "/config.json");
  }
  m->enable_lora(lora.config, 0, torch::kFloat32);
  torch::NoGradGuard ng;
  auto params = m->named_parameters();
  for (auto& item : params) {
    const bool adapter = policy::is_lora_param(item.key());
    if (!adapter && !lora.base_in_checkpoint) continue;  // from the base folder
    auto it = weights.find(item.key());
    if (it == weights.end()) throw Error(ckpt + "/model.safetensors: tensor '" + item.key() + "' is missing");
    if (it->second.sizes() != item.value().sizes())
      throw Error(ckpt + "/model.safetensors: tensor '" + item.key() +
                  "': shape mismatch with config.json and state.json lora");
    item.value().copy_(it->second);
  }
  return m;
}

// PEFT's folder: adapter_config.json + adapter_model.safetensors with PEFT's key names
// (base_model.model.<our name>), which peft's PeftModel.from_pretrained loads onto the base.
void write_peft_adapter(policy::CausalLM& m, const CheckpointLora& lora, const ExportOptions& opt,
                        const std::string& out_dir) {
  ::mkdir(out_dir.c_str(), 0755);
  const auto dtype = opt.dtype == "bfloat16" ? torch::kBFloat16 : torch::kFloat32;
  std::vector<policy::StWriteSpec> specs;
  std::vector<torch::Tensor> data;
  for (const auto& p : m->named_parameters()) {
    if (!policy::is_lora_param(p.key())) continue;
    specs.push_back({"base_model.model." + p.key(), policy::safetensors_dtype(dtype), p.value().sizes().vec()});
    data.push_back(p.value().detach().to(torch::kCPU, dtype).contiguous());
  }
  policy::st_write(out_dir + "/adapter_model.safetensors", specs,
                   [&](std::size_t i, std::string& bytes) {
                     bytes.assign(static_cast<const char*>(data[i].data_ptr()), data[i].nbytes());
                   },
                   {{"format", "pt"}});
  const std::string base = !opt.base_model.empty() ? opt.base_model : lora.base_model;
  nlohmann::json cfg = {{"peft_type", "LORA"},
                        {"task_type", "CAUSAL_LM"},
                        {"r", lora.config.rank},
                        {"lora_alpha", lora.config.alpha},
                        {"target_modules", lora.config.targets},
                        {"lora_dropout", 0.0},
                        {"bias", "none"},
                        {"fan_in_fan_out", false},
                        {"use_rslora", false},
                        {"use_dora", false},
                        {"init_lora_weights", true},
                        {"inference_mode", true},
                        {"modules_to_save", nullptr},
                        {"base_model_name_or_path", base.empty() ? nlohmann::json(nullptr) : nlohmann::json(base)}};
  write_file_atomic(out_dir + "/adapter_config.json", cfg.dump(2) + "\n");
}

}  // namespace

std::string export_checkpoint(const std::string& checkpoint, const std::string& out_dir, const ExportOptions& opt) {
  std::string ckpt = checkpoint;
  if (!exists(ckpt + "/MANIFEST.json")) {
    const std::string dir = exists(ckpt + "/checkpoints") ? ckpt + "/checkpoints" : ckpt;
    auto ref = find_latest_valid(dir);
    if (!ref) throw Error("export: " + checkpoint + ": no valid learner checkpoint found (looked in " + dir + ")");
    ckpt = ref->path;
  }
  verify_checkpoint(ckpt);
  auto cfg = policy::load_model_config(ckpt + "/config.json");
  const auto dtype = opt.dtype == "bfloat16" ? torch::kBFloat16 : torch::kFloat32;
  if (opt.dtype != "bfloat16" && opt.dtype != "float32")
    throw Error("export: dtype '" + opt.dtype + "' is not float32 or bfloat16");
  policy::Policy p;
  p.config = cfg;
  p.model = policy::CausalLM(cfg, torch::TensorOptions().dtype(dtype));
  const auto lora = checkpoint_lora(ckpt);
  if (opt.peft && !lora.config.rank)
    throw Error("export --peft: " + ckpt + " is not a LoRA checkpoint (state.json has no \"lora\" section)");
  {
    torch::NoGradGuard ng;
    auto weights = read_tensors(ckpt + "/model.safetensors");
    if (lora.config.rank > 0) {
      // Frozen base (from the checkpoint, or the model folder the run started from) plus
      // the trained adapters, then merged: W + (alpha / rank) B A.
      auto full = lora_model(ckpt, cfg, lora, weights, opt.base_model);
      if (opt.peft) {
        write_peft_adapter(full, lora, opt, out_dir);
        log_info("export: ", ckpt, " -> ", out_dir, " (PEFT LoRA adapter, rank ", lora.config.rank, ", ", opt.dtype,
                 ")");
        return ckpt;
      }
      weights = full->merged_weights();
    }
    auto params = p.model->named_parameters();
    for (auto& item : params) {
      auto it = weights.find(item.key());
      if (it == weights.end()) throw Error(ckpt + "/model.safetensors: tensor '" + item.key() + "' is missing");
      if (it->second.sizes() != item.value().sizes())
        throw Error(ckpt + "/model.safetensors: tensor '" + item.key() + "': shape mismatch with config.json");
      item.value().copy_(it->second);
    }
    if (weights.size() != params.size())
      throw Error(ckpt + "/model.safetensors: holds " + std::to_string(weights.size()) +
                  " tensors, config.json's model has " + std::to_string(params.size()));
  }
  if (exists(ckpt + "/tokenizer.json")) p.tokenizer = policy::Tokenizer::from_file(ckpt + "/tokenizer.json");
  ::mkdir(out_dir.c_str(), 0755);
  policy::save_policy(p, out_dir);
  nlohmann::json gen = {{"_from_model_config", false},
                        {"do_sample", true},
                        {"temperature", opt.temperature},
                        {"top_p", opt.top_p},
                        {"max_new_tokens", opt.max_new_tokens}};
  if (cfg.bos_token_id >= 0) gen["bos_token_id"] = cfg.bos_token_id;
  if (!cfg.eos_token_ids.empty()) {
    if (cfg.eos_token_ids.size() == 1)
      gen["eos_token_id"] = cfg.eos_token_ids[0];
    else
      gen["eos_token_id"] = cfg.eos_token_ids;
  }
  write_file_atomic(out_dir + "/generation_config.json", gen.dump(2) + "\n");
  if (p.tokenizer) {
    // The tokenizer files of the model the run started from: its chat template and named
    // special tokens (eos/pad/bos), so the export renders prompts as the run did.
    const std::string base = tokenizer_files_dir(ckpt, opt.base_model);
    if (!base.empty()) {
      nlohmann::json tc;
      try {
        tc = nlohmann::json::parse(read_file(base + "/tokenizer_config.json"));
      } catch (const nlohmann::json::exception& e) {
        throw Error("export: " + base + "/tokenizer_config.json: not valid JSON: " + e.what());
      }
      if (!tc.is_object()) throw Error("export: " + base + "/tokenizer_config.json: must be a JSON object");
      write_file_atomic(out_dir + "/tokenizer_config.json", tc.dump(2) + "\n");
      for (const char* f : {"chat_template.jinja", "special_tokens_map.json"})
        if (exists(base + "/" + f)) write_file_atomic(out_dir + "/" + f, read_file(base + "/" + f));
      const bool chat = tc.contains("chat_template") || exists(base + "/chat_template.jinja");
      log_info("export: tokenizer_config.json", chat ? " with its chat template" : " (no chat template)", " from ",
               base);
    } else {
      nlohmann::json tc = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                           {"model_max_length", cfg.max_position_embeddings}};
      write_file_atomic(out_dir + "/tokenizer_config.json", tc.dump(2) + "\n");
      log_info("export: no tokenizer_config.json in ", ckpt, ", --base-model or the run's learner.policy: wrote a ",
               "plain one (no chat template, no named special tokens)");
    }
  }
  log_info("export: ", ckpt, " -> ", out_dir, " (", opt.dtype, ")");
  return ckpt;
}

}  // namespace kf::learner
