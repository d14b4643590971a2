// The prompt builder's helpers that only actors/ uses (prompt.cpp defines them): the
// prompt mode's names (actors.prompt.mode, the actor's start-up line, tools/optimize) and
// the dtype names of a task's signature. Pure functions; any thread.
#pragma once
#include <string>

#include "kf/actors/actors.h"

namespace kf::actors {

PromptMode parse_prompt_mode(const std::string& s, const std::string& context);  // throws kf::Error naming context
const char* prompt_mode_name(PromptMode m);
std::string kf_dtype_name(c10::ScalarType t);  // "float32", "bfloat16", ...

}  // namespace kf::actors
