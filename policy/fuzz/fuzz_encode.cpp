// libFuzzer target: encode arbitrary bytes (invalid UTF-8 included) with a real trained
// tokenizer (KF_FUZZ_TOKENIZER, default: the Qwen2-style test tokenizer). Valid UTF-8
// without added-token text and already in NFC must decode back to the same bytes.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "../src/unicode.h"
#include "kf/policy/policy.h"

static std::unique_ptr<kf::policy::Tokenizer> g_tok;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* p = std::getenv("KF_FUZZ_TOKENIZER");
  g_tok = std::make_unique<kf::policy::Tokenizer>(kf::policy::Tokenizer::from_file(p ? p : "tokenizer.json"));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const auto ids = g_tok->encode(text);
  const std::string back = g_tok->decode(ids);
  const bool valid = kf::policy::unicode::utf8_encode(kf::policy::unicode::utf8_decode(text)) == text;
  if (valid && text.find('<') == std::string::npos && text.find('[') == std::string::npos &&
      kf::policy::unicode::nfc(text) == text && back != text)
    std::abort();
  return 0;
}
