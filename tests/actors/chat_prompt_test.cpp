// Prompts through a model's chat template: the contrastive text becomes the user turn (and
// the template file's `system` section the system turn), the fitter counts the template's
// tokens, and a folder without a template keeps the raw text.
#include <gtest/gtest.h>

#include "kf/actors/actors.h"
#include "kf/common/error.h"
#include "kf/common/run_dir.h"
#include "kf/policy/policy.h"
#include "test_util.h"

using namespace kf::actors;
using kf::actors::test::relu_task;

namespace {

bool have_jinja2() {
  const std::string cmd = kf::test::python() + " -c 'import jinja2' >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

// A model folder with Qwen2.5-Coder-Instruct's tokenizer_config.json (its chat template).
struct QwenFolder {
  kf::actors::test::TempDir dir;
  QwenFolder() {
    kf::write_file_atomic(
        dir.path + "/tokenizer_config.json",
        kf::read_file(kf::actors::test::source_dir() +
                      "/tests/policy/data/chat_templates/qwen2.5-coder-instruct/tokenizer_config.json"));
  }
};

std::string big_kernel(int i) {
  std::string s = "// variant " + std::to_string(i) + "\n";
  for (int l = 0; l < 40; ++l) s += "  float v" + std::to_string(l) + " = " + std::to_string(l * i) + ".0f;\n";
  return s;
}

const char* kTemplate =
    "=== header ===\nTask {{task}} ({{backend}}).\n"
    "=== exemplars_intro ===\n{{count}} earlier kernels:\n"
    "=== exemplar ===\n#{{index}} speedup {{speedup}}\n{{source}}\n"
    "=== truncated ===\n[{{omitted_lines}} lines cut]\n"
    "=== contrastive_instruction ===\nWrite a faster {{lang}} kernel in a ```{{marker}} block.\n"
    "=== no_exemplar_instruction ===\nWrite a {{lang}} kernel in a ```{{marker}} block.\n"
    "=== plain ===\nPlain {{task}}\n";

}  // namespace

TEST(ChatPromptTest, UserTurnThroughTheTemplateAndItsTokensCounted) {
  if (!have_jinja2()) GTEST_SKIP() << "jinja2 is not installed for " << kf::test::python();
  QwenFolder f;
  const auto chat = kf::policy::ChatTemplate::for_model(f.dir.path);
  ASSERT_NE(chat, nullptr);
  const auto tpl = PromptTemplate::parse(kTemplate, "t.txt");
  const auto codec = TextCodec::bytes();
  const auto info = task_info(*relu_task(), kf::tasks::Backend::CPU);
  std::vector<ExemplarIn> ex;
  for (int i = 1; i <= 3; ++i) ex.push_back({1.0 + i, i, "ok", big_kernel(i)});

  PromptOptions raw;
  raw.max_tokens = 100000;
  const auto r = build_prompt(tpl, codec, info, ex, raw);
  EXPECT_EQ(r.text, r.user);
  EXPECT_EQ(r.system, "");

  PromptOptions o = raw;
  o.chat = chat;
  const auto p = build_prompt(tpl, codec, info, ex, o);
  EXPECT_EQ(p.user, r.text);
  EXPECT_EQ(p.text,
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\n" +
                r.text + "<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(p.tokens, codec.encode(p.text));

  // A budget the raw prompt fits exactly: with the template's tokens it no longer does, so
  // the fitter cuts or drops exemplars, and stays within the budget.
  o.max_tokens = r.tokens.size();
  const auto fitted = build_prompt(tpl, codec, info, ex, o);
  EXPECT_LE(fitted.tokens.size(), o.max_tokens);
  EXPECT_GT(fitted.truncated + fitted.dropped, 0u);
  EXPECT_EQ(fitted.tokens, codec.encode(fitted.text));
  EXPECT_EQ(fitted.text.rfind("<|im_start|>user\n", 0), std::string::npos);  // starts with the system turn
  EXPECT_NE(fitted.text.find("<|im_start|>user\n" + fitted.user + "<|im_end|>"), std::string::npos);

  // Too small for even the no-exemplar prompt in the template: the error names the task.
  o.max_tokens = codec.count(build_prompt(tpl, codec, info, {}, raw).text) + 5;
  EXPECT_THROW(build_prompt(tpl, codec, info, {}, o), kf::Error);
}

TEST(ChatPromptTest, SystemSectionIsTheSystemTurn) {
  if (!have_jinja2()) GTEST_SKIP() << "jinja2 is not installed for " << kf::test::python();
  QwenFolder f;
  const auto tpl =
      PromptTemplate::parse(std::string(kTemplate) + "=== system ===\nYou write {{lang}} kernels.\n", "t.txt");
  const auto codec = TextCodec::bytes();
  const auto info = task_info(*relu_task(), kf::tasks::Backend::CPU);
  PromptOptions o;
  o.max_tokens = 100000;
  const auto raw = build_prompt(tpl, codec, info, {}, o);
  EXPECT_EQ(raw.system, "You write cpp kernels.\n");
  EXPECT_EQ(raw.text, raw.system + raw.user);  // no template: the system text first
  o.chat = kf::policy::ChatTemplate::for_model(f.dir.path);
  const auto p = build_prompt(tpl, codec, info, {}, o);
  EXPECT_EQ(p.text, "<|im_start|>system\nYou write cpp kernels.\n<|im_end|>\n<|im_start|>user\n" + p.user +
                        "<|im_end|>\n<|im_start|>assistant\n");
}
