#include "kf/common/config.h"

#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cstdlib>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "kf/common/error.h"

namespace kf {
namespace {

// Keys that name files or folders. A relative value is resolved when the config is loaded,
// so a run works from any working directory and its saved config.yaml holds absolute paths:
// defaults and values in a config file inside the repository against the repository, a
// config file elsewhere against its own folder, --set values against the working directory.
const char* const kPathKeys[] = {"run.root",
                                 "tasks.dir",
                                 "tasks.heldout",
                                 "actors.prompt.template",
                                 "actors.prompt.abi_header",
                                 "actors.prompt.feedback",
                                 "learner.policy",
                                 "learner.init_shape"};

std::string source_tree() {
  if (const char* e = std::getenv("KF_SOURCE_DIR"); e && *e) return e;
  return KF_SOURCE_DIR_BUILT;
}

std::string absolute_dir(const std::string& p) {
  char buf[PATH_MAX];
  return ::realpath(p.c_str(), buf) ? std::string(buf) : p;
}

std::string cwd() {
  char buf[PATH_MAX];
  return ::getcwd(buf, sizeof buf) ? std::string(buf) : std::string(".");
}

// learner.init_shape is a shape name ("tiny") or a config.json path.
bool names_a_path(const std::string& key, const std::string& v) {
  if (v.empty() || v[0] == '/') return false;
  if (key == "learner.init_shape")
    return v.find('/') != std::string::npos || v.size() > 5 && v.substr(v.size() - 5) == ".json";
  return true;
}

const char* type_name(ConfigType t) {
  switch (t) {
    case ConfigType::Int:
      return "an integer";
    case ConfigType::Float:
      return "a number";
    case ConfigType::Bool:
      return "a boolean";
    case ConfigType::String:
      return "a string";
    case ConfigType::IntList:
      return "a list of integers";
    case ConfigType::StringList:
      return "a list of strings";
  }
  return "?";
}

const ConfigKey* find_key(const std::vector<ConfigKey>& schema, const std::string& path) {
  for (const ConfigKey& k : schema)
    if (k.path == path) return &k;
  return nullptr;
}

bool is_section(const std::vector<ConfigKey>& schema, const std::string& path) {
  const std::string prefix = path + ".";
  for (const ConfigKey& k : schema)
    if (k.path.compare(0, prefix.size(), prefix) == 0) return true;
  return false;
}

template <typename V>
bool scalar_as(const YAML::Node& n, V& out) {
  if (!n.IsScalar()) return false;
  try {
    out = n.as<V>();
    return true;
  } catch (const YAML::Exception&) {
    return false;
  }
}

bool scalar_is_int(const YAML::Node& n) {
  int64_t v;
  if (!scalar_as(n, v)) return false;
  // yaml-cpp accepts "1.0" as int on some versions; require digits only.
  const std::string& s = n.Scalar();
  return s.find_first_of(".eE") == std::string::npos;
}

std::string number_text(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

template <typename Fail>
void check_range(const ConfigKey& key, double v, const std::string& text, const Fail& fail) {
  const bool low = key.min_open ? !(v > key.min) : v < key.min;
  if (!low && !(v > key.max)) return;
  std::string range;
  if (std::isfinite(key.min)) range = (key.min_open ? "> " : ">= ") + number_text(key.min);
  if (std::isfinite(key.max)) range += (range.empty() ? "<= " : " and <= ") + number_text(key.max);
  throw fail("must be " + range + ", got '" + text + "'");
}

// Checks `value` against `key` and returns its canonical YAML text. Throws naming `where`.
std::string validate_value(const ConfigKey& key, const YAML::Node& value, const std::string& where) {
  auto fail = [&](const std::string& what) -> Error { return error_at(where, "key '" + key.path + "' " + what); };
  YAML::Emitter out;
  out.SetSeqFormat(YAML::Flow);
  switch (key.type) {
    case ConfigType::Int: {
      int64_t v;
      if (!scalar_is_int(value) || !scalar_as(value, v))
        throw fail("expects an integer, got '" + YAML::Dump(value) + "'");
      check_range(key, static_cast<double>(v), YAML::Dump(value), fail);
      out << v;
      break;
    }
    case ConfigType::Float: {
      double v;
      if (!scalar_as(value, v)) throw fail("expects a number, got '" + YAML::Dump(value) + "'");
      if (!std::isfinite(v)) throw fail("expects a finite number, got '" + YAML::Dump(value) + "'");
      check_range(key, v, YAML::Dump(value), fail);
      // The shortest text that reads back as the same double: a saved config shows 0.2 as
      // written, not 0.20000000000000001.
      char buf[64];
      const auto r = std::to_chars(buf, buf + sizeof buf, v);
      std::string text(buf, r.ptr);
      // A '.' in the mantissa keeps it a float for every YAML reader (PyYAML reads "1e-05"
      // as a string): 3 -> 3.0, 1e-05 -> 1.0e-05.
      const std::size_t e = text.find_first_of("eE");
      if (text.find('.') == std::string::npos) text.insert(e == std::string::npos ? text.size() : e, ".0");
      return text;
    }
    case ConfigType::Bool: {
      bool v;
      if (!scalar_as(value, v)) throw fail("expects true or false, got '" + YAML::Dump(value) + "'");
      out << v;
      break;
    }
    case ConfigType::String: {
      if (!value.IsScalar())
        throw fail("expects a string, got " + std::string(value.IsSequence() ? "a list" : "a map"));
      const std::string v = value.Scalar();
      if (!key.choices.empty()) {
        bool ok = false;
        std::string all;
        for (const auto& c : key.choices) {
          ok = ok || c == v;
          all += (all.empty() ? "" : ", ") + c;
        }
        if (!ok) throw fail("must be one of {" + all + "}, got '" + v + "'");
      }
      out << YAML::DoubleQuoted << v;
      break;
    }
    case ConfigType::IntList:
    case ConfigType::StringList: {
      if (!value.IsSequence())
        throw fail(std::string("expects ") + type_name(key.type) + ", got '" + YAML::Dump(value) + "'");
      out << YAML::BeginSeq;
      for (std::size_t i = 0; i < value.size(); ++i) {
        const YAML::Node& e = value[i];
        if (key.type == ConfigType::IntList) {
          int64_t v;
          if (!scalar_is_int(e) || !scalar_as(e, v))
            throw fail("element " + std::to_string(i) + " expects an integer, got '" + YAML::Dump(e) + "'");
          out << v;
        } else {
          if (!e.IsScalar()) throw fail("element " + std::to_string(i) + " expects a string");
          out << YAML::DoubleQuoted << e.Scalar();
        }
      }
      out << YAML::EndSeq;
      break;
    }
  }
  return out.c_str();
}

void walk(const std::vector<ConfigKey>& schema, const YAML::Node& node, const std::string& prefix,
          const std::string& where, std::map<std::string, std::string>& values) {
  for (auto it = node.begin(); it != node.end(); ++it) {
    const std::string name = it->first.as<std::string>();
    const std::string path = prefix.empty() ? name : prefix + "." + name;
    const YAML::Node& child = it->second;
    if (const ConfigKey* key = find_key(schema, path)) {
      values[path] = validate_value(*key, child, where);
    } else if (is_section(schema, path)) {
      if (!child.IsMap()) throw error_at(where, "key '" + path + "' is a section and expects a map of keys");
      walk(schema, child, path, where, values);
    } else {
      throw error_at(where, "unknown key '" + path + "'");
    }
  }
}

}  // namespace

Config Config::load(const std::string& file, const std::vector<std::string>& overrides,
                    const std::vector<ConfigKey>& schema) {
  std::ifstream in(file);
  if (!in) throw error_at(file, "cannot open config file");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse(ss.str(), file, overrides, schema);
}

Config Config::parse(const std::string& yaml_text, const std::string& source_name,
                     const std::vector<std::string>& overrides, const std::vector<ConfigKey>& schema) {
  Config cfg;
  cfg.source_ = source_name;
  cfg.schema_ = &schema;
  std::set<std::string> from_set, from_default;
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    throw error_at(source_name, std::string("not valid YAML: ") + e.what());
  }
  if (root.IsDefined() && !root.IsNull()) {
    if (!root.IsMap()) throw error_at(source_name, "top level must be a map of sections");
    walk(schema, root, "", source_name, cfg.values_);
    cfg.file_keys_ = cfg.values_.size();
  }
  for (const std::string& ov : overrides) {
    const auto eq = ov.find('=');
    if (eq == std::string::npos || eq == 0) throw error_at("--set " + ov, "expects key.path=value");
    const std::string path = ov.substr(0, eq);
    const ConfigKey* key = find_key(schema, path);
    if (!key) throw error_at("--set " + ov, "unknown key '" + path + "'");
    YAML::Node value;
    try {
      value = YAML::Load(ov.substr(eq + 1));
    } catch (const YAML::Exception& e) {
      throw error_at("--set " + ov, std::string("value is not valid YAML: ") + e.what());
    }
    cfg.values_[path] = validate_value(*key, value, "--set " + ov);
    from_set.insert(path);
  }
  for (const ConfigKey& k : schema) {
    if (cfg.values_.count(k.path)) continue;
    if (k.required) throw error_at(source_name, "missing required key '" + k.path + "'");
    cfg.values_[k.path] = validate_value(k, YAML::Load(k.fallback), "schema default");
    from_default.insert(k.path);
  }
  // Relative paths become absolute (kPathKeys says against what).
  struct stat st;
  const bool is_file = ::stat(source_name.c_str(), &st) == 0 && S_ISREG(st.st_mode);
  std::string file_base = cwd();
  if (is_file) {
    const std::string f = absolute_dir(source_name), tree = absolute_dir(source_tree());
    file_base = f.rfind(tree + "/", 0) == 0 ? tree : f.substr(0, f.rfind('/'));
  }
  for (const char* path : kPathKeys) {
    const ConfigKey* key = find_key(schema, path);
    if (!key || key->type != ConfigType::String) continue;
    const std::string v = YAML::Load(cfg.values_.at(path)).as<std::string>();
    if (!names_a_path(path, v)) continue;
    const std::string base = from_set.count(path) ? cwd() : from_default.count(path) ? source_tree() : file_base;
    cfg.values_[path] = validate_value(*key, YAML::Node(base + "/" + v), source_name);
  }
  return cfg;
}

const ConfigKey& Config::key_or_throw(const std::string& path, ConfigType type) const {
  const ConfigKey* key = find_key(*schema_, path);
  if (!key) throw error_at(source_, "program asked for undeclared key '" + path + "'");
  if (key->type != type)
    throw error_at(source_,
                   "program read key '" + path + "' as " + type_name(type) + " but it is " + type_name(key->type));
  return *key;
}

int64_t Config::get_int(const std::string& path) const {
  key_or_throw(path, ConfigType::Int);
  return YAML::Load(values_.at(path)).as<int64_t>();
}
double Config::get_float(const std::string& path) const {
  key_or_throw(path, ConfigType::Float);
  return YAML::Load(values_.at(path)).as<double>();
}
bool Config::get_bool(const std::string& path) const {
  key_or_throw(path, ConfigType::Bool);
  return YAML::Load(values_.at(path)).as<bool>();
}
std::string Config::get_string(const std::string& path) const {
  key_or_throw(path, ConfigType::String);
  return YAML::Load(values_.at(path)).as<std::string>();
}
std::vector<int64_t> Config::get_ints(const std::string& path) const {
  key_or_throw(path, ConfigType::IntList);
  return YAML::Load(values_.at(path)).as<std::vector<int64_t>>();
}
std::vector<std::string> Config::get_strings(const std::string& path) const {
  key_or_throw(path, ConfigType::StringList);
  return YAML::Load(values_.at(path)).as<std::vector<std::string>>();
}

namespace {
struct YamlTree {
  std::map<std::string, YamlTree> children;
  std::string value;  // canonical YAML text for leaves
};
void emit_tree(const YamlTree& t, int indent, std::string& out) {
  for (const auto& [name, child] : t.children) {
    out += std::string(indent, ' ') + name + ":";
    if (child.children.empty()) {
      out += " " + child.value + "\n";
    } else {
      out += "\n";
      emit_tree(child, indent + 2, out);
    }
  }
}
}  // namespace

std::string Config::to_yaml() const {
  YamlTree root;
  for (const auto& [path, text] : values_) {
    YamlTree* node = &root;
    std::stringstream ss(path);
    for (std::string part; std::getline(ss, part, '.');) node = &node->children[part];
    node->value = text;
  }
  std::string out = "# resolved KernelForge config (from " + source_ + ")\n";
  emit_tree(root, 0, out);
  return out;
}

}  // namespace kf
