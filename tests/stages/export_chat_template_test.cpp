// tools/export keeps the starting model's chat template and named special tokens: from
// --base-model, from the folder the run's config.yaml names in learner.policy, or from the
// checkpoint's own tokenizer_config.json; without any, a plain tokenizer_config.json.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "../test_support.h"
#include "kf/common/error.h"
#include "kf/common/run_dir.h"
#include "kf/learner/learner.h"
#include "kf/policy/policy.h"

using json = nlohmann::json;
namespace kt = kf::test;

namespace {

// A byte-level tokenizer.json (256 byte tokens, no merges) plus two added special tokens.
std::string tokenizer_json() {
  json vocab = json::object();
  auto byte_char = [](int b) {
    // GPT-2's bytes_to_unicode.
    std::vector<int> bs;
    for (int x = '!'; x <= '~'; ++x) bs.push_back(x);
    for (int x = 0xA1; x <= 0xAC; ++x) bs.push_back(x);
    for (int x = 0xAE; x <= 0xFF; ++x) bs.push_back(x);
    int cp = -1, n = 0;
    for (int x = 0; x < 256; ++x) {
      const bool direct = std::find(bs.begin(), bs.end(), x) != bs.end();
      const int c = direct ? x : 256 + n++;
      if (x == b) cp = c;
    }
    std::string u;
    if (cp < 0x80)
      u.push_back(static_cast<char>(cp));
    else {
      u.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      u.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    return u;
  };
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  json added = json::array();
  int id = 256;
  for (const char* t : {"<|im_start|>", "<|im_end|>"})
    added.push_back({{"id", id++},
                     {"content", t},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  json bl = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  json j = {{"version", "1.0"},
            {"truncation", nullptr},
            {"padding", nullptr},
            {"added_tokens", added},
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
              {"merges", json::array()}}}};
  return j.dump();
}

// A run folder with one learner checkpoint of the tiny shape.
std::string make_run(const std::string& root, const std::string& config_yaml) {
  const std::string run = root + "/run";
  ::mkdir(run.c_str(), 0755);
  ::mkdir((run + "/checkpoints").c_str(), 0755);
  if (!config_yaml.empty()) kt::write_file(run + "/config.yaml", config_yaml);
  auto c = kf::policy::named_model_shape("tiny");
  c.vocab_size = std::max<int64_t>(c.vocab_size, 320);
  kf::policy::CausalLM m(c, torch::TensorOptions().dtype(torch::kFloat32));
  m->init_random(1);
  kf::learner::CheckpointData d;
  d.step = 1;
  for (const auto& it : m->named_parameters()) d.model.push_back({it.key(), it.value().detach().clone()});
  d.state_json = "{}";
  d.model_config_json = kf::policy::model_config_to_json(c);
  d.tokenizer_json = tokenizer_json();
  kf::learner::write_checkpoint(run + "/checkpoints", d, 3);
  return run;
}

// The starting model: Qwen2.5-Coder-Instruct's tokenizer_config.json (chat template, eos and
// pad tokens).
std::string make_base(const std::string& root) {
  const std::string base = root + "/base";
  ::mkdir(base.c_str(), 0755);
  kt::write_file(base + "/tokenizer_config.json",
                 kt::read_file(kt::source_dir() +
                               "/tests/policy/data/chat_templates/qwen2.5-coder-instruct/tokenizer_config.json"));
  return base;
}

bool have_jinja2() { return std::system((kt::python() + " -c 'import jinja2' >/dev/null 2>&1").c_str()) == 0; }

}  // namespace

TEST(ExportChatTemplateTest, BaseModelTemplateAndSpecialTokensAreKept) {
  kt::TempDir tmp("export-chat");
  const std::string base = make_base(tmp.path);
  const std::string run = make_run(tmp.path, "");
  kf::learner::ExportOptions o;
  o.base_model = base;
  kf::learner::export_checkpoint(run, tmp.path + "/out", o);
  const auto want = json::parse(kt::read_file(base + "/tokenizer_config.json"));
  const auto got = json::parse(kt::read_file(tmp.path + "/out/tokenizer_config.json"));
  for (const char* k : {"chat_template", "eos_token", "pad_token", "bos_token"}) EXPECT_EQ(got[k], want[k]) << k;
  if (!have_jinja2()) GTEST_SKIP() << "jinja2 is not installed for " << kt::python();
  const auto a = kf::policy::ChatTemplate::load(base), b = kf::policy::ChatTemplate::load(tmp.path + "/out");
  ASSERT_TRUE(a && b);
  const std::vector<kf::policy::ChatMessage> m = {{"system", "s"}, {"user", "write a kernel"}};
  EXPECT_EQ(b->render(m), a->render(m));
}

TEST(ExportChatTemplateTest, RunConfigNamesTheStartingModelAndJinjaFileTravels) {
  kt::TempDir tmp("export-chat");
  const std::string base = make_base(tmp.path);
  kt::write_file(base + "/chat_template.jinja", "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}");
  kt::write_file(base + "/special_tokens_map.json", R"({"eos_token": "<|im_end|>"})");
  const std::string run = make_run(tmp.path, "learner:\n  policy: " + base + "\n");
  kf::learner::export_checkpoint(run, tmp.path + "/out");
  EXPECT_EQ(kt::read_file(tmp.path + "/out/chat_template.jinja"), kt::read_file(base + "/chat_template.jinja"));
  EXPECT_EQ(kt::read_file(tmp.path + "/out/special_tokens_map.json"), kt::read_file(base + "/special_tokens_map.json"));
  const auto got = json::parse(kt::read_file(tmp.path + "/out/tokenizer_config.json"));
  EXPECT_EQ(got["eos_token"], "<|im_end|>");
}

TEST(ExportChatTemplateTest, WithoutAStartingModelAPlainConfigAndBadBaseIsAnError) {
  kt::TempDir tmp("export-chat");
  const std::string run = make_run(tmp.path, "");
  kf::learner::export_checkpoint(run, tmp.path + "/out");
  const auto got = json::parse(kt::read_file(tmp.path + "/out/tokenizer_config.json"));
  EXPECT_FALSE(got.contains("chat_template"));
  EXPECT_EQ(got["tokenizer_class"], "PreTrainedTokenizerFast");
  kf::learner::ExportOptions o;
  o.base_model = tmp.path + "/nowhere";
  try {
    kf::learner::export_checkpoint(run, tmp.path + "/out2", o);
    FAIL() << "a --base-model without tokenizer_config.json must be an error";
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--base-model " + o.base_model + ": no tokenizer_config.json"),
              std::string::npos)
        << e.what();
  }
}
