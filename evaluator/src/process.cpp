// Child processes: fork+exec with async-signal-safe set-up (see process.h).
#include "process.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>

#include "kf/common/error.h"
#include "wire/confine.h"

extern char** environ;

namespace kf::evaluator {
namespace {

// The confinement steps, in the order the child runs them; a failing step reports
// (step, item, errno) on a pipe, and the parent turns it into a message.
enum Step : int {
  kUnshare,
  kSetgroupsDeny,
  kUidMap,
  kGidMap,
  kMakePrivate,
  kRootTmpfs,
  kMkdir,
  kBindCreate,
  kBind,
  kRemount,
  kTmpTmpfs,
  kSymlink,
  kRootReadOnly,
  kPivotRoot,
  kDetachOld,
  kChdirRoot,
  kSetgroups,
  kSetgid,
  kSetuid,
  kNoNewPrivs,
  kDeathSignal,
  kChdirCwd,
  kExec,
  kProcNamespace,
  kProcPrivate,
  kProcMount,
  kViewProc,
  kLastStep = kViewProc
};
const char* const kStepName[] = {"unshare(user/mount/net namespaces)",
                                 "write /proc/self/setgroups",
                                 "write /proc/self/uid_map",
                                 "write /proc/self/gid_map",
                                 "make / private",
                                 "mount the view's tmpfs root",
                                 "mkdir in the view",
                                 "create a bind target",
                                 "bind mount",
                                 "remount read-only/nosuid",
                                 "mount the private /tmp",
                                 "symlink in the view",
                                 "remount the view's root read-only",
                                 "pivot_root",
                                 "detach the old root",
                                 "chdir /",
                                 "setgroups",
                                 "setgid",
                                 "setuid",
                                 "prctl(PR_SET_NO_NEW_PRIVS)",
                                 "prctl(PR_SET_PDEATHSIG)",
                                 "chdir to the working folder",
                                 "execve",
                                 "unshare(mount namespace) for a private /proc",
                                 "make / private for a private /proc",
                                 "mount a private /proc (hidepid=invisible)",
                                 "mount the view's private /proc (hidepid=invisible)"};
struct ChildFailure {
  int step, item, err;
};

// Everything the child's confinement needs, computed before fork (no allocation after).
struct ViewPlan {
  bool userns = false;  // caller is not root: a user namespace provides the privileges
  std::string root, tmp, tmp_options, root_ro_options = "size=1m,mode=0755";
  std::string proc;  // the view's private /proc (empty: none)
  std::string uid_map, gid_map;
  std::vector<std::string> dirs;  // full paths, parents first
  struct BindStep {
    std::string src, dst, what;
    bool dir;
    unsigned long remount;
  };
  std::vector<BindStep> binds;
  std::vector<std::pair<std::string, std::string>> links;  // (text, full path)
  uid_t uid;
  gid_t gid;
};

ViewPlan plan_view(const Confinement& c) {
  ViewPlan v;
  v.userns = geteuid() != 0;
  v.root = c.mount_point;
  while (v.root.size() > 1 && v.root.back() == '/') v.root.pop_back();
  v.uid = c.uid;
  v.gid = c.gid;
  v.uid_map = "0 " + std::to_string(geteuid()) + " 1\n";
  v.gid_map = "0 " + std::to_string(getegid()) + " 1\n";
  std::set<std::string> seen;
  auto add_dirs = [&](const std::string& inner, bool include_last) {
    // "/kf/work" -> "/kf", "/kf/work" (parents first).
    std::size_t pos = 0;
    while ((pos = inner.find('/', pos + 1)) != std::string::npos) {
      const std::string d = inner.substr(0, pos);
      if (seen.insert(d).second) v.dirs.push_back(v.root + d);
    }
    if (include_last && seen.insert(inner).second) v.dirs.push_back(v.root + inner);
  };
  for (const auto& b : c.binds) {
    if (b.target.empty() || b.target[0] != '/')
      throw Error("confinement: bind target '" + b.target + "' is not absolute");
    struct stat st;
    if (::stat(b.source.c_str(), &st) != 0)
      throw Error("confinement: bind source " + b.source + ": " + std::strerror(errno));
    const bool dir = S_ISDIR(st.st_mode);
    add_dirs(b.target, dir);
    unsigned long fl = MS_BIND | MS_REMOUNT | MS_NOSUID;
    if (!b.devices) fl |= MS_NODEV;
    if (!b.writable) fl |= MS_RDONLY;
    // Flags the source mount already has must be kept (a user namespace may not clear them).
    struct statvfs sv;
    if (::statvfs(b.source.c_str(), &sv) == 0) {
      if (sv.f_flag & ST_RDONLY) fl |= MS_RDONLY;
      if (sv.f_flag & ST_NODEV) fl |= MS_NODEV;
      if (sv.f_flag & ST_NOEXEC) fl |= MS_NOEXEC;
      if (sv.f_flag & ST_NOATIME) fl |= MS_NOATIME;
      if (sv.f_flag & ST_NODIRATIME) fl |= MS_NODIRATIME;
      if (sv.f_flag & ST_RELATIME) fl |= MS_RELATIME;
    }
    v.binds.push_back({b.source, v.root + b.target, b.source + " -> " + b.target, dir, fl});
  }
  add_dirs("/tmp", true);
  v.tmp = v.root + "/tmp";
  if (c.private_proc) {
    add_dirs("/proc", true);
    v.proc = v.root + "/proc";
  }
  v.tmp_options = c.tmp_options;
  for (const auto& l : c.symlinks) {
    add_dirs(l.second, false);
    v.links.push_back({l.first, v.root + l.second});
  }
  return v;
}

std::string describe_failure(const ChildFailure& f, const ViewPlan& v) {
  std::string what = f.step >= 0 && f.step <= kLastStep ? kStepName[f.step] : "step " + std::to_string(f.step);
  auto in = [&](std::size_t n) { return f.item >= 0 && std::size_t(f.item) < n; };
  std::string detail;
  switch (f.step) {
    case kMkdir:
      if (in(v.dirs.size())) detail = " " + v.dirs[f.item];
      break;
    case kBindCreate:
    case kBind:
    case kRemount:
      if (in(v.binds.size())) detail = " " + v.binds[f.item].what;
      break;
    case kSymlink:
      if (in(v.links.size())) detail = " " + v.links[f.item].second;
      break;
    case kRootTmpfs:
    case kRootReadOnly:
    case kPivotRoot:
      detail = " " + v.root;
      break;
    default:
      break;
  }
  std::string hint;
  if (f.err == EPERM && (f.step == kUnshare || f.step == kMakePrivate || f.step == kRootTmpfs))
    hint = v.userns ? " (not root, and unprivileged user namespaces are unavailable: run as root or enable them)"
                    : " (this process lacks CAP_SYS_ADMIN: a container needs it to create mount namespaces)";
  return "confinement failed at " + what + detail + ": " + std::strerror(f.err) + hint;
}

// Child side: write a string to a /proc file (async-signal-safe).
bool write_file(const char* path, const char* text) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const ssize_t n = write(fd, text, strlen(text));
  close(fd);
  return n == ssize_t(strlen(text));
}

[[noreturn]] void child_fail(int fd, int step, int item, int err) {
  ChildFailure f{step, item, err};
  if (fd >= 0) (void)!write(fd, &f, sizeof f);
  _exit(125);
}

// Child side, between fork and exec: only system calls on data prepared by plan_view.
void enter_view(const ViewPlan& v, pid_t parent, int efd) {
  if (v.userns) {
    if (unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET) != 0) child_fail(efd, kUnshare, -1, errno);
    if (!write_file("/proc/self/setgroups", "deny")) child_fail(efd, kSetgroupsDeny, -1, errno);
    if (!write_file("/proc/self/uid_map", v.uid_map.c_str())) child_fail(efd, kUidMap, -1, errno);
    if (!write_file("/proc/self/gid_map", v.gid_map.c_str())) child_fail(efd, kGidMap, -1, errno);
  } else if (unshare(CLONE_NEWNS | CLONE_NEWNET) != 0) {
    child_fail(efd, kUnshare, -1, errno);
  }
  // Nothing mounted from here on propagates back to the host.
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) child_fail(efd, kMakePrivate, -1, errno);
  if (mount("kf-view", v.root.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, v.root_ro_options.c_str()) != 0)
    child_fail(efd, kRootTmpfs, -1, errno);
  for (std::size_t i = 0; i < v.dirs.size(); ++i)
    if (mkdir(v.dirs[i].c_str(), 0755) != 0 && errno != EEXIST) child_fail(efd, kMkdir, int(i), errno);
  for (std::size_t i = 0; i < v.binds.size(); ++i) {
    const auto& b = v.binds[i];
    if (!b.dir) {
      int fd = open(b.dst.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
      if (fd < 0) child_fail(efd, kBindCreate, int(i), errno);
      close(fd);
    }
    if (mount(b.src.c_str(), b.dst.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0)
      child_fail(efd, kBind, int(i), errno);
    if (mount(nullptr, b.dst.c_str(), nullptr, b.remount, nullptr) != 0) child_fail(efd, kRemount, int(i), errno);
  }
  if (mount("kf-tmp", v.tmp.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, v.tmp_options.c_str()) != 0)
    child_fail(efd, kTmpTmpfs, -1, errno);
  if (!v.proc.empty() &&
      mount("proc", v.proc.c_str(), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=invisible") != 0)
    child_fail(efd, kViewProc, -1, errno);
  for (std::size_t i = 0; i < v.links.size(); ++i)
    if (symlink(v.links[i].first.c_str(), v.links[i].second.c_str()) != 0) child_fail(efd, kSymlink, int(i), errno);
  if (mount("kf-view", v.root.c_str(), "tmpfs", MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV,
            v.root_ro_options.c_str()) != 0)
    child_fail(efd, kRootReadOnly, -1, errno);
  // The view becomes "/"; the host's tree is detached and unreachable from here on.
  if (chdir(v.root.c_str()) != 0) child_fail(efd, kPivotRoot, -1, errno);
  if (syscall(SYS_pivot_root, ".", ".") != 0) child_fail(efd, kPivotRoot, -1, errno);
  if (umount2(".", MNT_DETACH) != 0) child_fail(efd, kDetachOld, -1, errno);
  if (chdir("/") != 0) child_fail(efd, kChdirRoot, -1, errno);
  if (!v.userns) {
    if (setgroups(0, nullptr) != 0) child_fail(efd, kSetgroups, -1, errno);
    if (setresgid(v.gid, v.gid, v.gid) != 0) child_fail(efd, kSetgid, -1, errno);
    // With a private /proc, a user no other process has (hidepid hides other users only).
    const uid_t uid = v.proc.empty() ? v.uid : uid_t(worker::kOwnUidBase + unsigned(getpid()));
    if (setresuid(uid, uid, uid) != 0) child_fail(efd, kSetuid, -1, errno);
  }
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) child_fail(efd, kNoNewPrivs, -1, errno);
  // A change of identity clears the parent-death signal: set it now, after the change.
  if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) child_fail(efd, kDeathSignal, -1, errno);
  if (getppid() != parent) _exit(125);  // the parent died before the signal was armed
}

}  // namespace

