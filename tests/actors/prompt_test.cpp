// Prompt building: template, contents, bucketed exemplars, token-exact fitting, modes.
#include <gtest/gtest.h>

#include <algorithm>

#include "kf/actors/actors.h"
#include "kf/common/error.h"
#include "kf/common/run_dir.h"
#include "kf/replay/replay.h"
#include "prompt.h"  // actors/src: parse_prompt_mode
#include "test_util.h"

using namespace kf::actors;
using kf::actors::test::relu_task;

namespace {

PromptTemplate default_template() {
  return PromptTemplate::load(kf::actors::test::source_dir() + "/configs/prompts/contrastive.txt");
}
std::string abi_text() {
  return compact_abi(kf::read_file(kf::actors::test::source_dir() + "/evaluator/include/kf/kernel.h"));
}
std::string kernel_source(int i, int lines) {
  std::string s = "#include <kf/kernel.h>\n// variant " + std::to_string(i) + "\n";
  s += "extern \"C\" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {\n";
  for (int l = 0; l < lines; ++l)
    s += "  float v" + std::to_string(l) + " = " + std::to_string(l * i) + ".0f;  // step\n";
  return s + "  return 0;\n}\n";
}
// A BPE tokenizer from the policy tests' HF references, when they were made.
std::optional<kf::policy::Tokenizer> bpe() {
  for (const auto& d : {kf::actors::test::build_dir(), kf::actors::test::source_dir() + "/build"}) {
    const auto p = d + "/policy_refs/tokenizer_qwen2.json";
    if (kf::actors::test::exists(p)) return kf::policy::Tokenizer::from_file(p);
  }
  return std::nullopt;
}

}  // namespace

TEST(PromptTemplateTest, ShippedTemplateHasEverySection) {
  const auto t = default_template();
  for (const char* s : {"header", "backend_notes_cpu", "backend_notes_cuda", "exemplars_intro", "exemplar", "truncated",
                        "contrastive_instruction", "no_exemplar_instruction", "plain"})
    EXPECT_TRUE(t.has(s)) << s;
}

