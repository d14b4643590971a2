// Per-process logging: every line carries time, level, process role and id, so a
// merged view of a run's logs still says which process said what.
//   2026-12-02T18:50:00.123Z I [evaluator:0 pid=4242] compiled 3 candidates
// Thread-safe: any thread may log after log_init(). Before log_init() the role is "main".
#pragma once
#include <cstdint>
#include <sstream>
#include <string>

namespace kf {

enum class LogLevel { Debug = 0, Info = 1, Warn = 2, Error = 3 };

// Sets this process's role and id, and (if non-empty) a file that receives a copy of
// every line. Lines always go to stderr too. Call again after fork() in the child.
void log_init(const std::string& role, int id, const std::string& file = "");
void log_set_level(LogLevel level);
void log_line(LogLevel level, const std::string& message);
std::string log_prefix_role();  // "role:id", for messages that name this process
// Lines written to stderr so far (a terminal status display redraws in place only
// while no log line came in between).
uint64_t log_line_count();

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

template <typename... Args>
void log_debug(const Args&... a) {
  log_line(LogLevel::Debug, detail::concat(a...));
}
template <typename... Args>
void log_info(const Args&... a) {
  log_line(LogLevel::Info, detail::concat(a...));
}
template <typename... Args>
void log_warn(const Args&... a) {
  log_line(LogLevel::Warn, detail::concat(a...));
}
template <typename... Args>
void log_error(const Args&... a) {
  log_line(LogLevel::Error, detail::concat(a...));
}

}  // namespace kf
