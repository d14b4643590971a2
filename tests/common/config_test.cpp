#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "kf/common/config.h"
#include "kf/common/error.h"

namespace {

using kf::Config;
using kf::ConfigKey;
using kf::ConfigType;

// A schema of our own, so the tests do not depend on which keys components declare.
const std::vector<ConfigKey>& test_schema() {
  static const std::vector<ConfigKey> s = {
      {"learner.lr", ConfigType::Float, "0.001", false, {}, ""},
      {"learner.batch", ConfigType::Int, "", true, {}, ""},
      {"learner.sched.kind", ConfigType::String, "cosine", false, {"cosine", "constant"}, ""},
      {"actors.count", ConfigType::Int, "2", false, {}, ""},
      {"actors.gpu", ConfigType::Bool, "false", false, {}, ""},
      {"tasks.levels", ConfigType::IntList, "[1, 2]", false, {}, ""},
      {"tasks.names", ConfigType::StringList, "[]", false, {}, ""},
  };
  return s;
}

std::string error_of(const std::string& yaml, const std::vector<std::string>& sets = {}) {
  try {
    Config::parse(yaml, "configs/x.yaml", sets, test_schema());
  } catch (const kf::Error& e) {
    return e.what();
  }
  return "";
}

TEST(ConfigTest, LoadsTypedValuesAndFillsDefaults) {
  Config c = Config::parse("learner:\n  batch: 8\n  lr: 3e-4\ntasks:\n  names: [a, b]\n", "x.yaml", {}, test_schema());
  EXPECT_EQ(c.get_int("learner.batch"), 8);
  EXPECT_DOUBLE_EQ(c.get_float("learner.lr"), 3e-4);
  EXPECT_EQ(c.get_string("learner.sched.kind"), "cosine");
  EXPECT_EQ(c.get_int("actors.count"), 2);
  EXPECT_FALSE(c.get_bool("actors.gpu"));
  EXPECT_EQ(c.get_ints("tasks.levels"), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(c.get_strings("tasks.names"), (std::vector<std::string>{"a", "b"}));
}

TEST(ConfigTest, UnknownKeyNamesFileAndFullPath) {
  const std::string e = error_of("learner:\n  batch: 8\n  sched:\n    knd: cosine\n");
  EXPECT_NE(e.find("configs/x.yaml"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown key 'learner.sched.knd'"), std::string::npos) << e;
}

TEST(ConfigTest, UnknownSectionIsAnError) {
  EXPECT_NE(error_of("learner:\n  batch: 1\nlernr:\n  lr: 1\n").find("unknown key 'lernr'"), std::string::npos);
}

TEST(ConfigTest, WrongTypeNamesKeyAndExpectedType) {
  std::string e = error_of("learner:\n  batch: eight\n");
  EXPECT_NE(e.find("configs/x.yaml"), std::string::npos) << e;
  EXPECT_NE(e.find("'learner.batch' expects an integer"), std::string::npos) << e;
  e = error_of("learner:\n  batch: 1.5\n");
  EXPECT_NE(e.find("'learner.batch' expects an integer"), std::string::npos) << e;
  e = error_of("learner:\n  batch: 1\nactors:\n  gpu: maybe\n");
  EXPECT_NE(e.find("'actors.gpu' expects true or false"), std::string::npos) << e;
  e = error_of("learner:\n  batch: 1\ntasks:\n  levels: [1, x]\n");
  EXPECT_NE(e.find("'tasks.levels' element 1 expects an integer"), std::string::npos) << e;
  e = error_of("learner:\n  batch: 1\n  sched: 3\n");
  EXPECT_NE(e.find("'learner.sched' is a section"), std::string::npos) << e;
}

TEST(ConfigTest, ValueOutsideChoicesIsAnError) {
  const std::string e = error_of("learner:\n  batch: 1\n  sched:\n    kind: linear\n");
  EXPECT_NE(e.find("'learner.sched.kind' must be one of {cosine, constant}"), std::string::npos) << e;
}

TEST(ConfigTest, MissingRequiredKeyIsAnError) {
  const std::string e = error_of("actors:\n  count: 3\n");
  EXPECT_NE(e.find("configs/x.yaml"), std::string::npos) << e;
  EXPECT_NE(e.find("missing required key 'learner.batch'"), std::string::npos) << e;
}

TEST(ConfigTest, OverridesApplyAndAreValidated) {
  Config c = Config::parse("learner:\n  batch: 8\n", "x.yaml", {"learner.batch=16", "tasks.levels=[3]"}, test_schema());
  EXPECT_EQ(c.get_int("learner.batch"), 16);
  EXPECT_EQ(c.get_ints("tasks.levels"), (std::vector<int64_t>{3}));
  // A required key may come from --set alone.
  EXPECT_EQ(Config::parse("", "x.yaml", {"learner.batch=4"}, test_schema()).get_int("learner.batch"), 4);
  std::string e = error_of("learner:\n  batch: 8\n", {"learner.bach=3"});
  EXPECT_NE(e.find("--set learner.bach=3"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown key 'learner.bach'"), std::string::npos) << e;
  e = error_of("learner:\n  batch: 8\n", {"learner.batch=big"});
  EXPECT_NE(e.find("'learner.batch' expects an integer"), std::string::npos) << e;
  e = error_of("learner:\n  batch: 8\n", {"novalue"});
  EXPECT_NE(e.find("expects key.path=value"), std::string::npos) << e;
}

TEST(ConfigTest, InvalidYamlAndMissingFileNameTheFile) {
  EXPECT_NE(error_of("learner: [unclosed\n").find("not valid YAML"), std::string::npos);
  try {
    Config::load("/nonexistent/cfg.yaml");
    FAIL() << "expected an error";
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/cfg.yaml"), std::string::npos);
  }
}

TEST(ConfigTest, ResolvedYamlRoundTrips) {
  Config c = Config::parse("learner:\n  batch: 8\n", "x.yaml", {"tasks.names=[p, q]"}, test_schema());
  Config again = Config::parse(c.to_yaml(), "resolved.yaml", {}, test_schema());
  EXPECT_EQ(again.to_yaml().substr(again.to_yaml().find('\n')), c.to_yaml().substr(c.to_yaml().find('\n')));
  EXPECT_EQ(again.get_strings("tasks.names"), (std::vector<std::string>{"p", "q"}));
  EXPECT_EQ(again.get_int("learner.batch"), 8);
}

// Numbers are saved as written (the shortest text that reads back as the same double).
TEST(ConfigTest, ResolvedYamlWritesFloatsAsWritten) {
  for (const char* v : {"0.2", "1.0e-05", "3.0", "0.1", "123456.789", "2.5e-07", "-0.75"}) {
    Config c = Config::parse(std::string("learner:\n  batch: 8\n  lr: ") + v + "\n", "x.yaml", {}, test_schema());
    const std::string y = c.to_yaml();
    const std::string line = y.substr(y.find("lr: ") + 4, y.find('\n', y.find("lr: ")) - y.find("lr: ") - 4);
    EXPECT_EQ(std::stod(line), std::stod(v)) << line;
    EXPECT_LE(line.size(), std::string(v).size() + 1) << v << " saved as " << line;
    EXPECT_EQ(Config::parse(y, "resolved.yaml", {}, test_schema()).get_float("learner.lr"), std::stod(v)) << line;
  }
  Config c = Config::parse("learner:\n  batch: 8\n  lr: 0.2\n", "x.yaml", {}, test_schema());
  EXPECT_NE(c.to_yaml().find("lr: 0.2\n"), std::string::npos) << c.to_yaml();
  // Python's YAML reader (tools/report) sees floats, not strings.
  c = Config::parse("learner:\n  batch: 8\n  lr: 1e-5\n", "x.yaml", {}, test_schema());
  EXPECT_NE(c.to_yaml().find("lr: 1.0e-05\n"), std::string::npos) << c.to_yaml();
}

TEST(ConfigTest, ProgramReadingWrongTypeIsAnError) {
  Config c = Config::parse("learner:\n  batch: 8\n", "x.yaml", {}, test_schema());
  EXPECT_THROW(c.get_string("learner.batch"), kf::Error);
  EXPECT_THROW(c.get_int("learner.nothing"), kf::Error);
}

TEST(ConfigTest, ShippedConfigsLoadAgainstTheRealSchema) {
  const char* env = std::getenv("KF_SOURCE_DIR");
  const std::string src = env ? env : KF_SOURCE_DIR_DEFAULT;
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(src + "/configs")) {
    if (e.path().extension() != ".yaml") continue;
    EXPECT_NO_THROW(Config::load(e.path().string())) << e.path();
    ++n;
  }
  EXPECT_GE(n, 1);
}

// Every numeric key of the real schema has a range where a value outside it is
// meaningless; a negative limit, a zero count or a zero interval is rejected naming the key.
std::string real_error(const std::string& set) {
  try {
    Config::parse("run: {name: x}\n", "configs/x.yaml", {set});
  } catch (const kf::Error& e) {
    return e.what();
  }
  return "";
}

TEST(ConfigTest, NumericKeysOutsideTheirRangeAreRejectedNamingTheKey) {
  for (const char* set :
       {"launch.max_minutes=-1", "launch.restart_backoff_s=-0.5", "learner.steps=-3", "learner.checkpoint.every=-1",
        "learner.checkpoint.keep=0", "launch.hang_timeout_s=0", "actors.count=0", "actors.group_size=0",
        "evaluator.trials=0", "replay.groups.capacity=0", "learner.optim.beta1=1.5", "actors.sampling.top_p=0",
        "launch.max_restarts=-1", "evaluator.gpu_memory_fraction=2", "learner.dist.ranks=0"}) {
    const std::string key = std::string(set).substr(0, std::string(set).find('='));
    const std::string err = real_error(set);
    EXPECT_NE(err.find("'" + key + "' must be"), std::string::npos) << set << ": " << err;
  }
  // The edges stay allowed: 0 minutes (no cap), 0 steps (until the run stops), backoff 0.
  for (const char* set : {"launch.max_minutes=0", "learner.steps=0", "launch.restart_backoff_s=0",
                          "learner.checkpoint.every=0", "actors.sampling.top_p=1", "learner.temperature=0"})
    EXPECT_EQ(real_error(set), "") << set;
  // A YAML file is checked the same way, and a non-finite number is no number.
  try {
    Config::parse("launch:\n  max_minutes: -5\n", "configs/neg.yaml");
    FAIL() << "negative launch.max_minutes accepted";
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("configs/neg.yaml"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("launch.max_minutes"), std::string::npos) << e.what();
  }
  EXPECT_NE(real_error("launch.max_minutes=.nan"), "");
  // Every schema default lies in its own range.
  EXPECT_NO_THROW(Config::parse("", "defaults"));
}

TEST(ConfigTest, FileKeysCountsOnlyWhatTheFileSets) {
  EXPECT_EQ(Config::parse("", "empty.yaml", {"learner.batch=4"}, test_schema()).file_keys(), 0u);
  EXPECT_EQ(Config::parse("# only a comment\n", "c.yaml", {"learner.batch=4"}, test_schema()).file_keys(), 0u);
  EXPECT_EQ(Config::parse("learner: {batch: 8, lr: 0.1}\n", "x.yaml", {}, test_schema()).file_keys(), 2u);
}

}  // namespace

namespace {
// A real config file in `dir`, loaded against the real schema.
Config load_at(const std::string& dir, const std::string& yaml, const std::vector<std::string>& sets = {}) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/c.yaml") << yaml;
  return Config::load(dir + "/c.yaml", sets);
}
struct ScopedEnv {
  std::string name;
  ScopedEnv(const char* n, const std::string& v) : name(n) { ::setenv(n, v.c_str(), 1); }
  ~ScopedEnv() { ::unsetenv(name.c_str()); }
};
}  // namespace

// Relative paths do not depend on the working directory: defaults and a config inside the
// tree resolve against the tree, a config elsewhere against its folder, --set against the
// working directory; absolute paths and shape names stay as written.
TEST(ConfigTest, RelativePathsResolveAgainstTheTreeOrTheConfigFile) {
  const std::string tmp =
      std::filesystem::temp_directory_path().string() + "/kf-cfgpaths-" + std::to_string(::getpid());
  const std::string tree = tmp + "/tree", outside = tmp + "/elsewhere";
  std::filesystem::create_directories(tree + "/configs");
  ScopedEnv src("KF_SOURCE_DIR", tree);

  Config in_tree = load_at(tree + "/configs",
                           "tasks: {dir: my/tasks, heldout: tasks/heldout.txt}\n"
                           "learner: {policy: policies/default, init_shape: configs/shapes/x.json}\n");
  EXPECT_EQ(in_tree.get_string("tasks.dir"), tree + "/my/tasks");
  EXPECT_EQ(in_tree.get_string("tasks.heldout"), tree + "/tasks/heldout.txt");
  EXPECT_EQ(in_tree.get_string("learner.policy"), tree + "/policies/default");
  EXPECT_EQ(in_tree.get_string("learner.init_shape"), tree + "/configs/shapes/x.json");
  EXPECT_EQ(in_tree.get_string("run.root"), tree + "/runs");  // a default
  EXPECT_EQ(in_tree.get_string("actors.prompt.template"), tree + "/configs/prompts/contrastive.txt");

  Config other = load_at(outside, "tasks: {dir: my/tasks}\nlearner: {policy: /abs/model, init_shape: tiny}\n");
  EXPECT_EQ(other.get_string("tasks.dir"), outside + "/my/tasks");
  EXPECT_EQ(other.get_string("learner.policy"), "/abs/model");
  EXPECT_EQ(other.get_string("learner.init_shape"), "tiny");
  EXPECT_EQ(other.get_string("tasks.heldout"), "");  // empty means none, not a folder
  EXPECT_EQ(other.get_string("run.root"), tree + "/runs");

  Config set = load_at(outside, "run: {name: x}\n", {"tasks.dir=cli/tasks"});
  EXPECT_EQ(set.get_string("tasks.dir"), std::filesystem::current_path().string() + "/cli/tasks");

  // The saved config holds the absolute paths, so a resumed run finds the same folders.
  Config again = Config::parse(in_tree.to_yaml(), "resolved.yaml");
  EXPECT_EQ(again.get_string("tasks.dir"), tree + "/my/tasks");
  std::filesystem::remove_all(tmp);
}
