// bench_netqueue: the Redis Streams queue (kf::netqueue::StreamQueue) beside the
// shared-memory queue (kf::replay::ShmQueue) in the same run, same record size, same
// producer/consumer threads.
//   saturated: P producer threads push batches of --batch flat out (one push script call
//              per batch); C consumer threads take up to --batch (XREADGROUP COUNT) and
//              acknowledge each batch (one ack script call). records/s = records
//              acknowledged in the window / window.
//   latency:   producers push single records at --latency-rate records/s in all;
//              latency = push call start -> the consumer holds the record (before ack).
// Each record carries its push time (CLOCK_MONOTONIC ns) in its first 8 bytes.
// Per-record CPU: redis-server's utime+stime (from /proc) and this process's (all
// client threads) over the saturated window, divided by records.
// Rows "BENCH|netqueue|<case>|<metric>|<value>|<unit>" go to stdout, then a table.
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kf/netqueue/netqueue.h"
#include "kf/replay/replay.h"
#include "queue.h"  // defines: ShmQueue (replay/src, internal)

using namespace kf::netqueue;
using kf::replay::QueueConfig;
using kf::replay::ShmQueue;
using kf::replay::ShmSegment;

namespace {

struct Options {
  int producers = 2, consumers = 2;
  uint32_t record_bytes = 4096, batch = 64;
  uint64_t bound = 4096;
  double seconds = 3.0;
  double latency_rate = 5000;
  std::string host, user = "kf", password_env = "KF_REDIS_PASSWORD", redis_server = "redis-server";
  int port = 0;
};

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}
void sleep_until_ns(int64_t t) {
  timespec ts{static_cast<time_t>(t / 1000000000LL), static_cast<long>(t % 1000000000LL)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
}
double cpu_self_s() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_utime.tv_usec / 1e6 + u.ru_stime.tv_sec + u.ru_stime.tv_usec / 1e6;
}
double cpu_of_pid_s(pid_t pid) {  // utime + stime of another process; 0 if unknown
  if (pid <= 0) return 0;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto rp = s.rfind(')');
  if (rp == std::string::npos) return 0;
  std::istringstream f(s.substr(rp + 2));
  std::string tok;
  unsigned long long ut = 0, st = 0;
  for (int i = 3; i <= 15 && (f >> tok); ++i) {
    if (i == 14) ut = std::stoull(tok);
    if (i == 15) st = std::stoull(tok);
  }
  return static_cast<double>(ut + st) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

struct Figures {
  double rate = 0, p50_us = 0, p99_us = 0, server_cpu_us = 0, client_cpu_us = 0;
  uint64_t records = 0;
};

// A queue under test, seen by one thread: push a batch, take+ack (returns records taken).
struct Endpoint {
  virtual ~Endpoint() = default;
  virtual void push(std::vector<std::string>& recs) = 0;
  virtual std::size_t take_ack(std::size_t max, std::vector<uint32_t>* lat) = 0;
};

struct RedisEnd : Endpoint {
  StreamQueue q;
  std::vector<Outgoing> out;
  explicit RedisEnd(const StreamConfig& c) : q(StreamQueue::open(c)) {}
  void push(std::vector<std::string>& recs) override {
    out.resize(recs.size());
    for (std::size_t i = 0; i < recs.size(); ++i) out[i].tag = i, out[i].data.swap(recs[i]);
    q.push_batch(out, Millis(1000));
    for (std::size_t i = 0; i < recs.size(); ++i) out[i].data.swap(recs[i]);
  }
  std::size_t take_ack(std::size_t max, std::vector<uint32_t>* lat) override {
    auto got = q.take(max, Millis(20));
    int64_t t = now_ns();
    std::vector<std::string> ids;
    ids.reserve(got.size());
    for (auto& m : got) {
      int64_t stamp;
      std::memcpy(&stamp, m.data.data(), 8);
      lat->push_back(static_cast<uint32_t>(std::min<int64_t>((t - stamp) / 1000, UINT32_MAX)));
      ids.push_back(std::move(m.id));
    }
    if (!ids.empty()) q.ack(ids);
    return got.size();
  }
};

struct ShmEnd : Endpoint {
  ShmQueue q;
  std::vector<uint64_t> tags;
  std::vector<ShmQueue::Slot> slots;
  std::string buf;
  explicit ShmEnd(const std::string& name) : q(ShmQueue::attach(name)) {}
  void push(std::vector<std::string>& recs) override {
    tags.assign(recs.size(), 0);
    q.push_batch(recs, tags, std::chrono::milliseconds(1000));
  }
  std::size_t take_ack(std::size_t max, std::vector<uint32_t>* lat) override {
    slots.resize(max);
    std::size_t k = q.take(slots.data(), max, std::chrono::milliseconds(20));
    int64_t t = now_ns();
    for (std::size_t i = 0; i < k; ++i) {
      buf.assign(reinterpret_cast<const char*>(slots[i].data), slots[i].len);  // copy out, as the network does
      int64_t stamp;
      std::memcpy(&stamp, buf.data(), 8);
      lat->push_back(static_cast<uint32_t>(std::min<int64_t>((t - stamp) / 1000, UINT32_MAX)));
    }
    q.release(slots.data(), k);
    return k;
  }
};

template <typename MakeEnd>
Figures run_case(const Options& o, MakeEnd make, bool paced, pid_t server_pid) {
  std::atomic<int64_t> start{0}, stop{0};
  std::atomic<uint64_t> consumed{0};
  std::vector<std::vector<uint32_t>> lats(o.consumers);
  std::vector<std::thread> threads;
  std::atomic<int> ready{0};
  for (int c = 0; c < o.consumers; ++c)
    threads.emplace_back([&, c] {
      auto e = make();
      lats[c].reserve(1 << 20);
      ++ready;
      while (start.load() == 0) std::this_thread::yield();
      uint64_t n = 0;
      for (;;) {
        std::size_t k = e->take_ack(o.batch, &lats[c]);
        if (now_ns() < stop.load())
          n += k;
        else if (k == 0)
          break;
      }
      consumed += n;
    });
  for (int p = 0; p < o.producers; ++p)
    threads.emplace_back([&, p] {
      auto e = make();
      const uint32_t batch = paced ? 1 : o.batch;
      std::vector<std::string> recs(batch, std::string(o.record_bytes, static_cast<char>('a' + p)));
      const int64_t gap = paced ? static_cast<int64_t>(1e9 * o.producers / o.latency_rate) : 0;
      ++ready;
      while (start.load() == 0) std::this_thread::yield();
      int64_t next = start.load() + (gap ? gap * p / o.producers : 0);
      for (;;) {
        if (gap) {
          sleep_until_ns(next);
          next += gap;
        }
        int64_t t = now_ns();
        if (t >= stop.load()) break;
        for (auto& r : recs) std::memcpy(r.data(), &t, 8);
        e->push(recs);
      }
    });
  while (ready.load() < o.consumers + o.producers) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const double cpu0 = cpu_self_s(), srv0 = cpu_of_pid_s(server_pid);
  const int64_t t0 = now_ns() + 20'000'000;
  stop.store(t0 + static_cast<int64_t>(o.seconds * 1e9));
  start.store(t0);
  sleep_until_ns(stop.load());
  const double cpu1 = cpu_self_s(), srv1 = cpu_of_pid_s(server_pid);
  for (auto& t : threads) t.join();
  Figures f;
  f.records = consumed.load();
  f.rate = f.records / o.seconds;
  std::vector<uint32_t> all;
  for (auto& l : lats) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  if (!all.empty()) {
    f.p50_us = all[all.size() / 2];
    f.p99_us = all[std::min(all.size() - 1, all.size() * 99 / 100)];
  }
  if (f.records) {
    f.client_cpu_us = (cpu1 - cpu0) * 1e6 / f.records;
    f.server_cpu_us = server_pid > 0 ? (srv1 - srv0) * 1e6 / f.records : 0;
  }
  return f;
}

void row(const std::string& c, const char* metric, double v, const char* unit) {
  std::printf("BENCH|netqueue|%s|%s|%.2f|%s\n", c.c_str(), metric, v, unit);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"bench_netqueue: Redis Streams queue vs shared-memory queue, 4 KiB records on loopback"};
  app.add_option("--producers", o.producers, "producer threads")->check(CLI::Range(1, 64));
  app.add_option("--consumers", o.consumers, "consumer threads")->check(CLI::Range(1, 64));
  app.add_option("--record-bytes", o.record_bytes, "bytes per record")->check(CLI::Range(16u, 1u << 20));
  app.add_option("--batch", o.batch, "records per push / take / ack call (saturated case)")
      ->check(CLI::Range(1u, 4096u));
  app.add_option("--bound", o.bound, "queue bound: redis unacknowledged records, shm capacity")
      ->check(CLI::Range(1u, 1u << 20));
  app.add_option("--seconds", o.seconds, "measured window per case")->check(CLI::Range(0.1, 600.0));
  app.add_option("--latency-rate", o.latency_rate, "records/s offered in the latency cases (all producers)")
      ->check(CLI::Range(1.0, 1e7));
  app.add_option("--host", o.host, "use this redis server instead of starting one");
  app.add_option("--port", o.port, "its port");
  app.add_option("--user", o.user, "its ACL user");
  app.add_option("--password-env", o.password_env, "environment variable holding its password");
  app.add_option("--redis-server", o.redis_server, "redis-server executable to start (when no --host)");
  CLI11_PARSE(app, argc, argv);

  std::optional<RedisServer> srv;
  StreamConfig cfg;
  pid_t server_pid = -1;
  try {
    if (o.host.empty()) {
      ServerOptions so;
      so.executable = o.redis_server;
      so.password = "bench" + std::to_string(getpid()) + "x" + std::to_string(now_ns() % 1000003);
      srv.emplace(RedisServer::start(so));
      cfg = srv->client_config();
      server_pid = srv->pid();
    } else {
      const char* pw = std::getenv(o.password_env.c_str());
      cfg.host = o.host;
      cfg.port = o.port;
      cfg.user = o.user;
      cfg.password = pw ? pw : "";
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_netqueue: %s\n", e.what());
    return 1;
  }
  cfg.bound = o.bound;
  cfg.batch_records = std::max<uint32_t>(o.batch, 1);
  cfg.claim_idle = Millis(60000);  // no claims during a bench

  struct Line {
    std::string name;
    Figures f;
  };
  std::vector<Line> lines;
  try {
    for (bool paced : {false, true}) {
      const std::string suffix = paced ? "_latency" : "_saturated";
      StreamConfig c = cfg;
      c.stream = "kf:bench:" + std::to_string(getpid()) + suffix;
      lines.push_back({"redis" + suffix, run_case(
                                             o, [&] { return std::make_unique<RedisEnd>(c); }, paced, server_pid)});
      const std::string name = "kfbench.netq." + std::to_string(getpid()) + suffix;
      auto q = ShmQueue::create(name, QueueConfig{static_cast<uint32_t>(std::min<uint64_t>(o.bound, 1u << 16)),
                                                  o.record_bytes, std::chrono::milliseconds(100), 20});
      lines.push_back({"shm" + suffix, run_case(
                                           o, [&] { return std::make_unique<ShmEnd>(name); }, paced, -1)});
      ShmSegment::remove(name);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_netqueue: %s\n", e.what());
    return 1;
  }
  for (const auto& l : lines) {
    row(l.name, "records_per_s", l.f.rate, "rec/s");
    row(l.name, "p50_latency", l.f.p50_us, "us");
    row(l.name, "p99_latency", l.f.p99_us, "us");
    row(l.name, "client_cpu_per_record", l.f.client_cpu_us, "us");
    if (l.name.rfind("redis", 0) == 0 && server_pid > 0) row(l.name, "server_cpu_per_record", l.f.server_cpu_us, "us");
  }
  std::printf(
      "\n%d producers, %d consumers, %u-byte records, batch %u (saturated) / 1 at %.0f rec/s (latency), bound %llu, "
      "%.1f s per case\n",
      o.producers, o.consumers, o.record_bytes, o.batch, o.latency_rate, static_cast<unsigned long long>(o.bound),
      o.seconds);
  std::printf("%-18s %12s %10s %10s %14s %14s\n", "case", "records/s", "p50 us", "p99 us", "client cpu/rec",
              "server cpu/rec");
  for (const auto& l : lines)
    std::printf("%-18s %12.0f %10.0f %10.0f %12.2f us %12.2f us\n", l.name.c_str(), l.f.rate, l.f.p50_us, l.f.p99_us,
                l.f.client_cpu_us, l.f.server_cpu_us);
  return 0;
}
