// MetricsWriter: one metrics stream of a run (the learner's steps, the launcher's status,
// one actor...), written two ways from the same calls:
//   <dir>/<stem>.jsonl      appended, one JSON object per line:
//                           {"step":S,"time":unix_seconds,<key>:<value>...,<extra>...}
//                           (tools/report and scripts read this; NaN/inf become null);
//   <dir>/events.out.tfevents.<unix_time>.<hostname>.<pid>.<stem>
//                           a TensorBoard event file (TFRecord of Event protos), one scalar
//                           per numeric key with tag "<stem>/<key>", so several streams can
//                           share one folder: `tensorboard --logdir <run>/metrics`.
// Every write() reaches the OS before it returns, so a process killed at any instruction
// loses at most the line it was writing (readers skip a torn last line).
// Threading: not thread-safe; one owner thread calls everything.
#pragma once
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace kf {

class MetricsWriter {
 public:
  // Creates `dir` if needed. Throws kf::Error naming the path if a file cannot be opened.
  MetricsWriter(const std::string& dir, const std::string& stem);
  ~MetricsWriter();  // flushes
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  // One record for `step`. scalars go to both files; `extra` (a JSON object of non-scalar
  // fields: counts by code, names...) only to the JSONL. Throws kf::Error naming the key for
  // an empty key, a reserved one ("step", "time"), a key given twice, or a non-object
  // `extra`; and naming the file when a write fails.
  void write(int64_t step, const std::vector<std::pair<std::string, double>>& scalars,
             const nlohmann::json& extra = nlohmann::json::object());
  void flush();
  const std::string& jsonl_path() const { return jsonl_path_; }
  const std::string& events_path() const { return events_path_; }

 private:
  void write_record(const std::string& data);  // one TFRecord around `data`
  std::string stem_, jsonl_path_, events_path_;
  std::FILE* jsonl_ = nullptr;
  std::FILE* events_ = nullptr;
};

}  // namespace kf
