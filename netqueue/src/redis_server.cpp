// RedisServer: starts redis-server from a generated config file (0600: the password is
// not on a command line), waits until AUTH + PING answer, stops it with SIGTERM/SIGKILL.
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "conn.h"
#include "kf/common/error.h"
#include "kf/common/log.h"
#include "kf/netqueue/netqueue.h"

namespace kf::netqueue {

namespace {

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0)
    throw Error(std::string("redis-server: cannot open a socket to find a free port: ") + std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    int e = errno;
    ::close(fd);
    throw Error(std::string("redis-server: cannot find a free port: ") + std::strerror(e));
  }
  int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

std::string tail(const std::string& path, std::size_t lines) {
  std::ifstream in(path);
  std::vector<std::string> all;
  for (std::string l; std::getline(in, l);) all.push_back(l);
  std::string out;
  for (std::size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) out += "\n  " + all[i];
  return out.empty() ? " (empty log)" : out;
}

void remove_dir(const std::string& dir) {
  for (const char* f : {"redis.conf", "redis.log", "dump.rdb"}) ::unlink((dir + "/" + f).c_str());
  ::rmdir(dir.c_str());
}

bool no_space(const std::string& s) {
  for (unsigned char c : s)
    if (std::isspace(c) || std::iscntrl(c) || c == '"' || c == '\'') return false;
  return !s.empty();
}

}  // namespace

RedisServer RedisServer::start(const ServerOptions& opt) {
  if (!no_space(opt.password))
    throw error_at("redis-server options", "field 'password' must be non-empty, without spaces or quotes");
  if (!no_space(opt.user))
    throw error_at("redis-server options", "field 'user' must be non-empty, without spaces or quotes");
  if (opt.bind.empty()) throw error_at("redis-server options", "field 'bind' names no address");
  for (const auto& b : opt.bind)
    if (!no_space(b)) throw error_at("redis-server options", "field 'bind' has a bad address '" + b + "'");
  if (opt.port < 0 || opt.port > 65535) throw error_at("redis-server options", "field 'port' must be 0..65535");

  RedisServer s;
  s.opt_ = opt;
  if (opt.dir.empty()) {
    char tmpl[] = "/tmp/kf-redis-XXXXXX";
    if (!::mkdtemp(tmpl))
      throw Error(std::string("redis-server: cannot make a folder under /tmp: ") + std::strerror(errno));
    s.dir_ = tmpl;
    s.own_dir_ = true;
  } else {
    s.dir_ = opt.dir;
    ::mkdir(s.dir_.c_str(), 0700);
  }

  const int attempts = opt.port == 0 ? 3 : 1;  // a picked free port can be taken before redis binds it
  std::string last_error;
  for (int attempt = 0; attempt < attempts; ++attempt) {
    s.port_ = opt.port == 0 ? free_port() : opt.port;
    const std::string conf = s.dir_ + "/redis.conf";
    {
      int fd = ::open(conf.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (fd < 0) throw Error("redis-server: cannot write " + conf + ": " + std::strerror(errno));
      std::ostringstream c;
      c << "port " << s.port_ << "\nbind";
      for (const auto& b : opt.bind) c << ' ' << b;
      c << "\nprotected-mode yes\ndaemonize no\nsave \"\"\nappendonly no\n"
        << "dir " << s.dir_ << "\nlogfile " << s.dir_ << "/redis.log\n"
        << "user default off\n"
        << "user " << opt.user << " on >" << opt.password << " ~" << opt.key_prefix
        << "* resetchannels +@all -@dangerous +info\n";
      if (opt.max_memory_mb > 0) c << "maxmemory " << opt.max_memory_mb << "mb\nmaxmemory-policy noeviction\n";
      std::string text = c.str();
      bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
      ::close(fd);
      if (!ok) throw Error("redis-server: cannot write " + conf);
    }
    ::unlink(s.log_path().c_str());
    pid_t parent = getpid();
    pid_t pid = ::fork();
    if (pid < 0) throw Error(std::string("redis-server: fork failed: ") + std::strerror(errno));
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // the server dies with its starter
      if (getppid() != parent) _exit(127);
      ::setpgid(0, 0);  // a terminal's Ctrl-C goes to the launcher, which stops us
      execlp(opt.executable.c_str(), opt.executable.c_str(), conf.c_str(), static_cast<char*>(nullptr));
      std::fprintf(stderr, "redis-server: cannot exec '%s': %s\n", opt.executable.c_str(), std::strerror(errno));
      _exit(127);
    }
    s.pid_ = pid;
    const auto deadline = std::chrono::steady_clock::now() + opt.start_timeout;
    bool up = false;
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        s.pid_ = -1;
        last_error =
            "exited (" +
            std::string(WIFEXITED(status) ? "status " + std::to_string(WEXITSTATUS(status))
                                          : "signal " + std::to_string(WTERMSIG(status))) +
            ")" + (WIFEXITED(status) && WEXITSTATUS(status) == 127 ? " - is '" + opt.executable + "' installed?" : "");
        break;
      }
      try {
        detail::Conn c(opt.bind.front() == "0.0.0.0" ? "127.0.0.1" : opt.bind.front(), s.port_, opt.user, opt.password,
                       Millis(200), Millis(1000));
        detail::Args ping;
        ping.add("PING");
        c.call(ping, "PING");
        up = true;
        break;
      } catch (const Error& e) {
        last_error = e.what();
      }
      std::this_thread::sleep_for(Millis(20));
    }
    if (up) {
      log_info("netqueue: redis-server pid ", s.pid_, " listening on ", opt.bind.front(), ":", s.port_, " (user ",
               opt.user, ", folder ", s.dir_, ")");
      return s;
    }
    std::string log_tail = tail(s.log_path(), 8);
    if (s.pid_ > 0) {
      ::kill(s.pid_, SIGKILL);
      ::waitpid(s.pid_, nullptr, 0);
      s.pid_ = -1;
      last_error = "did not answer within " + std::to_string(opt.start_timeout.count()) + " ms (" + last_error + ")";
    }
    last_error += "; log " + s.log_path() + ":" + log_tail;
    bool port_taken = log_tail.find("Address already in use") != std::string::npos;
    log_warn("netqueue: redis-server on port ", s.port_, " ", last_error,
             port_taken && attempt + 1 < attempts ? "; trying another port" : "");
    if (!port_taken) break;
  }
  throw Error("redis-server (" + opt.executable + ") on " + opt.bind.front() + ":" + std::to_string(s.port_) +
              " failed to start: " + last_error);
}

