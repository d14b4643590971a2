// Checkpoint folders: bad files give errors naming file and field; what we write loads in
// HF transformers with the same logits (checked by hf_reference.py verify).
#include <gtest/gtest.h>

#include <cstdlib>

#include "kf/common/error.h"
#include "kf/policy/policy.h"
#include "torch_util.h"

using namespace kf::policy;
namespace t = kf::policy::test;

namespace {

std::string copy_model(const std::string& from, const std::string& to) {
  for (const char* f : {"config.json", "model.safetensors"}) t::write_file(to + "/" + f, t::read_file(from + "/" + f));
  return to;
}

std::string load_error(const std::string& dir) {
  try {
    load_policy(dir, torch::kCPU);
  } catch (const kf::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(PolicyCheckpointTest, TruncatedWeightsNameFile) {
  t::TempDir d;
  copy_model(t::refs_dir() + "/qwen2", d.path);
  const std::string w = t::read_file(d.path + "/model.safetensors");
  t::write_file(d.path + "/model.safetensors", w.substr(0, w.size() / 2));
  const auto e = load_error(d.path);
  EXPECT_NE(e.find(d.path + "/model.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("data_offsets"), std::string::npos) << e;
}

TEST(PolicyCheckpointTest, VocabShapeMismatchNamesFileAndField) {
  t::TempDir d;
  copy_model(t::refs_dir() + "/qwen2", d.path);
  std::string cfg = t::read_file(d.path + "/config.json");
  cfg.replace(cfg.find("\"vocab_size\": 384"), 17, "\"vocab_size\": 400");
  t::write_file(d.path + "/config.json", cfg);
  const auto e = load_error(d.path);
  EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("model.embed_tokens.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("vocab_size=400"), std::string::npos) << e;
}

TEST(PolicyCheckpointTest, TokenizerLargerThanModelVocabIsAnError) {
  t::TempDir d;
  copy_model(t::refs_dir() + "/qwen2", d.path);
  t::write_file(d.path + "/tokenizer.json", t::read_file(t::refs_dir() + "/tokenizer_qwen2.json"));  // 603 ids > 384
  const auto e = load_error(d.path);
  EXPECT_NE(e.find("tokenizer.json"), std::string::npos) << e;
  EXPECT_NE(e.find("vocab_size"), std::string::npos) << e;
}

TEST(PolicyCheckpointTest, MissingConfigKeyNamesField) {
  t::TempDir d;
  copy_model(t::refs_dir() + "/llama", d.path);
  std::string cfg = t::read_file(d.path + "/config.json");
  cfg.replace(cfg.find("\"num_hidden_layers\""), 19, "\"num_layers_renamed\"");
  t::write_file(d.path + "/config.json", cfg);
  const auto e = load_error(d.path);
  EXPECT_NE(e.find(d.path + "/config.json"), std::string::npos) << e;
  EXPECT_NE(e.find("num_hidden_layers"), std::string::npos) << e;
}

// Qwen2 weights under a config.json that says qwen3: the first tensor a Qwen3 model needs
// and the file lacks is named, with the shape expected; Qwen3 weights under "qwen2" name the
// first q/k/v bias missing.
TEST(PolicyCheckpointTest, MissingTensorNamesItAndTheShapeExpected) {
  t::TempDir d;
  copy_model(t::refs_dir() + "/qwen2", d.path);
  std::string cfg = t::read_file(d.path + "/config.json");
  cfg.replace(cfg.find("\"model_type\": \"qwen2\""), 21, "\"model_type\": \"qwen3\"");
  t::write_file(d.path + "/config.json", cfg);
  const auto e = load_error(d.path);
  EXPECT_NE(e.find("model.layers.0.self_attn.q_norm.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("is missing"), std::string::npos) << e;
  EXPECT_NE(e.find("shape [16]"), std::string::npos) << e;
  EXPECT_NE(e.find("qwen3"), std::string::npos) << e;

  t::TempDir d3;
  copy_model(t::refs_dir() + "/qwen3", d3.path);
  std::string cfg3 = t::read_file(d3.path + "/config.json");
  cfg3.replace(cfg3.find("\"model_type\": \"qwen3\""), 21, "\"model_type\": \"qwen2\"");
  t::write_file(d3.path + "/config.json", cfg3);
  const auto e3 = load_error(d3.path);
  EXPECT_NE(e3.find("model.layers.0.self_attn.q_proj.bias"), std::string::npos) << e3;
  EXPECT_NE(e3.find("shape [96]"), std::string::npos) << e3;  // 4 heads x head_dim 24
}

// Write our model (sharded, to cover the index too), then HF loads it and must give our logits.
TEST(PolicyCheckpointTest, WrittenCheckpointLoadsInHfWithSameLogits) {
  for (const std::string name : {"qwen2", "llama", "qwen3", "qwen3_tied"}) {
    t::TempDir d;
    auto p = load_policy(t::refs_dir() + "/" + name, torch::kCPU);
    save_policy(p, d.path, /*max_shard_bytes=*/64 << 10);
    // Our own reader takes it back bit-exactly.
    auto back = load_policy(d.path, torch::kCPU);
    auto pa = p.model->named_parameters(), pb = back.model->named_parameters();
    for (const auto& it : pa) EXPECT_TRUE(torch::equal(it.value(), pb[it.key()])) << it.key();
    const auto ids = t::load_tensor(t::refs_dir() + "/" + name + "/refs.safetensors", "ids");
    torch::Tensor logits;
    {
      torch::NoGradGuard g;
      logits = p.model->forward(ids).contiguous();
    }
    const std::string ref = d.path + "/ours.safetensors";
    st_write(ref, {{"ids", "I64", ids.sizes().vec()}, {"logits", "F32", logits.sizes().vec()}},
             [&](std::size_t i, std::string& out) {
               const auto& x = i == 0 ? ids : logits;
               out.assign(static_cast<const char*>(x.data_ptr()), x.numel() * x.element_size());
             });
    const std::string cmd =
        t::python() + " " + t::source_dir() + "/tests/policy/hf_reference.py verify --dir " + d.path + " --ref " + ref;
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
}
