// The pre-tokeniser regexes of byte-level BPE tokenizers, hand-compiled.
// Why not a regex engine: std::regex has no \p{L}/\p{N}, and the three patterns that
// matter (GPT-2, Qwen2, Llama 3) are short; matching them by hand, alternation by
// alternation with the same leftmost-first and backtracking semantics as Oniguruma, is
// exact and fast. Unknown patterns are rejected by the tokenizer loader.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kf::policy {

enum class SplitPattern { kGpt2, kQwen2, kLlama3 };

// Returns the pattern for a regex string from tokenizer.json; false when unknown.
bool split_pattern_from_regex(const std::string& regex, SplitPattern& out);

// Splits code points into [begin, end) pieces covering the input, in order.
std::vector<std::pair<std::size_t, std::size_t>> split_pieces(const std::vector<uint32_t>& cps, SplitPattern p);

}  // namespace kf::policy
