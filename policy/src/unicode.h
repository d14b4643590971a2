// Unicode helpers for the tokenizer, without ICU: UTF-8 decode/encode, the general
// categories L and N, White_Space, and NFC. Tables come from unicode_tables.inc
// (generated from Python's unicodedata; see policy/tools/gen_unicode_tables.py).
// Pure functions; safe from any thread.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kf::policy::unicode {

// Decodes UTF-8; an invalid byte becomes U+FFFD (one per bad byte), never a crash.
std::vector<uint32_t> utf8_decode(const std::string& s);
void utf8_append(std::string& out, uint32_t cp);
std::string utf8_encode(const std::vector<uint32_t>& cps);

bool is_letter(uint32_t cp);      // \p{L}
bool is_number(uint32_t cp);      // \p{N}
bool is_whitespace(uint32_t cp);  // \s (Unicode White_Space, as Rust's regex)

// Canonical composition (NFC) of UTF-8 text.
std::string nfc(const std::string& s);

}  // namespace kf::policy::unicode
