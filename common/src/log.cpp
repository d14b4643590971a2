#include "kf/common/log.h"

#include <atomic>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

namespace kf {
namespace {

struct LogState {
  std::mutex mu;
  std::string role = "main";
  int id = 0;
  FILE* file = nullptr;
  LogLevel level = LogLevel::Info;
};

LogState& state() {
  static LogState s;
  return s;
}

const char* level_letter(LogLevel l) {
  switch (l) {
    case LogLevel::Debug:
      return "D";
    case LogLevel::Info:
      return "I";
    case LogLevel::Warn:
      return "W";
    case LogLevel::Error:
      return "E";
  }
  return "?";
}

std::string utc_now() {
  using namespace std::chrono;
  auto now = system_clock::now();
  std::time_t t = system_clock::to_time_t(now);
  int ms = static_cast<int>(duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[40];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
  return buf;
}

}  // namespace

void log_init(const std::string& role, int id, const std::string& file) {
  LogState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.role = role;
  s.id = id;
  if (s.file) {
    std::fclose(s.file);
    s.file = nullptr;
  }
  if (!file.empty()) {
    s.file = std::fopen(file.c_str(), "a");
    if (!s.file)
      std::fprintf(stderr, "[%s:%d] cannot open log file %s; logging to stderr only\n", role.c_str(), id, file.c_str());
  }
}

void log_set_level(LogLevel level) { state().level = level; }

std::string log_prefix_role() {
  LogState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.role + ":" + std::to_string(s.id);
}

namespace {
std::atomic<uint64_t> g_lines{0};
}
uint64_t log_line_count() { return g_lines.load(); }

void log_line(LogLevel level, const std::string& message) {
  LogState& s = state();
  if (static_cast<int>(level) < static_cast<int>(s.level)) return;
  std::lock_guard<std::mutex> lock(s.mu);
  std::string line = utc_now() + " " + level_letter(level) + " [" + s.role + ":" + std::to_string(s.id) +
                     " pid=" + std::to_string(::getpid()) + "] " + message + "\n";
  std::fputs(line.c_str(), stderr);
  g_lines.fetch_add(1);
  if (s.file) {
    std::fputs(line.c_str(), s.file);
    std::fflush(s.file);
  }
}

}  // namespace kf
