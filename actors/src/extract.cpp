// Extraction: the one marked kernel block out of a completion, or a failure code saying why
// there is none (docs/actors.md, Extraction).
#include "kf/actors/actors.h"

#include <cctype>
#include <sstream>
#include <vector>

namespace kf::actors {
namespace {

struct Block {
  std::string info;  // the fence's info string, trimmed
  std::string body;
  bool closed = false;
  std::size_t line = 0;  // 1-based line of the opening fence
};

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

// Fences are ``` (3+ backticks) at the start of a line (up to 3 spaces of indent, as in
// CommonMark); a block closes at a line of at least as many backticks and nothing else.
std::vector<Block> fenced_blocks(const std::string& text) {
  std::vector<Block> out;
  std::istringstream in(text);
  std::string line;
  std::size_t lineno = 0, fence_len = 0;
  bool inside = false;
  Block cur;
  while (std::getline(in, line)) {
    ++lineno;
    std::size_t i = 0;
    while (i < line.size() && i < 3 && line[i] == ' ') ++i;
    std::size_t ticks = 0;
    while (i + ticks < line.size() && line[i + ticks] == '`') ++ticks;
    if (!inside) {
      if (ticks >= 3) {
        inside = true;
        fence_len = ticks;
        cur = Block{};
        cur.info = trim(line.substr(i + ticks));
        cur.line = lineno;
      }
    } else if (ticks >= fence_len && trim(line.substr(i + ticks)).empty()) {
      cur.closed = true;
      out.push_back(cur);
      inside = false;
    } else {
      cur.body += line;
      cur.body += '\n';
    }
  }
  if (inside) out.push_back(cur);  // unterminated
  return out;
}

bool has_word(const std::string& info, const std::string& word) {
  std::istringstream in(info);
  std::string w;
  while (in >> w) {
    if (w == word) return true;
    // "cuda,kernel" or "{.cpp kernel}" style info strings
    for (char& c : w)
      if (c == ',' || c == '{' || c == '}' || c == '.') c = ' ';
    std::istringstream in2(w);
    std::string w2;
    while (in2 >> w2)
      if (w2 == word) return true;
  }
  return false;
}

Extraction fail(const std::string& code, const std::string& detail) {
  Extraction e;
  e.code = code;
  e.error = "extract: " + code + ": " + detail;
  return e;
}

// Blanks out comments and string literals so "kf_forward" in a comment does not count.
std::string strip_comments_and_strings(const std::string& s) {
  std::string out = s;
  enum { Code, Line, Block, Str, Chr } st = Code;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i], n = i + 1 < s.size() ? s[i + 1] : '\0';
    switch (st) {
      case Code:
        if (c == '/' && n == '/')
          st = Line, out[i] = ' ';
        else if (c == '/' && n == '*')
          st = Block, out[i] = ' ';
        else if (c == '"')
          st = Str;
        else if (c == '\'')
          st = Chr;
        break;
      case Line:
        if (c == '\n')
          st = Code;
        else
          out[i] = ' ';
        break;
      case Block:
        if (c == '*' && n == '/') {
          out[i] = out[i + 1] = ' ';
          ++i;
          st = Code;
        } else if (c != '\n')
          out[i] = ' ';
        break;
      case Str:
        if (c == '\\') {
          out[i] = ' ';
          if (i + 1 < s.size()) out[++i] = ' ';
        } else if (c == '"')
          st = Code;
        else
          out[i] = ' ';
        break;
      case Chr:
        if (c == '\\') {
          out[i] = ' ';
          if (i + 1 < s.size()) out[++i] = ' ';
        } else if (c == '\'')
          st = Code;
        else
          out[i] = ' ';
        break;
    }
  }
  return out;
}

