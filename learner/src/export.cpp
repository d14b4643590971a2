#include "kf/learner/export.h"

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "kf/common/error.h"
#include "kf/common/log.h"
#include "kf/common/run_dir.h"
#include "kf/learner/checkpoint.h"
#include "kf/policy/checkpoint.h"

namespace kf::learner {
namespace {
bool exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
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
  {
    torch::NoGradGuard ng;
    auto weights = read_tensors(ckpt + "/model.safetensors");
    auto params = p.model->named_parameters();
    for (auto& item : params) {
      auto it = weights.find(item.key());
      if (it == weights.end())
        throw Error(ckpt + "/model.safetensors: tensor '" + item.key() + "' is missing");
      if (it->second.sizes() != item.value().sizes())
        throw Error(ckpt + "/model.safetensors: tensor '" + item.key() + "': shape mismatch with config.json");
      item.value().copy_(it->second);
    }
    if (weights.size() != params.size())
      throw Error(ckpt + "/model.safetensors: holds " + std::to_string(weights.size()) + " tensors, config.json's model has " +
                  std::to_string(params.size()));
  }
  if (exists(ckpt + "/tokenizer.json")) p.tokenizer = policy::Tokenizer::from_file(ckpt + "/tokenizer.json");
  ::mkdir(out_dir.c_str(), 0755);
  policy::save_policy(p, out_dir);
  nlohmann::json gen = {{"_from_model_config", false}, {"do_sample", true}, {"temperature", opt.temperature},
                        {"top_p", opt.top_p}, {"max_new_tokens", opt.max_new_tokens}};
  if (cfg.bos_token_id >= 0) gen["bos_token_id"] = cfg.bos_token_id;
  if (!cfg.eos_token_ids.empty()) {
    if (cfg.eos_token_ids.size() == 1) gen["eos_token_id"] = cfg.eos_token_ids[0];
    else gen["eos_token_id"] = cfg.eos_token_ids;
  }
  write_file_atomic(out_dir + "/generation_config.json", gen.dump(2) + "\n");
  if (p.tokenizer && !exists(out_dir + "/tokenizer_config.json")) {
    nlohmann::json tc = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                         {"model_max_length", cfg.max_position_embeddings}};
    write_file_atomic(out_dir + "/tokenizer_config.json", tc.dump(2) + "\n");
  }
  log_info("export: ", ckpt, " -> ", out_dir, " (", opt.dtype, ")");
  return ckpt;
}

}  // namespace kf::learner
