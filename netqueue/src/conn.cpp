// Conn: connect (with timeout), AUTH, socket timeouts, and error text naming the server.
#include "conn.h"

#include <sys/time.h>

#include <utility>

#include "kf/common/error.h"

namespace kf::netqueue::detail {

Args& Args::add(const char* s) {
  ptr.push_back(s);
  len.push_back(std::char_traits<char>::length(s));
  return *this;
}

Args& Args::add_copy(std::string s) {
  own.push_back(std::make_unique<std::string>(std::move(s)));
  ptr.push_back(own.back()->data());
  len.push_back(own.back()->size());
  return *this;
}

namespace {
timeval to_tv(std::chrono::milliseconds t) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(t.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((t.count() % 1000) * 1000);
  return tv;
}
}  // namespace

Conn::Conn(std::string host, int port, std::string user, std::string password,
           std::chrono::milliseconds connect_timeout, std::chrono::milliseconds io_timeout)
    : host_(std::move(host)),
      user_(std::move(user)),
      password_(std::move(password)),
      port_(port),
      connect_timeout_(connect_timeout),
      io_timeout_(io_timeout) {
  connect();
}

Conn::~Conn() {
  if (ctx_) redisFree(ctx_);
}

void Conn::connect() {
  if (ctx_) {
    redisFree(ctx_);
    ctx_ = nullptr;
  }
  redisContext* c = redisConnectWithTimeout(host_.c_str(), port_, to_tv(connect_timeout_));
  if (!c) throw Error(where() + ": cannot connect: out of memory for the connection");
  if (c->err) {
    std::string msg = where() + ": cannot connect: " + c->errstr +
                      " (is redis-server running there, and is the address in the config right?)";
    redisFree(c);
    throw Error(msg);
  }
  redisEnableKeepAlive(c);
  ctx_ = c;
  set_read_timeout(io_timeout_);
  if (!password_.empty()) {
    Args a;
    a.add("AUTH");
    if (!user_.empty()) a.add(user_);
    a.add(password_);
    Reply r = call(a, "AUTH", false);
    if (r->type == REDIS_REPLY_ERROR) {
      std::string msg = where() + ": AUTH refused for user '" + (user_.empty() ? "default" : user_) +
                        "': " + std::string(r->str, r->len) + " (check the password and the ACL user in the config)";
      redisFree(ctx_);
      ctx_ = nullptr;
      throw Error(msg);
    }
  }
}

void Conn::reconnect() { connect(); }

void Conn::set_read_timeout(std::chrono::milliseconds t) {
  if (ctx_ && redisSetTimeout(ctx_, to_tv(t)) != REDIS_OK) fail_io("setting the socket timeout");
}

void Conn::fail_io(const char* what) {
  std::string err = ctx_ ? std::string(ctx_->errstr) : "not connected";
  if (ctx_ && ctx_->err == REDIS_ERR_IO && err.find("temporarily unavailable") != std::string::npos)
    err = "no reply within the timeout (" + err + ")";
  if (ctx_) redisFree(ctx_);
  ctx_ = nullptr;
  throw Error(where() + ": " + what + " failed: " + err + " (connection dropped; the next call reconnects)");
}

Reply Conn::call(const Args& a, const char* what, bool throw_on_error) {
  if (!ctx_) reconnect();
  void* raw =
      redisCommandArgv(ctx_, static_cast<int>(a.ptr.size()), const_cast<const char**>(a.ptr.data()), a.len.data());
  if (!raw) fail_io(what);
  Reply r(static_cast<redisReply*>(raw));
  if (throw_on_error && r->type == REDIS_REPLY_ERROR)
    throw Error(where() + ": " + what + " refused: " + std::string(r->str, r->len));
  return r;
}

std::vector<Reply> Conn::pipeline(const std::vector<Args>& cmds, const char* what, bool throw_on_error) {
  if (!ctx_) reconnect();
  for (const Args& a : cmds)
    if (redisAppendCommandArgv(ctx_, static_cast<int>(a.ptr.size()), const_cast<const char**>(a.ptr.data()),
                               a.len.data()) != REDIS_OK)
      fail_io(what);
  std::vector<Reply> out;
  out.reserve(cmds.size());
  for (std::size_t i = 0; i < cmds.size(); ++i) {
    void* raw = nullptr;
    if (redisGetReply(ctx_, &raw) != REDIS_OK || !raw) fail_io(what);
    out.emplace_back(static_cast<redisReply*>(raw));
  }
  if (throw_on_error)
    for (const Reply& r : out)
      if (r->type == REDIS_REPLY_ERROR) throw Error(where() + ": " + what + " refused: " + std::string(r->str, r->len));
  return out;
}

std::string describe(const redisReply* r) {
  if (!r) return "no reply";
  switch (r->type) {
    case REDIS_REPLY_STRING:
      return "string(" + std::to_string(r->len) + " bytes)";
    case REDIS_REPLY_ARRAY:
      return "array(" + std::to_string(r->elements) + ")";
    case REDIS_REPLY_INTEGER:
      return "integer " + std::to_string(r->integer);
    case REDIS_REPLY_NIL:
      return "nil";
    case REDIS_REPLY_STATUS:
      return "status " + std::string(r->str, r->len);
    case REDIS_REPLY_ERROR:
      return "error " + std::string(r->str, r->len);
    default:
      return "reply type " + std::to_string(r->type);
  }
}

std::string reply_string(const redisReply* r, const std::string& where, const char* what) {
  if (!r || (r->type != REDIS_REPLY_STRING && r->type != REDIS_REPLY_STATUS))
    throw Error(where + ": " + what + ": expected a string, got " + describe(r));
  return std::string(r->str, r->len);
}

long long reply_integer(const redisReply* r, const std::string& where, const char* what) {
  if (!r || r->type != REDIS_REPLY_INTEGER)
    throw Error(where + ": " + what + ": expected an integer, got " + describe(r));
  return r->integer;
}

}  // namespace kf::netqueue::detail
