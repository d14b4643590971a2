// kf-render-prompt (tools/render-prompt --model DIR --messages FILE.json): prints the text
// the system shows the policy for a conversation: the model folder's chat template
// rendered as transformers' apply_chat_template(..., tokenize=False,
// add_generation_prompt=True) renders it, or, for a folder without a template, the
// contents joined as they are (the raw prompt). FILE.json: a list of {"role", "content"}.
// --tokens also prints the prompt's token count on stderr (with the folder's tokenizer.json).
// --enable-thinking true|false passes that template variable (apply_chat_template's
// enable_thinking=...); without it the template's own default.
// Exit: 0 ok, 1 bad input or template error (message names the file and field), 2 usage.
#include <sys/stat.h>

#include "kf/common/cli.h"
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "kf/common/error.h"
#include "kf/common/run_dir.h"
#include "kf/policy/policy.h"

namespace {

std::vector<kf::policy::ChatMessage> read_messages(const std::string& path) {
  nlohmann::json j;
  const std::string text = kf::read_file(path);
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw kf::Error(path + ": not valid JSON: " + e.what());
  }
  if (!j.is_array()) throw kf::Error(path + ": must be a list of {\"role\", \"content\"} objects");
  if (j.empty()) throw kf::Error(path + ": the list of messages is empty");
  std::vector<kf::policy::ChatMessage> out;
  for (std::size_t i = 0; i < j.size(); ++i) {
    const std::string at = path + ": [" + std::to_string(i) + "]";
    const auto& m = j[i];
    if (!m.is_object()) throw kf::Error(at + ": must be an object with fields 'role' and 'content'");
    for (const char* k : {"role", "content"}) {
      if (!m.contains(k)) throw kf::Error(at + ": field '" + k + "' is missing");
      if (!m[k].is_string()) throw kf::Error(at + ": field '" + k + "' must be a string");
    }
    for (const auto& [k, v] : m.items())
      if (k != "role" && k != "content")
        throw kf::Error(at + ": unknown field '" + k + "' (only 'role' and 'content')");
    out.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  return out;
}

bool is_dir(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Print the prompt text a model folder's chat template renders for a conversation"};
  std::string model, messages;
  bool tokens = false;
  app.add_option("--model", model, "HF model folder (tokenizer_config.json / chat_template.jinja)")->required();
  app.add_option("--messages", messages, "JSON file: a list of {\"role\", \"content\"}")->required();
  app.add_flag("--tokens", tokens, "also print the token count on stderr (needs the folder's tokenizer.json)");
  std::string thinking;
  app.add_option("--enable-thinking", thinking, "true or false: the template variable enable_thinking")
      ->check(CLI::IsMember({"true", "false"}));
  KF_CLI_PARSE(app, argc, argv);
  if (!is_dir(model)) {
    std::fprintf(stderr, "render-prompt: --model %s: not a folder\n", model.c_str());
    return 2;
  }
  try {
    const auto msgs = read_messages(messages);
    std::string text;
    const std::string vars = thinking.empty() ? "" : "{\"enable_thinking\": " + thinking + "}";
    if (auto t = kf::policy::ChatTemplate::load(model, vars)) {
      text = t->render(msgs);
    } else {
      std::fprintf(stderr, "render-prompt: %s has no chat template: the raw text (contents joined)\n", model.c_str());
      for (const auto& m : msgs) text += m.content;
    }
    std::fwrite(text.data(), 1, text.size(), stdout);
    if (tokens) {
      const auto tok = kf::policy::Tokenizer::from_file(model + "/tokenizer.json");
      std::fprintf(stderr, "render-prompt: %zu tokens\n", tok.encode(text).size());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "render-prompt: %s; nothing printed\n", e.what());
    return 1;
  }
}
