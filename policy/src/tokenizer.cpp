// Tokenizer (kf/policy/policy.h): an HF tokenizer.json byte-level BPE. Covers: merges as
// "a b" or ["a","b"]; added/special tokens split off before normalisation/pre-tokenisation
// (leftmost-longest, lstrip/rstrip/single_word); the GPT-2, Qwen2 and Llama 3 split regexes
// (pretokenize.h); NFC (unicode.h); ignore_merges; byte-level decoding back to the exact
// bytes. Anything else is refused with kf::Error naming the file and the field (e.g.
// "tokenizer.json: field 'model.type': 'WordPiece' is not supported"). Fuzzed: policy/fuzz/.
#include "kf/policy/policy.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "kf/common/error.h"
#include "pretokenize.h"
#include "unicode.h"

namespace kf::policy {

namespace {
using nlohmann::json;

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
};

struct PairHash {
  std::size_t operator()(uint64_t k) const { return std::hash<uint64_t>()(k * 0x9E3779B97F4A7C15ull); }
};

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// GPT-2's byte <-> printable code point table.
struct ByteMap {
  uint32_t byte_to_cp[256];
  std::unordered_map<uint32_t, uint8_t> cp_to_byte;
  ByteMap() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      byte_to_cp[b] = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
      cp_to_byte[byte_to_cp[b]] = static_cast<uint8_t>(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

}  // namespace

struct Tokenizer::Impl {
  std::string context;
  std::string json_text;
  std::unordered_map<std::string, int32_t> vocab;
  std::vector<std::string> id_to_token;                                        // model vocab and added tokens
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>, PairHash> merges;  // (a,b) -> (rank, merged id)
  std::vector<AddedToken> added;  // longest first, for leftmost-longest matching
  std::vector<bool> special;
  bool nfc = false;
  bool ignore_merges = false;
  bool add_prefix_space = false;
  std::vector<SplitPattern> splits;  // applied in order
  int32_t byte_token[256];           // token id of each single byte, -1 if absent

