// How ChatTemplate (kf/policy/policy.h) renders exactly what transformers renders, and the
// text helpers it shares with its tests. Torch-free (kf_policy_text).
//
// Why this shape: chat templates are Jinja programs, and a hand-written Jinja subset in C++
// would drift from what transformers prints. The template is therefore run by jinja2 itself
// (policy/tools/kf_chat_template.py, with transformers' environment: trim_blocks,
// lstrip_blocks, loopcontrols, tojson, raise_exception, strftime_now, the named special
// tokens), but only once per role sequence (e.g. [user] or [system, user]), not once per
// prompt: the script renders sentinel strings in place of the contents and returns the
// literal pieces between them plus, per placed content, whether the template trims it.
// render() joins the pieces around the real contents in C++ (microseconds; the prompt
// fitter re-renders many times per prompt). The script proves the layout exact for that
// role sequence with probe contents. Where the template transforms or branches on the text
// beyond placing and trimming it (Qwen3 strips an earlier turn's <think> block), that role
// sequence is rendered by jinja2 itself instead: one `kf_chat_template.py serve` process per
// object keeps the compiled template and renders each conversation on request (a pipe round
// trip, 0.06 ms on the 2-core machine). A template that branches on a content being empty
// gets an error for an empty content of a laid-out sequence. A layout is cached for the life
// of the object, so a template that prints today's date (Llama 3.x) keeps the date of its
// first rendering. The layout cache is locked: const methods may run concurrently.
//
// Python: $KF_PYTHON, else the interpreter the build was configured with; the script: under
// $KF_SOURCE_DIR, else the source tree this was built from.
#pragma once
#include <string>

namespace kf::policy {

// Python's str.lstrip()/rstrip() without arguments (what Jinja's `trim` does): the code
// points for which str.isspace() is true, on UTF-8 text.
std::string py_lstrip(const std::string& s);
std::string py_rstrip(const std::string& s);

}  // namespace kf::policy
