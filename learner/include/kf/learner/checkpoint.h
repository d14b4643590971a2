// Learner checkpoints: one folder per checkpoint under <run>/checkpoints/, named
// step-<12 digits>, holding
//   model.safetensors       trainable weights (fp32, HF names)
//   optimizer.safetensors   AdamW exp_avg / exp_avg_sq per parameter
//   reference.safetensors   the frozen reference (only when the objective needs one)
//   config.json, tokenizer.json   the policy's HF config (and tokenizer, if it has one)
//   state.json              step, version, schedule, RNG states, counters, config echo
//   replay.bin, kernel_db.json    replay contents and kernel database (rank 0, when attached)
//   MANIFEST.json           every other file's size and 64-bit hash; written last
// Atomic: everything goes to a hidden temp folder first (each file fsynced), which is
// renamed into place and the parent fsynced, so a crash leaves the previous
// checkpoints intact and at most a temp folder (removed on the next write). Only the
// newest `keep` valid ones are kept: the one just written always counts, corrupt folders
// never do, so cleanup cannot delete the last good checkpoint.
// Corruption: find_latest_valid() checks the manifest of each checkpoint, newest first;
// a missing manifest, a size or hash mismatch is logged (which checkpoint, why, which one
// is used instead) and the previous checkpoint is tried. A corrupt folder is renamed to
// <name>.corrupt-<UTC time> (set_aside_corrupt), never overwritten or deleted.
// Threading: one writer (learner rank 0); readers any thread.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace kf::learner {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

struct CheckpointData {
  int64_t step = 0;
  NamedTensors model, optimizer, reference;
  std::string state_json;
  std::string model_config_json;
  std::string tokenizer_json;  // empty: none
  // Writes extra files (replay.bin, kernel_db.json) into the temp folder; they are
  // hashed into the manifest like the rest.
  std::function<void(const std::string& dir)> extra;
};

std::string checkpoint_name(int64_t step);  // "step-000000000123"

// Writes <dir>/step-..., removes older ones beyond `keep` and stale temp folders.
// Returns the checkpoint's path. Throws kf::Error naming the file on I/O failure.
std::string write_checkpoint(const std::string& dir, const CheckpointData& data, int64_t keep);

// Throws kf::Error naming the checkpoint and the file and field that failed.
void verify_checkpoint(const std::string& path);

struct CheckpointRef {
  std::string path;
  int64_t step = 0;
};
// The newest checkpoint that verifies; corrupt ones newer than it are set aside with a warning.
std::optional<CheckpointRef> find_latest_valid(const std::string& dir);
std::vector<CheckpointRef> list_checkpoints(const std::string& dir);  // ascending step; step-<12 digits> only

// Every checkpoint folder, newest first, verified; changes nothing (tools/launch --resume
// reports these before it starts anything).
struct CheckpointCheck {
  std::string path;
  int64_t step = 0;
  std::string error;  // empty: valid; else why it is unusable
};
std::vector<CheckpointCheck> check_checkpoints(const std::string& dir);

// Renames an unusable checkpoint folder to <path>.corrupt-<UTC time> with a log line naming
// both paths and `why`; returns the new path (the old one if the rename failed, logged).
std::string set_aside_corrupt(const std::string& path, const std::string& why);

// Reads every tensor of a safetensors file to CPU (copies; the file is closed after).
std::map<std::string, torch::Tensor> read_tensors(const std::string& file);

// 64-bit content hash (XXH64, seed 0) of bytes and of a whole file.
uint64_t hash64(const void* data, std::size_t n, uint64_t seed = 0);
uint64_t hash_file(const std::string& path);

// Not std::filesystem::remove_all (libtorch exports a clashing symbol): nftw.
void remove_tree(const std::string& path);

}  // namespace kf::learner
