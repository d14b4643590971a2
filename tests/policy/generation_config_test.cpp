// generation_config.json's eos_token_id (an integer or a list) joins config.json's stop ids.
#include <gtest/gtest.h>

#include "kf/common/error.h"
#include "kf/policy/policy.h"
#include "config.h"
#include "test_util.h"

using namespace kf::policy;
using namespace kf::policy::test;

namespace {

const char* kConfig = R"({"model_type": "qwen2", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "eos_token_id": 7})";

std::string error_of(const std::string& dir) {
  try {
    load_model_config(dir + "/config.json");
  } catch (const kf::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(GenerationConfigTest, EosIdsJoinConfigStopIds) {
  TempDir d;
  write_file(d.path + "/config.json", kConfig);
  EXPECT_EQ(load_model_config(d.path + "/config.json").eos_token_ids, std::vector<int64_t>{7});
  // Qwen2.5-Instruct style: a list holding config.json's id and the turn end.
  write_file(d.path + "/generation_config.json", R"({"eos_token_id": [9, 7], "pad_token_id": 7})");
  EXPECT_EQ(load_model_config(d.path + "/config.json").eos_token_ids, (std::vector<int64_t>{7, 9}));
  write_file(d.path + "/generation_config.json", R"({"eos_token_id": 11})");
  EXPECT_EQ(load_model_config(d.path + "/config.json").eos_token_ids, (std::vector<int64_t>{7, 11}));
  write_file(d.path + "/generation_config.json", R"({"eos_token_id": null, "do_sample": true})");
  EXPECT_EQ(load_model_config(d.path + "/config.json").eos_token_ids, std::vector<int64_t>{7});
  // parse_model_config reads text only: no generation_config.json.
  EXPECT_EQ(parse_model_config(kConfig, "config.json").eos_token_ids, std::vector<int64_t>{7});
}

TEST(GenerationConfigTest, BadValuesNameTheFileAndField) {
  TempDir d;
  write_file(d.path + "/config.json", kConfig);
  write_file(d.path + "/generation_config.json", R"({"eos_token_id": "</s>"})");
  EXPECT_NE(error_of(d.path).find("generation_config.json: field 'eos_token_id': must be an integer or a list"),
            std::string::npos)
      << error_of(d.path);
  write_file(d.path + "/generation_config.json", R"({"eos_token_id": [1, "x"]})");
  EXPECT_NE(error_of(d.path).find("field 'eos_token_id': must hold integers"), std::string::npos) << error_of(d.path);
  write_file(d.path + "/generation_config.json", R"({"eos_token_id": 100})");
  EXPECT_NE(error_of(d.path).find("100 is outside the vocabulary"), std::string::npos) << error_of(d.path);
  write_file(d.path + "/generation_config.json", "{oops");
  EXPECT_NE(error_of(d.path).find("generation_config.json: not valid JSON"), std::string::npos) << error_of(d.path);
}
