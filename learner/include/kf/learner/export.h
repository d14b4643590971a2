// Export: a learner checkpoint -> an HF-format folder that transformers loads
// (config.json, model.safetensors, tokenizer.json when the checkpoint has one,
// generation_config.json, and the starting model's tokenizer_config.json with its chat
// template and named special tokens, chat_template.jinja and special_tokens_map.json).
// A LoRA checkpoint (state.json "lora") exports merged weights (W + alpha/r B A) by
// default, or with `peft` a PEFT adapter folder; the base comes from the checkpoint (a
// random-init base is saved there) or from the model folder the run started from
// (state.json lora.base_model, or base_model below).
// Used by tools/export.
// Plain function; any thread.
#pragma once
#include <string>

namespace kf::learner {

struct ExportOptions {
  std::string dtype = "float32";  // "float32" or "bfloat16" weights
  double temperature = 1.0;       // generation_config.json sampling defaults
  double top_p = 1.0;
  int64_t max_new_tokens = 2048;
  // The model folder the run started from, for its tokenizer_config.json (chat template,
  // eos/pad/bos tokens), chat_template.jinja and special_tokens_map.json. Empty: the
  // checkpoint's own copies, else the folder the run's config.yaml names in learner.policy.
  std::string base_model;
  // LoRA checkpoints only: write a PEFT adapter folder (adapter_config.json +
  // adapter_model.safetensors, PEFT's tensor names) instead of merged weights.
  bool peft = false;
};

// `checkpoint` is a checkpoint folder, a run's checkpoints/ folder or a run folder (then
// the newest valid checkpoint is used). The checkpoint is verified first. Throws
// kf::Error naming the file and field. Returns the checkpoint folder used.
std::string export_checkpoint(const std::string& checkpoint, const std::string& out_dir, const ExportOptions& opt = {});

}  // namespace kf::learner
