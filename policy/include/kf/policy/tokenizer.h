// Tokenizer: a Hugging Face tokenizer.json byte-level BPE (GPT-2, Qwen2, Llama 3 style).
// Covers: merges as "a b" or ["a","b"]; added/special tokens split off before
// normalisation/pre-tokenisation (leftmost-longest, lstrip/rstrip/single_word); the
// GPT-2, Qwen2 and Llama 3 split regexes; NFC; ignore_merges; byte-level decoding back
// to the exact bytes. Torch-free (fuzzed: policy/fuzz/).
// Thread safety: immutable after construction; const methods may run concurrently.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kf::policy {

class Tokenizer {
 public:
  // Throws kf::Error naming `context` (the file) and the field for anything unsupported
  // (e.g. "tokenizer.json: field 'model.type': 'WordPiece' is not supported").
  static Tokenizer from_json(const std::string& json_text, const std::string& context);
  static Tokenizer from_file(const std::string& path);

  // Token ids for the text; adds no BOS/EOS (callers build prompts explicitly).
  std::vector<int32_t> encode(const std::string& text) const;
  // The exact bytes the ids stand for (HF would replace invalid UTF-8 with U+FFFD).
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;

  int64_t vocab_size() const;  // largest id + 1, added tokens included
  std::optional<int32_t> token_to_id(const std::string& token) const;
  std::string id_to_token(int32_t id) const;  // "" for an unknown id
  bool is_special(int32_t id) const;
  // Writes the tokenizer.json this tokenizer was read from.
  void save(const std::string& path) const;

  struct Impl;

 private:
  std::shared_ptr<const Impl> impl_;
};

// For training a vocabulary that this tokenizer encodes exactly as it was trained
// (stages/ bpe trainer):
// The pieces the pre-tokeniser splits UTF-8 `text` into, in order, under `split_regex`
// (a Split pre-tokenizer's regex as written in tokenizer.json; GPT-2, Qwen2 and Llama 3
// are supported). Throws kf::Error naming the regex when it is not supported.
std::vector<std::string> pretokenize(const std::string& text, const std::string& split_regex);
// Byte-level BPE's byte -> printable character table (GPT-2): the UTF-8 string that
// stands for each of the 256 bytes.
std::vector<std::string> byte_level_symbols();

}  // namespace kf::policy
