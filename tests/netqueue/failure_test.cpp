// StreamQueue failures against a real redis-server: wrong or missing password, nothing
// listening, the server SIGKILLed under a blocked consumer and a producer, malformed
// records written by another client. Each must be a kf::Error naming host:port (or the
// record), quickly, never a crash or a hang.
#include <hiredis/hiredis.h>
#include <signal.h>

#include <functional>
#include <future>
#include <thread>

#include "kf/common/error.h"
#include "test_util.h"

using namespace kf::netqueue;
using kf::netqueue::test::seconds_since;
using kf::netqueue::test::start_server;
using Clock = std::chrono::steady_clock;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const kf::Error& e) {
    return e.what();
  }
  return "(no error)";
}

std::string hostport(const RedisServer& s) { return "127.0.0.1:" + std::to_string(s.port()); }

}  // namespace

TEST(NetqueueFailureTest, WrongPasswordRefusedWithClearMessage) {
  RedisServer srv = start_server();
  StreamConfig cfg = srv.client_config();
  cfg.password = "not-the-password";
  std::string e = error_of([&] { StreamQueue::open(cfg); });
  EXPECT_NE(e.find("redis at " + hostport(srv)), std::string::npos) << e;
  EXPECT_NE(e.find("AUTH refused for user 'kf'"), std::string::npos) << e;
  EXPECT_NE(e.find("WRONGPASS"), std::string::npos) << e;

  cfg.password = "";  // no AUTH at all: the default user is off
  e = error_of([&] { StreamQueue::open(cfg); });
  EXPECT_NE(e.find(hostport(srv)), std::string::npos) << e;
  EXPECT_NE(e.find("NOAUTH"), std::string::npos) << e;

  cfg = srv.client_config();
  cfg.port = 0;
  e = error_of([&] { StreamQueue::open(cfg); });
  EXPECT_NE(e.find("netqueue config: field 'port'"), std::string::npos) << e;
}

TEST(NetqueueFailureTest, NothingListeningNamesTheAddress) {
  RedisServer srv = start_server();
  StreamConfig cfg = srv.client_config();
  srv.stop();  // its port is now closed
  auto t0 = Clock::now();
  std::string e = error_of([&] { StreamQueue::open(cfg); });
  EXPECT_LT(seconds_since(t0), 3.0);
  EXPECT_NE(e.find("redis at " + hostport(srv) + ": cannot connect"), std::string::npos) << e;
}

TEST(NetqueueFailureTest, ServerKilledMidRunGivesClearErrorNotHang) {
  RedisServer srv = start_server();
  StreamConfig cfg = srv.client_config();
  cfg.io_timeout = Millis(2000);
  StreamQueue prod = StreamQueue::open(cfg);
  ASSERT_TRUE(prod.push(1, "one", Millis(1000)));
  StreamQueue cons = StreamQueue::open(cfg);
  ASSERT_EQ(cons.take(1, Millis(1000)).size(), 1u);

  // The consumer blocks in XREADGROUP for up to 20 s; the server dies under it.
  auto t0 = Clock::now();
  auto blocked = std::async(std::launch::async, [&] { return error_of([&] { cons.take(1, Millis(20000)); }); });
  std::this_thread::sleep_for(Millis(300));
  srv.kill();
  ASSERT_EQ(blocked.wait_for(std::chrono::seconds(5)), std::future_status::ready)
      << "take() hung after the server died";
  std::string e = blocked.get();
  EXPECT_LT(seconds_since(t0), 5.0);
  EXPECT_NE(e.find("redis at " + hostport(srv)), std::string::npos) << e;
  EXPECT_NE(e.find("XREADGROUP failed"), std::string::npos) << e;

  // The producer's open connection finds the server gone; its next push reconnects,
  // finds nothing listening, and says so.
  e = error_of([&] { prod.push(2, "two", Millis(1000)); });
  EXPECT_NE(e.find("redis at " + hostport(srv) + ": XADD (push script) failed"), std::string::npos) << e;
  e = error_of([&] { prod.push(2, "two", Millis(1000)); });
  EXPECT_NE(e.find("redis at " + hostport(srv) + ": cannot connect"), std::string::npos) << e;
  // The consumer too, on its next call.
  e = error_of([&] { cons.take(1, Millis(100)); });
  EXPECT_NE(e.find("cannot connect"), std::string::npos) << e;
}

TEST(NetqueueFailureTest, MalformedRecordsAreDeadLetteredNotDelivered) {
  RedisServer srv = start_server();
  StreamConfig cfg = srv.client_config();
  StreamQueue q = StreamQueue::open(cfg);

  // Another client writes entries that are not records.
  redisContext* c = redisConnect("127.0.0.1", srv.port());
  ASSERT_TRUE(c && !c->err);
  auto cmd = [&](const std::string& s) {
    redisReply* r = static_cast<redisReply*>(redisCommand(c, s.c_str()));
    ASSERT_TRUE(r);
    EXPECT_NE(r->type, REDIS_REPLY_ERROR) << s << ": " << (r->str ? r->str : "");
    freeReplyObject(r);
  };
  cmd("AUTH kf " + cfg.password);
  cmd("XADD kf:candidates * foo bar");
  cmd("XADD kf:candidates * t abc d xyz");
  cmd("XADD kf:candidates * t 5 d ok extra field");
  redisFree(c);
  ASSERT_TRUE(q.push(6, "valid", Millis(1000)));

  auto got = q.take(10, Millis(1000));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].tag, 6u);
  EXPECT_EQ(got[0].data, "valid");
  EXPECT_EQ(q.stats().dead_lettered, 3u);
  auto dead = q.dead_letters(10);
  ASSERT_EQ(dead.size(), 3u);
  EXPECT_EQ(dead[0][2], "reason");
  EXPECT_NE(dead[0][3].find("malformed record: expected fields [t, d]"), std::string::npos) << dead[0][3];
  EXPECT_NE(dead[1][3].find("tag 'abc' is not an unsigned integer"), std::string::npos) << dead[1][3];
  EXPECT_NE(dead[2][3].find("expected fields [t, d], got 3 field(s)"), std::string::npos) << dead[2][3];
  EXPECT_EQ(q.ack({got[0].id}), 1u);
  StreamDepth d = q.depth();
  EXPECT_EQ(d.length, 0u);
  EXPECT_EQ(d.pending, 0u);
  EXPECT_EQ(d.dead, 3u);
}

// A server that stops answering (SIGSTOP: a hung host or a silent network) gives an
// error after io_timeout, not a hang.
TEST(NetqueueFailureTest, SilentServerTimesOutWithClearError) {
  RedisServer srv = start_server();
  StreamConfig cfg = srv.client_config();
  cfg.io_timeout = Millis(500);
  StreamQueue q = StreamQueue::open(cfg);
  ASSERT_TRUE(q.push(1, "one", Millis(1000)));
  ASSERT_EQ(kill(srv.pid(), SIGSTOP), 0);
  auto t0 = Clock::now();
  std::string e = error_of([&] { q.push(2, "two", Millis(1000)); });
  double waited = seconds_since(t0);
  kill(srv.pid(), SIGCONT);
  EXPECT_GE(waited, 0.4);
  EXPECT_LT(waited, 3.0);
  EXPECT_NE(e.find("redis at " + hostport(srv) + ": XADD (push script) failed: no reply within the timeout"),
            std::string::npos)
      << e;
  // Once it answers again, the next call reconnects and works.
  EXPECT_TRUE(q.push(3, "three", Millis(1000)));
  EXPECT_EQ(q.stats().reconnects, 1u);
}
