#include <gtest/gtest.h>
#include <unistd.h>

#include <cctype>
#include <filesystem>

#include "kf/common/error.h"
#include "kf/common/run_dir.h"

namespace fs = std::filesystem;

namespace {
std::string temp_root() {
  std::string p = fs::temp_directory_path() / ("kf_rundir_test_" + std::to_string(::getpid()));
  fs::remove_all(p);
  return p;
}

TEST(RunDirTest, CreatesLayoutAndNeverReusesAFolder) {
  const std::string root = temp_root();
  kf::RunDir a = kf::RunDir::create(root, "exp");
  for (const char* sub : {"logs", "metrics", "checkpoints", "kernels", "best"})
    EXPECT_TRUE(fs::is_directory(a.sub(sub))) << sub;
  kf::RunDir b = kf::RunDir::create(root, "exp");
  EXPECT_EQ(a.name(), "exp");
  EXPECT_EQ(b.name(), "exp-2");
  EXPECT_EQ(a.log_file("evaluator", 3), a.path() + "/logs/evaluator-3.log");
  fs::remove_all(root);
}

TEST(RunDirTest, OpenNeedsAConfigSnapshot) {
  const std::string root = temp_root();
  kf::RunDir a = kf::RunDir::create(root, "r");
  EXPECT_THROW(kf::RunDir::open(a.path()), kf::Error);
  kf::write_file_atomic(a.path() + "/config.yaml", "run:\n  name: r\n");
  EXPECT_EQ(kf::RunDir::open(a.path()).name(), "r");
  EXPECT_THROW(kf::RunDir::create(root, "bad/name"), kf::Error);
  fs::remove_all(root);
}

// Two runs of the same name under different roots must not share shared-memory segments;
// one folder, however it is spelled (relative, trailing slash, via a symlink), is one key.
TEST(RunDirTest, SharedMemoryKeyFollowsTheFolderNotJustTheName) {
  const std::string root = temp_root();
  kf::RunDir a = kf::RunDir::create(root + "/one", "exp");
  kf::RunDir b = kf::RunDir::create(root + "/two", "exp");
  EXPECT_EQ(a.name(), b.name());
  EXPECT_NE(a.shm_key(), b.shm_key());
  EXPECT_EQ(a.shm_key().rfind("exp-", 0), 0u) << a.shm_key();
  EXPECT_EQ(a.shm_key().size(), std::string("exp-").size() + 8) << a.shm_key();
  for (char c : a.shm_key()) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c)) || c == '-') << a.shm_key();
  kf::write_file_atomic(a.path() + "/config.yaml", "run:\n  name: exp\n");
  EXPECT_EQ(kf::RunDir::open(a.path() + "/").shm_key(), a.shm_key());
  fs::create_directory_symlink(root + "/one", root + "/link");
  EXPECT_EQ(kf::RunDir::open(root + "/link/exp").shm_key(), a.shm_key());
  const fs::path cwd = fs::current_path();
  fs::current_path(root);
  EXPECT_EQ(kf::RunDir::open("one/exp").shm_key(), a.shm_key());
  fs::current_path(cwd);
  fs::remove_all(root);
}

TEST(RunDirTest, AtomicWriteReplacesWholeFile) {
  const std::string root = temp_root();
  fs::create_directories(root);
  const std::string f = root + "/x.txt";
  kf::write_file_atomic(f, "first version, long text");
  kf::write_file_atomic(f, "second");
  EXPECT_EQ(kf::read_file(f), "second");
  int leftovers = 0;
  for (const auto& e : fs::directory_iterator(root)) leftovers += e.path().filename() != "x.txt";
  EXPECT_EQ(leftovers, 0) << "temporary files must not remain";
  EXPECT_THROW(kf::write_file_atomic(root + "/missing/dir/x", "y"), kf::Error);
  EXPECT_THROW(kf::read_file(root + "/absent"), kf::Error);
  fs::remove_all(root);
}
}  // namespace
