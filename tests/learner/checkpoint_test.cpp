// Checkpoint files: atomic folders, keep-last-K, and the fallback past corrupt or
// partial checkpoints.
#include <gtest/gtest.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "kf/common/error.h"

#include "kf/learner/checkpoint.h"
#include "test_util.h"

using namespace kf::learner;
using kf::learner::test::TempDir;

namespace {
CheckpointData tiny_data(int64_t step) {
  CheckpointData d;
  d.step = step;
  d.model = {{"w", torch::full({4, 4}, static_cast<float>(step))}};
  d.optimizer = {{"w.exp_avg", torch::zeros({4, 4})}, {"w.exp_avg_sq", torch::zeros({4, 4})}};
  d.state_json = "{\"step\": " + std::to_string(step) + "}";
  d.model_config_json = "{}";
  return d;
}
bool exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}
void flip_byte(const std::string& path, long offset_from_end) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-offset_from_end, std::ios::end);
  char c;
  f.read(&c, 1);
  c ^= 0x5a;
  f.seekp(-offset_from_end, std::ios::end);
  f.write(&c, 1);
}
}  // namespace

TEST(LearnerCheckpointTest, WritesAtomicallyAndKeepsTheLastK) {
  TempDir tmp;
  const std::string dir = tmp.path + "/checkpoints";
  for (int64_t s = 1; s <= 4; ++s) write_checkpoint(dir, tiny_data(s), 2);
  const auto all = list_checkpoints(dir);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].step, 3);
  EXPECT_EQ(all[1].step, 4);
  EXPECT_NO_THROW(verify_checkpoint(all[1].path));
  EXPECT_TRUE(exists(all[1].path + "/MANIFEST.json"));
  const auto w = read_tensors(all[1].path + "/model.safetensors");
  EXPECT_EQ(w.at("w")[0][0].item<float>(), 4.0f);
}

TEST(LearnerCheckpointTest, CorruptOrPartialCheckpointFallsBackToThePreviousOne) {
  TempDir tmp;
  const std::string dir = tmp.path + "/checkpoints";
  for (int64_t s = 1; s <= 3; ++s) write_checkpoint(dir, tiny_data(s), 5);
  EXPECT_EQ(find_latest_valid(dir)->step, 3);
  flip_byte(dir + "/" + checkpoint_name(3) + "/model.safetensors", 3);  // one bit of the data
  try {
    verify_checkpoint(dir + "/" + checkpoint_name(3));
    FAIL() << "a flipped byte must be detected";
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.safetensors"), std::string::npos) << e.what();
  }
  EXPECT_EQ(find_latest_valid(dir)->step, 2);
  // A partial checkpoint (the manifest is written last, so a folder without one is
  // incomplete) and a truncated file are skipped too.
  ::remove((dir + "/" + checkpoint_name(2) + "/MANIFEST.json").c_str());
  EXPECT_EQ(find_latest_valid(dir)->step, 1);
  ::truncate((dir + "/" + checkpoint_name(1) + "/optimizer.safetensors").c_str(), 10);
  EXPECT_FALSE(find_latest_valid(dir).has_value());
}

TEST(LearnerCheckpointTest, HashIsXxh64) {
  // Reference values of XXH64 with seed 0.
  EXPECT_EQ(hash64("", 0), 0xEF46DB3751D8E999ULL);
  EXPECT_EQ(hash64("abc", 3), 0x44BC2CF5AD770999ULL);
}

namespace {
// Folder names in `dir` that start with `prefix`.
std::vector<std::string> names_with(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d))
      if (std::string(e->d_name).rfind(prefix, 0) == 0) out.push_back(e->d_name);
    ::closedir(d);
  }
  return out;
}
}  // namespace

TEST(LearnerCheckpointTest, KeepNeverCountsCorruptFoldersAndNeverDeletesTheLastGoodOne) {
  TempDir tmp;
  const std::string dir = tmp.path + "/checkpoints";
  write_checkpoint(dir, tiny_data(1), 2);
  write_checkpoint(dir, tiny_data(2), 2);
  ::truncate((dir + "/" + checkpoint_name(2) + "/model.safetensors").c_str(), 16);
  // keep 2 used to count step 2 as kept and delete step 1, the only other good one.
  write_checkpoint(dir, tiny_data(3), 2);
  const auto all = list_checkpoints(dir);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].step, 1);
  EXPECT_EQ(all[1].step, 3);
  EXPECT_NO_THROW(verify_checkpoint(all[0].path));
  // The corrupt folder was renamed aside, not deleted, and is no longer listed.
  const auto aside = names_with(dir, checkpoint_name(2) + ".corrupt-");
  ASSERT_EQ(aside.size(), 1u);
  EXPECT_TRUE(exists(dir + "/" + aside[0] + "/model.safetensors"));
}

TEST(LearnerCheckpointTest, FallbackRenamesCorruptFoldersAndARewriteNeverOverwritesOne) {
  TempDir tmp;
  const std::string dir = tmp.path + "/checkpoints";
  for (int64_t s = 1; s <= 2; ++s) write_checkpoint(dir, tiny_data(s), 5);
  ::truncate((dir + "/" + checkpoint_name(2) + "/optimizer.safetensors").c_str(), 10);
  // check_checkpoints reports, newest first, and touches nothing.
  const auto checks = check_checkpoints(dir);
  ASSERT_EQ(checks.size(), 2u);
  EXPECT_EQ(checks[0].step, 2);
  EXPECT_NE(checks[0].error.find("optimizer.safetensors"), std::string::npos) << checks[0].error;
  EXPECT_TRUE(checks[1].error.empty()) << checks[1].error;
  EXPECT_TRUE(exists(dir + "/" + checkpoint_name(2)));
  // The fallback sets the corrupt one aside.
  EXPECT_EQ(find_latest_valid(dir)->step, 1);
  EXPECT_FALSE(exists(dir + "/" + checkpoint_name(2)));
  EXPECT_EQ(names_with(dir, checkpoint_name(2) + ".corrupt-").size(), 1u);
  // A corrupt folder of the step being written is set aside too, not replaced in place.
  write_checkpoint(dir, tiny_data(3), 5);
  ::truncate((dir + "/" + checkpoint_name(3) + "/state.json").c_str(), 1);
  write_checkpoint(dir, tiny_data(3), 5);
  EXPECT_NO_THROW(verify_checkpoint(dir + "/" + checkpoint_name(3)));
  EXPECT_EQ(names_with(dir, checkpoint_name(3) + ".corrupt-").size(), 1u);
  EXPECT_EQ(list_checkpoints(dir).size(), 2u);  // 1 and 3; the .corrupt-* folders are not checkpoints
}
