#include <gtest/gtest.h>
#include <unistd.h>

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