pid_t spawn_process(const SpawnSpec& spec) {
  if (spec.argv.empty()) throw Error("spawn_process: empty argv");
  // Everything the child needs is prepared before fork: no allocation after it.
  const bool confined = spec.confine.enabled;
  const bool private_proc = spec.private_proc && !confined;  // a view has its own /proc (or none)
  const bool reports = confined || private_proc;             // set-up steps that can fail
  ViewPlan view;
  if (confined) view = plan_view(spec.confine);
  int errp[2] = {-1, -1};
  if (reports && pipe2(errp, O_CLOEXEC) != 0) throw Error(std::string("pipe: ") + std::strerror(errno));
  const pid_t parent = getpid();
  std::vector<char*> argv, envp;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  std::vector<std::pair<int, int>> fds = spec.fds;
  std::vector<std::pair<int, unsigned long long>> lims = spec.rlimits;
  const char* cwd = spec.cwd.empty() ? nullptr : spec.cwd.c_str();

  pid_t pid = fork();
  if (pid < 0) {
    const int e = errno;
    if (reports) close(errp[0]), close(errp[1]);
    throw Error(std::string("fork: ") + std::strerror(e));
  }
  if (pid == 0) {
    setpgid(0, 0);
    // Move sources out of the way first, so a source never collides with a target.
    for (auto& f : fds) f.first = fcntl(f.first, F_DUPFD, 200);
    int efd = reports ? fcntl(errp[1], F_DUPFD, 200) : -1;
    int devnull = open("/dev/null", O_RDWR);
    bool has[3] = {false, false, false};
    for (const auto& f : fds) {
      dup2(f.first, f.second);
      if (f.second < 3) has[f.second] = true;
    }
    for (int i = 0; i < 3; ++i)
      if (!has[i] && devnull >= 0) dup2(devnull, i);
    int maxfd = 2;
    for (const auto& f : fds) maxfd = f.second > maxfd ? f.second : maxfd;
    if (efd >= 0) {  // the failure pipe sits just above the child's fds, closed by exec
      dup2(efd, maxfd + 1);
      efd = maxfd + 1;
      fcntl(efd, F_SETFD, FD_CLOEXEC);
      ++maxfd;
    }
    syscall(SYS_close_range, maxfd + 1, ~0u, 0);
    if (confined) enter_view(view, parent, efd);
    if (private_proc) {
      // Nothing mounted here propagates back: the host's /proc stays as it is.
      if (unshare(CLONE_NEWNS) != 0) child_fail(efd, kProcNamespace, -1, errno);
      if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) child_fail(efd, kProcPrivate, -1, errno);
      if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=invisible") != 0)
        child_fail(efd, kProcMount, -1, errno);
    }
    for (const auto& l : lims) {
      struct rlimit rl {
        rlim_t(l.second), rlim_t(l.second)
      };
      setrlimit(l.first, &rl);
    }
    signal(SIGPIPE, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (cwd && chdir(cwd) != 0) {
      if (reports) child_fail(efd, kChdirCwd, -1, errno);
      _exit(126);
    }
    execve(argv[0], argv.data(), envp.data());
    if (reports) child_fail(efd, kExec, -1, errno);
    _exit(127);
  }
  setpgid(pid, pid);  // also from the parent: no race with an early kill
  if (reports) {
    // The pipe closes at exec (close-on-exec) or carries the step that failed.
    close(errp[1]);
    ChildFailure f{};
    ssize_t n;
    while ((n = read(errp[0], &f, sizeof f)) < 0 && errno == EINTR) {
    }
    close(errp[0]);
    if (n == ssize_t(sizeof f)) {
      int status = 0;
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      std::string msg = describe_failure(f, view);
      if (f.step == kExec || f.step == kChdirCwd)
        msg += " (" + std::string(f.step == kExec ? spec.argv[0] : spec.cwd) + (confined ? ", inside the view)" : ")");
      throw Error("spawn " + spec.argv[0] + ": " + msg);
    }
  }
  return pid;
}

