// kf-export (tools/export CHECKPOINT OUT): writes an HF-format folder from a learner
// checkpoint (or a run folder: its newest valid checkpoint). Exit 0 ok, 1 error, 2 usage.
#include "kf/common/cli.h"

#include "kf/common/error.h"
#include "kf/common/log.h"
#include "kf/learner/learner.h"

int main(int argc, char** argv) {
  CLI::App app{"Export a learner checkpoint as an HF transformers folder"};
  std::string ckpt, out;
  kf::learner::ExportOptions opt;
  app.add_option("CHECKPOINT", ckpt, "checkpoint folder, checkpoints/ folder or run folder")->required();
  app.add_option("OUT", out, "output folder")->required();
  app.add_option("--dtype", opt.dtype, "float32 or bfloat16")->check(CLI::IsMember({"float32", "bfloat16"}));
  app.add_option("--temperature", opt.temperature, "generation_config.json temperature");
  app.add_option("--top-p", opt.top_p, "generation_config.json top_p");
  app.add_option("--base-model", opt.base_model,
                 "model folder the run started from (its tokenizer_config.json / chat template); "
                 "default: the checkpoint's copy, else the run's learner.policy");
  app.add_flag("--peft", opt.peft,
               "LoRA checkpoints: write a PEFT adapter folder (adapter_config.json + adapter_model.safetensors) "
               "instead of merged weights");
  KF_CLI_PARSE(app, argc, argv);
  kf::log_init("export", 0);
  try {
    const auto used = kf::learner::export_checkpoint(ckpt, out, opt);
    std::printf("exported %s -> %s\n", used.c_str(), out.c_str());
    return 0;
  } catch (const std::exception& e) {
    kf::log_error("export failed: ", kf::message_of(e), "; nothing usable was written to ", out);
    return 1;
  }
}
