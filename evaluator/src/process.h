// Child processes for the evaluator: the compiler and the sandbox worker.
// fork+exec with only async-signal-safe calls in the child (the evaluator has threads:
// torch's and TBB's), its own process group (so a kill reaches every descendant),
// rlimits, exact fd placement and a clean environment. Optionally the child is confined
// before exec (a private filesystem view, no network, an unprivileged user): the
// compiler runs that way, since candidate source steers what it opens.
// Threading: any thread may call these; each call owns the child it spawns.
#pragma once
#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

namespace kf::evaluator {

// A private filesystem view and identity for the child, set up in the child between fork
// and exec: new mount and network namespaces (plus a user namespace when the caller is not
// root), a tmpfs root holding only `binds`, `symlinks` and a tmpfs /tmp, pivot_root into
// it, then the identity `uid`/`gid` (root callers; a non-root caller stays itself, mapped
// to root inside its user namespace) and no_new_privs. Paths in `binds[].target`,
// `symlinks` and the spec's argv[0]/cwd are paths inside the view.
struct Bind {
  std::string source;     // a folder or a file outside
  std::string target;     // where it appears in the view
  bool writable = false;  // read-only unless set
  bool devices = false;   // device nodes usable (only for /dev/null and friends)
};
struct Confinement {
  bool enabled = false;
  std::string mount_point;  // an existing empty folder to mount the view's root on
  std::vector<Bind> binds;
  std::vector<std::pair<std::string, std::string>> symlinks;  // (link text, path in the view)
  std::string tmp_options = "size=512m,mode=1777";            // the private /tmp (tmpfs)
  uid_t uid = 65534;                                          // nobody
  gid_t gid = 65534;                                          // nogroup
  // A fresh /proc in the view (hidepid=invisible), writable by the child for its own
  // entries, and the identity a user of the child's own (kOwnUidBase + pid, not `uid`), so
  // that /proc lists only the child's processes. CUDA's driver names its threads through
  // /proc/<pid>/task/<tid>/comm during cuInit and fails (304) when it cannot; a bind of the
  // host's /proc would show every other worker. Needs private_proc_supported().
  bool private_proc = false;
};

struct SpawnSpec {
  std::vector<std::string> argv;                            // argv[0] is the executable path
  std::vector<std::string> env;                             // "K=V"; the child gets exactly these
  std::vector<std::pair<int, int>> fds;                     // (fd in parent, fd number in child); others close
  std::vector<std::pair<int, unsigned long long>> rlimits;  // (RLIMIT_*, soft=hard value)
  std::string cwd;                                          // empty: inherit
  Confinement confine;                                      // off unless confine.enabled
  // Unconfined children only: a mount namespace of its own with a fresh /proc that lists
  // only the processes of the child's own user (hidepid=invisible), so a child that turns
  // into another user before it runs untrusted code sees no other process. Needs root and
  // Linux 5.8 or later (per-mount proc options; on older kernels the option would change
  // the host's /proc): private_proc_supported().
  bool private_proc = false;
};

// Whether this process can give a child a private /proc (root, Linux >= 5.8).
bool private_proc_supported();

// Starts the child in a new process group (pgid == pid). Throws kf::Error if fork fails,
// and, with confinement, if any step of it fails in the child (the message names the
// step, the path and the errno; the child never execs unconfined).
pid_t spawn_process(const SpawnSpec& spec);

// SIGKILL to the child's whole process group, then reaps the child. Returns its wait status.
int kill_and_reap(pid_t pid);

struct BoundedRun {
  int status = -1;  // wait status (WIFEXITED/WIFSIGNALED)
  bool timed_out = false;
  std::string output;  // stdout+stderr, the first `max_output` bytes
  bool truncated = false;
  double seconds = 0;
};
// Runs to completion or until `time_limit_s` passes (then kills the process group).
BoundedRun run_bounded(SpawnSpec spec, double time_limit_s, std::size_t max_output);

// Environment entries of this process whose names are in `keep` ("PATH", ...).
std::vector<std::string> pick_env(const std::vector<std::string>& keep);

std::string describe_wait_status(int status);  // "exit 1", "killed by SIGSEGV", ...

}  // namespace kf::evaluator
