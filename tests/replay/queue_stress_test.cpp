// Multi-process stress: producers and consumers over one ShmQueue, with hundreds of
// random SIGKILLs of both. Checks that every item is delivered exactly once or is
// counted as lost (and named in the lost log), that no torn record is ever seen, and
// that no slot leaks.
//
// Accounting: producer incarnation i pushes ids (i << 32) | 0, 1, 2, ... in order,
// so every id below the highest one seen from i was pushed and must come back as
// delivered (consumers report ids on a pipe before releasing the slots) or lost.
// An id may be both only if its consumer died between reporting and releasing.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <thread>

#include "kf/replay/replay.h"
#include "queue.h"
#include "proc_util.h"

using namespace kf::replay;
using namespace kf::replay::test;
using namespace std::chrono_literals;

namespace {
constexpr uint64_t kTornFlag = 1ull << 63;

std::size_t record_len(uint64_t id) { return 8 + (id * 7919) % 201; }
void fill_record(uint64_t id, std::string& r) {
  r.resize(record_len(id));
  std::memcpy(&r[0], &id, 8);
  for (std::size_t j = 8; j < r.size(); ++j) r[j] = static_cast<char>((id + j * 13) & 0xff);
}
bool record_ok(uint64_t tag, const unsigned char* d, uint32_t len) {
  if (len != record_len(tag)) return false;
  uint64_t id;
  std::memcpy(&id, d, 8);
  if (id != tag) return false;
  for (std::size_t j = 8; j < len; ++j)
    if (d[j] != static_cast<unsigned char>((id + j * 13) & 0xff)) return false;
  return true;
}

int producer_main(const std::string& qname, const std::string& cname, uint32_t inc) {
  ShmQueue q = ShmQueue::attach(qname);
  ControlBlock ctl = ControlBlock::attach(cname);
  std::mt19937 rng(inc);
  uint64_t seq = 0;
  std::vector<std::string> recs;
  std::vector<uint64_t> tags;
  while (ctl.state() == RunState::running) {
    const std::size_t n = 1 + rng() % 4;
    recs.resize(n);
    tags.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      tags[i] = (static_cast<uint64_t>(inc) << 32) | seq++;
      fill_record(tags[i], recs[i]);
    }
    // Zero-copy path, written slowly on purpose: kills often land mid-record.
    std::size_t done = 0;
    while (done < n) {  // never give up on a record: a drop would break the accounting
      ShmQueue::Slot slots[4];
      std::size_t k = q.acquire(slots, n - done, tags.data() + done, 10s);
      for (std::size_t i = 0; i < k; ++i) {
        const std::string& r = recs[done + i];
        for (std::size_t j = 0; j < r.size(); j += 16) {
          std::memcpy(slots[i].data + j, r.data() + j, std::min<std::size_t>(16, r.size() - j));
          for (int spin = 0; spin < 20; ++spin) __builtin_ia32_pause();
        }
        slots[i].len = static_cast<uint32_t>(r.size());
      }
      q.commit(slots, k);
      done += k;
    }
  }
  return 0;
}

int consumer_main(const std::string& qname, const std::string& cname, uint32_t inc, int report_fd) {
  ShmQueue q = ShmQueue::attach(qname);
  ControlBlock ctl = ControlBlock::attach(cname);
  std::mt19937 rng(inc);
  ShmQueue::Slot slots[8];
  for (;;) {
    std::size_t k = q.take(slots, 1 + rng() % 8, 30ms);
    if (k == 0) {
      if (ctl.state() == RunState::stopped) return 0;
      continue;
    }
    uint64_t msg[9];
    msg[0] = k;
    for (std::size_t i = 0; i < k; ++i)
      msg[1 + i] = record_ok(slots[i].tag, slots[i].data, slots[i].len) ? slots[i].tag : (slots[i].tag | kTornFlag);
    // One write <= PIPE_BUF is atomic: the parent gets the whole report or none of it.
    if (::write(report_fd, msg, 8 * (k + 1)) != static_cast<ssize_t>(8 * (k + 1))) return 3;
    for (int spin = 0; spin < 2000; ++spin) __builtin_ia32_pause();  // "work" on the records in place
    q.release(slots, k);
  }
}
}  // namespace

