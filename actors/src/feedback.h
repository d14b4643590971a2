// Multi-turn refinement (actors.turns > 1, docs/multi-turn.md): the verifier's word on a
// member's answer as the next user turn of its conversation, and the conversation rendered
// as the next prompt. Only the actor loop (actor.cpp) and its tests use it.
//
// Feedback template file (configs/prompts/feedback.txt, PromptTemplate format): one section
// per outcome (no_code, compile_error, incorrect, failed for runtime_error / timeout /
// rejected_cheat, ok), then `revise` appended to each, and `raw_turn` ({{feedback}}): what a
// model without a chat template sees after its own answer. Placeholders: {{verdict}}
// {{reason}} {{speedup}} {{max_error}} {{lang}} {{marker}} {{turn}} {{turns}}. load() renders
// every section once, so a missing section or unknown placeholder fails at start, naming
// the file and section.
//
// Conversation: the turns so far (system?, user, assistant, user, ..., ending with a user
// turn). With the model's chat template the prompt is its rendering (the same
// apply_chat_template layout as the first prompt, multi-turn history included); without one
// it is plain text: the first prompt's text, then each answer followed by raw_turn.
// Pure functions on immutable inputs; any thread.
#pragma once
#include <string>
#include <vector>

#include "kf/actors/actors.h"

namespace kf::actors {

class FeedbackTemplate {
 public:
  static FeedbackTemplate load(const std::string& path);
  static FeedbackTemplate parse(const std::string& text, const std::string& context);
  // The next user turn for a member's answer `c` scored `r`, asking for turn `turn` of `turns`.
  std::string feedback(const replay::Candidate& c, const replay::Result& r, int turn, int turns,
                       const std::string& lang, const std::string& marker) const;
  std::string raw_turn(const std::string& feedback) const;
  const std::string& context() const { return tpl_.context(); }

 private:
  PromptTemplate tpl_;
};

struct Conversation {
  std::vector<policy::ChatMessage> messages;  // ends with a user turn
  std::string raw;                            // the plain-text rendering (no chat template)
};

// The first turn of a prompt built by build_prompt (its system and user text).
Conversation first_turn(const Prompt& p);
// Appends the member's answer and the feedback on it.
void add_turn(Conversation& conv, const FeedbackTemplate& tpl, const std::string& answer, const std::string& feedback);
// The prompt text: the chat template's rendering of the messages, or the raw text.
std::string render_conversation(const Conversation& conv, const policy::ChatTemplate* chat);

}  // namespace kf::actors
