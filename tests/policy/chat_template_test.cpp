// Chat templates: our rendering (ChatTemplate: jinja2 layouts joined in C++, or jinja2 itself
// where a template transforms the text) against transformers' apply_chat_template, run live
// (tests/policy/chat_template_reference.py), on the templates of five model families
// (tests/policy/data/chat_templates), and tools/render-prompt's output and errors.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>

#include <nlohmann/json.hpp>

#include "kf/common/error.h"
#include "kf/policy/policy.h"
#include "chat_template.h"
#include "test_util.h"

using namespace kf::policy;
using namespace kf::policy::test;
using json = nlohmann::json;

namespace {

int run(const std::string& cmd, std::string* out = nullptr) {
  // Output and errors together, unless the command sends its stderr elsewhere.
  std::string full = cmd.find(" 2>") == std::string::npos ? cmd + " 2>&1" : cmd;
  FILE* p = ::popen(full.c_str(), "r");
  if (!p) return -1;
  std::string o;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) o.append(buf, n);
  const int st = ::pclose(p);
  if (out) *out = o;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

std::vector<ChatMessage> messages_of(const json& j) {
  std::vector<ChatMessage> m;
  for (const auto& x : j) m.push_back({x["role"].get<std::string>(), x["content"].get<std::string>()});
  return m;
}

// transformers' renderings of the test conversations, made once per test binary run.
struct References {
  std::unique_ptr<TempDir> dir;
  std::string skip;  // non-empty: why there are none
  std::string error;
};

const References& references() {
  static References r = [] {
    References x;
    x.dir = std::make_unique<TempDir>();
    std::string out;
    const int rc = run(python() + " " + source_dir() + "/tests/policy/chat_template_reference.py make --data " +
                           source_dir() + "/tests/policy/data/chat_templates --out " + x.dir->path,
                       &out);
    if (rc == 3)
      x.skip = "transformers is not installed for " + python() + ": " + out;
    else if (rc != 0)
      x.error = "chat_template_reference.py failed (exit " + std::to_string(rc) + "):\n" + out;
    return x;
  }();
  return r;
}

#define REQUIRE_REFERENCES()                       \
  do {                                             \
    const auto& r_ = references();                 \
    if (!r_.skip.empty()) GTEST_SKIP() << r_.skip; \
    ASSERT_TRUE(r_.error.empty()) << r_.error;     \
  } while (0)

// The jinja2 side only (no transformers): what every other test needs.
bool have_jinja2() { return std::system((python() + " -c 'import jinja2' >/dev/null 2>&1").c_str()) == 0; }

#define REQUIRE_JINJA2() \
  if (!have_jinja2()) GTEST_SKIP() << "jinja2 is not installed for " << python()

std::string data_dir(const std::string& family) { return source_dir() + "/tests/policy/data/chat_templates/" + family; }

const char* kFamilies[] = {"qwen2.5-coder-instruct", "llama-3.2-instruct", "deepseek-coder-instruct",
                           "mistral-nemo-instruct", "qwen3"};

}  // namespace

TEST(ChatTemplateTest, EqualsTransformersOnFiveModelFamilies) {
  REQUIRE_REFERENCES();
  int compared = 0, with_history = 0;
  for (const char* fam : kFamilies) {
    const std::string dir = references().dir->path + "/" + fam;
    SCOPED_TRACE(fam);
    auto t = ChatTemplate::load(dir);
    ASSERT_TRUE(t.has_value()) << dir << " has no chat template";
    const auto expected = json::parse(read_file(dir + "/expected.json"));
    const auto tok = Tokenizer::from_file(dir + "/tokenizer.json");
    for (const auto& e : expected) {
      const auto msgs = messages_of(e["messages"]);
      if (e.contains("error")) {
        EXPECT_THROW(t->render(msgs), kf::Error);
        continue;
      }
      const std::string want = e["text"].get<std::string>();
      const std::string got = t->render(msgs);
      EXPECT_EQ(got, want) << "conversation " << e["messages"].dump();
      // The template's special tokens are single tokens, as in HF: the fitter counts them right.
      EXPECT_EQ(tok.encode(got), e["ids"].get<std::vector<int32_t>>()) << "token ids of " << e["messages"].dump();
      ++compared;
      if (msgs.size() >= 4 && msgs[0].role == "system") ++with_history;
    }
  }
  EXPECT_GE(compared, 140) << "6 fixed and 24 generated conversations for each of 5 families";
  EXPECT_GE(with_history, 10) << "each family renders conversations of a system turn plus a two-turn history";
}

