// StreamQueue behaviour against a real redis-server: order, acknowledgement, claims of
// a SIGKILLed consumer's records (each acknowledged exactly once), back-pressure,
// atomic ack-and-forward, keep-alive, dead letters.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "kf/common/error.h"
#include "kf/replay/replay.h"
#include "test_util.h"

using namespace kf::netqueue;
using kf::netqueue::test::seconds_since;
using kf::netqueue::test::start_server;
using Clock = std::chrono::steady_clock;

namespace {

std::string payload(uint64_t i, std::size_t n) {
  std::string s(n, '\0');
  for (std::size_t k = 0; k < n; ++k) s[k] = static_cast<char>((i * 131 + k * 7) & 0xff);  // zeros included
  return s;
}

}  // namespace

TEST(NetqueueTest, PutTakeAckInOrder) {
  RedisServer srv = start_server();
  StreamConfig cfg = srv.client_config();
  StreamQueue prod = StreamQueue::open(cfg);
  StreamQueue cons = StreamQueue::open(cfg);

  // One record is a real encoded candidate: the same bytes the shared-memory queue carries.
  kf::replay::Candidate cand;
  cand.id = 4242;
  cand.task = "level1/matmul";
  cand.completion_tokens = {1, 2, 3};
  cand.behaviour_logprobs = {-0.5f, -0.25f, -1.0f};
  cand.source = "extern \"C\" int kf_forward(...) { return 0; }";
  std::string cand_bytes(kf::replay::encoded_size(cand), '\0');
  kf::replay::encode(cand, reinterpret_cast<unsigned char*>(cand_bytes.data()));

  std::vector<Outgoing> recs;
  for (uint64_t i = 0; i < 100; ++i) recs.push_back({1000 + i, payload(i, 64 + i * 13)});
  recs[7] = {cand.id, cand_bytes};
  ASSERT_EQ(prod.push_batch(recs, Millis(2000)), 100u);
  EXPECT_EQ(prod.stats().pushed, 100u);

  std::vector<Message> got;
  while (got.size() < 100) {
    auto batch = cons.take(30, Millis(2000));
    ASSERT_FALSE(batch.empty()) << "take timed out after " << got.size() << " records";
    EXPECT_LE(batch.size(), 30u);
    for (auto& m : batch) got.push_back(std::move(m));
  }
  std::set<std::string> ids;
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].tag, recs[i].tag) << "position " << i;
    EXPECT_EQ(got[i].data, recs[i].data) << "position " << i;
    EXPECT_EQ(got[i].deliveries, 1u);
    ids.insert(got[i].id);
  }
  EXPECT_EQ(ids.size(), 100u);
  auto back =
      kf::replay::decode_candidate(reinterpret_cast<const unsigned char*>(got[7].data.data()), got[7].data.size());
  EXPECT_EQ(back.id, 4242u);
  EXPECT_EQ(back.task, "level1/matmul");
  EXPECT_EQ(back.behaviour_logprobs, cand.behaviour_logprobs);

  // Pending until acknowledged.
  StreamDepth d = cons.depth();
  EXPECT_EQ(d.length, 100u);
  EXPECT_EQ(d.pending, 100u);

  std::vector<std::string> idv;
  for (auto& m : got) idv.push_back(m.id);
  std::vector<bool> first;
  EXPECT_EQ(cons.ack(idv, &first), 100u);
  EXPECT_EQ(std::count(first.begin(), first.end(), true), 100);
  d = cons.depth();
  EXPECT_EQ(d.length, 0u);
  EXPECT_EQ(d.pending, 0u);

  // Acknowledged records never come back, and a second ack is reported as late.
  EXPECT_TRUE(cons.take(10, Millis(150)).empty());
  EXPECT_EQ(cons.ack({idv[0]}, &first), 0u);
  EXPECT_FALSE(first[0]);
  EXPECT_EQ(cons.stats().ack_late, 1u);
  EXPECT_THROW(cons.ack({"not-an-id"}), kf::Error);
}

