// Checkpoint helpers inside the learner: naming, listing, finding the newest valid
// checkpoint, setting corrupt ones aside, reading tensors back, and the content hash
// (the format and write_checkpoint / verify_checkpoint / check_checkpoints are public, in
// kf/learner/learner.h, "Learner checkpoints").
//
// Atomic writes: everything goes to a hidden temp folder first (each file fsynced), which
// is renamed into place and the parent fsynced, so a crash leaves the previous checkpoints
// intact and at most a temp folder (removed on the next write). Only the newest `keep`
// valid ones are kept: the one just written always counts, corrupt folders never do, so
// cleanup cannot delete the last good checkpoint.
// Corruption: find_latest_valid() checks the manifest of each checkpoint, newest first;
// a missing manifest, a size or hash mismatch is logged (which checkpoint, why, which one
// is used instead) and the previous checkpoint is tried. A corrupt folder is renamed to
// <name>.corrupt-<UTC time> (set_aside_corrupt), never overwritten or deleted.
// Threading: one writer (learner rank 0); readers any thread.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kf/learner/learner.h"

namespace kf::learner {

std::string checkpoint_name(int64_t step);  // "step-000000000123"

struct CheckpointRef {
  std::string path;
  int64_t step = 0;
};
// The newest checkpoint that verifies; corrupt ones newer than it are set aside with a warning.
std::optional<CheckpointRef> find_latest_valid(const std::string& dir);
std::vector<CheckpointRef> list_checkpoints(const std::string& dir);  // ascending step; step-<12 digits> only

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
