// Checkpoint files: atomic folders, keep-last-K, and the fallback past corrupt or
// partial checkpoints; sharded optimizer state through a checkpoint (exact resume, re-shard).
#include <gtest/gtest.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "checkpoint.h"
#include "kf/common/error.h"

#include "kf/learner/learner.h"
#include "shard_util.h"
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

// Sharded training state through a checkpoint (kf-learner processes on CPU ranks): rank 0
// gathers the optimizer slices into whole per-parameter tensors, so the checkpoint has the
// unsharded format; resuming at the same world size continues bitwise like the straight
// run, and resuming at another world size re-shards (each rank takes its slice of the
// whole tensors): bitwise what an unsharded run resumed from that checkpoint does.
// learner.dist.shard: gradients resumes bitwise as well.
TEST(LearnerShardTest, ShardedResumeIsExactAndReshardsAtAnotherWorldSize) {
  namespace lt = kf::learner::test;
  TempDir tmp;
  const std::string shard = "  dist:\n    shard: optimizer\n";
  const std::string run = tmp.path + "/run";
  const auto straight = lt::run_shard_ranks(tmp.path, "straight", 2, 4, shard);
  ASSERT_EQ(straight.codes, (std::vector<int>{0, 0})) << straight.logs[0] << straight.logs[1];
  const auto first = lt::run_shard_ranks(tmp.path, "first", 2, 2, shard, {"--final-checkpoint"}, run);
  ASSERT_EQ(first.codes, (std::vector<int>{0, 0})) << first.logs[0] << first.logs[1];
  const std::string ckpt = run + "/checkpoints/" + checkpoint_name(2);
  verify_checkpoint(ckpt);
  // Whole tensors, named as an unsharded checkpoint names them.
  const auto opt = read_tensors(ckpt + "/optimizer.safetensors");
  const auto model = read_tensors(ckpt + "/model.safetensors");
  ASSERT_EQ(opt.size(), 2 * model.size());
  for (const auto& [name, w] : model) {
    ASSERT_TRUE(opt.count(name + ".exp_avg")) << name;
    EXPECT_EQ(opt.at(name + ".exp_avg").sizes(), w.sizes()) << name;
    EXPECT_GT(opt.at(name + ".exp_avg_sq").abs().sum().item<double>(), 0) << name << ": moments never gathered";
  }
  const auto resumed = lt::run_shard_ranks(tmp.path, "resumed", 2, 4, shard, {"--resume"}, run);
  ASSERT_EQ(resumed.codes, (std::vector<int>{0, 0})) << resumed.logs[0] << resumed.logs[1];
  EXPECT_NE(resumed.logs[1].find("resumed from " + ckpt), std::string::npos) << resumed.logs[1];
  EXPECT_TRUE(lt::bitwise_equal(resumed.weights, straight.weights))
      << "resumed sharded run differs from the straight one; max relative difference "
      << lt::max_rel_diff(resumed.weights, straight.weights);
  EXPECT_EQ(resumed.checksums, straight.checksums);
  // Another world size: 4 sharded ranks from the 2-rank checkpoint against 4 unsharded ones.
  const auto reshard = lt::run_shard_ranks(tmp.path, "reshard4", 4, 4, shard, {"--resume"}, run);
  const auto plain = lt::run_shard_ranks(tmp.path, "plain4", 4, 4, "", {"--resume"}, run);
  for (int k = 0; k < 4; ++k) {
    ASSERT_EQ(reshard.codes[k], 0) << reshard.logs[k];
    ASSERT_EQ(plain.codes[k], 0) << plain.logs[k];
  }
  EXPECT_NE(reshard.logs[3].find("resumed from " + ckpt), std::string::npos) << reshard.logs[3];
  EXPECT_TRUE(lt::bitwise_equal(reshard.weights, plain.weights))
      << "re-sharded resume differs from the unsharded one; max relative difference "
      << lt::max_rel_diff(reshard.weights, plain.weights);
  // Sharded gradients (ZeRO-2) resume exactly too.
  const std::string grads = "  dist:\n    shard: gradients\n", grun = tmp.path + "/grun";
  const auto gstraight = lt::run_shard_ranks(tmp.path, "gstraight", 2, 4, grads);
  const auto gfirst = lt::run_shard_ranks(tmp.path, "gfirst", 2, 2, grads, {"--final-checkpoint"}, grun);
  const auto gresumed = lt::run_shard_ranks(tmp.path, "gresumed", 2, 4, grads, {"--resume"}, grun);
  for (const auto* r : {&gstraight, &gfirst, &gresumed})
    ASSERT_EQ(r->codes, (std::vector<int>{0, 0})) << r->logs[0] << r->logs[1];
  EXPECT_TRUE(lt::bitwise_equal(gresumed.weights, gstraight.weights))
      << "resumed sharded-gradients run differs from the straight one; max relative difference "
      << lt::max_rel_diff(gresumed.weights, gstraight.weights);
  EXPECT_EQ(gresumed.checksums, gstraight.checksums);
  std::map<std::string, torch::Tensor> at_two(model.begin(), model.end());
  EXPECT_FALSE(lt::bitwise_equal(reshard.weights, at_two)) << "the 4 ranks must have trained past step 2";
  EXPECT_EQ(reshard.steps.size(), 2u);
}