// A consumer process takes 40 records and is SIGKILLed holding them. Two live consumers
// share the rest and claim the dead one's 40 after claim_idle: every record acknowledged
// exactly once (counted by tag), none left pending.
TEST(NetqueueTest, KilledConsumerRecordsClaimedExactlyOnce) {
  RedisServer srv = start_server();
  StreamConfig cfg = srv.client_config();
  cfg.claim_idle = Millis(1000);  // well above any scheduling stall of a live consumer on a loaded 2-core box
  cfg.claim_every = Millis(50);
  constexpr uint64_t kN = 300;
  constexpr std::size_t kDead = 40;
  {
    StreamQueue prod = StreamQueue::open(cfg);
    std::vector<Outgoing> recs;
    for (uint64_t i = 0; i < kN; ++i) recs.push_back({i, payload(i, 4096)});
    ASSERT_EQ(prod.push_batch(recs, Millis(5000)), kN);
  }

  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(fds[0]);
    int rc = 1;
    try {
      StreamConfig c = cfg;
      c.consumer = "doomed";
      StreamQueue q = StreamQueue::open(c);
      std::size_t n = 0;
      while (n < kDead) n += q.take(kDead - n, Millis(2000)).size();
      rc = n == kDead ? 0 : 1;
    } catch (...) {
      rc = 2;
    }
    char b = static_cast<char>(rc);
    if (write(fds[1], &b, 1) != 1) _exit(3);
    pause();  // holds its 40 records until killed
    _exit(0);
  }
  close(fds[1]);
  char b = 9;
  ASSERT_EQ(read(fds[0], &b, 1), 1);
  close(fds[0]);
  ASSERT_EQ(b, 0) << "the doomed consumer could not take its records";
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));

  std::mutex mu;
  std::map<uint64_t, int> acked;  // tag -> acknowledgements that removed it
  std::map<uint64_t, uint32_t> deliveries;
  std::atomic<uint64_t> claimed{0}, total{0};
  auto consumer = [&](int k) {
    StreamConfig c = cfg;
    c.consumer = "live-" + std::to_string(k);
    StreamQueue q = StreamQueue::open(c);
    auto t0 = Clock::now();
    while (total.load() < kN && seconds_since(t0) < 20) {
      auto got = q.take(16, Millis(100));
      std::vector<std::string> ids;
      for (auto& m : got) ids.push_back(m.id);
      std::vector<bool> first;
      q.ack(ids, &first);
      std::lock_guard<std::mutex> lk(mu);
      for (std::size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].data, payload(got[i].tag, 4096));
        deliveries[got[i].tag] = std::max(deliveries[got[i].tag], got[i].deliveries);
        if (first[i]) {
          ++acked[got[i].tag];
          ++total;
        }
      }
    }
    claimed += q.stats().claimed;
  };
  std::thread a(consumer, 0), c2(consumer, 1);
  a.join();
  c2.join();

  EXPECT_EQ(total.load(), kN);
  ASSERT_EQ(acked.size(), kN);
  for (const auto& [tag, n] : acked) EXPECT_EQ(n, 1) << "tag " << tag;
  EXPECT_EQ(claimed.load(), kDead);
  std::size_t redelivered = 0;
  for (const auto& [tag, d] : deliveries) redelivered += d == 2;
  EXPECT_EQ(redelivered, kDead);
  StreamQueue check = StreamQueue::open(cfg);
  StreamDepth d = check.depth();
  EXPECT_EQ(d.length, 0u);
  EXPECT_EQ(d.pending, 0u);
  EXPECT_EQ(d.dead, 0u);
}

