// Compact parameters: the init recipe C++ replays gives, bit for bit, the tensors Python's
// Model(*get_init_inputs()) made (the ones the golden outputs were computed from).
//
// The test imports tests/tasks/problems/params_roundtrip.py twice with tools/import-tasks,
// once with --params full (every tensor stored as Python made it) and once compact (the
// recipe, plus a forward-made constant in the params file), at both backends' sizes.
#include <ftw.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kf/common/run_dir.h"
#include "kf/tasks/tasks.h"

namespace fs = std::filesystem;
using namespace kf::tasks;

namespace {

void remove_tree(const std::string& dir) {  // not fs::remove_all: see task_artifact_test.cpp
  ::nftw(
      dir.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }, 16,
      FTW_DEPTH | FTW_PHYS);
}

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

// Imports the round-trip problem into <root>/full and <root>/compact once per test binary run.
class ParamsRecipeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("kf_params_recipe_" + std::to_string(::getpid()));
    remove_tree(root_);
    const std::string src = env_or("KF_SOURCE_DIR", KF_SOURCE_DIR_DEFAULT);
    const std::string py = env_or("KF_PYTHON", KF_PYTHON_DEFAULT);
    for (const char* mode : {"full", "compact"}) {
      const std::string cmd = py + " " + src + "/tasks/importer/kf_import.py " + src +
                              "/tests/tasks/problems/params_roundtrip.py --backends cpu,cuda --size cuda:batch_size=64"
                              " --params " +
                              mode + " --out " + root_ + "/" + mode + " > " + root_ + "." + mode + ".log 2>&1";
      status_ += std::system(cmd.c_str());
    }
  }
  static void TearDownTestSuite() {
    remove_tree(root_);
    ::remove((root_ + ".full.log").c_str());
    ::remove((root_ + ".compact.log").c_str());
  }
  void SetUp() override {
    ASSERT_EQ(status_, 0) << "tools/import-tasks failed; see " << root_
                          << ".{full,compact}.log: " << kf::read_file(root_ + ".compact.log");
  }
  static std::string dir(const std::string& mode) { return root_ + "/" + mode + "/params_roundtrip"; }
  static nlohmann::json meta(const std::string& mode) {
    return nlohmann::json::parse(kf::read_file(dir(mode) + "/task.json"));
  }
  static inline std::string root_;
  static inline int status_ = 0;
};

TEST_F(ParamsRecipeTest, CompactArtifactStoresARecipeAndOnlyTheForwardConstant) {
  for (const char* b : {"cpu", "cuda"}) {
    SCOPED_TRACE(b);
    const auto storage = meta("compact")["backends"][b]["params_storage"];
    EXPECT_EQ(storage.value("init", ""), std::string(b) + ".init.json");
    EXPECT_EQ(storage["file"].get<int>(), 1) << storage.dump();  // torch.tensor(-0.5) made in forward
    EXPECT_GE(storage["recipe"].get<int>(), 20) << storage.dump();
    const auto full = meta("full")["backends"][b]["params_storage"];
    EXPECT_FALSE(full.contains("init")) << full.dump();
    EXPECT_EQ(full["file"].get<int>(), storage["recipe"].get<int>() + 1);
  }
}

TEST_F(ParamsRecipeTest, RecipeReplayEqualsPythonInitBitForBitAtBothSizes) {
  auto compact = Task::load(dir("compact"));
  auto full = Task::load(dir("full"));
  const at::Device cpu(at::kCPU);
  for (Backend b : {Backend::CPU, Backend::CUDA}) {
    SCOPED_TRACE(backend_name(b));
    auto mine = compact->initial_params(b, cpu);
    auto python = full->initial_params(b, cpu);
    ASSERT_EQ(mine.size(), python.size());
    ASSERT_GE(mine.size(), 20u);
    for (std::size_t i = 0; i < mine.size(); ++i) {
      const std::string& name = compact->params(b)[i].name;
      EXPECT_EQ(name, full->params(b)[i].name);
      EXPECT_TRUE(at::equal(mine[i], python[i])) << name << " differs from Python's init";
    }
    // Distinct slots never share storage (set_params and re-draws replace them one by one).
    for (std::size_t i = 0; i < mine.size(); ++i)
      for (std::size_t j = i + 1; j < mine.size(); ++j)
        EXPECT_NE(mine[i].data_ptr(), mine[j].data_ptr()) << i << " " << j;
  }
}

TEST_F(ParamsRecipeTest, GoldenOutputsMatchWithRecipeParams) {
  auto t = Task::load(dir("compact"));
  GoldenResult g = check_golden(*t);
  EXPECT_TRUE(g.problem.empty()) << g.problem;
  EXPECT_TRUE(g.inputs_equal);
  EXPECT_EQ(g.max_rel_error, 0.0) << "C++ with recipe parameters must compute Python's golden outputs exactly";
}

TEST_F(ParamsRecipeTest, ADifferentSeedGivesOtherParams) {
  // The recipe really draws from its seed (a recipe of constants would pass the test above
  // only if Python's init were constant too).
  const std::string copy = root_ + "/seed1";
  fs::copy(dir("compact"), copy, fs::copy_options::recursive);
  auto j = nlohmann::json::parse(kf::read_file(copy + "/cpu.init.json"));
  j["seed"] = 1;
  std::ofstream(copy + "/cpu.init.json") << j.dump();
  auto a = Task::load(dir("compact"))->initial_params(Backend::CPU, at::Device(at::kCPU));
  auto b = Task::load(copy)->initial_params(Backend::CPU, at::Device(at::kCPU));
  int differ = 0;
  for (std::size_t i = 0; i < a.size(); ++i) differ += !at::equal(a[i], b[i]);
  EXPECT_GE(differ, 10);
}

TEST_F(ParamsRecipeTest, BrokenRecipeOrParamsFileNamesTheFile) {
  const std::string c1 = root_ + "/broken_init";
  fs::copy(dir("compact"), c1, fs::copy_options::recursive);
  auto j = nlohmann::json::parse(kf::read_file(c1 + "/cpu.init.json"));
  j["outputs"].erase(j["outputs"].begin());
  std::ofstream(c1 + "/cpu.init.json") << j.dump();
  try {
    Task::load(c1);
    ADD_FAILURE() << "an init recipe with too few outputs loaded";
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cpu.init.json"), std::string::npos) << e.what();
  }
  const std::string c2 = root_ + "/truncated";
  fs::copy(dir("full"), c2, fs::copy_options::recursive);
  fs::resize_file(c2 + "/cpu.params.safetensors", 20);
  try {
    Task::load(c2)->initial_params(Backend::CPU, at::Device(at::kCPU));
    ADD_FAILURE() << "a truncated params file loaded";
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cpu.params.safetensors"), std::string::npos) << e.what();
  }
}

}  // namespace
