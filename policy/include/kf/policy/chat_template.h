// ChatTemplate: a model folder's chat template (tokenizer_config.json "chat_template", or
// chat_template.jinja beside it, which wins, as in transformers), rendered exactly as
// transformers' apply_chat_template(messages, tokenize=False, add_generation_prompt=True).
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
// role sequence with probe contents and refuses (kf::Error) a template that transforms or
// branches on the text beyond placing and trimming it; a template that branches on a
// content being empty gets an error for an empty content instead. A layout is cached for
// the life of the object, so a template that prints today's date (Llama 3.x) keeps the
// date of its first rendering.
//
// Python: $KF_PYTHON, else the interpreter the build was configured with; the script: under
// $KF_SOURCE_DIR, else the source tree this was built from. Needs jinja2 (requirements.txt).
// Thread safety: const methods may run concurrently (the layout cache is locked).
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kf::policy {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", ...
  std::string content;
};

class ChatTemplate {
 public:
  // The template of `model_dir`, or nullopt when the folder has none. Renders the [user]
  // layout at once, so a template that cannot be rendered exactly fails here: kf::Error
  // naming the file (and the Python or jinja2 failure).
  static std::optional<ChatTemplate> load(const std::string& model_dir);
  // One shared instance per folder for the process (null when the folder has no template or
  // `model_dir` is empty); the pointer stays valid for the life of the process.
  static std::shared_ptr<const ChatTemplate> for_model(const std::string& model_dir);
  // True when the folder holds a template (chat_template.jinja or a non-null
  // tokenizer_config.json "chat_template"); reads files only.
  static bool present(const std::string& model_dir);

  // The text transformers renders for `messages` with add_generation_prompt=True.
  // kf::Error naming the template for a role sequence the template rejects
  // (raise_exception) or cannot be laid out exactly, or an empty content it branches on.
  std::string render(const std::vector<ChatMessage>& messages) const;

  const std::string& model_dir() const;
  const std::string& source() const;  // the file (and field) the template came from

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

// Python's str.strip()/lstrip()/rstrip() without arguments (what Jinja's `trim` does): the
// code points for which str.isspace() is true, on UTF-8 text.
std::string py_lstrip(const std::string& s);
std::string py_rstrip(const std::string& s);

}  // namespace kf::policy
