// Bad artifacts give errors that name the file and the field; nothing crashes.
#include <ftw.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <ATen/Context.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>

#include "kf/common/run_dir.h"
#include "kf/tasks/tasks.h"

namespace fs = std::filesystem;
using namespace kf::tasks;

namespace {

// Not std::filesystem::remove_all: libtorch.so exports its own copy of that symbol, and
// calls from a torch-linked binary land there and crash (seen with torch 2.11 wheels).
void remove_tree(const std::string& dir) {
  ::nftw(
      dir.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }, 16,
      FTW_DEPTH | FTW_PHYS);
}

std::string some_task_dir() {
  const char* b = std::getenv("KF_BUILD_DIR");
  const std::string dir = std::string(b ? b : KF_BUILD_DIR_DEFAULT) + "/tasks";
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir))
    if (fs::exists(e.path() / "task.json")) names.push_back(e.path().string());
  std::sort(names.begin(), names.end());
  return names.at(0);
}

struct Copy {
  std::string dir;
  explicit Copy(const std::string& src) {
    dir = fs::temp_directory_path() / ("kf_task_copy_" + std::to_string(::getpid()));
    remove_tree(dir);
    fs::copy(src, dir, fs::copy_options::recursive);
  }
  ~Copy() { remove_tree(dir); }
  void edit_json(const std::string& file, const std::function<void(nlohmann::json&)>& f) {
    auto j = nlohmann::json::parse(kf::read_file(dir + "/" + file));
    f(j);
    std::ofstream(dir + "/" + file) << j.dump();
  }
};

std::string load_error(const std::string& dir, bool run = false) {
  try {
    auto t = Task::load(dir);
    if (run)
      t->new_reference(Backend::CPU, at::Device(at::kCPU))
          ->forward(t->make_inputs(Backend::CPU, 0, at::Device(at::kCPU)));
  } catch (const kf::Error& e) {
    return e.what();
  }
  return "";
}

TEST(TaskArtifactTest, MissingFolderOrFile) {
  EXPECT_NE(load_error("/nonexistent/task").find("/nonexistent/task"), std::string::npos);
  Copy c(some_task_dir());
  fs::remove(c.dir + "/cpu.graph.json");
  EXPECT_NE(load_error(c.dir).find("cpu.graph.json"), std::string::npos);
}

TEST(TaskArtifactTest, WrongFormatVersion) {
  Copy c(some_task_dir());
  c.edit_json("task.json", [](auto& j) { j["format"] = 99; });
  const std::string e = load_error(c.dir);
  EXPECT_NE(e.find("task.json"), std::string::npos) << e;
  EXPECT_NE(e.find("'format'"), std::string::npos) << e;
}

TEST(TaskArtifactTest, MalformedFieldsNameTheFile) {
  Copy c(some_task_dir());
  c.edit_json("task.json", [](auto& j) { j["backends"]["cpu"]["inputs"][0]["dtype"] = "float7"; });
  std::string e = load_error(c.dir);
  EXPECT_NE(e.find("backends.cpu.inputs[0].dtype"), std::string::npos) << e;
  Copy d(some_task_dir());
  d.edit_json("task.json", [](auto& j) { j.erase("mode"); });
  e = load_error(d.dir);
  EXPECT_NE(e.find("task.json"), std::string::npos) << e;
  EXPECT_NE(e.find("malformed artifact"), std::string::npos) << e;
}

TEST(TaskArtifactTest, UnknownOperatorIsReportedWithNode) {
  Copy c(some_task_dir());
  std::string node;
  c.edit_json("cpu.graph.json", [&](auto& j) {
    for (auto& n : j["nodes"])
      if (n.contains("op")) {
        n["op"] = "aten::no_such_op";
        node = n["name"];
        break;
      }
  });
  ASSERT_FALSE(node.empty());
  const std::string e = load_error(c.dir, true);
  EXPECT_NE(e.find("cpu.graph.json"), std::string::npos) << e;
  EXPECT_NE(e.find("node '" + node + "'"), std::string::npos) << e;
  EXPECT_NE(e.find("aten::no_such_op"), std::string::npos) << e;
}

// A truncated params file: ParamsRecipeTest.BrokenRecipeOrParamsFileNamesTheFile (params_recipe_test.cpp).

}  // namespace

// References compute in IEEE fp32 inside the scope whatever the process set (these are
// process flags: no GPU needed), nested and overlapping scopes from two threads keep it so
// until the last one ends, and then the process's own setting is back.
TEST(ExactFp32ScopeTest, TurnsTf32OffWhileAnyScopeLivesThenRestoresTheProcessSetting) {
  auto& ctx = at::globalContext();
  const bool cublas0 = ctx.allowTF32CuBLAS(), cudnn0 = ctx.allowTF32CuDNN();
  ctx.setAllowTF32CuBLAS(true);  // as tools/selfsup trains
  ctx.setAllowTF32CuDNN(true);   // torch's default
  {
    kf::tasks::ExactFp32Scope outer;
    EXPECT_FALSE(ctx.allowTF32CuBLAS());
    EXPECT_FALSE(ctx.allowTF32CuDNN());
    std::promise<void> entered, leave;
    std::thread other([&] {
      kf::tasks::ExactFp32Scope inner;
      entered.set_value();
      leave.get_future().wait();
    });
    entered.get_future().wait();
    { kf::tasks::ExactFp32Scope nested; }
    EXPECT_FALSE(ctx.allowTF32CuBLAS()) << "a nested scope ended, two still live";
    leave.set_value();
    other.join();
    EXPECT_FALSE(ctx.allowTF32CuDNN()) << "the other thread's scope ended, the outer one lives";
  }
  EXPECT_TRUE(ctx.allowTF32CuBLAS());
  EXPECT_TRUE(ctx.allowTF32CuDNN());
  ctx.setAllowTF32CuDNN(false);
  { kf::tasks::ExactFp32Scope s; }
  EXPECT_TRUE(ctx.allowTF32CuBLAS());
  EXPECT_FALSE(ctx.allowTF32CuDNN()) << "restored to what the process had, not to a default";
  ctx.setAllowTF32CuBLAS(cublas0);
  ctx.setAllowTF32CuDNN(cudnn0);
}