TEST(ReplayQueueStressTest, RandomKillsDeliverExactlyOnceOrCountAsLost) {
  const std::string qname = unique_name("stressq"), cname = unique_name("stressc");
  struct Cleanup {  // also on an early ASSERT return
    std::string a, b;
    ~Cleanup() {
      ShmSegment::remove(a);
      ShmSegment::remove(b);
    }
  } cleanup{qname, cname};
  ShmQueue q = ShmQueue::create(qname, QueueConfig{64, 256, 20ms, 20});
  ControlBlock ctl = ControlBlock::create(cname);
  ctl.set_state(RunState::running);
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ::fcntl(fds[0], F_SETPIPE_SZ, 1 << 20);
  ::fcntl(fds[0], F_SETFL, O_NONBLOCK);

  constexpr int kProducers = 4, kConsumers = 3, kKills = 300;
  uint32_t next_inc = 1;
  struct Lane {
    bool producer;
    pid_t pid;
  };
  std::vector<Lane> lanes;
  auto start_lane = [&](bool producer) {
    uint32_t inc = next_inc++;
    pid_t pid = spawn([&, inc, producer] {
      ::close(fds[0]);
      return producer ? producer_main(qname, cname, inc) : consumer_main(qname, cname, inc, fds[1]);
    });
    return pid;
  };
  for (int i = 0; i < kProducers; ++i) lanes.push_back({true, start_lane(true)});
  for (int i = 0; i < kConsumers; ++i) lanes.push_back({false, start_lane(false)});

  std::vector<uint64_t> delivered;
  std::vector<unsigned char> carry;
  uint64_t torn = 0;
  auto drain_pipe = [&] {
    unsigned char buf[65536];
    for (;;) {
      ssize_t n = ::read(fds[0], buf, sizeof buf);
      if (n <= 0) break;
      carry.insert(carry.end(), buf, buf + n);
    }
    std::size_t off = 0;
    while (carry.size() - off >= 8) {
      uint64_t k;
      std::memcpy(&k, &carry[off], 8);
      if (carry.size() - off < 8 * (k + 1)) break;
      for (uint64_t i = 0; i < k; ++i) {
        uint64_t id;
        std::memcpy(&id, &carry[off + 8 * (1 + i)], 8);
        if (id & kTornFlag) ++torn;
        delivered.push_back(id & ~kTornFlag);
      }
      off += 8 * (k + 1);
    }
    carry.erase(carry.begin(), carry.begin() + off);
  };

  std::mt19937 rng(12345);
  int producer_kills = 0, consumer_kills = 0;
  for (int kill = 0; kill < kKills; ++kill) {
    auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(2 + rng() % 20);
    while (std::chrono::steady_clock::now() < until) {
      drain_pipe();
      std::this_thread::sleep_for(1ms);
    }
    Lane& victim = lanes[rng() % lanes.size()];
    kill_and_wait(victim.pid);
    (victim.producer ? producer_kills : consumer_kills)++;
    victim.pid = start_lane(victim.producer);
    if (kill % 16 == 0) q.reap();  // the supervisor's periodic sweep
  }

  // Drain: stop producers, let consumers empty the queue, then stop consumers.
  ctl.set_state(RunState::draining);
  auto wait_draining = [&](pid_t pid) {  // keep reading reports so no consumer blocks on the pipe
    int st = 0;
    while (::waitpid(pid, &st, WNOHANG) == 0) {
      drain_pipe();
      std::this_thread::sleep_for(1ms);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  };
  for (auto& l : lanes) {
    if (l.producer) EXPECT_EQ(wait_draining(l.pid), 0);
  }
  for (int i = 0; i < 1000 && q.stats().queued > 0; ++i) {
    drain_pipe();
    std::this_thread::sleep_for(5ms);
  }
  ctl.set_state(RunState::stopped);
  for (auto& l : lanes) {
    if (!l.producer) EXPECT_EQ(wait_draining(l.pid), 0);
  }
  drain_pipe();
  q.reap();  // everyone is gone: whatever a dead process still held is lost now

  uint64_t cursor = 0;
  std::vector<uint64_t> lost_log = q.lost_tags(&cursor);
  QueueStats s = q.stats();
  std::set<uint64_t> lost(lost_log.begin(), lost_log.end());
  std::sort(delivered.begin(), delivered.end());
  std::set<uint64_t> got(delivered.begin(), delivered.end());

  EXPECT_EQ(torn, 0u) << "a consumer saw a torn record";
  EXPECT_EQ(delivered.size(), got.size()) << "an item was delivered twice";
  EXPECT_EQ(lost.size(), lost_log.size()) << "an item was counted lost twice";
  EXPECT_LT(cursor, ShmQueue::kLostLog);
  EXPECT_EQ(s.lost_producer + s.lost_consumer, lost_log.size());
  EXPECT_EQ(s.corrupt, 0u);
  EXPECT_EQ(s.dropped_full, 0u);
  EXPECT_EQ(s.queued, 0u);
  EXPECT_EQ(s.free_slots, q.capacity()) << "slots leaked";

  // Every id up to the highest seen per producer incarnation is delivered or lost.
  std::map<uint32_t, uint64_t> max_seq;
  for (const auto* set : {&got, &lost})
    for (uint64_t id : *set) {
      auto& m = max_seq[static_cast<uint32_t>(id >> 32)];
      m = std::max(m, (id & 0xffffffffu) + 1);
    }
  uint64_t expected = 0, missing = 0, both = 0;
  for (auto& [inc, n] : max_seq)
    for (uint64_t sq = 0; sq < n; ++sq) {
      uint64_t id = (static_cast<uint64_t>(inc) << 32) | sq;
      ++expected;
      bool d = got.count(id), l = lost.count(id);
      if (!d && !l) ++missing;
      if (d && l) ++both;
    }
  EXPECT_EQ(missing, 0u) << "items vanished without being counted";
  EXPECT_LE(both, static_cast<uint64_t>(consumer_kills) * 8) << "delivered+lost only in a consumer's report window";
  EXPECT_LE(lost.size(), static_cast<uint64_t>(kKills) * 8) << "more lost than the dead held in flight";
  EXPECT_GT(got.size(), 10000u) << "too little traffic to mean anything";
  std::printf(
      "stress: %d kills (%d producers, %d consumers), %llu items, %zu delivered, %zu lost "
      "(%llu producer-side, %llu consumer-side), %llu both, %llu lock recoveries\n",
      kKills, producer_kills, consumer_kills, static_cast<unsigned long long>(expected), got.size(), lost.size(),
      static_cast<unsigned long long>(s.lost_producer), static_cast<unsigned long long>(s.lost_consumer),
      static_cast<unsigned long long>(both), static_cast<unsigned long long>(s.recoveries));
  ::close(fds[0]);
  ::close(fds[1]);
}
