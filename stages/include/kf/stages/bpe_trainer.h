// Byte-level BPE tokenizer training (stage 1): learns merges from text and writes a
// Hugging Face tokenizer.json (Qwen2 split regex, ByteLevel pre-tokenizer and decoder,
// no normaliser, so decode(encode(x)) == x for any bytes) that both kf::policy::Tokenizer
// and HF `tokenizers` load.
// Words are split with the policy's own pre-tokeniser (the encoder's split), so every
// merge learned here is one the encoder can apply. Ids: the special tokens first
// (<|endoftext|> = 0, the EOS and padding id), then the 256 byte symbols, then one id per
// merge. Ties between equally frequent pairs go to the lower ids, so training is
// deterministic. Pure function; any thread.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kf::stages {

struct BpeTrainOptions {
  int64_t vocab_size = 4096;  // specials + 256 bytes + merges (fewer if pairs run out)
  int64_t min_frequency = 2;  // a pair seen fewer times is never merged
  std::vector<std::string> special_tokens = {"<|endoftext|>"};
};

struct BpeTrainStats {
  int64_t words = 0, unique_words = 0, merges = 0, vocab = 0;
};

// Returns the tokenizer.json text. Throws kf::Error for a vocab_size below specials + 256.
std::string train_bpe_tokenizer(const std::vector<std::string>& texts, const BpeTrainOptions& opts,
                                BpeTrainStats* stats = nullptr);

}  // namespace kf::stages