// True if `source` has an extern "C" kf_forward definition (a body, not just a declaration).
bool defines_entry_point(const std::string& source) {
  const std::string s = strip_comments_and_strings(source);
  // extern "C" survives stripping as `extern "` + blanks + `"`; accept either form.
  const bool has_extern_c = source.find("extern \"C\"") != std::string::npos;
  if (!has_extern_c) return false;
  std::size_t pos = 0;
  while ((pos = s.find("kf_forward", pos)) != std::string::npos) {
    const bool word_start = pos == 0 || !(std::isalnum(static_cast<unsigned char>(s[pos - 1])) || s[pos - 1] == '_');
    std::size_t i = pos + 10;
    pos = i;
    if (!word_start || (i < s.size() && (std::isalnum(static_cast<unsigned char>(s[i])) || s[i] == '_'))) continue;
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    if (i >= s.size() || s[i] != '(') continue;
    int depth = 0;
    for (; i < s.size(); ++i) {
      if (s[i] == '(')
        ++depth;
      else if (s[i] == ')' && --depth == 0)
        break;
    }
    if (i >= s.size()) return false;
    ++i;
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    if (i < s.size() && s[i] == '{') return true;  // a definition, not a declaration
  }
  return false;
}

}  // namespace

Extraction extract_kernel(const std::string& full, const ExtractOptions& opts) {
  // A model that reasons first (Qwen3's <think> ... </think>) may draft code in its
  // reasoning: the kernel is what follows the block. A block that never closes is cut off.
  std::string after;
  const auto think_end = full.rfind("</think>");
  if (think_end != std::string::npos) {
    after = full.substr(think_end + 8);
  } else if (full.find("<think>") != std::string::npos) {
    return fail("unterminated", "the reasoning block (<think>) never closes (completion cut off?)");
  }
  const std::string& completion = think_end != std::string::npos ? after : full;
  const auto blocks = fenced_blocks(completion);
  if (blocks.empty()) return fail("no_code", "the completion has no fenced code block");
  std::vector<const Block*> marked, unmarked;
  for (const auto& b : blocks) (has_word(b.info, opts.marker) ? marked : unmarked).push_back(&b);
  const Block* pick = nullptr;
  if (marked.size() > 1) {
    return fail("several_blocks", std::to_string(marked.size()) + " blocks marked '" + opts.marker + "' (lines " +
                                      std::to_string(marked[0]->line) + " and " + std::to_string(marked[1]->line) +
                                      "); exactly one is expected");
  } else if (marked.size() == 1) {
    pick = marked[0];
  } else {
    std::vector<const Block*> with_entry;
    for (const auto* b : unmarked)
      if (b->closed && defines_entry_point(b->body)) with_entry.push_back(b);
    if (opts.allow_unmarked && with_entry.size() == 1) {
      pick = with_entry[0];
    } else {
      if (!unmarked.empty() && !unmarked.back()->closed)
        return fail("unterminated", "the code block opened at line " + std::to_string(unmarked.back()->line) +
                                        " never closes (completion cut off?)");
      return fail("no_marked_block", std::to_string(unmarked.size()) + " code block(s), none marked '```<lang> " +
                                         opts.marker + "'" +
                                         (with_entry.size() > 1 ? " and several define kf_forward" : ""));
    }
  }
  if (!pick->closed)
    return fail("unterminated", "the kernel block opened at line " + std::to_string(pick->line) +
                                    " never closes (completion cut off?)");
  if (trim(pick->body).find_first_not_of(" \t\r\n") == std::string::npos)
    return fail("empty_block", "the kernel block at line " + std::to_string(pick->line) + " is empty");
  if (pick->body.size() > opts.max_bytes)
    return fail("too_large", "the kernel is " + std::to_string(pick->body.size()) + " bytes (limit " +
                                 std::to_string(opts.max_bytes) + ")");
  if (!defines_entry_point(pick->body))
    return fail("no_entry_point", "the kernel block at line " + std::to_string(pick->line) +
                                      " does not define extern \"C\" int kf_forward(...)");
  Extraction e;
  e.ok = true;
  e.source = pick->body;
  return e;
}

}  // namespace kf::actors
