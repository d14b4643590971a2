// config.json and generation_config.json parsing and writing behind load_model_config and
// save_weights (kf/policy/policy.h). Torch-free (kf_policy_text); pure functions, any thread.
// Errors are kf::Error naming the file and the field ("config.json: field 'hidden_size': ...").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kf/policy/policy.h"

namespace kf::policy {

// Parses config.json text; `context` names the file in errors.
ModelConfig parse_model_config(const std::string& json_text, const std::string& context);
// The eos_token_id of a generation_config.json text (an integer or a list; none when absent
// or null). load_model_config appends these to config.json's own stop ids, without repeats.
std::vector<int64_t> generation_eos_ids(const std::string& json_text, const std::string& context);
// Writes model_config_to_json(c) to `path`.
void save_model_config(const ModelConfig& c, const std::string& path);

}  // namespace kf::policy