  void parse(const json& j);
  void parse_model(const json& m);
  void parse_normalizer(const json& n, const std::string& field);
  void parse_pre_tokenizer(const json& p, const std::string& field, bool& byte_level);
  void bpe_word(const std::string& bytes, std::vector<int32_t>& out) const;
  void encode_plain(const std::string& text, std::vector<int32_t>& out) const;
  void split_added(const std::string& text, bool normalized_pass,
                   std::vector<std::pair<std::string, int32_t>>& out) const;
};

namespace {
[[noreturn]] void fail(const std::string& ctx, const std::string& field, const std::string& msg) {
  throw Error(ctx + ": field '" + field + "': " + msg);
}
}  // namespace

void Tokenizer::Impl::parse_model(const json& m) {
  if (!m.is_object()) fail(context, "model", "missing or not an object");
  const std::string type = m.contains("type") && m["type"].is_string() ? m["type"].get<std::string>() : "BPE";
  if (type != "BPE") fail(context, "model.type", "'" + type + "' is not supported (only byte-level BPE)");
  if (m.contains("continuing_subword_prefix") && !m["continuing_subword_prefix"].is_null() &&
      m["continuing_subword_prefix"] != "")
    fail(context, "model.continuing_subword_prefix", "not supported for byte-level BPE");
  if (m.contains("end_of_word_suffix") && !m["end_of_word_suffix"].is_null() && m["end_of_word_suffix"] != "")
    fail(context, "model.end_of_word_suffix", "not supported for byte-level BPE");
  if (m.contains("byte_fallback") && m["byte_fallback"].is_boolean() && m["byte_fallback"].get<bool>())
    fail(context, "model.byte_fallback", "not supported (byte-level BPE needs no fallback)");
  if (m.contains("ignore_merges") && m["ignore_merges"].is_boolean()) ignore_merges = m["ignore_merges"].get<bool>();
  if (!m.contains("vocab") || !m["vocab"].is_object()) fail(context, "model.vocab", "missing or not an object");
  for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
    if (!it->is_number_integer()) fail(context, "model.vocab." + it.key(), "id must be an integer");
    const int64_t id = it->get<int64_t>();
    if (id < 0 || id >= (1 << 24))
      fail(context, "model.vocab." + it.key(), "id " + std::to_string(id) + " out of range");
    vocab[it.key()] = static_cast<int32_t>(id);
    if (id_to_token.size() <= static_cast<std::size_t>(id)) id_to_token.resize(id + 1);
    id_to_token[id] = it.key();
  }
  if (!m.contains("merges") || !m["merges"].is_array()) fail(context, "model.merges", "missing or not a list");
  int32_t rank = 0;
  for (const auto& e : m["merges"]) {
    std::string a, b;
    if (e.is_string()) {  // legacy "a b"
      const std::string s = e.get<std::string>();
      const auto sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        fail(context, "model.merges[" + std::to_string(rank) + "]", "'" + s + "' is not \"a b\"");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      fail(context, "model.merges[" + std::to_string(rank) + "]", "must be \"a b\" or [\"a\", \"b\"]");
    }
    auto ia = vocab.find(a), ib = vocab.find(b), ic = vocab.find(a + b);
    if (ia == vocab.end() || ib == vocab.end() || ic == vocab.end())
      fail(context, "model.merges[" + std::to_string(rank) + "]",
           "merge '" + a + "' + '" + b + "' uses tokens absent from the vocab");
    merges.emplace(pair_key(ia->second, ib->second), std::make_pair(rank, ic->second));  // first (lowest) rank wins
    ++rank;
  }
}

void Tokenizer::Impl::parse_normalizer(const json& n, const std::string& field) {
  if (n.is_null()) return;
  if (!n.is_object() || !n.contains("type") || !n["type"].is_string())
    fail(context, field, "must be an object with a type");
  const std::string type = n["type"].get<std::string>();
  if (type == "NFC") {
    nfc = true;
  } else if (type == "Sequence") {
    if (!n.contains("normalizers") || !n["normalizers"].is_array()) fail(context, field + ".normalizers", "missing");
    for (std::size_t i = 0; i < n["normalizers"].size(); ++i)
      parse_normalizer(n["normalizers"][i], field + ".normalizers[" + std::to_string(i) + "]");
  } else {
    fail(context, field + ".type", "normalizer '" + type + "' is not supported (NFC, Sequence)");
  }
}

void Tokenizer::Impl::parse_pre_tokenizer(const json& p, const std::string& field, bool& byte_level) {
  if (p.is_null()) return;
  if (!p.is_object() || !p.contains("type") || !p["type"].is_string())
    fail(context, field, "must be an object with a type");
  const std::string type = p["type"].get<std::string>();
  if (type == "Sequence") {
    if (!p.contains("pretokenizers") || !p["pretokenizers"].is_array())
      fail(context, field + ".pretokenizers", "missing");
    for (std::size_t i = 0; i < p["pretokenizers"].size(); ++i)
      parse_pre_tokenizer(p["pretokenizers"][i], field + ".pretokenizers[" + std::to_string(i) + "]", byte_level);
  } else if (type == "ByteLevel") {
    byte_level = true;
    if (p.contains("add_prefix_space") && p["add_prefix_space"].is_boolean())
      add_prefix_space = p["add_prefix_space"].get<bool>();
    const bool use_regex = !(p.contains("use_regex") && p["use_regex"].is_boolean()) || p["use_regex"].get<bool>();
    if (use_regex) splits.push_back(SplitPattern::kGpt2);
  } else if (type == "Split") {
    if (!p.contains("pattern") || !p["pattern"].is_object() || !p["pattern"].contains("Regex") ||
        !p["pattern"]["Regex"].is_string())
      fail(context, field + ".pattern", "must be {\"Regex\": ...}");
    SplitPattern sp;
    if (!split_pattern_from_regex(p["pattern"]["Regex"].get<std::string>(), sp))
      fail(context, field + ".pattern.Regex", "unsupported regex (known: GPT-2, Qwen2, Llama 3 patterns)");
    const std::string behavior =
        p.contains("behavior") && p["behavior"].is_string() ? p["behavior"].get<std::string>() : "";
    if (behavior != "Isolated") fail(context, field + ".behavior", "'" + behavior + "' is not supported (Isolated)");
    if (p.contains("invert") && p["invert"].is_boolean() && p["invert"].get<bool>())
      fail(context, field + ".invert", "must be false");
    splits.push_back(sp);
  } else {
    fail(context, field + ".type", "pre-tokenizer '" + type + "' is not supported (ByteLevel, Split, Sequence)");
  }
}

void Tokenizer::Impl::parse(const json& j) {
  if (!j.is_object()) throw Error(context + ": not a JSON object");
  parse_model(j.contains("model") ? j["model"] : json());
  if (j.contains("normalizer")) parse_normalizer(j["normalizer"], "normalizer");
  bool byte_level = false;
  if (j.contains("pre_tokenizer")) parse_pre_tokenizer(j["pre_tokenizer"], "pre_tokenizer", byte_level);
  if (!byte_level) fail(context, "pre_tokenizer", "no ByteLevel pre-tokenizer: only byte-level BPE is supported");
  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
    if (!j["added_tokens"].is_array()) fail(context, "added_tokens", "must be a list");
    for (std::size_t i = 0; i < j["added_tokens"].size(); ++i) {
      const auto& t = j["added_tokens"][i];
      const std::string f = "added_tokens[" + std::to_string(i) + "]";
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() || !t.contains("content") ||
          !t["content"].is_string())
        fail(context, f, "needs an integer id and a string content");
      AddedToken a;
      a.content = t["content"].get<std::string>();
      const int64_t id = t["id"].get<int64_t>();
      if (id < 0 || id >= (1 << 24)) fail(context, f + ".id", "out of range");
      if (a.content.empty()) fail(context, f + ".content", "must not be empty");
      a.id = static_cast<int32_t>(id);
      auto flag = [&](const char* k) { return t.contains(k) && t[k].is_boolean() && t[k].get<bool>(); };
      a.special = flag("special");
      a.lstrip = flag("lstrip");
      a.rstrip = flag("rstrip");
      a.single_word = flag("single_word");
      a.normalized = flag("normalized");
      if (id_to_token.size() <= static_cast<std::size_t>(id)) id_to_token.resize(id + 1);
      id_to_token[id] = a.content;
      added.push_back(a);
    }
  }
  std::stable_sort(added.begin(), added.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
  special.assign(id_to_token.size(), false);
  for (const auto& a : added) special[a.id] = a.special;
  const auto& bm = byte_map();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    unicode::utf8_append(s, bm.byte_to_cp[b]);
    auto it = vocab.find(s);
    byte_token[b] = it == vocab.end() ? -1 : it->second;
  }
}