int kill_and_reap(pid_t pid) {
  if (pid <= 0) return -1;
  kill(-pid, SIGKILL);
  kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

BoundedRun run_bounded(SpawnSpec spec, double time_limit_s, std::size_t max_output) {
  BoundedRun r;
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) throw Error(std::string("pipe: ") + std::strerror(errno));
  spec.fds.push_back({p[1], 1});
  spec.fds.push_back({p[1], 2});
  const auto t0 = std::chrono::steady_clock::now();
  pid_t pid;
  try {
    pid = spawn_process(spec);
  } catch (...) {
    close(p[0]);
    close(p[1]);
    throw;
  }
  close(p[1]);
  char buf[8192];
  bool open_pipe = true;
  while (open_pipe) {
    const double left = time_limit_s - std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (left <= 0) {
      r.timed_out = true;
      break;
    }
    pollfd pf{p[0], POLLIN, 0};
    int pr = poll(&pf, 1, int(left * 1000) + 1);
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) continue;
    ssize_t n = read(p[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      open_pipe = false;
      break;
    }
    if (r.output.size() < max_output)
      r.output.append(buf, std::min<std::size_t>(size_t(n), max_output - r.output.size()));
    else
      r.truncated = true;
  }
  close(p[0]);
  if (r.timed_out) {
    r.status = kill_and_reap(pid);
  } else {
    // The pipe closed; the compiler may still be finishing (or a descendant held the pipe).
    int status = 0;
    while (true) {
      pid_t w = waitpid(pid, &status, WNOHANG);
      if (w == pid) break;
      const double left = time_limit_s - std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (left <= 0) {
        r.timed_out = true;
        status = kill_and_reap(pid);
        break;
      }
      usleep(2000);
    }
    kill(-pid, SIGKILL);  // no descendant outlives the run
    r.status = status;
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::vector<std::string> pick_env(const std::vector<std::string>& keep) {
  std::vector<std::string> out;
  for (const auto& k : keep)
    if (const char* v = std::getenv(k.c_str())) out.push_back(k + "=" + v);
  return out;
}

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int s = WTERMSIG(status);
    const char* name = sigabbrev_np(s);
    return std::string("killed by SIG") + (name ? name : std::to_string(s).c_str());
  }
  return "status " + std::to_string(status);
}

bool private_proc_supported() {
  if (geteuid() != 0) return false;
  // hidepid is an option of each proc mount from Linux 5.8; before, all mounts of one PID
  // namespace share it, and mounting with it would hide processes on the host's /proc.
  struct utsname u {};
  if (uname(&u) != 0) return false;
  int major = 0, minor = 0;
  if (std::sscanf(u.release, "%d.%d", &major, &minor) != 2) return false;
  return major > 5 || (major == 5 && minor >= 8);
}

}  // namespace kf::evaluator
