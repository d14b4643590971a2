// Conn: one hiredis connection with AUTH, socket timeouts and errors that name the
// server. Private to netqueue. Every failure throws kf::Error "redis at HOST:PORT: ...";
// an I/O failure also marks the connection broken (the owner reconnects).
#pragma once
#include <hiredis/hiredis.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace kf::netqueue::detail {

struct ReplyFree {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyFree>;

// A command as binary-safe arguments (views into caller-owned bytes).
struct Args {
  std::vector<const char*> ptr;
  std::vector<std::size_t> len;
  std::vector<std::unique_ptr<std::string>> own;  // numbers and other temporaries (heap: pointers stay valid)
  Args& add(const std::string& s) {
    ptr.push_back(s.data());
    len.push_back(s.size());
    return *this;
  }
  Args& add(const char* s);
  Args& add_copy(std::string s);
};

class Conn {
 public:
  Conn(std::string host, int port, std::string user, std::string password, std::chrono::milliseconds connect_timeout,
       std::chrono::milliseconds io_timeout);
  ~Conn();
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  // Sends one command, returns its reply. Throws on I/O errors (connection marked
  // broken). A server error reply is returned as is unless `throw_on_error`.
  Reply call(const Args& a, const char* what, bool throw_on_error = true);
  // Pipelines the commands, then reads every reply in order.
  std::vector<Reply> pipeline(const std::vector<Args>& cmds, const char* what, bool throw_on_error = true);
  // Read timeout for the next calls (a BLOCK command needs block time + io_timeout).
  void set_read_timeout(std::chrono::milliseconds t);
  void reset_read_timeout() { set_read_timeout(io_timeout_); }
  bool broken() const { return ctx_ == nullptr; }
  void reconnect();
  std::string where() const { return "redis at " + host_ + ":" + std::to_string(port_); }

 private:
  void connect();
  [[noreturn]] void fail_io(const char* what);
  std::string host_, user_, password_;
  int port_;
  std::chrono::milliseconds connect_timeout_, io_timeout_;
  redisContext* ctx_ = nullptr;
};

// Reply helpers: throw kf::Error naming `where` and `what` when the shape is wrong.
std::string reply_string(const redisReply* r, const std::string& where, const char* what);
long long reply_integer(const redisReply* r, const std::string& where, const char* what);
std::string describe(const redisReply* r);  // short text of a reply, for error messages

}  // namespace kf::netqueue::detail
