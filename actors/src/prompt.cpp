// Contrastive prompts: template files, task info, the ABI text, and build_prompt's token-exact
// fitting to the context (docs/actors.md, Prompt template).
#include "kf/actors/actors.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "kf/common/error.h"
#include "kf/common/run_dir.h"
#include "prompt.h"

namespace kf::actors {

PromptMode parse_prompt_mode(const std::string& s, const std::string& context) {
  if (s == "contrastive") return PromptMode::contrastive;
  if (s == "no_exemplars") return PromptMode::no_exemplars;
  if (s == "plain") return PromptMode::plain;
  throw error_at(context, "unknown prompt mode '" + s + "' (contrastive, no_exemplars, plain)");
}

const char* prompt_mode_name(PromptMode m) {
  switch (m) {
    case PromptMode::contrastive:
      return "contrastive";
    case PromptMode::no_exemplars:
      return "no_exemplars";
    case PromptMode::plain:
      return "plain";
  }
  return "?";
}

PromptTemplate PromptTemplate::load(const std::string& path) { return parse(read_file(path), path); }

PromptTemplate PromptTemplate::parse(const std::string& text, const std::string& context) {
  PromptTemplate t;
  t.context_ = context;
  std::istringstream in(text);
  std::string line;
  bool in_section = false;
  while (std::getline(in, line)) {
    if (line.size() >= 8 && line.compare(0, 4, "=== ") == 0 && line.compare(line.size() - 4, 4, " ===") == 0) {
      std::string name = line.substr(4, line.size() - 8);
      for (const auto& s : t.sections_)
        if (s.first == name) throw error_at(context, "section '" + name + "' appears twice");
      t.sections_.emplace_back(name, "");
      in_section = true;
      continue;
    }
    if (in_section) t.sections_.back().second += line + "\n";
  }
  // A section's trailing blank lines are layout of the file, not of the prompt: keep one newline.
  for (auto& s : t.sections_) {
    while (s.second.size() >= 2 && s.second[s.second.size() - 1] == '\n' && s.second[s.second.size() - 2] == '\n')
      s.second.pop_back();
  }
  if (t.sections_.empty()) throw error_at(context, "no sections (a section starts with a line '=== name ===')");
  return t;
}

bool PromptTemplate::has(const std::string& name) const {
  for (const auto& s : sections_)
    if (s.first == name) return true;
  return false;
}

const std::string& PromptTemplate::section(const std::string& name) const {
  for (const auto& s : sections_)
    if (s.first == name) return s.second;
  throw error_at(context_, "missing section '" + name + "'");
}

std::string PromptTemplate::render(const std::string& name,
                                   const std::vector<std::pair<std::string, std::string>>& vars) const {
  const std::string& body = section(name);
  std::string out;
  std::size_t pos = 0;
  while (true) {
    const auto open = body.find("{{", pos);
    if (open == std::string::npos) break;
    const auto close = body.find("}}", open + 2);
    if (close == std::string::npos) throw error_at(context_, "section '" + name + "': unclosed '{{'");
    out.append(body, pos, open - pos);
    const std::string key = body.substr(open + 2, close - open - 2);
    bool found = false;
    for (const auto& [k, v] : vars)
      if (k == key) {
        out += v;
        found = true;
        break;
      }
    if (!found) throw error_at(context_, "section '" + name + "': unknown placeholder {{" + key + "}}");
    pos = close + 2;
  }
  out.append(body, pos, std::string::npos);
  return out;
}

std::string kf_dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float:
      return "float32";
    case c10::ScalarType::Half:
      return "float16";
    case c10::ScalarType::BFloat16:
      return "bfloat16";
    case c10::ScalarType::Double:
      return "float64";
    case c10::ScalarType::Int:
      return "int32";
    case c10::ScalarType::Long:
      return "int64";
    case c10::ScalarType::Short:
      return "int16";
    case c10::ScalarType::Char:
      return "int8";
    case c10::ScalarType::Byte:
      return "uint8";
    case c10::ScalarType::Bool:
      return "bool";
    default:
      return c10::toString(t);
  }
}

