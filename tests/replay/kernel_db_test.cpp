// KernelDb: dedup, best-per-task, bucketed exemplars (CUDA-L1), per-task caps,
// seeding from files, persistence, and a process killed mid-insert.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "kf/common/error.h"
#include "kf/common/run_dir.h"
#include "kf/replay/replay.h"
#include "proc_util.h"

using namespace kf::replay;
using namespace kf::replay::test;

namespace {
struct ReplayKernelDbTest : ::testing::Test {
  std::string name = unique_name(::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::string dir = "/tmp/" + name;
  void SetUp() override { std::filesystem::create_directories(dir); }
  void TearDown() override {
    ShmSegment::remove(name);
    std::filesystem::remove_all(dir);
  }
};
KernelEntry k(const std::string& task, double speedup, const std::string& src, int64_t version = 1) {
  return KernelEntry{task, speedup, version, src, 0};
}
}  // namespace

TEST_F(ReplayKernelDbTest, IdenticalSourcesAreStoredOnce) {
  KernelDb db = KernelDb::create(name, KernelDbConfig{64, 4096, 16});
  EXPECT_EQ(db.insert(k("relu", 1.2, "src A")), InsertOutcome::inserted);
  EXPECT_EQ(db.insert(k("relu", 1.9, "src A")), InsertOutcome::duplicate);
  EXPECT_EQ(db.insert(k("gelu", 1.0, "src A")), InsertOutcome::inserted);  // dedup is per task
  EXPECT_EQ(db.insert(k("relu", 1.1, "src B")), InsertOutcome::inserted);
  EXPECT_EQ(db.entries("relu").size(), 2u);
  EXPECT_EQ(db.stats().duplicates, 1u);
  EXPECT_EQ(db.tasks(), (std::vector<std::string>{"gelu", "relu"}));
  EXPECT_THROW(db.insert(k("", 1.0, "x")), kf::Error);
  EXPECT_EQ(db.insert(k("relu", 1.0, std::string(5000, 'x'))), InsertOutcome::too_large);
}

TEST_F(ReplayKernelDbTest, BestKernelPerTask) {
  KernelDb db = KernelDb::create(name, KernelDbConfig{64, 4096, 16});
  EXPECT_FALSE(db.best("relu").has_value());
  db.insert(k("relu", 1.2, "a", 3));
  db.insert(k("relu", 2.5, "b", 7));
  db.insert(k("relu", 0.8, "c", 9));
  db.insert(k("conv", 9.0, "d"));
  auto best = db.best("relu");
  ASSERT_TRUE(best.has_value());
  EXPECT_EQ(best->source, "b");
  EXPECT_DOUBLE_EQ(best->speedup, 2.5);
  EXPECT_EQ(best->policy_version, 7);
}

TEST_F(ReplayKernelDbTest, ExemplarsComeFromEachPerformanceBucket) {
  KernelDb db = KernelDb::create(name, KernelDbConfig{64, 4096, 64});
  for (int i = 0; i < 20; ++i) db.insert(k("mm", 0.1 * (i + 1), "kernel " + std::to_string(i)));
  auto ex = db.exemplars("mm", 4, 42);
  ASSERT_EQ(ex.size(), 4u);
  for (int b = 0; b < 4; ++b) {  // bucket b holds speedups 0.1*(5b+1) .. 0.1*(5b+5)
    EXPECT_GE(ex[b].speedup, 0.1 * (5 * b + 1) - 1e-9) << "bucket " << b;
    EXPECT_LE(ex[b].speedup, 0.1 * (5 * b + 5) + 1e-9) << "bucket " << b;
  }
  auto again = db.exemplars("mm", 4, 42);
  for (int b = 0; b < 4; ++b) EXPECT_EQ(again[b].source, ex[b].source) << "same seed, same pick";
  bool differs = false;
  for (uint64_t seed = 1; seed < 20 && !differs; ++seed) {
    auto other = db.exemplars("mm", 4, seed);
    for (int b = 0; b < 4; ++b) differs |= other[b].source != ex[b].source;
  }
  EXPECT_TRUE(differs) << "the pick within a bucket should depend on the seed";
  EXPECT_EQ(db.exemplars("mm", 30, 1).size(), 20u);
  EXPECT_TRUE(db.exemplars("none", 4, 1).empty());
}

TEST_F(ReplayKernelDbTest, FullTaskKeepsTheFastestAndFullTableEvictsTheBiggestTask) {
  KernelDb db = KernelDb::create(name, KernelDbConfig{4, 4096, 3});
  db.insert(k("a", 1.0, "a1"));
  db.insert(k("a", 2.0, "a2"));
  db.insert(k("a", 3.0, "a3"));
  EXPECT_EQ(db.insert(k("a", 0.5, "a0")), InsertOutcome::rejected_slower);
  EXPECT_EQ(db.insert(k("a", 4.0, "a4")), InsertOutcome::inserted);  // replaces a1
  EXPECT_EQ(db.entries("a").front().source, "a2");
  db.insert(k("b", 1.0, "b1"));                                      // table now full (4)
  EXPECT_EQ(db.insert(k("c", 1.0, "c1")), InsertOutcome::inserted);  // evicts a's slowest (a2)
  EXPECT_EQ(db.entries("a").size(), 2u);
  EXPECT_EQ(db.entries("a").front().source, "a3");
  EXPECT_EQ(db.stats().evicted, 2u);
}

TEST_F(ReplayKernelDbTest, SeedsFromFiles) {
  std::filesystem::create_directories(dir + "/seed/relu");
  std::filesystem::create_directories(dir + "/seed/softmax");
  std::ofstream(dir + "/seed/relu/fast.cu") << "__global__ void relu_fast() {}";
  std::ofstream(dir + "/seed/relu/fast.json") << R"({"speedup": 2.5})";
  std::ofstream(dir + "/seed/relu/plain.cpp") << "void relu() {}";
  std::ofstream(dir + "/seed/softmax/s.cu") << "__global__ void s() {}";
  std::ofstream(dir + "/seed/softmax/notes.txt") << "ignored";
  KernelDb db = KernelDb::create(name, KernelDbConfig{64, 4096, 16});
  EXPECT_EQ(db.seed_from_dir(dir + "/seed"), 3u);
  EXPECT_EQ(db.best("relu")->source, "__global__ void relu_fast() {}");
  EXPECT_EQ(db.best("relu")->policy_version, -1);
  EXPECT_DOUBLE_EQ(db.best("softmax")->speedup, 1.0);
  std::ofstream(dir + "/seed/relu/fast.json", std::ios::trunc) << R"({"speedup": "fast"})";
  try {
    db.seed_from_dir(dir + "/seed");
    FAIL();
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("fast.json: field speedup"), std::string::npos) << e.what();
  }
}

