// The hand-compiled pre-tokeniser regexes of GPT-2, Qwen2 and Llama 3 (pretokenize.h says
// why by hand); tokenizer.cpp runs them.
#include "pretokenize.h"

#include "unicode.h"

namespace kf::policy {
namespace {

using unicode::is_letter;
using unicode::is_number;
using unicode::is_whitespace;

const char* const kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

bool is_other(uint32_t c) { return !is_whitespace(c) && !is_letter(c) && !is_number(c); }
bool is_newline(uint32_t c) { return c == '\r' || c == '\n'; }

// Case-insensitive ASCII letter match with Unicode simple case folding (ſ folds to s,
// K (Kelvin) to k), as (?i:...) does in Oniguruma.
bool ci_eq(uint32_t c, char lower) {
  if (c < 0x80) return static_cast<uint32_t>(lower) == (c | 0x20) && ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
  return (lower == 's' && c == 0x17F) || (lower == 'k' && c == 0x212A);
}

// 's 't 're 've 'm 'll 'd at i; returns the length, 0 when none.
std::size_t contraction(const std::vector<uint32_t>& s, std::size_t i, bool icase) {
  const std::size_t n = s.size();
  if (s[i] != '\'' || i + 1 >= n) return 0;
  auto eq = [&](std::size_t k, char ch) {
    return k < n && (icase ? ci_eq(s[k], ch) : s[k] == static_cast<uint32_t>(ch));
  };
  if (eq(i + 1, 's') || eq(i + 1, 't') || eq(i + 1, 'm') || eq(i + 1, 'd')) return 2;
  if ((eq(i + 1, 'r') && eq(i + 2, 'e')) || (eq(i + 1, 'v') && eq(i + 2, 'e')) || (eq(i + 1, 'l') && eq(i + 2, 'l')))
    return 3;
  return 0;
}

template <typename Pred>
std::size_t run(const std::vector<uint32_t>& s, std::size_t i, Pred pred) {
  while (i < s.size() && pred(s[i])) ++i;
  return i;
}

// \s+(?!\S) then \s+ : a whitespace run, leaving its last char for the next piece when
// a non-space follows (so " word" keeps its space).
std::size_t whitespace_tail(const std::vector<uint32_t>& s, std::size_t i) {
  const std::size_t k = run(s, i, is_whitespace);
  if (k == i) return 0;
  if (k == s.size() || k - 1 == i) return k - i;  // at the end, or a single space before \S (\s+ fallback)
  return k - 1 - i;
}

std::size_t match_gpt2(const std::vector<uint32_t>& s, std::size_t i) {
  if (std::size_t n = contraction(s, i, false)) return n;
  const std::size_t j = (s[i] == ' ' && i + 1 < s.size()) ? i + 1 : i;
  for (auto pred : {is_letter, is_number, is_other}) {
    if (pred(s[j])) return run(s, j, pred) - i;
  }
  return whitespace_tail(s, i);
}

std::size_t match_qwen(const std::vector<uint32_t>& s, std::size_t i, std::size_t max_digits) {
  const std::size_t n = s.size();
  if (std::size_t c = contraction(s, i, true)) return c;
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (is_letter(s[i])) return run(s, i, is_letter) - i;
  if (!is_newline(s[i]) && !is_number(s[i]) && i + 1 < n && is_letter(s[i + 1])) return run(s, i + 1, is_letter) - i;
  // \p{N} or \p{N}{1,3}
  if (is_number(s[i])) {
    std::size_t k = i;
    while (k < n && k - i < max_digits && is_number(s[k])) ++k;
    return k - i;
  }
  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
  const std::size_t j = (s[i] == ' ' && i + 1 < n) ? i + 1 : i;
  if (is_other(s[j])) return run(s, run(s, j, is_other), is_newline) - i;
  // \s*[\r\n]+ : up to and including the last newline of the whitespace run.
  const std::size_t k = run(s, i, is_whitespace);
  for (std::size_t m = k; m > i; --m)
    if (is_newline(s[m - 1])) return m - i;
  return whitespace_tail(s, i);
}

}  // namespace

bool split_pattern_from_regex(const std::string& regex, SplitPattern& out) {
  if (regex == kGpt2Regex)
    out = SplitPattern::kGpt2;
  else if (regex == kQwen2Regex)
    out = SplitPattern::kQwen2;
  else if (regex == kLlama3Regex)
    out = SplitPattern::kLlama3;
  else
    return false;
  return true;
}

std::vector<std::pair<std::size_t, std::size_t>> split_pieces(const std::vector<uint32_t>& cps, SplitPattern p) {
  std::vector<std::pair<std::size_t, std::size_t>> out;
  std::size_t i = 0;
  while (i < cps.size()) {
    std::size_t len = 0;
    switch (p) {
      case SplitPattern::kGpt2:
        len = match_gpt2(cps, i);
        break;
      case SplitPattern::kQwen2:
        len = match_qwen(cps, i, 1);
        break;
      case SplitPattern::kLlama3:
        len = match_qwen(cps, i, 3);
        break;
    }
    if (len == 0) len = 1;  // unreachable: every code point is letter, number, space or other
    out.emplace_back(i, i + len);
    i += len;
  }
  return out;
}

}  // namespace kf::policy