TEST(NetqueueTest, BackPressureAtBound) {
  RedisServer srv = start_server();
  StreamConfig cfg = srv.client_config();
  cfg.bound = 8;
  StreamQueue prod = StreamQueue::open(cfg);
  std::vector<Outgoing> recs;
  for (uint64_t i = 0; i < 8; ++i) recs.push_back({i, payload(i, 4096)});
  ASSERT_EQ(prod.push_batch(recs, Millis(1000)), 8u);

  auto t0 = Clock::now();
  EXPECT_FALSE(prod.push(8, payload(8, 4096), Millis(200)));
  EXPECT_GE(seconds_since(t0), 0.19);
  EXPECT_EQ(prod.stats().push_timeouts, 1u);
  EXPECT_GE(prod.stats().push_waits, 1u);
  EXPECT_EQ(prod.depth().length, 8u);  // nothing trimmed, nothing added

  // A consumer frees 3 places after 300 ms: the blocked producer goes on then.
  std::thread consumer([&] {
    StreamQueue q = StreamQueue::open(cfg);
    std::this_thread::sleep_for(Millis(300));
    auto got = q.take(3, Millis(1000));
    std::vector<std::string> ids;
    for (auto& m : got) ids.push_back(m.id);
    EXPECT_EQ(q.ack(ids), 3u);
  });
  std::vector<Outgoing> more;
  for (uint64_t i = 8; i < 11; ++i) more.push_back({i, payload(i, 4096)});
  t0 = Clock::now();
  EXPECT_EQ(prod.push_batch(more, Millis(5000)), 3u);
  double waited = seconds_since(t0);
  consumer.join();
  EXPECT_GE(waited, 0.25);
  EXPECT_LT(waited, 3.0);
  EXPECT_EQ(prod.depth().length, 8u);

  // Order survives the wait: the consumer sees 3..10.
  StreamQueue q = StreamQueue::open(cfg);
  auto rest = q.take(100, Millis(1000));
  ASSERT_EQ(rest.size(), 8u);
  for (std::size_t i = 0; i < rest.size(); ++i) EXPECT_EQ(rest[i].tag, 3 + i);
}

// A claimed record scored by two consumers yields exactly one result: the ack that
// finds it pending forwards its result, the late one is dropped.
TEST(NetqueueTest, AckForwardAppendsResultOnce) {
  RedisServer srv = start_server();
  StreamConfig cfg = srv.client_config();
  cfg.claim_idle = Millis(100);
  cfg.claim_every = Millis(20);
  StreamConfig rcfg = srv.client_config();
  rcfg.stream = "kf:results";
  rcfg.group = "replay";
  StreamQueue results = StreamQueue::open(rcfg);
  StreamQueue prod = StreamQueue::open(cfg);
  ASSERT_TRUE(prod.push(77, "candidate-77", Millis(1000)));

  StreamConfig ca = cfg, cb = cfg;
  ca.consumer = "slow";
  cb.consumer = "fast";
  StreamQueue a = StreamQueue::open(ca);
  StreamQueue b = StreamQueue::open(cb);
  auto ma = a.take(1, Millis(1000));
  ASSERT_EQ(ma.size(), 1u);
  std::this_thread::sleep_for(Millis(150));  // a is silent for longer than claim_idle
  auto mb = b.take(1, Millis(1000));
  ASSERT_EQ(mb.size(), 1u);
  EXPECT_EQ(mb[0].id, ma[0].id);
  EXPECT_EQ(mb[0].deliveries, 2u);
  EXPECT_EQ(b.stats().claimed, 1u);
  EXPECT_EQ(a.keep_alive({ma[0].id}), 0u);  // a no longer owns it

  std::vector<bool> first;
  EXPECT_EQ(b.ack_forward({mb[0].id}, {{77, "result-from-fast"}}, rcfg.stream, &first), 1u);
  EXPECT_TRUE(first[0]);
  EXPECT_EQ(a.ack_forward({ma[0].id}, {{77, "result-from-slow"}}, rcfg.stream, &first), 0u);
  EXPECT_FALSE(first[0]);
  EXPECT_EQ(a.stats().ack_late, 1u);

  auto r = results.take(10, Millis(500));
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].tag, 77u);
  EXPECT_EQ(r[0].data, "result-from-fast");
  EXPECT_EQ(results.ack({r[0].id}), 1u);
  EXPECT_EQ(results.depth().length, 0u);
  EXPECT_EQ(a.depth().length, 0u);
  EXPECT_THROW(a.ack_forward({ma[0].id}, {}, rcfg.stream), kf::Error);
}

// A live consumer that takes longer than claim_idle keeps its record with keep_alive().
TEST(NetqueueTest, KeepAliveHoldsASlowConsumersRecord) {
  RedisServer srv = start_server();
  StreamConfig cfg = srv.client_config();
  cfg.claim_idle = Millis(400);
  cfg.claim_every = Millis(20);
  StreamQueue prod = StreamQueue::open(cfg);
  ASSERT_TRUE(prod.push(5, "x", Millis(1000)));
  StreamQueue a = StreamQueue::open(cfg);
  StreamQueue b = StreamQueue::open(cfg);
  auto ma = a.take(1, Millis(1000));
  ASSERT_EQ(ma.size(), 1u);
  std::atomic<bool> stop{false};
  std::thread beat([&] {
    while (!stop) {
      EXPECT_EQ(a.keep_alive({ma[0].id}), 1u);
      std::this_thread::sleep_for(Millis(50));
    }
  });
  auto mb = b.take(1, Millis(1200));  // 3x claim_idle
  stop = true;
  beat.join();
  EXPECT_TRUE(mb.empty());
  EXPECT_EQ(a.ack({ma[0].id}), 1u);
}