TEST(PromptTemplateTest, ErrorsNameFileSectionAndPlaceholder) {
  const auto t = PromptTemplate::parse("# comment\n=== header ===\nHello {{who}} and {{nobody}}\n", "my.txt");
  try {
    t.render("header", {{"who", "x"}});
    FAIL();
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("my.txt: section 'header': unknown placeholder {{nobody}}"), std::string::npos)
        << e.what();
  }
  try {
    t.section("plain");
    FAIL();
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("my.txt: missing section 'plain'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(PromptTemplate::parse("=== a ===\nx\n=== a ===\ny\n", "dup.txt"), kf::Error);
  EXPECT_THROW(PromptTemplate::parse("no sections\n", "none.txt"), kf::Error);
  EXPECT_EQ(t.render("header", {{"who", "x"}, {"nobody", "y"}}), "Hello x and y\n");
}

TEST(PromptTest, ContrastivePromptHasReferenceSignatureAbiExemplarsAndInstruction) {
  KF_NEED_TASKS();
  const auto task = relu_task();
  const auto info = task_info(*task, kf::tasks::Backend::CPU);
  EXPECT_NE(info.signature.find("in[0]  x0  float32 [3500, 2048]  (input, read-only)"), std::string::npos)
      << info.signature;
  EXPECT_NE(info.signature.find("out[0]  y0  float32 [3500, 2048]"), std::string::npos) << info.signature;
  std::vector<ExemplarIn> ex = {{0.8, 3, "ok", kernel_source(1, 2)}, {1.7, 5, "ok", kernel_source(2, 2)}};
  PromptOptions o;
  o.max_tokens = 100000;
  o.abi = abi_text();
  const auto codec = TextCodec::bytes();
  const auto p = build_prompt(default_template(), codec, info, ex, o);
  EXPECT_NE(p.text.find(task->source()), std::string::npos);
  EXPECT_NE(p.text.find("struct Tensor"), std::string::npos);  // the ABI
  EXPECT_EQ(p.text.find("// Contract"), std::string::npos);    // its comments dropped
  EXPECT_NE(p.text.find("OpenMP"), std::string::npos);         // CPU backend notes
  const auto a = p.text.find("speedup 0.80x"), b = p.text.find("speedup 1.70x");
  ASSERT_NE(a, std::string::npos);
  ASSERT_NE(b, std::string::npos);
  EXPECT_LT(a, b);  // slowest first
  EXPECT_NE(p.text.find("verdict ok"), std::string::npos);
  const auto analyse = p.text.find("explain why the faster ones are faster");
  const auto plan = p.text.find("Plan:");
  const auto write = p.text.find("Write exactly one new kernel");
  ASSERT_NE(analyse, std::string::npos);
  EXPECT_LT(analyse, plan);
  EXPECT_LT(plan, write);
  EXPECT_NE(p.text.find("```cpp kernel"), std::string::npos);
  EXPECT_EQ(p.tokens, codec.encode(p.text));
  EXPECT_EQ(p.shown.size(), 2u);
  EXPECT_EQ(p.dropped + p.truncated, 0u);
}

TEST(PromptTest, ExemplarsComeOneFromEachSpeedupBucket) {
  KF_NEED_TASKS();
  const std::string name = kf::actors::test::run_name("kdb");
  auto db = kf::replay::KernelDb::create("kf." + name + ".kdb", {64, 4096, 64});
  // 12 kernels, speedups 0.5 .. 6.0: 4 buckets of 3.
  for (int i = 0; i < 12; ++i) db.insert({"001_relu", 0.5 * (i + 1), i, kernel_source(i, 1), 0});
  const auto info = task_info(*relu_task(), kf::tasks::Backend::CPU);
  PromptOptions o;
  o.max_tokens = 100000;
  for (uint64_t seed = 0; seed < 8; ++seed) {
    std::vector<ExemplarIn> ex;
    for (const auto& e : db.exemplars("001_relu", 4, seed)) ex.push_back({e.speedup, e.policy_version, "ok", e.source});
    const auto p = build_prompt(default_template(), TextCodec::bytes(), info, ex, o);
    ASSERT_EQ(p.shown.size(), 4u);
    for (int b = 0; b < 4; ++b) {
      const double s = p.shown[b].speedup;
      EXPECT_GT(s, 1.5 * b) << "bucket " << b << " seed " << seed;
      EXPECT_LE(s, 1.5 * (b + 1)) << "bucket " << b << " seed " << seed;
      char buf[64];
      std::snprintf(buf, sizeof buf, "speedup %.2fx", s);
      EXPECT_NE(p.text.find(buf), std::string::npos);
    }
  }
  kf::replay::ShmSegment::remove("kf." + name + ".kdb");
}

// Fitting with a real BPE tokenizer (and with bytes): never over the budget, cuts on a
// token boundary, drops the middle exemplar when cutting is not enough.
TEST(PromptTest, FitsTheContextTokenExactly) {
  KF_NEED_TASKS();
  const auto info = task_info(*relu_task(), kf::tasks::Backend::CPU);
  std::vector<TextCodec> codecs = {TextCodec::bytes()};
  if (auto t = bpe())
    codecs.push_back(TextCodec::bpe(*t));
  else
    std::cerr << "note: policy_refs/tokenizer_qwen2.json absent, BPE case skipped\n";
  std::vector<ExemplarIn> ex;
  for (int i = 0; i < 4; ++i) ex.push_back({0.5 + i, i, "ok", kernel_source(i + 1, 40)});
  const auto tpl = default_template();
  for (const auto& codec : codecs) {
    PromptOptions o;
    o.abi = abi_text();
    o.max_tokens = 1u << 30;
    const auto full = build_prompt(tpl, codec, info, ex, o);
    const auto none = build_prompt(tpl, codec, info, {}, o);
    const std::size_t per_ex = (full.tokens.size() - none.tokens.size()) / 4;
    // Budgets from "everything fits" down to "not even one exemplar fits".
    for (std::size_t budget :
         {full.tokens.size(), full.tokens.size() - 1, full.tokens.size() - per_ex / 2, full.tokens.size() - 2 * per_ex,
          none.tokens.size() + per_ex / 2, none.tokens.size() + 20}) {
      o.max_tokens = budget;
      o.min_exemplar_tokens = 64;
      const auto p = build_prompt(tpl, codec, info, ex, o);
      SCOPED_TRACE("budget " + std::to_string(budget) + (codec.is_bytes() ? " bytes" : " bpe"));
      EXPECT_LE(p.tokens.size(), budget);
      EXPECT_EQ(p.tokens, codec.encode(p.text));
      EXPECT_EQ(p.shown.size() + p.dropped, 4u);
      if (budget == full.tokens.size()) EXPECT_EQ(p.truncated + p.dropped, 0u);
      if (budget < full.tokens.size()) EXPECT_GT(p.truncated + p.dropped, 0u);
      if (p.shown.size() >= 2) {  // the fastest stays when the middle ones go
        EXPECT_DOUBLE_EQ(p.shown.back().speedup, 3.5);
      }
      // Every cut source is a token-boundary prefix of the original.
      std::size_t pos = 0;
      for (const auto& s : p.shown) {
        const auto at = p.text.find("```cpp\n", p.text.find("### Kernel", pos));
        ASSERT_NE(at, std::string::npos);
        const auto start = at + 7;
        const auto end = p.text.find("```", start);
        std::string shown = p.text.substr(start, end - start);
        pos = end;
        if (!s.truncated) continue;
        const auto note = shown.find("// ... [");
        ASSERT_NE(note, std::string::npos);
        std::string head = shown.substr(0, note);
        // The cut may end inside a token's trailing indentation; a newline is then added.
        if (head.size() && head.back() == '\n' && ex[0].source.size() && [&] {
              for (const auto& e : ex)
                if (e.speedup == s.speedup) return e.source.compare(0, head.size(), head) != 0;
              return false;
            }())
          head.pop_back();
        const ExemplarIn* orig = nullptr;
        for (const auto& e : ex)
          if (e.speedup == s.speedup) orig = &e;
        ASSERT_NE(orig, nullptr);
        ASSERT_EQ(orig->source.compare(0, head.size(), head), 0) << head;
        const auto ids = codec.encode(orig->source);
        std::string acc;
        std::size_t m = 0;
        while (m < ids.size() && acc.size() < head.size()) acc += codec.decode({ids[m++]});
        EXPECT_EQ(acc, head) << "cut is not on a token boundary";
      }
    }
  }
}

TEST(PromptTest, NoExemplarAndPlainModesAndAnEmptyDatabase) {
  KF_NEED_TASKS();
  const auto info = task_info(*relu_task(), kf::tasks::Backend::CPU);
  const auto tpl = default_template();
  const auto codec = TextCodec::bytes();
  std::vector<ExemplarIn> ex = {{0.8, 3, "ok", kernel_source(1, 2)}};
  PromptOptions o;
  o.max_tokens = 100000;
  // Empty database: contrastive falls back to the no-exemplar instruction.
  auto p = build_prompt(tpl, codec, info, {}, o);
  EXPECT_EQ(p.text.find("### Kernel"), std::string::npos);
  EXPECT_NE(p.text.find("Analyse the reference"), std::string::npos);
  o.mode = PromptMode::no_exemplars;
  p = build_prompt(tpl, codec, info, ex, o);
  EXPECT_EQ(p.text.find("### Kernel"), std::string::npos);
  EXPECT_EQ(p.offered, 0u);
  o.mode = PromptMode::plain;
  p = build_prompt(tpl, codec, info, ex, o);
  EXPECT_EQ(p.text.find("### Kernel"), std::string::npos);
  EXPECT_NE(p.text.find(info.reference), std::string::npos);
  EXPECT_NE(p.text.find("```cpp kernel"), std::string::npos);
  // A budget the reference alone does not fit: an error naming the task.
  o.mode = PromptMode::contrastive;
  o.max_tokens = 50;
  try {
    build_prompt(tpl, codec, info, ex, o);
    FAIL();
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("prompt for task 001_relu"), std::string::npos) << e.what();
  }
  EXPECT_EQ(parse_prompt_mode("plain", "x"), PromptMode::plain);
  EXPECT_THROW(parse_prompt_mode("fancy", "x"), kf::Error);
}