// Byte-level BPE of one pre-token: repeatedly merge the lowest-ranked adjacent pair
// (leftmost on ties), as HF's Word::merge_all does, with a heap over a linked list.
void Tokenizer::Impl::bpe_word(const std::string& bytes, std::vector<int32_t>& out) const {
  if (ignore_merges) {
    std::string mapped;
    for (unsigned char c : bytes) unicode::utf8_append(mapped, byte_map().byte_to_cp[c]);
    auto it = vocab.find(mapped);
    if (it != vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  std::vector<int32_t> sym;
  sym.reserve(bytes.size());
  for (unsigned char c : bytes)
    if (byte_token[c] >= 0)
      sym.push_back(byte_token[c]);  // a byte absent from the vocab is dropped, as HF does without unk
  const int n = static_cast<int>(sym.size());
  if (n <= 1) {
    out.insert(out.end(), sym.begin(), sym.end());
    return;
  }
  std::vector<int> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  using Item = std::tuple<int32_t, int, int32_t, int32_t>;  // rank, pos, left id, right id
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> heap;
  auto push = [&](int i) {
    if (i < 0 || next[i] < 0) return;
    auto it = merges.find(pair_key(sym[i], sym[next[i]]));
    if (it != merges.end()) heap.emplace(it->second.first, i, sym[i], sym[next[i]]);
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    auto [rank, i, a, b] = heap.top();
    heap.pop();
    if (!alive[i] || next[i] < 0 || sym[i] != a || sym[next[i]] != b) continue;  // stale
    const int j = next[i];
    sym[i] = merges.find(pair_key(a, b))->second.second;
    alive[j] = false;
    next[i] = next[j];
    if (next[j] >= 0) prev[next[j]] = i;
    push(prev[i]);
    push(i);
  }
  for (int i = 0; i >= 0; i = next[i]) out.push_back(sym[i]);
}

void Tokenizer::Impl::encode_plain(const std::string& raw, std::vector<int32_t>& out) const {
  std::string text = raw;
  if (add_prefix_space && !text.empty() && text[0] != ' ') text = " " + text;
  std::vector<std::string> pieces{text};
  for (SplitPattern p : splits) {
    std::vector<std::string> next;
    for (const auto& piece : pieces) {
      const auto cps = unicode::utf8_decode(piece);
      // Re-encoding is exact for valid UTF-8; invalid bytes cannot reach here (std::string
      // input from HF is always UTF-8), and become U+FFFD as in Rust's lossy conversion.
      for (const auto& [b, e] : split_pieces(cps, p))
        next.push_back(unicode::utf8_encode(std::vector<uint32_t>(cps.begin() + b, cps.begin() + e)));
    }
    pieces.swap(next);
  }
  for (const auto& piece : pieces) bpe_word(piece, out);
}

namespace {
bool is_word_char(unsigned char c) { return std::isalnum(c) || c == '_' || c >= 0x80; }
bool is_ws_byte(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
}  // namespace

// Splits text on added tokens (leftmost-longest); pieces with id >= 0 are added tokens.
// lstrip/rstrip swallow adjacent whitespace, single_word needs non-word neighbours.
void Tokenizer::Impl::split_added(const std::string& text, bool normalized_pass,
                                  std::vector<std::pair<std::string, int32_t>>& out) const {
  std::size_t start = 0, i = 0;
  const std::size_t n = text.size();
  while (i < n) {
    const AddedToken* hit = nullptr;
    for (const auto& a : added) {
      if (a.normalized != normalized_pass) continue;
      if (a.content.size() > n - i || text.compare(i, a.content.size(), a.content) != 0) continue;
      if (a.single_word) {
        const std::size_t e = i + a.content.size();
        if ((i > 0 && is_word_char(text[i - 1])) || (e < n && is_word_char(text[e]))) continue;
      }
      hit = &a;
      break;  // longest first
    }
    if (!hit) {
      ++i;
      continue;
    }
    std::size_t b = i, e = i + hit->content.size();
    if (hit->lstrip)
      while (b > start && is_ws_byte(text[b - 1])) --b;
    if (hit->rstrip)
      while (e < n && is_ws_byte(text[e])) ++e;
    if (b > start) out.emplace_back(text.substr(start, b - start), -1);
    out.emplace_back(hit->content, hit->id);
    start = i = e;
  }
  if (start < n) out.emplace_back(text.substr(start), -1);
}

Tokenizer Tokenizer::from_json(const std::string& text, const std::string& context) {
  auto impl = std::make_shared<Impl>();
  impl->context = context;
  impl->json_text = text;
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    throw Error(context + ": not valid JSON: " + e.what());
  }
  impl->parse(j);
  Tokenizer t;
  t.impl_ = impl;
  return t;
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return from_json(ss.str(), path);
}

std::vector<int32_t> Tokenizer::encode(const std::string& text) const {
  std::vector<int32_t> out;
  // HF order: non-normalized added tokens on the raw text, then normalise, then the
  // normalized added tokens, then pre-tokenise and BPE what is left.
  std::vector<std::pair<std::string, int32_t>> raw_parts, parts;
  impl_->split_added(text, false, raw_parts);
  for (auto& [s, id] : raw_parts) {
    if (id >= 0) {
      parts.emplace_back(std::move(s), id);
      continue;
    }
    impl_->split_added(impl_->nfc ? unicode::nfc(s) : s, true, parts);
  }
  for (const auto& [s, id] : parts) {
    if (id >= 0)
      out.push_back(id);
    else
      impl_->encode_plain(s, out);
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  const auto& bm = byte_map();
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || static_cast<std::size_t>(id) >= impl_->id_to_token.size()) continue;
    if (skip_special && impl_->special[id]) continue;
    const std::string& tok = impl_->id_to_token[id];
    // Per token, as HF's ByteLevel decoder: map every char back to its byte, or, if any
    // char is not a byte-level char (e.g. an added token with a space), emit it raw.
    std::string bytes;
    bool all = true;
    for (uint32_t cp : unicode::utf8_decode(tok)) {
      auto it = bm.cp_to_byte.find(cp);
      if (it == bm.cp_to_byte.end()) {
        all = false;
        break;
      }
      bytes.push_back(static_cast<char>(it->second));
    }
    out += all ? bytes : tok;
  }
  return out;
}

int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(impl_->id_to_token.size()); }

