// StoreRendezvous against a real redis-server: ranks in separate processes hand over a
// blob (as the NCCL unique id goes from rank 0 to the others across nodes), and every
// way it can fail names what is missing.
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "../test_support.h"
#include "kf/common/error.h"
#include "kf/netqueue/netqueue.h"
#include "test_util.h"

namespace kf::netqueue {
namespace {

using test::start_server;
using Clock = std::chrono::steady_clock;

RendezvousConfig config_for(const RedisServer& srv, int rank, int world, const std::string& scope = "runA") {
  RendezvousConfig c;
  c.server = srv.client_config();
  c.scope = scope;
  c.rank = rank;
  c.world = world;
  c.timeout = Millis(10000);
  return c;
}

// A binary blob like an NCCL unique id (128 bytes, zeros and newlines included).
std::string blob() {
  std::string b(128, '\0');
  for (int i = 0; i < 128; ++i) b[i] = static_cast<char>((i * 37 + 11) & 0xff);
  b[5] = '\n';
  b[6] = ',';
  return b;
}

// A child process running one rank; exit 0 = it handed over / received exactly blob().
pid_t spawn_rank(const RedisServer& srv, int rank, int world, int delay_ms) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  int code = 1;
  try {
    usleep(static_cast<useconds_t>(delay_ms) * 1000);
    StoreRendezvous r(config_for(srv, rank, world));
    if (rank == 0) {
      r.publish("nccl_id", blob());
      code = 0;
    } else {
      code = r.fetch("nccl_id", Millis(10000)) == blob() ? 0 : 3;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    code = 2;
  }
  _exit(code);
}

using kf::test::wait_exit;

TEST(NetqueueRendezvousTest, FourProcessesGetRankZerosBlob) {
  auto srv = start_server();
  // Rank 0 comes last, so the others wait for it; and once first, so it waits for them.
  for (int rank0_delay : {400, 0}) {
    SCOPED_TRACE("rank 0 delay " + std::to_string(rank0_delay));
    std::vector<pid_t> kids;
    kids.push_back(spawn_rank(srv, 0, 4, rank0_delay));
    for (int r = 1; r < 4; ++r) kids.push_back(spawn_rank(srv, r, 4, rank0_delay ? 0 : 300 * r));
    for (std::size_t i = 0; i < kids.size(); ++i) EXPECT_EQ(wait_exit(kids[i]), 0) << "rank " << i;
  }
}

TEST(NetqueueRendezvousTest, RankZeroTimeoutNamesTheRanksThatNeverCame) {
  auto srv = start_server();
  const pid_t one = spawn_rank(srv, 1, 3, 0);  // rank 2 never starts
  auto c = config_for(srv, 0, 3);
  c.timeout = Millis(1500);
  StoreRendezvous r(c);
  const auto t0 = Clock::now();
  try {
    r.publish("nccl_id", blob());
    FAIL() << "publish did not time out";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("rendezvous 'nccl_id' of run 'runA'"), std::string::npos) << m;
    EXPECT_NE(m.find("redis at 127.0.0.1:" + std::to_string(srv.port())), std::string::npos) << m;
    EXPECT_NE(m.find("rank(s) 2 did not announce themselves within 1500 ms"), std::string::npos) << m;
  }
  EXPECT_LT(test::seconds_since(t0), 5.0);
  kill(one, SIGKILL);
  wait_exit(one);
}

TEST(NetqueueRendezvousTest, FetchTimeoutNamesRankZeroAndTheMissing) {
  auto srv = start_server();
  StoreRendezvous r(config_for(srv, 1, 3));
  try {
    r.fetch("nccl_id", Millis(800));
    FAIL() << "fetch did not time out";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("rank 1 of 3: rank 0 did not publish; rank(s) 0, 2 never announced themselves within 800 ms"),
              std::string::npos)
        << m;
  }
}

TEST(NetqueueRendezvousTest, AnEarlierAttemptsValueIsNotTaken) {
  auto srv = start_server();
  {  // attempt 1 completes
    const pid_t a = spawn_rank(srv, 0, 2, 0), b = spawn_rank(srv, 1, 2, 0);
    ASSERT_EQ(wait_exit(a), 0);
    ASSERT_EQ(wait_exit(b), 0);
  }
  // Attempt 2: a restarted rank 1 must not take attempt 1's id (its NCCL init would hang).
  StoreRendezvous r(config_for(srv, 1, 2));
  try {
    r.fetch("nccl_id", Millis(600));
    FAIL() << "fetch took an earlier attempt's value";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("only an earlier attempt's value is there"), std::string::npos) << e.what();
  }
  // Its rank 0 comes: both meet.
  const pid_t a = spawn_rank(srv, 0, 2, 0);
  EXPECT_EQ(r.fetch("nccl_id", Millis(10000)), blob());
  EXPECT_EQ(wait_exit(a), 0);
}

TEST(NetqueueRendezvousTest, RunsDoNotSeeEachOther) {
  auto srv = start_server();
  StoreRendezvous a0(config_for(srv, 0, 1, "runA"));
  a0.publish("nccl_id", "A");  // world 1: nobody to wait for
  StoreRendezvous b1(config_for(srv, 1, 2, "runB"));
  EXPECT_THROW(b1.fetch("nccl_id", Millis(300)), Error);
}

TEST(NetqueueRendezvousTest, WrongPasswordFailsAtOnceAndBadConfigNamesTheField) {
  auto srv = start_server();
  auto c = config_for(srv, 1, 2);
  c.server.password = "not-the-password";
  StoreRendezvous r(c);
  const auto t0 = Clock::now();
  try {
    r.fetch("nccl_id", Millis(5000));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("AUTH refused"), std::string::npos) << e.what();
  }
  EXPECT_LT(test::seconds_since(t0), 2.0);
  auto bad = config_for(srv, 2, 2);
  try {
    StoreRendezvous x(bad);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("field 'rank' must be 0..1, got 2"), std::string::npos) << e.what();
  }
  bad = config_for(srv, 0, 2, "a:b");
  EXPECT_THROW(StoreRendezvous{bad}, Error);
}

TEST(NetqueueRendezvousTest, ServerNotUpYetIsRetriedUntilTheDeadline) {
  auto srv = start_server();
  auto c = config_for(srv, 1, 2);
  srv.kill();  // nothing listens on the port now
  StoreRendezvous r(c);
  const auto t0 = Clock::now();
  try {
    r.fetch("nccl_id", Millis(700));
    FAIL();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("could not reach the server within 700 ms"), std::string::npos) << m;
    EXPECT_NE(m.find("cannot connect"), std::string::npos) << m;
  }
  EXPECT_LT(test::seconds_since(t0), 4.0);
}

}  // namespace
}  // namespace kf::netqueue