TEST(ActorOptionsTest, ConfigKeysAreReadAndCheckedByName) {
  auto cfg = kf::Config::parse("actors:\n  group_size: 4\n  prompt:\n    mode: plain\n", "t.yaml");
  auto o = actor_options(cfg, 3);
  EXPECT_EQ(o.id, 3);
  EXPECT_EQ(o.group_size, 4);
  EXPECT_EQ(o.mode, PromptMode::plain);
  EXPECT_EQ(o.schedule.policy, SchedulePolicy::room);
  try {
    actor_options(kf::Config::parse("actors:\n  group_size: 65\n", "t.yaml"), 0);
    FAIL();
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("t.yaml: actors.group_size"), std::string::npos) << e.what();
  }
  EXPECT_THROW(kf::Config::parse("actors:\n  bogus: 1\n", "t.yaml"), kf::Error);
}

TEST(ActorOptionsTest, LoopStopKeysAreReadAndChecked) {
  auto o = actor_options(kf::Config::parse("", "t.yaml"), 0);
  EXPECT_EQ(o.loop_repeats, 4);  // on by default
  EXPECT_EQ(o.loop_max_period, 128);
  EXPECT_EQ(o.loop_min_span, 64);
  o = actor_options(
      kf::Config::parse("actors:\n  sampling: {loop_repeats: 0, loop_max_period: 32, loop_min_span: 16}\n", "t.yaml"),
      0);
  EXPECT_EQ(o.loop_repeats, 0);
  EXPECT_EQ(o.loop_max_period, 32);
  EXPECT_EQ(o.loop_min_span, 16);
  for (const std::string bad : {"loop_repeats: 1", "loop_repeats: -2", "loop_max_period: 0", "loop_min_span: -1"}) {
    try {
      actor_options(kf::Config::parse("actors:\n  sampling: {" + bad + "}\n", "t.yaml"), 0);
      ADD_FAILURE() << bad;
    } catch (const kf::Error& e) {
      // The file and the key are named (the config loader's range check or the actor's own).
      const std::string key = "actors.sampling." + bad.substr(0, bad.find(':'));
      EXPECT_EQ(std::string(e.what()).rfind("t.yaml", 0), 0u) << e.what();
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
}
