// kf::Error: the one exception type of the common library, carrying context.
// Why one type: callers at process boundaries (tools, workers) catch kf::Error,
// log what() (which already names the file/key/task), and decide what happens next.
#pragma once
#include <exception>
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

// An exception's message for a log line, without a C++ backtrace: libtorch's errors
// (c10::Error, a CUDA out-of-memory among them) append "Exception raised from ... (most
// recent call first):" and one "frame #N" line per stack frame to what().
inline std::string message_of(const std::exception& e) {
  std::string s = e.what();
  for (const char* tail : {"\nException raised from ", "\nframe #0"})
    if (const auto cut = s.find(tail); cut != std::string::npos) s.erase(cut);
  return s;
}

}  // namespace kf