TEST(ChatTemplateTest, ChatTemplateJinjaWinsOverTokenizerConfig) {
  REQUIRE_JINJA2();
  TempDir d;
  write_file(d.path + "/tokenizer_config.json", R"({"chat_template": "CONFIG {{ messages[0].content }}"})");
  auto a = ChatTemplate::load(d.path);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->render({{"user", "x"}}), "CONFIG x");
  EXPECT_NE(a->source().find("tokenizer_config.json"), std::string::npos);
  write_file(d.path + "/chat_template.jinja",
             "FILE {{ messages[0].content }}{% if add_generation_prompt %}>{% endif %}");
  auto b = ChatTemplate::load(d.path);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->render({{"user", "x"}}), "FILE x>");
  EXPECT_NE(b->source().find("chat_template.jinja"), std::string::npos);
}

TEST(ChatTemplateTest, NamedTemplateListUsesDefault) {
  REQUIRE_JINJA2();
  TempDir d;
  write_file(
      d.path + "/tokenizer_config.json",
      R"({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D{{ messages[0].content }}"}]})");
  auto t = ChatTemplate::load(d.path);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->render({{"user", "q"}}), "Dq");
}

TEST(ChatTemplateTest, NoTemplateIsRawText) {
  TempDir d;
  EXPECT_FALSE(ChatTemplate::present(d.path));
  EXPECT_FALSE(ChatTemplate::load(d.path).has_value());
  write_file(d.path + "/tokenizer_config.json", R"({"chat_template": null, "eos_token": "</s>"})");
  EXPECT_FALSE(ChatTemplate::present(d.path));
  EXPECT_EQ(ChatTemplate::for_model(d.path), nullptr);
  EXPECT_EQ(ChatTemplate::for_model(""), nullptr);
}

// A template that transforms the text (Qwen3-style: the text after </think> only; upper
// case) cannot be laid out: jinja2 renders each such conversation itself, exactly, and in
// about a millisecond (the time per rendered prompt is printed).
TEST(ChatTemplateTest, RendersTemplateThatRewritesContentExactly) {
  REQUIRE_JINJA2();
  TempDir d;
  write_file(d.path + "/chat_template.jinja",
             "{% for m in messages %}<{{ m.role }}>{{ m.content.split('</think>')[-1] }}\n{% endfor %}");
  auto t = ChatTemplate::load(d.path);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->render({{"user", "q"}, {"assistant", "<think>plan</think>done"}, {"user", "again</think>x"}}),
            "<user>q\n<assistant>done\n<user>x\n");
  EXPECT_EQ(t->render({{"user", "no think"}}), "<user>no think\n");
  const int n = 200;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i)
    ASSERT_EQ(t->render({{"user", "u" + std::to_string(i)}, {"assistant", "<think>r</think>a"}, {"user", "v"}}),
              "<user>u" + std::to_string(i) + "\n<assistant>a\n<user>v\n");
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / n;
  std::printf("exact rendering: %.3f ms per prompt (mean of %d)\n", ms, n);
  EXPECT_LT(ms, 50) << "a rendered prompt must not slow an actor's step";
  TempDir u;
  write_file(u.path + "/chat_template.jinja", "{{ messages[0].content | upper }}");
  auto up = ChatTemplate::load(u.path);
  ASSERT_TRUE(up);
  EXPECT_EQ(up->render({{"user", "mixed Case"}}), "MIXED CASE");
}

// Template variables (apply_chat_template's keyword arguments): Qwen3's enable_thinking.
TEST(ChatTemplateTest, TemplateVariablesReachTheTemplate) {
  REQUIRE_JINJA2();
  const std::string dir = data_dir("qwen3");
  auto on = ChatTemplate::load(dir);
  auto off = ChatTemplate::load(dir, R"({"enable_thinking": false})");
  ASSERT_TRUE(on && off);
  EXPECT_EQ(on->render({{"user", "q"}}), "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(off->render({{"user", "q"}}),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  // Multi-turn (rendered by jinja2 itself): the earlier turn's reasoning is dropped.
  EXPECT_EQ(off->render({{"user", "q"}, {"assistant", "<think>\nr\n</think>\n\nk1"}, {"user", "again"}}),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\nk1<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_THROW(ChatTemplate::load(dir, "[1]"), kf::Error);
  EXPECT_THROW(ChatTemplate::load(dir, "{bad"), kf::Error);
}

TEST(ChatTemplateTest, EmptyContentTheTemplateBranchesOnIsAnError) {
  REQUIRE_JINJA2();
  TempDir d;
  write_file(d.path + "/chat_template.jinja",
             "{% for m in messages %}[{{ m.role }}]{% if m.content %}: {{ m.content }}{% endif %}\n{% endfor %}");
  auto t = ChatTemplate::load(d.path);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->render({{"user", "hi"}}), "[user]: hi");  // trim_blocks eats the newline
  try {
    t->render({{"user", ""}});
    FAIL() << "an empty content the template branches on must be an error";
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("message 0 (user) is empty"), std::string::npos) << e.what();
  }
}