TEST_F(ReplayKernelDbTest, PersistenceRoundTripAndBadFilesRejected) {
  const std::string file = dir + "/kernel_db.json";
  {
    KernelDb db = KernelDb::create(name, KernelDbConfig{64, 4096, 16});
    db.insert(k("relu", 1.5, "x \"quoted\"\n\tsrc", 4));
    db.insert(k("gemm", 3.0, "gemm src", 8));
    db.save(file);
  }
  ShmSegment::remove(name);
  KernelDb db = KernelDb::create(name, KernelDbConfig{64, 4096, 16});
  EXPECT_EQ(db.load(file), 2u);
  EXPECT_EQ(db.best("relu")->source, "x \"quoted\"\n\tsrc");
  EXPECT_EQ(db.best("gemm")->policy_version, 8);
  EXPECT_EQ(db.load(file), 2u);  // loading twice: dedup keeps one copy
  EXPECT_EQ(db.stats().entries, 2u);

  std::string good = kf::read_file(file);
  auto expect_error = [&](const std::string& content, const std::string& needle) {
    std::ofstream(file, std::ios::trunc) << content;
    try {
      db.load(file);
      FAIL() << "accepted: " << needle;
    } catch (const kf::Error& e) {
      EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  std::string tampered = good;
  tampered.replace(tampered.find("gemm src"), 8, "GEMM SRC");
  expect_error(tampered, "field hash");
  std::string v2 = good;
  v2.replace(v2.find("\"version\": 1"), 12, "\"version\": 2");
  expect_error(v2, "field version");
  expect_error("{", "not valid JSON");
  std::string bad_speedup = good;
  bad_speedup.replace(bad_speedup.find("\"speedup\": 3.0"), 14, "\"speedup\": \"x\"");
  expect_error(bad_speedup, "entries[");
  EXPECT_EQ(db.stats().entries, 2u) << "failed loads must not touch what is stored";
}

TEST_F(ReplayKernelDbTest, ProcessKilledMidInsertLeavesNoHalfEntry) {
  KernelDb db = KernelDb::create(name, KernelDbConfig{64, 4096, 16});
  db.insert(k("relu", 1.0, "old"));
  Staller st;
  pid_t evaluator = spawn([&] {
    KernelDb mine = KernelDb::attach(name);
    st.arm("kdb.insert_mid");
    mine.insert(k("relu", 5.0, "new kernel source, half written"));
    return 0;
  });
  ASSERT_TRUE(st.wait_stalled());
  kill_and_wait(evaluator);
  EXPECT_EQ(db.entries("relu").size(), 1u);  // recovers the lock; the half entry is invisible
  EXPECT_EQ(db.best("relu")->source, "old");
  EXPECT_EQ(db.stats().recoveries, 1u);
  EXPECT_EQ(db.insert(k("relu", 5.0, "new kernel source, half written")), InsertOutcome::inserted);
  EXPECT_EQ(db.best("relu")->speedup, 5.0);
}
