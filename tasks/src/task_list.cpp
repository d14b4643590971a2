#include "kf/tasks/tasks.h"

#include <algorithm>
#include <sstream>

#include "kf/common/error.h"
#include "kf/common/run_dir.h"

namespace kf::tasks {
namespace {

bool name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

}  // namespace

std::vector<std::string> parse_task_list(const std::string& text, const std::string& source) {
  std::vector<std::string> names;
  std::istringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    const std::string name = trim(line.substr(0, line.find('#')));
    if (name.empty()) continue;
    if (name == "." || name == ".." || !std::all_of(name.begin(), name.end(), name_char))
      throw Error(source + ":" + std::to_string(n) + ": '" + name +
                  "' is not a task name (one name per line: letters, digits, '_', '-', '.')");
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  return names;
}

std::vector<std::string> read_task_list(const std::string& path) { return parse_task_list(read_file(path), path); }

}  // namespace kf::tasks
