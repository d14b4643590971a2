// Helpers for the learner tests: temp folders, child processes, tool paths.
#pragma once
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <fcntl.h>
#include <ftw.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../test_support.h"

extern char** environ;

namespace kf::learner::test {

using kf::test::env_or;
using kf::test::python;
using kf::test::source_dir;
inline std::string learner_bin() { return KF_LEARNER_BIN_DEFAULT; }
inline std::string export_bin() { return KF_EXPORT_BIN_DEFAULT; }

using kf::test::remove_tree;
struct TempDir : kf::test::TempDir {
  TempDir() : kf::test::TempDir("learner-test") {}
};
inline void write_text(const std::string& path, const std::string& text) { kf::test::write_file(path, text); }
inline std::string read_text(const std::string& path) { return kf::test::read_file(path); }

using kf::test::spawn;
using kf::test::wait_exit;
inline int run(const std::vector<std::string>& args, const std::string& log) {
  const pid_t pid = spawn(args, log);
  return pid < 0 ? -1 : wait_exit(pid);
}

}  // namespace kf::learner::test

namespace kf::learner::test {
// One intra-op thread in the tests and in every process they start: this 2-core CI
// machine runs several test processes at once, and OpenMP spin-waiting across
// oversubscribed cores made a 25 ms step take 500 ms. Results do not depend on it.
struct OneThreadEnvironment : ::testing::Environment {
  void SetUp() override {
    ::setenv("OMP_NUM_THREADS", "1", 1);
    torch::set_num_threads(1);
  }
};
}  // namespace kf::learner::test
