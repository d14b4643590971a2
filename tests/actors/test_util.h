// Helpers shared by the actor tests: paths, temp dirs, tiny models, the imported task.
#pragma once
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "kf/actors/actor_policy.h"
#include "kf/tasks/task.h"

namespace kf::actors::test {

inline std::string env_or(const char* name, const std::string& dflt) {
  const char* v = std::getenv(name);
  return v && *v ? v : dflt;
}
inline std::string source_dir() { return env_or("KF_SOURCE_DIR", KF_SOURCE_DIR_DEFAULT); }
inline std::string build_dir() { return env_or("KF_BUILD_DIR", KF_BUILD_DIR_DEFAULT); }
inline bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}
// The imported suite: $KF_TASKS_DIR, else <build>/tasks, else the tree's build/tasks.
inline std::string tasks_dir() {
  for (const std::string& d : {env_or("KF_TASKS_DIR", ""), build_dir() + "/tasks", source_dir() + "/build/tasks"})
    if (!d.empty() && exists(d + "/001_relu/task.json")) return d;
  return "";
}
inline std::shared_ptr<const tasks::Task> relu_task() {
  const auto d = tasks_dir();
  return d.empty() ? nullptr : tasks::Task::load(d + "/001_relu");
}
#define KF_NEED_TASKS()                                                                       \
  do {                                                                                        \
    if (::kf::actors::test::tasks_dir().empty())                                              \
      GTEST_SKIP() << "task 001_relu is not imported (run setup.sh or set KF_TASKS_DIR)";     \
  } while (0)

// Not std::filesystem::remove_all: libtorch.so exports its own copy of that symbol.
inline void remove_tree(const std::string& dir) {
  ::nftw(dir.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }, 16,
         FTW_DEPTH | FTW_PHYS);
}
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/kf-actors-test-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { remove_tree(path); }
};
inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}
inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A tiny byte-level model (the "tiny" init shape), seeded.
inline ActorPolicy tiny_policy(uint64_t seed, int64_t hidden = 64) {
  auto c = init_shape_config("tiny");
  c.hidden_size = hidden;
  c.head_dim = hidden / c.num_attention_heads;
  policy::CausalLM m(c, torch::TensorOptions().dtype(torch::kFloat32));
  m->init_random(seed);
  return make_actor_policy(m, nullptr);
}

// A unique run name for shared memory.
inline std::string run_name(const std::string& tag) {
  return "kfat" + tag + std::to_string(::getpid());
}

}  // namespace kf::actors::test
