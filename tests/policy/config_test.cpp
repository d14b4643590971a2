#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "kf/common/error.h"
#include "kf/policy/policy.h"
#include "config.h"

using kf::policy::parse_model_config;

namespace {

const char* kQwen = R"({"model_type": "qwen2", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "rope_theta": 1000000.0,
  "rms_norm_eps": 1e-6, "tie_word_embeddings": true, "eos_token_id": [5, 6]})";

std::string error_of(const std::string& text) {
  try {
    parse_model_config(text, "dir/config.json");
  } catch (const kf::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(PolicyConfigTest, ReadsQwen2Fields) {
  const auto c = parse_model_config(kQwen, "config.json");
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{5, 6}));
}

// Qwen3 (as transformers 5 writes it): q/k norms on, no q/k/v bias unless attention_bias,
// an explicit head_dim; sliding-window attention refused by name.
TEST(PolicyConfigTest, ReadsQwen3Fields) {
  const auto c = parse_model_config(R"({"model_type": "qwen3", "vocab_size": 100, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 32, "attention_bias": false, "tie_word_embeddings": false,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}})",
                                    "config.json");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  const auto biased = parse_model_config(R"({"model_type": "qwen3", "vocab_size": 100, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "attention_bias": true})",
                                         "config.json");
  EXPECT_TRUE(biased.qkv_bias && biased.o_bias);
  EXPECT_FALSE(parse_model_config(kQwen, "config.json").qk_norm);
  const std::string e = error_of(R"({"model_type": "qwen3", "vocab_size": 100, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "use_sliding_window": true})");
  EXPECT_NE(e.find("use_sliding_window"), std::string::npos) << e;
}

TEST(PolicyConfigTest, ReadsNewerRopeParametersForm) {
  const auto c = parse_model_config(R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2, "attention_bias": true,
    "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})",
                                    "config.json");
  EXPECT_EQ(c.rope.type, "llama3");
  EXPECT_DOUBLE_EQ(c.rope.theta, 500000.0);
  EXPECT_DOUBLE_EQ(c.rope.factor, 8.0);
  EXPECT_TRUE(c.qkv_bias && c.o_bias);
  EXPECT_EQ(c.num_key_value_heads, 2);
}

TEST(PolicyConfigTest, MissingKeyNamesFileAndField) {
  const std::string e = error_of(R"({"model_type": "qwen2", "vocab_size": 100, "hidden_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 4})");
  EXPECT_NE(e.find("dir/config.json"), std::string::npos) << e;
  EXPECT_NE(e.find("intermediate_size"), std::string::npos) << e;
}

TEST(PolicyConfigTest, BadValuesNameTheField) {
  EXPECT_NE(error_of(R"({"model_type": "gpt_neox"})").find("model_type"), std::string::npos);
  // An unknown architecture names itself and the supported list.
  const std::string unknown = error_of(R"({"model_type": "gpt_neox"})");
  EXPECT_NE(unknown.find("'gpt_neox' is not supported (qwen2, qwen3, llama)"), std::string::npos) << unknown;
  EXPECT_NE(error_of("{not json").find("dir/config.json"), std::string::npos);
  std::string bad = kQwen;
  bad.replace(bad.find("\"num_key_value_heads\": 2"), 24, "\"num_key_value_heads\": 3");
  EXPECT_NE(error_of(bad).find("num_key_value_heads"), std::string::npos);
  bad = kQwen;
  bad.replace(bad.find("\"hidden_size\": 64"), 17, "\"hidden_size\": \"64\"");
  EXPECT_NE(error_of(bad).find("'hidden_size'"), std::string::npos);
  EXPECT_NE(error_of(R"({"model_type": "qwen2", "vocab_size": 1, "hidden_size": 8, "intermediate_size": 8,
    "num_hidden_layers": 1, "num_attention_heads": 2, "rope_scaling": {"rope_type": "yarn"}})")
                .find("rope_scaling"),
            std::string::npos);
}

TEST(PolicyConfigTest, WrittenConfigReadsBack) {
  auto c = parse_model_config(kQwen, "config.json");
  const auto back = parse_model_config(kf::policy::model_config_to_json(c), "written");
  EXPECT_EQ(back.hidden_size, c.hidden_size);
  EXPECT_EQ(back.num_key_value_heads, c.num_key_value_heads);
  EXPECT_DOUBLE_EQ(back.rope.theta, c.rope.theta);
  EXPECT_EQ(back.eos_token_ids, c.eos_token_ids);
}

// learner.init_shape: a built-in name or a config.json path (configs/shapes/), for a random
// init of a real model's exact shape.
TEST(PolicyConfigTest, NamedShapeTakesAConfigJsonPath) {
  const std::string dir = ::testing::TempDir() + "/kf-shape-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  { std::ofstream(dir + "/shape.json") << kQwen; }
  const auto c = kf::policy::named_model_shape(dir + "/shape.json");
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.vocab_size, 100);
  EXPECT_EQ(kf::policy::named_model_shape("tiny").vocab_size, 256);
  try {
    kf::policy::named_model_shape("huge");
    FAIL() << "an unknown name must be refused";
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("or a config.json path"), std::string::npos) << e.what();
  }
  EXPECT_THROW(kf::policy::named_model_shape(dir + "/missing.json"), kf::Error);
  std::filesystem::remove_all(dir);
}