namespace {

std::string shape_text(const std::vector<int64_t>& s) {
  std::string o = "[";
  for (std::size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
  return o + "]";
}

std::string fmt_speedup(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", s);
  return buf;
}

std::size_t count_lines(const std::string& s) {
  return static_cast<std::size_t>(std::count(s.begin(), s.end(), '\n')) + (s.empty() || s.back() == '\n' ? 0 : 1);
}

}  // namespace

TaskInfo task_info(const tasks::Task& task, tasks::Backend b) {
  TaskInfo t;
  t.name = task.name();
  t.backend = tasks::backend_name(b);
  t.lang = b == tasks::Backend::CUDA ? "cuda" : "cpp";
  t.reference = task.source();
  std::ostringstream sig;
  int i = 0;
  auto line = [&](const char* arr, int idx, const tasks::TensorSpec& s, const char* role) {
    sig << arr << "[" << idx << "]  " << s.name << "  " << kf_dtype_name(s.dtype) << " " << shape_text(s.shape) << "  ("
        << role << ")\n";
  };
  for (const auto& s : task.inputs(b)) line("in", i++, s, "input, read-only");
  for (const auto& s : task.params(b)) line("in", i++, s, s.role == tasks::Role::Buffer ? "buffer" : "parameter");
  int o = 0;
  for (const auto& s : task.outputs(b)) line("out", o++, s, "output, preallocated");
  t.signature = sig.str();
  return t;
}

std::string compact_abi(const std::string& kernel_h) {
  std::istringstream in(kernel_h);
  std::string line, out;
  bool prev_blank = true;
  while (std::getline(in, line)) {
    const auto b = line.find_first_not_of(" \t");
    if (b != std::string::npos && line.compare(b, 2, "//") == 0) continue;
    const auto c = line.find("  //");  // trailing comment
    if (c != std::string::npos) line = line.substr(0, line.find_last_not_of(' ', c) + 1);
    const bool blank = line.find_first_not_of(" \t") == std::string::npos;
    if (blank && prev_blank) continue;
    out += line + "\n";
    prev_blank = blank;
  }
  return out;
}

namespace {

struct Ex {
  const ExemplarIn* in;
  std::vector<int32_t> ids;  // the full source's tokens
  std::size_t keep;          // tokens of the source kept
};

// The shown text of an exemplar source cut to `keep` tokens: cut at a token boundary,
// then back to the last line end if that loses at most half of what was kept.
std::string cut_source(const TextCodec& codec, const PromptTemplate& tpl, const Ex& e) {
  if (e.keep >= e.ids.size()) return e.in->source;
  // Back off to the last token (in the second half) that holds a line end, so the cut is
  // both on a token boundary and (nearly) on a line boundary.
  std::size_t keep = e.keep;
  for (std::size_t m = e.keep; m > e.keep / 2; --m)
    if (codec.decode({e.ids[m - 1]}).find('\n') != std::string::npos) {
      keep = m;
      break;
    }
  std::string head =
      codec.decode(std::vector<int32_t>(e.ids.begin(), e.ids.begin() + static_cast<std::ptrdiff_t>(keep)));
  if (!head.empty() && head.back() != '\n') head += '\n';
  const std::size_t omitted = count_lines(e.in->source) - std::min(count_lines(e.in->source), count_lines(head));
  return head + tpl.render("truncated", {{"omitted_lines", std::to_string(omitted)}});
}

}  // namespace

Prompt build_prompt(const PromptTemplate& tpl, const TextCodec& codec, const TaskInfo& task,
                    const std::vector<ExemplarIn>& exemplars, const PromptOptions& opts) {
  const std::string ctx = "prompt for task " + task.name;
  Prompt p;
  p.mode = opts.mode;
  p.offered = opts.mode == PromptMode::contrastive ? exemplars.size() : 0;
  const std::vector<std::pair<std::string, std::string>> common = {
      {"task", task.name},           {"backend", task.backend}, {"lang", task.lang},    {"reference", task.reference},
      {"signature", task.signature}, {"abi", opts.abi},         {"marker", opts.marker}};
  p.system = tpl.has("system") ? tpl.render("system", common) : "";
  // The prompt the policy sees: the turns through the model's chat template, or raw text.
  auto shown = [&](const std::string& user) {
    if (!opts.chat) return p.system + user;
    std::vector<policy::ChatMessage> turns;
    if (!p.system.empty()) turns.push_back({"system", p.system});
    turns.push_back({"user", user});
    return opts.chat->render(turns);
  };
  auto finish = [&](std::string user) {
    std::string text = shown(user);
    p.user = std::move(user);
    p.tokens = codec.encode(text);
    p.text = std::move(text);
    if (p.tokens.size() > opts.max_tokens)
      throw error_at(ctx, "prompt without exemplars is " + std::to_string(p.tokens.size()) +
                              " tokens, over the budget of " + std::to_string(opts.max_tokens) +
                              " (raise actors.context_tokens or lower actors.sampling.max_new_tokens)");
    return p;
  };
  if (opts.mode == PromptMode::plain) return finish(tpl.render("plain", common));

  auto vars = common;
  const std::string notes_section = "backend_notes_" + task.backend;
  vars.emplace_back("backend_notes", tpl.has(notes_section) ? tpl.section(notes_section) : "");
  const std::string header = tpl.render("header", vars);
  const std::string no_ex = tpl.render("no_exemplar_instruction", common);
  if (opts.mode == PromptMode::no_exemplars || exemplars.empty()) return finish(header + no_ex);

  const std::string instruction = tpl.render("contrastive_instruction", common);
  std::vector<Ex> ex;
  for (const auto& e : exemplars) {
    Ex x{&e, codec.encode(e.source), 0};
    x.keep = x.ids.size();
    ex.push_back(std::move(x));
  }
  auto render = [&]() {
    std::string s = header + tpl.render("exemplars_intro", {{"count", std::to_string(ex.size())}});
    for (std::size_t i = 0; i < ex.size(); ++i) {
      const auto& e = ex[i];
      s += tpl.render("exemplar", {{"index", std::to_string(i + 1)},
                                   {"speedup", fmt_speedup(e.in->speedup)},
                                   {"verdict", e.in->verdict},
                                   {"policy_version", std::to_string(e.in->policy_version)},
                                   {"lang", task.lang},
                                   {"source", cut_source(codec, tpl, e)}});
    }
    return s + instruction;
  };
  // Each pass either fits, shortens the longest source, or drops an exemplar, so the
  // loop ends; the bound is a guard against a tokenizer that grows text when it is cut.
  for (int pass = 0; pass < 10000 && !ex.empty(); ++pass) {
    std::string user = render();
    std::string text = shown(user);
    auto ids = codec.encode(text);
    if (ids.size() <= opts.max_tokens) {
      p.user = std::move(user);
      p.text = std::move(text);
      p.tokens = std::move(ids);
      for (const auto& e : ex) {
        p.shown.push_back({e.in->speedup, e.in->policy_version, e.keep < e.ids.size()});
        if (e.keep < e.ids.size()) ++p.truncated;
      }
      p.dropped = exemplars.size() - ex.size();
      return p;
    }
    const std::size_t over = ids.size() - opts.max_tokens;
    auto longest = std::max_element(ex.begin(), ex.end(), [](const Ex& a, const Ex& b) { return a.keep < b.keep; });
    // The truncation note costs tokens too: cut a little more than the overshoot.
    const std::size_t cut = over + 8;
    if (longest->keep >= opts.min_exemplar_tokens + cut) {
      longest->keep -= cut;
    } else {
      // Drop the middle exemplar (of an even count, the one below the middle): the slow
      // and fast ends carry the contrast.
      const std::size_t mid = ex.size() <= 2 ? 0 : (ex.size() - 1) / 2;
      ex.erase(ex.begin() + static_cast<std::ptrdiff_t>(mid));
    }
  }
  p.dropped = exemplars.size();
  return finish(header + no_ex);
}

}  // namespace kf::actors
