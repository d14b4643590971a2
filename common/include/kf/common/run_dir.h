// The run directory: runs/<name>/ holds everything one run produces.
//   config.yaml     resolved config snapshot
//   logs/           one log file per process (<role>-<id>.log)
//   metrics/        JSONL (and later TensorBoard events)
//   checkpoints/    atomic checkpoints
//   kernels/        the kernel database
//   best/           best verified kernel per task
// Not thread-safe to create; paths may be read from any thread afterwards.
#pragma once
#include <string>
#include <vector>

namespace kf {

class RunDir {
 public:
  // Creates <root>/<name>; if it already exists, uses <name>-2, <name>-3, ... so a
  // finished run is never overwritten. Throws kf::Error if the folder cannot be made.
  static RunDir create(const std::string& root, const std::string& name);
  // Opens an existing run (for --resume). Throws kf::Error if it is not a run directory.
  static RunDir open(const std::string& path);

  const std::string& path() const { return path_; }
  const std::string& name() const { return name_; }
  // Names the run's shared memory (/dev/shm/kf.<key>.<part>): the run name, '-', and 8 hex
  // digits of a hash of the folder's absolute path, so that runs of the same name under
  // different roots never take each other's segments. Stable across --resume.
  std::string shm_key() const;
  std::string log_file(const std::string& role, int id) const;
  std::string sub(const std::string& folder) const { return path_ + "/" + folder; }

 private:
  std::string path_;
  std::string name_;
};

// Writes `contents` to `path` atomically (temp file in the same folder, fsync, rename),
// so a reader sees the old file or the new one, never half of one.
void write_file_atomic(const std::string& path, const std::string& contents);
std::string read_file(const std::string& path);  // throws kf::Error naming the file
// The entry names of `dir` (no "." or ".."), sorted; empty when it cannot be read.
std::vector<std::string> list_dir(const std::string& dir);

}  // namespace kf
