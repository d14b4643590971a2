// Multi-turn refinement (feedback.h): the verifier's word as the next user turn, and the
// conversation rendered as the next prompt.
#include "kf/actors/actors.h"

#include <cmath>
#include <cstdio>

#include "feedback.h"

namespace kf::actors {

namespace {
std::string fmt_num(double v) {
  if (!std::isfinite(v)) return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}
const char* kSections[] = {"no_code", "compile_error", "incorrect", "failed", "ok", "revise"};
}  // namespace

FeedbackTemplate FeedbackTemplate::load(const std::string& path) {
  FeedbackTemplate f;
  f.tpl_ = PromptTemplate::load(path);
  // Every section once with every placeholder: a bad file fails here, not mid-run.
  const std::vector<std::pair<std::string, std::string>> vars = {{"verdict", ""},   {"reason", ""}, {"speedup", ""},
                                                                 {"max_error", ""}, {"lang", ""},   {"marker", ""},
                                                                 {"turn", ""},      {"turns", ""}};
  for (const char* s : kSections) (void)f.tpl_.render(s, vars);
  (void)f.raw_turn("");
  return f;
}

FeedbackTemplate FeedbackTemplate::parse(const std::string& text, const std::string& context) {
  FeedbackTemplate f;
  f.tpl_ = PromptTemplate::parse(text, context);
  return f;
}

std::string FeedbackTemplate::feedback(const replay::Candidate& c, const replay::Result& r, int turn, int turns,
                                       const std::string& lang, const std::string& marker) const {
  const bool no_code = c.source.empty();
  const std::vector<std::pair<std::string, std::string>> vars = {
      {"verdict", replay::verdict_name(r.verdict)},
      {"reason", no_code && !c.extraction_error.empty() ? c.extraction_error : r.reason},
      {"speedup", fmt_num(r.speedup)},
      {"max_error", fmt_num(r.max_error)},
      {"lang", lang},
      {"marker", marker},
      {"turn", std::to_string(turn)},
      {"turns", std::to_string(turns)}};
  const char* section = "failed";
  if (no_code)
    section = "no_code";
  else if (r.verdict == replay::Verdict::compile_error)
    section = "compile_error";
  else if (r.verdict == replay::Verdict::incorrect)
    section = "incorrect";
  else if (r.verdict == replay::Verdict::ok)
    section = "ok";
  return tpl_.render(section, vars) + tpl_.render("revise", vars);
}

std::string FeedbackTemplate::raw_turn(const std::string& feedback) const {
  return tpl_.render("raw_turn", {{"feedback", feedback}});
}

Conversation first_turn(const Prompt& p) {
  Conversation c;
  if (!p.system.empty()) c.messages.push_back({"system", p.system});
  c.messages.push_back({"user", p.user});
  c.raw = p.system + p.user;
  return c;
}

void add_turn(Conversation& conv, const FeedbackTemplate& tpl, const std::string& answer, const std::string& feedback) {
  conv.messages.push_back({"assistant", answer});
  conv.messages.push_back({"user", feedback});
  conv.raw += answer + tpl.raw_turn(feedback);
}

std::string render_conversation(const Conversation& conv, const policy::ChatTemplate* chat) {
  return chat ? chat->render(conv.messages) : conv.raw;
}

}  // namespace kf::actors
