// Confinement of the sandbox worker: rlimits, privilege drop, seccomp (see confine.h).
#include "wire/confine.h"

#include <fcntl.h>
#include <grp.h>
#include <linux/sched.h>
#include <seccomp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace kf::evaluator::worker {
namespace {

volatile int* g_forbidden_slot = nullptr;

void on_sigsys(int, siginfo_t* info, void*) {
  // Async-signal-safe only: a store and _exit.
  if (g_forbidden_slot) *g_forbidden_slot = info->si_syscall;
  _exit(kExitForbidden);
}

std::string set_limit(int resource, rlim_t soft, rlim_t hard, const char* name) {
  struct rlimit rl {
    soft, hard
  };
  if (setrlimit(resource, &rl) != 0) return std::string("setrlimit ") + name + ": " + std::strerror(errno);
  return "";
}

}  // namespace

void install_sigsys_handler(volatile int* slot) {
  g_forbidden_slot = slot;
  struct sigaction sa {};
  sa.sa_sigaction = on_sigsys;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSYS, &sa, nullptr);
}

std::string confine(const ConfineOptions& o) {
  std::string err;
  // --- rlimits
  if (!(err = set_limit(RLIMIT_CPU, o.cpu_seconds, o.cpu_seconds + 2, "CPU")).empty()) return err;
  if (!(err = set_limit(RLIMIT_FSIZE, 0, 0, "FSIZE")).empty()) return err;
  if (!(err = set_limit(RLIMIT_CORE, 0, 0, "CORE")).empty()) return err;
  if (!(err = set_limit(RLIMIT_NOFILE, 1024, 1024, "NOFILE")).empty()) return err;
  if (o.cpu_backend && o.address_space_bytes > 0)
    if (!(err = set_limit(RLIMIT_AS, o.address_space_bytes, o.address_space_bytes, "AS")).empty()) return err;

  // --- identity: root gives way to nobody (open fds, incl. /dev/nvidia*, stay usable)
  const pid_t parent = getppid();
  if (o.drop_root && geteuid() == 0) {
    const uid_t nobody = 65534;
    const uid_t uid = o.own_uid ? uid_t(kOwnUidBase + unsigned(getpid())) : nobody;
    if (setgroups(0, nullptr) != 0) return std::string("setgroups: ") + std::strerror(errno);
    if (setresgid(nobody, nobody, nobody) != 0) return std::string("setresgid: ") + std::strerror(errno);
    if (setresuid(uid, uid, uid) != 0) return std::string("setresuid: ") + std::strerror(errno);
    // NPROC counts threads of the uid system-wide; nobody runs nothing else of ours.
    if (!(err = set_limit(RLIMIT_NPROC, 4096, 4096, "NPROC")).empty()) return err;
  }
  // Changing credentials clears the parent-death signal: arm it again, then make sure the
  // evaluator did not die before it was armed (the worker would outlive it otherwise).
  if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) return std::string("PR_SET_PDEATHSIG: ") + std::strerror(errno);
  if (getppid() != parent) return "the evaluator exited during start-up";
  prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);  // no ptrace attach, no /proc/<pid>/mem from peers
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return std::string("no_new_privs: ") + std::strerror(errno);

  // --- seccomp: allow by default (CUDA's driver needs a wide set of ioctls and mmaps),
  // deny the classes of calls an untrusted kernel has no business making.
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (!ctx) return "seccomp_init failed";
  const uint32_t deny = SCMP_ACT_TRAP;
  int rc = 0;
  auto add = [&](int nr, uint32_t action = SCMP_ACT_TRAP) {
    if (nr < 0) return;  // not on this architecture
    if (rc == 0) rc = seccomp_rule_add(ctx, action, nr, 0);
  };
  auto add_cond = [&](int nr, uint32_t action, scmp_arg_cmp cmp) {
    if (nr < 0) return;
    if (rc == 0) rc = seccomp_rule_add(ctx, action, nr, 1, cmp);
  };
  const char* denied[] = {
      // new programs and processes
      "execve",
      "execveat",
      "fork",
      "vfork",
      // network and local IPC endpoints
      "socket",
      "socketpair",
      "connect",
      "bind",
      "listen",
      "accept",
      "accept4",
      "shmget",
      "shmat",
      "msgget",
      "msgsnd",
      "semget",
      "mq_open",
      // other processes' memory, tracing
      "ptrace",
      "process_vm_readv",
      "process_vm_writev",
      "kcmp",
      "pidfd_open",
      "pidfd_getfd",
      "pidfd_send_signal",
      "tkill",
      // interfaces that bypass or widen the filter
      "io_uring_setup",
      "io_uring_enter",
      "io_uring_register",
      "bpf",
      "perf_event_open",
      "userfaultfd",
      "personality",
      // file system changes (no candidate needs to write a file)
      "creat",
      "link",
      "linkat",
      "symlink",
      "symlinkat",
      "unlink",
      "unlinkat",
      "rename",
      "renameat",
      "renameat2",
      "mkdir",
      "mkdirat",
      "rmdir",
      "mknod",
      "mknodat",
      "truncate",
      "chmod",
      "fchmodat",
      "chown",
      "fchownat",
      "lchown",
      "utime",
      "utimes",
      "utimensat",
      "futimesat",
      "setxattr",
      "lsetxattr",
      "fsetxattr",
      "removexattr",
      "lremovexattr",
      "fremovexattr",
      "name_to_handle_at",
      "open_by_handle_at",
      "fanotify_init",
      "chdir",
      "fchdir",
      "chroot",
      "mount",
      "umount2",
      "pivot_root",
      "fsopen",
      "fsmount",
      "move_mount",
      "open_tree",
      // identity, namespaces, kernel and machine administration
      "setuid",
      "setgid",
      "setreuid",
      "setregid",
      "setresuid",
      "setresgid",
      "setgroups",
      "capset",
      "unshare",
      "setns",
      "init_module",
      "finit_module",
      "delete_module",
      "kexec_load",
      "kexec_file_load",
      "reboot",
      "swapon",
      "swapoff",
      "settimeofday",
      "clock_settime",
      "clock_adjtime",
      "adjtimex",
      "sethostname",
      "setdomainname",
      "acct",
      "quotactl",
      "keyctl",
      "add_key",
      "request_key",
      "syslog",
      "iopl",
      "ioperm",
  };
  for (const char* name : denied) add(seccomp_syscall_resolve_name(name), deny);

  // clone: threads (CLONE_THREAD) only. clone3 hides its flags in memory, so it reports
  // "not implemented" and glibc falls back to clone.
  add_cond(SCMP_SYS(clone), deny, SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_THREAD, 0));
  add(seccomp_syscall_resolve_name("clone3"), SCMP_ACT_ERRNO(ENOSYS));
  add(seccomp_syscall_resolve_name("openat2"), SCMP_ACT_ERRNO(ENOSYS));

  // open/openat: read-only opens only.
  const unsigned long write_bits[] = {O_WRONLY, O_RDWR, O_CREAT, O_TRUNC, O_APPEND, 020000000 /*__O_TMPFILE*/};
  for (unsigned long bit : write_bits) {
    add_cond(SCMP_SYS(openat), deny, SCMP_A2(SCMP_CMP_MASKED_EQ, bit, bit));
    add_cond(SCMP_SYS(open), deny, SCMP_A1(SCMP_CMP_MASKED_EQ, bit, bit));
  }

  // Signals: only to this process (glibc's raise/abort use tgkill on itself).
  const pid_t self = getpid();
  add(SCMP_SYS(kill), deny);
  add_cond(SCMP_SYS(tgkill), deny, SCMP_A0(SCMP_CMP_NE, (scmp_datum_t)self));
  add_cond(SCMP_SYS(rt_sigqueueinfo), deny, SCMP_A0(SCMP_CMP_NE, (scmp_datum_t)self));
  add_cond(SCMP_SYS(rt_tgsigqueueinfo), deny, SCMP_A0(SCMP_CMP_NE, (scmp_datum_t)self));
  // Nothing of the candidate may run outside kf_forward: no signal handlers (a timer or a
  // signal could run its code between calls or slow the reference), no timers at all.
  // Reading a disposition (act == NULL) stays allowed. The SIGSYS handler stays ours.
  // These trap (the verdict names the call) rather than fail quietly: no honest kernel
  // makes them, and a quiet failure would leave the candidate to find another way.
  add_cond(SCMP_SYS(rt_sigaction), deny, SCMP_A1(SCMP_CMP_NE, 0));
  for (const char* name : {"timer_create", "timer_settime", "setitimer", "alarm", "timerfd_create", "timerfd_settime"})
    add(seccomp_syscall_resolve_name(name), deny);
  // The evaluator resumes the stopped worker; the candidate may not (SIGCONT to itself would
  // undo a freeze), and may not fake an outside kill (SIGKILL is scored as the
  // environment's fault) or provoke one through a lowered resource limit.
  for (int sig : {SIGCONT, SIGKILL}) {
    add_cond(SCMP_SYS(tgkill), deny, SCMP_A2(SCMP_CMP_EQ, (scmp_datum_t)sig));
    add_cond(SCMP_SYS(rt_tgsigqueueinfo), deny, SCMP_A2(SCMP_CMP_EQ, (scmp_datum_t)sig));
    add_cond(SCMP_SYS(rt_sigqueueinfo), deny, SCMP_A1(SCMP_CMP_EQ, (scmp_datum_t)sig));
  }
  add_cond(SCMP_SYS(setrlimit), SCMP_ACT_ERRNO(EPERM), SCMP_A1(SCMP_CMP_NE, 0));
  add_cond(SCMP_SYS(prlimit64), SCMP_ACT_ERRNO(EPERM), SCMP_A2(SCMP_CMP_NE, 0));
  add_cond(SCMP_SYS(prlimit64), SCMP_ACT_ERRNO(EPERM), SCMP_A0(SCMP_CMP_NE, 0));
  // Scheduling of any other thread or process: none. Affinity, priority, policy and I/O
  // priority persist while the worker is stopped, so changing the evaluator's threads'
  // would slow the reference (squeezed onto one core, at low priority) while none of the
  // candidate's code runs. Each call may name only the calling thread (0). Priority,
  // policy, I/O priority and page migration of another target trap (the verdict names the
  // call); affinity of another thread fails with EPERM instead: pthread_setaffinity_np
  // names even the caller's own threads by id, and an honest kernel that pins its threads
  // runs unpinned rather than being scored a cheat.
  add_cond(SCMP_SYS(sched_setaffinity), SCMP_ACT_ERRNO(EPERM), SCMP_A0(SCMP_CMP_NE, 0));
  for (const char* name : {"sched_setscheduler", "sched_setparam", "sched_setattr", "migrate_pages", "move_pages"})
    add_cond(seccomp_syscall_resolve_name(name), deny, SCMP_A0(SCMP_CMP_NE, 0));
  add_cond(SCMP_SYS(setpriority), deny, SCMP_A0(SCMP_CMP_NE, 0 /*PRIO_PROCESS*/));
  add_cond(SCMP_SYS(setpriority), deny, SCMP_A1(SCMP_CMP_NE, 0));
  add_cond(SCMP_SYS(ioprio_set), deny, SCMP_A0(SCMP_CMP_NE, 1 /*IOPRIO_WHO_PROCESS*/));
  add_cond(SCMP_SYS(ioprio_set), deny, SCMP_A1(SCMP_CMP_NE, 0));
  // No more privileges via prctl tricks is covered by no_new_privs; forbid re-enabling dumping.
  add_cond(SCMP_SYS(prctl), SCMP_ACT_ERRNO(EPERM), SCMP_A0(SCMP_CMP_EQ, PR_SET_DUMPABLE));

  if (rc != 0) {
    seccomp_release(ctx);
    return std::string("seccomp_rule_add: ") + std::strerror(-rc);
  }
  rc = seccomp_load(ctx);
  seccomp_release(ctx);
  if (rc != 0) return std::string("seccomp_load: ") + std::strerror(-rc);
  return "";
}

}  // namespace kf::evaluator::worker
