// kf::Error: the one exception type of the common library, carrying context.
// Why one type: callers at process boundaries (tools, workers) catch kf::Error,
// log what() (which already names the file/key/task), and decide what happens next.
#pragma once
#include <stdexcept>
#include <string>

namespace kf {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Builds "context: message" so every error names the file, key or record it is about.
inline Error error_at(const std::string& context, const std::string& message) {
  return Error(context + ": " + message);
}

}  // namespace kf