TEST(ChatTemplateTest, TemplateRaiseNamesTheTemplate) {
  REQUIRE_JINJA2();
  auto t = ChatTemplate::load(data_dir("mistral-nemo-instruct"));
  ASSERT_TRUE(t);
  try {
    t->render({{"assistant", "a"}, {"assistant", "b"}});
    FAIL() << "Mistral's template rejects roles that do not alternate";
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("must alternate"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("chat_template.jinja"), std::string::npos) << e.what();
  }
}

TEST(ChatTemplateTest, BrokenTemplateFailsAtLoadNamingTheFile) {
  REQUIRE_JINJA2();
  TempDir d;
  write_file(d.path + "/tokenizer_config.json", R"({"chat_template": "{% for m in messages %}{{ m.content }"})");
  try {
    ChatTemplate::load(d.path);
    FAIL() << "a template that does not compile must fail at load";
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json: field 'chat_template'"), std::string::npos)
        << e.what();
  }
  write_file(d.path + "/tokenizer_config.json", "{not json");
  EXPECT_THROW(ChatTemplate::present(d.path), kf::Error);
}

TEST(ChatTemplateTest, PythonStripSemantics) {
  // str.isspace(): ASCII whitespace, \x1c-\x1f, NEL, NBSP, U+1680, U+2000-200A, U+2028/9,
  // U+202F, U+205F, U+3000; not U+200B (zero width space) or U+FEFF.
  EXPECT_EQ(py_lstrip("\u3000\u00a0 \x1c\t x \u2003"), "x \u2003");
  EXPECT_EQ(py_rstrip(" x\u205f\u2028\u0085\n"), " x");
  EXPECT_EQ(py_rstrip("x\u200b"), "x\u200b");
  EXPECT_EQ(py_lstrip("\ufeffx"), "\ufeffx");
  EXPECT_EQ(py_rstrip(py_lstrip(" \n ")), "");
  EXPECT_EQ(py_rstrip("\u00e9\u3000"), "\u00e9");  // a multi-byte letter before a multi-byte space
}

TEST(ChatTemplateTest, RenderPromptToolPrintsAndFails) {
  REQUIRE_JINJA2();
  const std::string tool = source_dir() + "/tools/render-prompt";
  const std::string dir = data_dir("qwen2.5-coder-instruct");
  TempDir d;
  const std::string msgs = d.path + "/m.json";
  // The tool prints what ChatTemplate renders (equal to transformers: the test above).
  const std::vector<ChatMessage> conv = {{"system", "sys"}, {"user", "u1"}, {"assistant", "a1"}, {"user", " u2\n"}};
  json j = json::array();
  for (const auto& m : conv) j.push_back({{"role", m.role}, {"content", m.content}});
  write_file(msgs, j.dump());
  std::string out;
  ASSERT_EQ(run(tool + " --model " + dir + " --messages " + msgs + " 2>/dev/null", &out), 0) << out;
  EXPECT_EQ(out, ChatTemplate::load(dir)->render(conv));
  EXPECT_NE(out.find("<|im_start|>assistant\na1<|im_end|>\n<|im_start|>user\n u2\n<|im_end|>"), std::string::npos)
      << out;

  write_file(msgs, R"([{"role": "user", "content": "a"}, {"role": "user"}])");
  ASSERT_EQ(run(tool + " --model " + dir + " --messages " + msgs, &out), 1) << out;
  EXPECT_NE(out.find(msgs + ": [1]: field 'content' is missing"), std::string::npos) << out;
  write_file(msgs, R"([{"role": "user", "content": 3}])");
  ASSERT_EQ(run(tool + " --model " + dir + " --messages " + msgs, &out), 1) << out;
  EXPECT_NE(out.find("[0]: field 'content' must be a string"), std::string::npos) << out;
  write_file(msgs, R"({"role": "user"})");
  ASSERT_EQ(run(tool + " --model " + dir + " --messages " + msgs, &out), 1) << out;
  EXPECT_NE(out.find("must be a list"), std::string::npos) << out;
  EXPECT_EQ(run(tool + " --messages " + msgs, &out), 2) << out;
  EXPECT_EQ(run(tool + " --model /nonexistent/dir --messages " + msgs, &out), 2) << out;
  // --enable-thinking reaches the template (Qwen3 closes an empty reasoning block).
  write_file(msgs, R"([{"role": "user", "content": "q"}])");
  ASSERT_EQ(run(tool + " --model " + data_dir("qwen3") + " --messages " + msgs + " --enable-thinking false 2>/dev/null",
                &out),
            0)
      << out;
  EXPECT_EQ(out, "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(run(tool + " --model " + data_dir("qwen3") + " --messages " + msgs + " --enable-thinking maybe", &out), 2)
      << out;
  // A folder without a template: the raw text.
  write_file(msgs, R"([{"role": "user", "content": "raw prompt\n"}])");
  ASSERT_EQ(run(tool + " --model " + d.path + " --messages " + msgs + " 2>/dev/null", &out), 0) << out;
  EXPECT_EQ(out, "raw prompt\n");
}