RedisServer::RedisServer(RedisServer&& o) noexcept
    : opt_(std::move(o.opt_)), pid_(o.pid_), port_(o.port_), dir_(std::move(o.dir_)), own_dir_(o.own_dir_) {
  o.pid_ = -1;
  o.own_dir_ = false;
}

RedisServer& RedisServer::operator=(RedisServer&& o) noexcept {
  if (this != &o) {
    stop();
    opt_ = std::move(o.opt_);
    pid_ = o.pid_;
    port_ = o.port_;
    dir_ = std::move(o.dir_);
    own_dir_ = o.own_dir_;
    o.pid_ = -1;
    o.own_dir_ = false;
  }
  return *this;
}

RedisServer::~RedisServer() { stop(); }

void RedisServer::stop() {
  if (pid_ > 0) {
    ::kill(pid_, SIGTERM);
    bool gone = false;
    for (int i = 0; i < 200 && !gone; ++i) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_)
        gone = true;
      else
        std::this_thread::sleep_for(Millis(10));
    }
    if (!gone) {
      log_warn("netqueue: redis-server pid ", pid_, " did not stop within 2 s of SIGTERM; sending SIGKILL");
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    pid_ = -1;
  }
  if (own_dir_) {
    remove_dir(dir_);
    own_dir_ = false;
  }
}

void RedisServer::kill() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
}

StreamConfig RedisServer::client_config() const {
  StreamConfig c;
  c.host = opt_.bind.front() == "0.0.0.0" ? "127.0.0.1" : opt_.bind.front();
  c.port = port_;
  c.user = opt_.user;
  c.password = opt_.password;
  return c;
}

}  // namespace kf::netqueue
