// Extraction of the kernel block from completions, well-formed and malformed.
#include <gtest/gtest.h>

#include "kf/actors/actors.h"

using kf::actors::extract_kernel;
using kf::actors::ExtractOptions;

namespace {
const std::string kKernel =
    "#include <kf/kernel.h>\n"
    "extern \"C\" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {\n"
    "  return 0;\n"
    "}\n";
}  // namespace

TEST(ExtractTest, TakesTheMarkedBlockAmongSnippets) {
  const std::string c =
      "Analysis: kernel 3 is faster because it vectorises:\n```cpp\nfor (i...) y[i] = x[i];\n```\n"
      "Plan: fuse.\n```cpp kernel\n" +
      kKernel + "```\nDone.";
  const auto e = extract_kernel(c);
  ASSERT_TRUE(e.ok) << e.error;
  EXPECT_EQ(e.source, kKernel);
  // Info strings in other spellings, and a longer fence.
  EXPECT_TRUE(extract_kernel("````cuda,kernel\n" + kKernel + "````\n").ok);
  EXPECT_TRUE(extract_kernel("  ```{.cpp kernel}\n" + kKernel + "```").ok);
}

TEST(ExtractTest, MalformedCompletionsFailWithTheirReason) {
  auto code = [](const std::string& c, ExtractOptions o = {}) {
    const auto e = extract_kernel(c, o);
    EXPECT_FALSE(e.ok);
    EXPECT_EQ(e.error.rfind("extract: " + e.code + ": ", 0), 0u) << e.error;
    return e.code;
  };
  EXPECT_EQ(code(""), "no_code");
  EXPECT_EQ(code("I would write a loop over the elements."), "no_code");
  EXPECT_EQ(code("```cpp\nint x;\n```\n"), "no_marked_block");
  EXPECT_EQ(code("```cpp kernel\n" + kKernel + "```\n```cuda kernel\n" + kKernel + "```\n"), "several_blocks");
  EXPECT_EQ(code("```cpp kernel\n" + kKernel), "unterminated");  // cut off at max tokens
  EXPECT_EQ(code("```cpp kernel\n   \n\n```\n"), "empty_block");
  EXPECT_EQ(code("```cpp kernel\nint main() { return 0; }\n```"), "no_entry_point");
  // A declaration, a name in a comment or string, or no extern "C", is not an entry point.
  EXPECT_EQ(
      code("```cpp kernel\nextern \"C\" int kf_forward(kf::Context*, const kf::Tensor*, int, kf::Tensor*, int);\n```"),
      "no_entry_point");
  EXPECT_EQ(code("```cpp kernel\nextern \"C\" int f() { return 0; } // kf_forward(a) {\n```"), "no_entry_point");
  EXPECT_EQ(code("```cpp kernel\nint kf_forward(kf::Context* c, const kf::Tensor* i, int a, kf::Tensor* o, int b) { "
                 "return 0; }\n```"),
            "no_entry_point");
  ExtractOptions small;
  small.max_bytes = 16;
  EXPECT_EQ(code("```cpp kernel\n" + kKernel + "```", small), "too_large");
}

TEST(ExtractTest, UnmarkedFallbackOnlyForOneBlockWithEntryPoint) {
  const std::string one = "Here it is:\n```cpp\n" + kKernel + "```\n";
  EXPECT_TRUE(extract_kernel(one).ok);
  ExtractOptions strict;
  strict.allow_unmarked = false;
  EXPECT_EQ(extract_kernel(one, strict).code, "no_marked_block");
  // Two unmarked blocks that both define kf_forward: ambiguous.
  EXPECT_EQ(extract_kernel(one + one).code, "no_marked_block");
  // A snippet plus one full kernel: the kernel is taken.
  EXPECT_TRUE(extract_kernel("```cpp\nint x;\n```\n" + one).ok);
  // Custom marker.
  ExtractOptions m;
  m.marker = "kf-final";
  EXPECT_TRUE(extract_kernel("```cuda kf-final\n" + kKernel + "```", m).ok);
}

// A reasoning model drafts code inside <think> ... </think>: the kernel is the one after it.
// A reasoning block that never closes (the completion ran out) is `unterminated`.
TEST(ExtractTest, KernelAfterTheReasoningBlock) {
  const std::string draft = "```cpp kernel\nint draft;\n```\n";
  const auto e = extract_kernel("<think>\nTry a loop first:\n" + draft + "No: vectorise.\n</think>\n\n```cpp kernel\n" +
                                kKernel + "```\n");
  ASSERT_TRUE(e.ok) << e.error;
  EXPECT_EQ(e.source, kKernel);
  const auto cut = extract_kernel("<think>\nstill thinking " + draft);
  EXPECT_FALSE(cut.ok);
  EXPECT_EQ(cut.code, "unterminated");
  EXPECT_NE(cut.error.find("<think>"), std::string::npos) << cut.error;
  // Reasoning with no kernel after it: no code (the draft inside does not count).
  EXPECT_EQ(extract_kernel("<think>\n" + draft + "</think>\nI give up.").code, "no_code");
  // A completion without reasoning is read as before.
  EXPECT_TRUE(extract_kernel("```cpp kernel\n" + kKernel + "```").ok);
}
