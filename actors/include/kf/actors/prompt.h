// Contrastive prompts (CUDA-L1 stage 3), built from a template file, fitted to the
// model's context by token count.
//
// Template file (configs/prompts/contrastive.txt): sections introduced by a line
// "=== name ===", with {{placeholders}}. Lines before the first section are comments.
//   header                  {{task}} {{backend}} {{lang}} {{reference}} {{signature}} {{abi}} {{backend_notes}}
//   backend_notes_cpu/_cuda text for {{backend_notes}}
//   exemplars_intro         {{count}}
//   exemplar                {{index}} {{speedup}} {{verdict}} {{policy_version}} {{lang}} {{source}}
//   truncated               appended to a cut exemplar source: {{omitted_lines}}
//   contrastive_instruction {{lang}} {{marker}}   (analyse why faster is faster, plan, write one kernel)
//   no_exemplar_instruction {{lang}} {{marker}}   (no earlier kernels: plan, then write)
//   plain                   a whole prompt on its own (ablation): {{task}} {{reference}} {{signature}} {{abi}} {{lang}}
//   {{marker}} {{backend}} system                  optional: the system turn ({{task}} {{backend}} {{lang}} {{marker}}
//   ...)
// Unknown placeholders and missing sections are errors naming the file and section.
//
// Chat template: with PromptOptions::chat set (the model folder has a chat template), the
// text built above is the user turn, after the `system` section's text as a system turn
// when the file has one, and the prompt is the template's rendering of those turns (as
// transformers' apply_chat_template(..., add_generation_prompt=True) renders them: special
// tokens, the assistant header). Without one the prompt is the raw text (the system text
// first, when there is one).
//
// Modes: contrastive (header + exemplars + contrastive instruction; with no exemplar it
// falls back to the no-exemplar text), no_exemplars (ablation: never shows exemplars),
// plain (the `plain` section only).
//
// Fitting (token-exact): the whole prompt, chat template included, is re-encoded after every change and must be
// <= max_tokens. Over budget, the longest exemplar source is cut at a token boundary
// (then back to a line end), never below min_exemplar_tokens; below that an exemplar is
// dropped (the middle one first, so slow and fast stay side by side). If the prompt
// without exemplars is still too long, build_prompt throws kf::Error naming the task.
// Pure functions on immutable inputs; any thread.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <memory>

#include "kf/actors/codec.h"
#include "kf/policy/policy.h"
#include "kf/tasks/tasks.h"

namespace kf::actors {

enum class PromptMode { contrastive, no_exemplars, plain };
PromptMode parse_prompt_mode(const std::string& s, const std::string& context);  // throws kf::Error
const char* prompt_mode_name(PromptMode m);

class PromptTemplate {
 public:
  static PromptTemplate load(const std::string& path);
  static PromptTemplate parse(const std::string& text, const std::string& context);
  bool has(const std::string& section) const;
  const std::string& section(const std::string& name) const;  // throws kf::Error naming the file
  // Substitutes {{key}} from `vars`; an unknown key throws naming the file and section.
  std::string render(const std::string& section_name,
                     const std::vector<std::pair<std::string, std::string>>& vars) const;
  const std::string& context() const { return context_; }

 private:
  std::string context_;
  std::vector<std::pair<std::string, std::string>> sections_;
};

// What a prompt says about the task: name, backend, the Python reference and the kernel's
// argument list in ABI order with shapes and dtypes.
struct TaskInfo {
  std::string name;
  std::string backend;    // "cpu" / "cuda"
  std::string lang;       // fence language: "cpp" / "cuda"
  std::string reference;  // Python source
  std::string signature;  // in[i] / out[i] lines
};
TaskInfo task_info(const tasks::Task& task, tasks::Backend b);
std::string kf_dtype_name(c10::ScalarType t);  // "float32", "bfloat16", ...

// The ABI header for {{abi}}, comments dropped (the contract is stated in the template).
std::string compact_abi(const std::string& kernel_h);

struct ExemplarIn {
  double speedup = 0;
  int64_t policy_version = -1;
  std::string verdict = "ok";
  std::string source;
};

struct PromptOptions {
  PromptMode mode = PromptMode::contrastive;
  std::size_t max_tokens = 4096;
  std::size_t min_exemplar_tokens = 64;
  std::string marker = "kernel";
  std::string abi;  // text for {{abi}}
  // The model folder's chat template (policy::ChatTemplate::for_model); null: raw text.
  std::shared_ptr<const policy::ChatTemplate> chat;
};

struct ShownExemplar {
  double speedup = 0;
  int64_t policy_version = -1;
  bool truncated = false;
};

struct Prompt {
  std::string text;             // what the policy is shown (chat template applied)
  std::vector<int32_t> tokens;  // text's tokens
  std::string system, user;     // the turns before the chat template (system: "" if none)
  PromptMode mode = PromptMode::contrastive;
  std::vector<ShownExemplar> shown;  // ascending speedup, as in the text
  std::size_t offered = 0;           // exemplars given
  std::size_t dropped = 0;           // dropped to fit
  std::size_t truncated = 0;         // shown but cut
};

// `exemplars` in the order to show (KernelDb::exemplars returns ascending speedup).
Prompt build_prompt(const PromptTemplate& tpl, const TextCodec& codec, const TaskInfo& task,
                    const std::vector<ExemplarIn>& exemplars, const PromptOptions& opts);

}  // namespace kf::actors