std::optional<int32_t> Tokenizer::token_to_id(const std::string& token) const {
  for (const auto& a : impl_->added)
    if (a.content == token) return a.id;
  auto it = impl_->vocab.find(token);
  if (it == impl_->vocab.end()) return std::nullopt;
  return it->second;
}

std::string Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= impl_->id_to_token.size()) return "";
  return impl_->id_to_token[id];
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<std::size_t>(id) < impl_->special.size() && impl_->special[id];
}

void Tokenizer::save(const std::string& path) const {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error(path + ": cannot create");
  out << impl_->json_text;
  if (!out) throw Error(path + ": write failed");
}

std::vector<std::string> pretokenize(const std::string& text, const std::string& split_regex) {
  SplitPattern pattern;
  if (!split_pattern_from_regex(split_regex, pattern))
    throw Error("pre-tokeniser: split regex '" + split_regex + "' is not supported (GPT-2, Qwen2, Llama 3)");
  const auto cps = unicode::utf8_decode(text);
  std::vector<std::string> out;
  for (const auto& [b, e] : split_pieces(cps, pattern))
    out.push_back(unicode::utf8_encode(std::vector<uint32_t>(cps.begin() + b, cps.begin() + e)));
  return out;
}

std::vector<std::string> byte_level_symbols() {
  std::vector<std::string> out(256);
  for (int b = 0; b < 256; ++b) unicode::utf8_append(out[b], byte_map().byte_to_cp[b]);
  return out;
}

}  // namespace kf::policy
