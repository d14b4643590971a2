#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "../../policy/src/unicode.h"
#include "kf/common/error.h"
#include "kf/policy/policy.h"
#include "test_util.h"

using kf::policy::Tokenizer;
namespace t = kf::policy::test;

namespace {

nlohmann::json expected() { return nlohmann::json::parse(t::read_file(t::refs_dir() + "/tokenizer_expected.json")); }

std::string show(const std::vector<int32_t>& v) {
  std::string s;
  for (auto x : v) s += std::to_string(x) + " ";
  return s;
}

void check_flavour(const std::string& name) {
  const auto all = expected();
  ASSERT_TRUE(all.contains(name)) << "no reference for " << name;
  const auto tok = Tokenizer::from_file(all[name]["file"].get<std::string>());
  int n = 0;
  for (const auto& c : all[name]["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const auto want = c["ids"].get<std::vector<int32_t>>();
    const auto got = tok.encode(text);
    EXPECT_EQ(got, want) << name << " text: [" << text << "]\n got: " << show(got) << "\nwant: " << show(want);
    EXPECT_EQ(tok.decode(want), c["decoded"].get<std::string>()) << name << " decode of [" << text << "]";
    ++n;
  }
  EXPECT_GT(n, 30);
}

}  // namespace

TEST(PolicyTokenizerTest, MatchesHfIdsQwen2) { check_flavour("qwen2"); }
TEST(PolicyTokenizerTest, MatchesHfIdsLegacyMerges) { check_flavour("qwen2_legacy"); }
TEST(PolicyTokenizerTest, MatchesHfIdsLlama3) { check_flavour("llama3"); }
TEST(PolicyTokenizerTest, MatchesHfIdsGpt2) { check_flavour("gpt2"); }
TEST(PolicyTokenizerTest, MatchesHfIdsGpt2PrefixSpace) { check_flavour("gpt2_prefix"); }

TEST(PolicyTokenizerTest, DecodesBackToSameBytes) {
  const auto tok = Tokenizer::from_file(expected()["gpt2"]["file"].get<std::string>());
  for (const std::string s :
       {"x = y  +\tz\n\n", "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x9a\x80", "   ", "<|im_start|>a<|im_end|>"})
    EXPECT_EQ(tok.decode(tok.encode(s)), s);
  // Special tokens are dropped on request.
  const auto ids = tok.encode("a<|endoftext|>b");
  EXPECT_EQ(tok.decode(ids, /*skip_special=*/true), "ab");
  EXPECT_TRUE(tok.is_special(*tok.token_to_id("<|endoftext|>")));
}

TEST(PolicyTokenizerTest, NfcComposes) {
  using kf::policy::unicode::nfc;
  EXPECT_EQ(nfc("e\xcc\x81"), "\xc3\xa9");                                 // e + combining acute -> é
  EXPECT_EQ(nfc("\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8"), "\xea\xb0\x81");  // Hangul L V T -> 각
  EXPECT_EQ(nfc("q\xcc\x87\xcc\xa3"), "q\xcc\xa3\xcc\x87");                // reordered by combining class
  EXPECT_EQ(nfc("plain ascii"), "plain ascii");
}

TEST(PolicyTokenizerTest, UnsupportedInputNamesFileAndField) {
  auto err = [](const std::string& json) {
    try {
      Tokenizer::from_json(json, "m/tokenizer.json");
    } catch (const kf::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  std::string e = err(R"({"model": {"type": "WordPiece", "vocab": {}}})");
  EXPECT_NE(e.find("m/tokenizer.json"), std::string::npos) << e;
  EXPECT_NE(e.find("model.type"), std::string::npos) << e;
  e = err(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
              "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "\\w+"}, "behavior": "Isolated"}})");
  EXPECT_NE(e.find("pre_tokenizer.pattern.Regex"), std::string::npos) << e;
  e = err(
      R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}, "pre_tokenizer": {"type": "ByteLevel"}})");
  EXPECT_NE(e.find("model.merges[0]"), std::string::npos) << e;
  e = err(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "normalizer": {"type": "NFKC"},
              "pre_tokenizer": {"type": "ByteLevel"}})");
  EXPECT_NE(e.find("normalizer.type"), std::string::npos) << e;
  EXPECT_NE(err("[1, 2").find("not valid JSON"), std::string::npos);
}
