// Typed, validated run configuration (YAML files in configs/).
//
// Every key the system understands is declared once in the schema (config_schema.cpp)
// with its type, default and a line of help. Loading rejects, naming the file and the
// full key path: an unknown key, a value of the wrong type, outside its allowed set or
// outside its numeric range (e.g. a negative time limit), and a missing required key. `--set a.b=c` overrides are
// validated the same way. A Config is immutable after load; const methods may be called from any thread.
#pragma once
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace kf {

enum class ConfigType { Int, Float, Bool, String, IntList, StringList };

struct ConfigKey {
  std::string path;  // "learner.batch_size"
  ConfigType type;
  std::string fallback;  // default as YAML text; empty with required=true means "must be given"
  bool required = false;
  std::vector<std::string> choices;  // allowed values for String keys (empty: any)
  std::string help;
  // Allowed range of an Int or Float key (default: any). min_open: the value must be > min.
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  bool min_open = false;
};

// The schema: all keys of all components.
const std::vector<ConfigKey>& config_schema();

class Config {
 public:
  // Loads `file` (YAML), applies overrides ("a.b=value", value parsed as YAML), validates,
  // fills defaults. Throws kf::Error naming the file (or "--set") and the key path.
  // `schema` defaults to config_schema(); it must outlive the Config.
  static Config load(const std::string& file, const std::vector<std::string>& overrides = {},
                     const std::vector<ConfigKey>& schema = config_schema());
  static Config parse(const std::string& yaml_text, const std::string& source_name,
                      const std::vector<std::string>& overrides = {},
                      const std::vector<ConfigKey>& schema = config_schema());

  int64_t get_int(const std::string& path) const;
  double get_float(const std::string& path) const;
  bool get_bool(const std::string& path) const;
  std::string get_string(const std::string& path) const;
  std::vector<int64_t> get_ints(const std::string& path) const;
  std::vector<std::string> get_strings(const std::string& path) const;

  const std::string& source() const { return source_; }
  // How many keys the YAML text itself set (0: an empty file; overrides not counted).
  std::size_t file_keys() const { return file_keys_; }
  // The resolved config (every key, defaults filled) as YAML, nested by section.
  std::string to_yaml() const;

 private:
  const ConfigKey& key_or_throw(const std::string& path, ConfigType type) const;
  std::string source_;
  const std::vector<ConfigKey>* schema_ = &config_schema();
  std::map<std::string, std::string> values_;  // path -> canonical YAML text of the value
  std::size_t file_keys_ = 0;
};

}  // namespace kf
