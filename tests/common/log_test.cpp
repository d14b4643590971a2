#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "kf/common/log.h"
#include "kf/common/run_dir.h"

TEST(LogTest, EveryLineNamesRoleIdAndPid) {
  const std::string file = std::filesystem::temp_directory_path() / ("kf_log_" + std::to_string(::getpid()) + ".log");
  std::filesystem::remove(file);
  kf::log_init("evaluator", 3, file);
  kf::log_info("compiled ", 2, " candidates");
  kf::log_debug("hidden at info level");
  kf::log_init("main", 0);  // closes the file
  const std::string text = kf::read_file(file);
  EXPECT_NE(text.find(" I [evaluator:3 pid=" + std::to_string(::getpid()) + "] compiled 2 candidates"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("hidden"), std::string::npos);
  std::filesystem::remove(file);
}