// A record that kills every consumer is moved to <stream>:dead after max_deliveries.
TEST(NetqueueTest, PoisonRecordDeadLetteredAfterMaxDeliveries) {
  RedisServer srv = start_server();
  StreamConfig cfg = srv.client_config();
  cfg.claim_idle = Millis(50);
  cfg.claim_every = Millis(10);
  cfg.max_deliveries = 2;
  StreamQueue prod = StreamQueue::open(cfg);
  ASSERT_TRUE(prod.push(9, "poison", Millis(1000)));
  ASSERT_TRUE(prod.push(10, "fine", Millis(1000)));
  StreamQueue q = StreamQueue::open(cfg);
  auto first = q.take(1, Millis(1000));  // delivery 1, never acknowledged
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].tag, 9u);
  std::this_thread::sleep_for(Millis(70));
  auto second = q.take(1, Millis(1000));  // delivery 2 (claimed), never acknowledged
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].tag, 9u);
  EXPECT_EQ(second[0].deliveries, 2u);
  std::this_thread::sleep_for(Millis(70));
  auto third = q.take(1, Millis(1000));  // delivery 3 > 2: dead-lettered, "fine" comes instead
  ASSERT_EQ(third.size(), 1u);
  EXPECT_EQ(third[0].tag, 10u);
  EXPECT_EQ(q.stats().dead_lettered, 1u);
  auto dead = q.dead_letters(10);
  ASSERT_EQ(dead.size(), 1u);
  ASSERT_GE(dead[0].size(), 8u);
  EXPECT_EQ(dead[0][0], "id");
  EXPECT_EQ(dead[0][1], first[0].id);
  EXPECT_NE(dead[0][3].find("delivered 3 times"), std::string::npos) << dead[0][3];
  EXPECT_EQ(dead[0][7], "poison");
  EXPECT_EQ(q.depth().dead, 1u);
}

// Names of consumers gone for 10 x claim_idle with nothing pending are forgotten.
TEST(NetqueueTest, IdleConsumersWithNothingPendingAreForgotten) {
  RedisServer srv = start_server();
  StreamConfig cfg = srv.client_config();
  cfg.claim_idle = Millis(40);  // forget after 400 ms
  cfg.claim_every = Millis(10);
  StreamQueue prod = StreamQueue::open(cfg);
  ASSERT_TRUE(prod.push(1, "a", Millis(1000)));
  ASSERT_TRUE(prod.push(2, "b", Millis(1000)));
  StreamConfig ca = cfg, cb = cfg, cc = cfg;
  ca.consumer = "gone-empty";
  cb.consumer = "gone-holding";
  cc.consumer = "survivor";
  {
    StreamQueue a = StreamQueue::open(ca);
    auto m = a.take(1, Millis(1000));
    ASSERT_EQ(m.size(), 1u);
    EXPECT_EQ(a.ack({m[0].id}), 1u);
  }
  StreamConfig cb_long = cb;
  cb_long.claim_idle = Millis(60000);
  {
    StreamQueue b = StreamQueue::open(cb_long);
    ASSERT_EQ(b.take(1, Millis(1000)).size(), 1u);  // never acknowledged
  }
  StreamQueue c = StreamQueue::open(cc);
  EXPECT_EQ(c.depth().consumers, 2u);
  std::this_thread::sleep_for(Millis(450));
  // The survivor claims b's record (idle > 40 ms), then prunes.
  auto got = c.take(1, Millis(1000));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].tag, 2u);
  // Both gone consumers have nothing pending now and were idle over 400 ms: forgotten.
  EXPECT_EQ(c.depth().consumers, 1u);
  EXPECT_EQ(c.ack({got[0].id}), 1u);
}
