// TextCodec: text <-> token ids for prompts and completions, over either the policy's
// tokenizer.json (BPE) or raw bytes (id = byte value, for byte-level models such as the
// random "tiny" shape, whose vocab is 256 with id 0 as EOS).
// Immutable after construction; const methods may run on any thread.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kf/policy/policy.h"

namespace kf::actors {

class TextCodec {
 public:
  static TextCodec bytes();
  static TextCodec bpe(policy::Tokenizer tok);

  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  std::size_t count(const std::string& text) const { return encode(text).size(); }
  bool is_bytes() const { return !tok_; }
  const policy::Tokenizer* tokenizer() const { return tok_ ? &*tok_ : nullptr; }

 private:
  std::optional<policy::Tokenizer> tok_;
};

}  // namespace kf::actors
