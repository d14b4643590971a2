// tools/export: a learner checkpoint becomes an HF folder that transformers loads with
// the same logits as our model (tests/learner/hf_export_check.py).
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "checkpoint.h"
#include "kf/common/safetensors.h"
#include "kf/learner/learner.h"
#include "kf/policy/policy.h"
#include "test_util.h"

using namespace kf::learner;
namespace lt = kf::learner::test;

namespace {

// A byte-level BPE tokenizer.json with the 256 GPT-2 byte tokens and no merges: ids = bytes.
std::string byte_tokenizer_json() {
  std::vector<int> bs;
  for (int b = '!'; b <= '~'; ++b) bs.push_back(b);
  for (int b = 0xA1; b <= 0xAC; ++b) bs.push_back(b);
  for (int b = 0xAE; b <= 0xFF; ++b) bs.push_back(b);
  std::vector<int> cs = bs;
  int n = 0;
  for (int b = 0; b < 256; ++b)
    if (std::find(bs.begin(), bs.end(), b) == bs.end()) {
      bs.push_back(b);
      cs.push_back(256 + n++);
    }
  nlohmann::json vocab = nlohmann::json::object();
  for (std::size_t i = 0; i < bs.size(); ++i) {
    const int cp = cs[i];
    std::string u;
    if (cp < 0x80)
      u.push_back(static_cast<char>(cp));
    else {
      u.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      u.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    vocab[u] = bs[i];
  }
  nlohmann::json bl = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  nlohmann::json j = {{"version", "1.0"},
                      {"truncation", nullptr},
                      {"padding", nullptr},
                      {"added_tokens", nlohmann::json::array()},
                      {"normalizer", nullptr},
                      {"pre_tokenizer", bl},
                      {"post_processor", nullptr},
                      {"decoder", bl},
                      {"model",
                       {{"type", "BPE"},
                        {"dropout", nullptr},
                        {"unk_token", nullptr},
                        {"continuing_subword_prefix", nullptr},
                        {"end_of_word_suffix", nullptr},
                        {"fuse_unk", false},
                        {"byte_fallback", false},
                        {"ignore_merges", false},
                        {"vocab", vocab},
                        {"merges", nlohmann::json::array()}}}};
  return j.dump();
}

}  // namespace

TEST(LearnerExportTest, ExportedFolderLoadsInTransformersWithMatchingLogits) {
  lt::TempDir tmp;
  LearnerConfig cfg;
  cfg.init_shape = "tiny";
  cfg.seed = 3;
  cfg.optim.lr = 1e-2;
  cfg.schedule.warmup_steps = 0;
  cfg.groups_per_step = 2;
  auto comm = make_local_comm();
  SyntheticSource src(SyntheticConfig{});
  src.groups_per_step_total = 2;
  LearnerDeps d;
  d.comm = comm.get();
  d.source = &src;
  d.checkpoint_dir = tmp.path + "/run/checkpoints";
  Learner l(cfg, d);
  l.set_tokenizer_json(byte_tokenizer_json());
  ASSERT_TRUE(l.step().updated);  // export trained weights, not the init
  l.checkpoint();

  const std::string out = tmp.path + "/hf";
  ASSERT_EQ(lt::run({lt::export_bin(), tmp.path + "/run", out}, tmp.path + "/export.log"), 0)
      << lt::read_text(tmp.path + "/export.log");
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"})
    EXPECT_TRUE(std::ifstream(out + "/" + f).good()) << f;

  // Our logits from the exported folder (so the round trip through our loader is covered).
  auto p = kf::policy::load_policy(out);
  torch::NoGradGuard ng;
  const auto ids = torch::randint(0, 256, {2, 12}, torch::TensorOptions().dtype(torch::kInt64));
  const auto logits = p.model->forward(ids).to(torch::kFloat32).contiguous();
  // ...and the learner's own model gives the same.
  EXPECT_LT((l.model()->forward(ids) - logits).abs().max().item<double>(), 1e-5);
  const std::string ref = tmp.path + "/ref.safetensors";
  kf::safetensors_write(
      ref, {{"ids", "I64", ids.sizes().vec(), ids.data_ptr(), static_cast<std::size_t>(ids.numel() * 8)},
            {"logits", "F32", logits.sizes().vec(), logits.data_ptr(), static_cast<std::size_t>(logits.numel() * 4)}});
  const std::string log = tmp.path + "/hf.log";
  const int rc = lt::run({lt::python(), lt::source_dir() + "/tests/learner/hf_export_check.py", out, ref}, log);
  if (rc == 3) GTEST_SKIP() << "HF transformers is not importable by " << lt::python() << ": " << lt::read_text(log);
  EXPECT_EQ(rc, 0) << lt::read_text(log);
  std::printf("%s", lt::read_text(log).c_str());

  // The exported folder is a valid initial policy (learner.policy): same weights, and its
  // tokenizer files (chat template included) travel into the next checkpoints.
  { std::ofstream(out + "/chat_template.jinja") << "{% for m in messages %}{{ m.content }}{% endfor %}"; }
  auto cfg2 = cfg;
  cfg2.policy = out;
  d.checkpoint_dir = tmp.path + "/run2/checkpoints";
  Learner l2(cfg2, d);
  EXPECT_EQ(l2.weights_checksum(), l.weights_checksum());
  const std::string ck = l2.checkpoint();
  EXPECT_EQ(lt::read_text(ck + "/tokenizer.json"), lt::read_text(out + "/tokenizer.json"));
  for (const char* f : {"tokenizer_config.json", "chat_template.jinja"}) {
    ASSERT_TRUE(std::ifstream(ck + "/" + f).good()) << f << " was not copied into " << ck;
    EXPECT_EQ(lt::read_text(ck + "/" + f), lt::read_text(out + "/" + f)) << f;
  }
  kf::learner::verify_checkpoint(ck);  // the copies are in its manifest
}

TEST(LearnerExportTest, LoraCheckpointsExportMergedWeightsOrAPeftAdapterFolder) {
  lt::TempDir tmp;
  LearnerConfig cfg;
  cfg.init_shape = "tiny";
  cfg.seed = 3;
  cfg.optim.lr = 2e-2;
  cfg.schedule.warmup_steps = 0;
  cfg.groups_per_step = 2;
  cfg.lora_rank = 4;
  cfg.lora_alpha = 8;
  cfg.lora_targets = {"q_proj", "v_proj", "up_proj"};
  auto comm = make_local_comm();
  SyntheticSource src(SyntheticConfig{});
  src.groups_per_step_total = 2;
  LearnerDeps d;
  d.comm = comm.get();
  d.source = &src;
  const auto ids = torch::randint(0, 256, {2, 12}, torch::TensorOptions().dtype(torch::kInt64));

  // 1. A random-init base: the checkpoint carries base and adapters.
  d.checkpoint_dir = tmp.path + "/run/checkpoints";
  Learner l(cfg, d);
  for (int s = 0; s < 2; ++s) ASSERT_TRUE(l.step().updated);
  const std::string ck = l.checkpoint();
  export_checkpoint(tmp.path + "/run", tmp.path + "/merged");
  {
    auto p = kf::policy::load_policy(tmp.path + "/merged");
    for (const auto& q : p.model->named_parameters()) EXPECT_FALSE(kf::policy::is_lora_param(q.key())) << q.key();
    torch::NoGradGuard ng;
    const double diff = (l.model()->forward(ids) - p.model->forward(ids)).abs().max().item<double>();
    EXPECT_LT(diff, 1e-5) << "merged export vs the learner's unmerged forward";
    l.model()->set_adapters_active(false);
    EXPECT_GT((l.model()->forward(ids) - p.model->forward(ids)).abs().max().item<double>(), 1e-4)
        << "the trained adapters made no difference: the test proves nothing";
    l.model()->set_adapters_active(true);
  }
  ExportOptions po;
  po.peft = true;
  po.base_model = "Qwen/Qwen2.5-Coder-7B-Instruct";  // recorded as given
  export_checkpoint(ck, tmp.path + "/peft", po);
  const auto ac = nlohmann::json::parse(lt::read_text(tmp.path + "/peft/adapter_config.json"));
  EXPECT_EQ(ac.at("peft_type"), "LORA");
  EXPECT_EQ(ac.at("r"), 4);
  EXPECT_DOUBLE_EQ(ac.at("lora_alpha").get<double>(), 8.0);
  EXPECT_EQ(ac.at("target_modules"), nlohmann::json({"q_proj", "v_proj", "up_proj"}));
  EXPECT_EQ(ac.at("base_model_name_or_path"), "Qwen/Qwen2.5-Coder-7B-Instruct");
  const auto peft = read_tensors(tmp.path + "/peft/adapter_model.safetensors");
  EXPECT_EQ(peft.size(), 2u * 2 * 3) << "2 layers x 3 targets x (A, B)";
  auto lp = l.model()->named_parameters();
  for (const auto& [name, t] : peft) {
    ASSERT_EQ(name.rfind("base_model.model.model.layers.", 0), 0u) << name;
    const auto ours = name.substr(std::string("base_model.model.").size());
    ASSERT_TRUE(lp.contains(ours)) << name;
    EXPECT_TRUE(torch::equal(t, lp[ours].detach())) << name;
  }
  EXPECT_TRUE(peft.count("base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"));

  // 2. A base from a model folder: the checkpoint holds the adapters only, and export
  // finds the base through state.json.
  const std::string base_dir = tmp.path + "/base";
  {
    kf::policy::Policy bp;
    bp.config = model_shape("tiny");
    bp.model = kf::policy::CausalLM(bp.config, torch::TensorOptions().dtype(torch::kFloat32));
    bp.model->init_random(21);
    kf::policy::save_policy(bp, base_dir);
  }
  auto cfg2 = cfg;
  cfg2.policy = base_dir;
  d.checkpoint_dir = tmp.path + "/run2/checkpoints";
  Learner l2(cfg2, d);
  for (int s = 0; s < 2; ++s) ASSERT_TRUE(l2.step().updated);
  const std::string ck2 = l2.checkpoint();
  for (const auto& [name, t] : read_tensors(ck2 + "/model.safetensors"))
    EXPECT_TRUE(kf::policy::is_lora_param(name)) << "base tensor " << name << " in an adapter-only checkpoint";
  export_checkpoint(ck2, tmp.path + "/merged2");
  auto p2 = kf::policy::load_policy(tmp.path + "/merged2");
  torch::NoGradGuard ng;
  const auto ours = l2.model()->forward(ids).to(torch::kFloat32).contiguous();
  EXPECT_LT((ours - p2.model->forward(ids)).abs().max().item<double>(), 1e-5);

  // 3. peft itself loads the PEFT folder onto the base and gives our unmerged logits.
  ExportOptions po2;
  po2.peft = true;
  export_checkpoint(ck2, tmp.path + "/peft2", po2);
  EXPECT_EQ(nlohmann::json::parse(lt::read_text(tmp.path + "/peft2/adapter_config.json")).at("base_model_name_or_path"),
            base_dir);
  const std::string ref = tmp.path + "/lora_ref.safetensors";
  kf::safetensors_write(
      ref, {{"ids", "I64", ids.sizes().vec(), ids.data_ptr(), static_cast<std::size_t>(ids.numel() * 8)},
            {"logits", "F32", ours.sizes().vec(), ours.data_ptr(), static_cast<std::size_t>(ours.numel() * 4)}});
  const std::string log = tmp.path + "/peft.log";
  const int rc = lt::run(
      {lt::python(), lt::source_dir() + "/tests/learner/peft_adapter_check.py", base_dir, tmp.path + "/peft2", ref},
      log);
  if (rc == 3) GTEST_SKIP() << "peft is not importable by " << lt::python() << ": " << lt::read_text(log);
  EXPECT_EQ(rc, 0) << lt::read_text(log);
  std::printf("%s", lt::read_text(log).c_str());
}

// Qwen3 (per-head q/k norms, no biases, head_dim 24 != 64 / 4): a learner trains it from a
// config.json shape, tools/export's folder loads in transformers with our logits; with LoRA
// on a Qwen3 base folder, peft loads the adapter folder onto that base with our logits.
TEST(LearnerExportTest, Qwen3TrainsFullAndWithLoraAndExportsForTransformersAndPeft) {
  lt::TempDir tmp;
  const std::string shape = tmp.path + "/qwen3-tiny.json";
  {
    std::ofstream f(shape);
    f << R"({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 256, "hidden_size": 64,
      "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
      "head_dim": 24, "attention_bias": false, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
      "tie_word_embeddings": false, "max_position_embeddings": 512, "eos_token_id": 0})";
  }
  LearnerConfig cfg;
  cfg.init_shape = shape;
  cfg.seed = 5;
  cfg.optim.lr = 1e-2;
  cfg.schedule.warmup_steps = 0;
  cfg.groups_per_step = 2;
  auto comm = make_local_comm();
  SyntheticSource src(SyntheticConfig{});
  src.groups_per_step_total = 2;
  LearnerDeps d;
  d.comm = comm.get();
  d.source = &src;
  d.checkpoint_dir = tmp.path + "/run/checkpoints";
  const auto ids = torch::randint(0, 256, {2, 12}, torch::TensorOptions().dtype(torch::kInt64));
  auto check_in_python = [&](const std::vector<std::string>& argv, const torch::Tensor& logits, const char* what) {
    const std::string ref = tmp.path + "/" + what + ".safetensors";
    kf::safetensors_write(
        ref, {{"ids", "I64", ids.sizes().vec(), ids.data_ptr(), std::size_t(ids.numel() * 8)},
              {"logits", "F32", logits.sizes().vec(), logits.data_ptr(), std::size_t(logits.numel() * 4)}});
    auto args = argv;
    args.push_back(ref);
    const std::string log = tmp.path + "/" + what + ".log";
    const int rc = lt::run(args, log);
    EXPECT_NE(rc, 3) << what << ": transformers/peft not importable by " << lt::python() << ": " << lt::read_text(log);
    EXPECT_EQ(rc, 0) << lt::read_text(log);
    std::printf("%s", lt::read_text(log).c_str());
  };

  // 1. Full weights.
  Learner l(cfg, d);
  l.set_tokenizer_json(byte_tokenizer_json());
  ASSERT_TRUE(l.step().updated);
  l.checkpoint();
  const std::string out = tmp.path + "/hf";
  ASSERT_EQ(lt::run({lt::export_bin(), tmp.path + "/run", out}, tmp.path + "/export.log"), 0)
      << lt::read_text(tmp.path + "/export.log");
  EXPECT_EQ(nlohmann::json::parse(lt::read_text(out + "/config.json")).at("architectures")[0], "Qwen3ForCausalLM");
  auto p = kf::policy::load_policy(out);
  torch::Tensor logits;
  {
    torch::NoGradGuard ng;
    logits = p.model->forward(ids).to(torch::kFloat32).contiguous();
    EXPECT_LT((l.model()->forward(ids) - logits).abs().max().item<double>(), 1e-5);
  }
  check_in_python({lt::python(), lt::source_dir() + "/tests/learner/hf_export_check.py", out}, logits, "qwen3_hf");

  // 2. LoRA on a Qwen3 base folder (the exported one), every projection adapted.
  auto cl = cfg;
  cl.policy = out;
  cl.optim.lr = 2e-2;
  cl.lora_rank = 4;
  cl.lora_alpha = 8;
  d.checkpoint_dir = tmp.path + "/run2/checkpoints";
  Learner l2(cl, d);
  for (int s = 0; s < 2; ++s) ASSERT_TRUE(l2.step().updated);
  const std::string ck = l2.checkpoint();
  ExportOptions po;
  po.peft = true;
  export_checkpoint(ck, tmp.path + "/peft", po);
  torch::Tensor ours;
  {
    torch::NoGradGuard ng;
    ours = l2.model()->forward(ids).to(torch::kFloat32).contiguous();
    l2.model()->set_adapters_active(false);
    EXPECT_GT((l2.model()->forward(ids) - ours).abs().max().item<double>(), 1e-4)
        << "the trained adapters made no difference: the test proves nothing";
    l2.model()->set_adapters_active(true);
  }
  check_in_python({lt::python(), lt::source_dir() + "/tests/learner/peft_adapter_check.py", out, tmp.path + "/peft"},
                  ours, "qwen3_peft");
}
