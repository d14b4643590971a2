#include "kf/stages/stages.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <queue>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "kf/common/error.h"
#include "kf/policy/policy.h"
// The policy's pre-tokeniser and UTF-8 helpers (policy/src, linked from kf_policy_text):
// training must split words exactly as the encoder will.

namespace kf::stages {
namespace {

// The pattern string must be byte-identical to the one the policy recognises as Qwen2.
const char* const kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

uint64_t key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

struct Word {
  std::vector<int32_t> sym;
  int64_t freq = 0;
};

}  // namespace

std::string train_bpe_tokenizer(const std::vector<std::string>& texts, const BpeTrainOptions& opts,
                                BpeTrainStats* stats) {
  const int64_t n_special = static_cast<int64_t>(opts.special_tokens.size());
  if (opts.vocab_size < n_special + 256)
    throw Error("bpe trainer: vocab_size " + std::to_string(opts.vocab_size) + " is below the " +
                std::to_string(n_special + 256) + " special and byte tokens");

  // Vocabulary: specials, then bytes.
  std::vector<std::string> tok;  // id -> byte-level string
  std::unordered_map<std::string, int32_t> ids;
  for (const auto& s : opts.special_tokens) {
    ids.emplace(s, static_cast<int32_t>(tok.size()));
    tok.push_back(s);
  }
  const auto bytes = policy::byte_level_symbols();
  for (int b = 0; b < 256; ++b) {
    ids.emplace(bytes[b], static_cast<int32_t>(tok.size()));
    tok.push_back(bytes[b]);
  }

  // Word counts over the pre-tokenised pieces.
  std::unordered_map<std::string, int64_t> counts;
  int64_t n_words = 0;
  for (const auto& text : texts) {
    for (auto& piece : policy::pretokenize(text, kQwen2Regex)) {
      ++counts[std::move(piece)];
      ++n_words;
    }
  }
  std::vector<std::pair<std::string, int64_t>> sorted(counts.begin(), counts.end());
  std::sort(sorted.begin(), sorted.end());  // deterministic word order
  std::vector<Word> words;
  words.reserve(sorted.size());
  for (const auto& [w, f] : sorted) {
    Word x;
    x.freq = f;
    for (unsigned char c : w) x.sym.push_back(static_cast<int32_t>(n_special + c));
    words.push_back(std::move(x));
  }

  // Pair counts, which words hold each pair, and a max-heap with lazy invalidation:
  // an entry whose count no longer matches is re-pushed with the current count.
  std::unordered_map<uint64_t, int64_t> pair_count;
  std::unordered_map<uint64_t, std::unordered_set<int32_t>> where;
  using Entry = std::tuple<int64_t, int32_t, int32_t>;  // count, -a, -b: ties to lower ids
  std::priority_queue<Entry> heap;
  for (int32_t w = 0; w < static_cast<int32_t>(words.size()); ++w) {
    const auto& s = words[w].sym;
    for (std::size_t i = 0; i + 1 < s.size(); ++i) {
      pair_count[key(s[i], s[i + 1])] += words[w].freq;
      where[key(s[i], s[i + 1])].insert(w);
    }
  }
  for (const auto& [k, c] : pair_count) heap.emplace(c, -int32_t(k >> 32), -int32_t(k & 0xffffffffu));

  std::vector<std::pair<int32_t, int32_t>> merges;
  while (static_cast<int64_t>(tok.size()) < opts.vocab_size && !heap.empty()) {
    auto [c, na, nb] = heap.top();
    heap.pop();
    const int32_t a = -na, b = -nb;
    const uint64_t k = key(a, b);
    const auto it = pair_count.find(k);
    const int64_t cur = it == pair_count.end() ? 0 : it->second;
    if (cur != c) {
      if (cur > 0) heap.emplace(cur, na, nb);
      continue;
    }
    if (c < opts.min_frequency) break;
    const std::string merged = tok[a] + tok[b];
    int32_t id;
    if (auto f = ids.find(merged); f != ids.end()) {
      id = f->second;  // the same string reached by another merge path
    } else {
      id = static_cast<int32_t>(tok.size());
      ids.emplace(merged, id);
      tok.push_back(merged);
    }
    merges.emplace_back(a, b);
    const auto holders = where[k];
    std::unordered_map<uint64_t, int64_t> delta;
    for (int32_t w : holders) {
      auto& s = words[w].sym;
      const int64_t f = words[w].freq;
      bool has = false;
      for (std::size_t i = 0; i + 1 < s.size(); ++i) has |= s[i] == a && s[i + 1] == b;
      if (!has) continue;
      for (std::size_t i = 0; i + 1 < s.size(); ++i) delta[key(s[i], s[i + 1])] -= f;
      std::vector<int32_t> out;
      out.reserve(s.size());
      for (std::size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          out.push_back(id);
          ++i;
        } else {
          out.push_back(s[i]);
        }
      }
      s.swap(out);
      for (std::size_t i = 0; i + 1 < s.size(); ++i) {
        delta[key(s[i], s[i + 1])] += f;
        where[key(s[i], s[i + 1])].insert(w);
      }
    }
    for (const auto& [dk, dv] : delta) {
      if (dv == 0) continue;
      auto& pc = pair_count[dk];
      pc += dv;
      if (dv > 0) heap.emplace(pc, -int32_t(dk >> 32), -int32_t(dk & 0xffffffffu));
    }
    pair_count.erase(k);
    where.erase(k);
  }

  nlohmann::ordered_json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  auto added = nlohmann::ordered_json::array();
  for (int64_t i = 0; i < n_special; ++i)
    added.push_back({{"id", i},
                     {"content", opts.special_tokens[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  j["added_tokens"] = added;
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", kQwen2Regex}}}, {"behavior", "Isolated"}, {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}}}};
  j["post_processor"] = nullptr;
  j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (std::size_t i = 0; i < tok.size(); ++i) vocab[tok[i]] = static_cast<int64_t>(i);
  auto m = nlohmann::ordered_json::array();
  for (const auto& [a, b] : merges) m.push_back({tok[a], tok[b]});
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", vocab},
                {"merges", m}};
  if (stats) {
    stats->words = n_words;
    stats->unique_words = static_cast<int64_t>(words.size());
    stats->merges = static_cast<int64_t>(merges.size());
    stats->vocab = static_cast<int64_t>(tok.size());
  }
  return j.dump(1) + "\n";
}

}  // namespace kf::stages
