// bench_replay: the replay pipes under load.
//   queue:    P producer and C consumer processes move fixed-size records through a
//             ShmQueue (single pushes and batches of --batch) and, in the same run,
//             through boost::interprocess::message_queue. Saturated throughput, and
//             end-to-end latency (push -> consumer has the record) at a fixed offered
//             rate (--latency-rate) so queueing delay does not swamp it.
//   snapshot: publish and read bandwidth of a --snapshot-mib blob.
// Rows "BENCH|replay|<case>|<metric>|<value>|<unit>" go to stdout, then a table.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <boost/date_time/posix_time/posix_time_types.hpp>
#include <boost/interprocess/ipc/message_queue.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kf/replay/replay.h"
#include "queue.h"  // defines: ShmQueue (replay/src, internal)

namespace bip = boost::interprocess;
using namespace kf::replay;

namespace {
struct Options {
  int producers = 8, consumers = 2;
  uint32_t record_bytes = 1024, batch = 32, capacity = 4096;
  double seconds = 2.0;
  double latency_rate = 100000;  // records/s offered in the latency phase (all producers)
  uint64_t snapshot_mib = 1024;
  int snapshot_reps = 3;
  int threads = 0;  // copy threads for snapshots (0: all cores)
  uint32_t spin_us = 20;
  std::string cases = "all";
};

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

// Sleeps (does not spin: spinning producers would starve consumers on small machines).
void sleep_until_ns(int64_t t) {
  timespec ts{static_cast<time_t>(t / 1000000000LL), static_cast<long>(t % 1000000000LL)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
}

// Shared between the bench processes (anonymous MAP_SHARED, made before fork).
struct Shared {
  std::atomic<int64_t> start_ns, stop_ns;
  std::atomic<uint64_t> consumed[16];
  std::atomic<uint64_t> samples[16];
  static constexpr uint64_t kMaxSamples = 1u << 22;  // per consumer
  uint32_t lat_ns[16][kMaxSamples];                  // large but untouched pages cost nothing
};
Shared* make_shared() {
  void* p = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  return new (p) Shared();
}

enum class Impl { kf_single, kf_batch, boost_mq };
const char* impl_name(Impl i) {
  return i == Impl::kf_single ? "kf_queue_single" : i == Impl::kf_batch ? "kf_queue_batch" : "boost_mq";
}

void record_latency(Shared* sh, int c, const unsigned char* rec) {
  int64_t stamp;
  std::memcpy(&stamp, rec, 8);
  uint64_t n = sh->samples[c].fetch_add(1, std::memory_order_relaxed);
  if (n < Shared::kMaxSamples)
    sh->lat_ns[c][n] = static_cast<uint32_t>(std::min<int64_t>(now_ns() - stamp, UINT32_MAX));
}

// Producer: until stop_ns, push records stamped with their push time; rate 0 = flat out.
int producer(const Options& o, Impl impl, const std::string& name, Shared* sh, int p, double rate) {
  std::vector<unsigned char> rec(o.record_bytes, static_cast<unsigned char>(p));
  const int64_t gap = rate > 0 ? static_cast<int64_t>(1e9 / rate) : 0;
  while (sh->start_ns.load() == 0) std::this_thread::yield();
  int64_t next = sh->start_ns.load() + (gap ? gap * p / o.producers : 0);
  const int64_t stop = sh->stop_ns.load();
  if (impl == Impl::boost_mq) {
    bip::message_queue mq(bip::open_only, name.c_str());
    for (;;) {
      if (gap) {
        sleep_until_ns(next);
        next += gap;
      }
      int64_t t = now_ns();
      if (t >= stop) return 0;
      std::memcpy(rec.data(), &t, 8);
      auto until = boost::posix_time::microsec_clock::universal_time() + boost::posix_time::milliseconds(20);
      mq.timed_send(rec.data(), rec.size(), 0, until);
    }
  }
  ShmQueue q = ShmQueue::attach(name);
  const uint32_t batch = impl == Impl::kf_batch ? o.batch : 1;
  std::vector<ShmQueue::Slot> slots(batch);
  std::vector<uint64_t> tags(batch, 0);
  for (;;) {
    if (gap) {
      sleep_until_ns(next);
      next += gap;
    }
    if (now_ns() >= stop) return 0;
    std::size_t k = q.acquire(slots.data(), batch, tags.data(), std::chrono::milliseconds(20));
    int64_t t = now_ns();
    for (std::size_t i = 0; i < k; ++i) {
      std::memcpy(rec.data(), &t, 8);
      std::memcpy(slots[i].data, rec.data(), rec.size());
      slots[i].len = o.record_bytes;
    }
    q.commit(slots.data(), k);
  }
}

// Consumer: copies each record out (as message_queue does) and records its latency.
int consumer(const Options& o, Impl impl, const std::string& name, Shared* sh, int c) {
  std::vector<unsigned char> buf(o.record_bytes);
  while (sh->start_ns.load() == 0) std::this_thread::yield();
  const int64_t stop = sh->stop_ns.load();
  uint64_t n = 0;
  if (impl == Impl::boost_mq) {
    bip::message_queue mq(bip::open_only, name.c_str());
    for (;;) {
      std::size_t got;
      unsigned prio;
      auto until = boost::posix_time::microsec_clock::universal_time() + boost::posix_time::milliseconds(20);
      if (mq.timed_receive(buf.data(), buf.size(), got, prio, until)) {
        record_latency(sh, c, buf.data());
        ++n;
      } else if (now_ns() >= stop) {
        break;
      }
    }
  } else {
    ShmQueue q = ShmQueue::attach(name);
    std::vector<ShmQueue::Slot> slots(o.batch);
    for (;;) {
      std::size_t k = q.take(slots.data(), slots.size(), std::chrono::milliseconds(20));
      for (std::size_t i = 0; i < k; ++i) {
        std::memcpy(buf.data(), slots[i].data, slots[i].len);
        record_latency(sh, c, buf.data());
      }
      q.release(slots.data(), k);
      n += k;
      if (k == 0 && now_ns() >= stop) break;
    }
  }
  sh->consumed[c].store(n);
  return 0;
}

struct QueueFigures {
  double rate = 0, p50_us = 0, p99_us = 0, p999_us = 0;
};

QueueFigures run_queue_case(const Options& o, Impl impl, double offered_rate, Shared* sh) {
  const std::string name = "kfbench." + std::to_string(getpid()) + "." + impl_name(impl);
  std::optional<ShmQueue> q;
  if (impl == Impl::boost_mq) {
    bip::message_queue::remove(name.c_str());
    bip::message_queue mq(bip::create_only, name.c_str(), o.capacity, o.record_bytes);
  } else {
    q.emplace(
        ShmQueue::create(name, QueueConfig{o.capacity, o.record_bytes, std::chrono::milliseconds(100), o.spin_us}));
  }
  sh->start_ns.store(0);
  for (int c = 0; c < 16; ++c) sh->consumed[c].store(0), sh->samples[c].store(0);
  std::vector<pid_t> kids;
  for (int c = 0; c < o.consumers; ++c) {
    pid_t pid = fork();
    if (pid == 0) _exit(consumer(o, impl, name, sh, c));
    kids.push_back(pid);
  }
  for (int p = 0; p < o.producers; ++p) {
    pid_t pid = fork();
    if (pid == 0) _exit(producer(o, impl, name, sh, p, offered_rate / o.producers));
    kids.push_back(pid);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let everyone attach
  const int64_t t0 = now_ns() + 10'000'000;
  sh->stop_ns.store(t0 + static_cast<int64_t>(o.seconds * 1e9));
  sh->start_ns.store(t0);
  for (pid_t k : kids) waitpid(k, nullptr, 0);
  const double elapsed = (now_ns() - t0) / 1e9;
  uint64_t total = 0;
  std::vector<uint32_t> lat;
  for (int c = 0; c < o.consumers; ++c) {
    total += sh->consumed[c].load();
    uint64_t n = std::min<uint64_t>(sh->samples[c].load(), Shared::kMaxSamples);
    lat.insert(lat.end(), sh->lat_ns[c], sh->lat_ns[c] + n);
  }
  if (impl == Impl::boost_mq)
    bip::message_queue::remove(name.c_str());
  else
    ShmSegment::remove(name);
  QueueFigures f;
  f.rate = total / elapsed;
  if (!lat.empty()) {
    std::sort(lat.begin(), lat.end());
    auto pct = [&](double p) {
      return lat[std::min<std::size_t>(lat.size() - 1, static_cast<std::size_t>(p * lat.size()))] / 1000.0;
    };
    f.p50_us = pct(0.50);
    f.p99_us = pct(0.99);
    f.p999_us = pct(0.999);
  }
  return f;
}

struct Row {
  std::string cas, metric, unit;
  double value;
};
std::vector<Row> rows;
void emit(const std::string& cas, const std::string& metric, double value, const std::string& unit) {
  std::printf("BENCH|replay|%s|%s|%.6g|%s\n", cas.c_str(), metric.c_str(), value, unit.c_str());
  std::fflush(stdout);
  rows.push_back({cas, metric, unit, value});
}

void bench_queues(const Options& o, Shared* sh) {
  for (Impl impl : {Impl::kf_single, Impl::kf_batch, Impl::boost_mq}) {
    QueueFigures sat = run_queue_case(o, impl, 0, sh);
    emit(impl_name(impl), "throughput", sat.rate, "rec/s");
    emit(impl_name(impl), "bandwidth", sat.rate * o.record_bytes / 1e9, "GB/s");
    emit(impl_name(impl), "saturated_p99", sat.p99_us, "us");
    if (impl == Impl::kf_batch) continue;  // latency at a fixed rate: single pushes only
    QueueFigures lat = run_queue_case(o, impl, o.latency_rate, sh);
    emit(impl_name(impl), "latency_rate", lat.rate, "rec/s");
    emit(impl_name(impl), "latency_p50", lat.p50_us, "us");
    emit(impl_name(impl), "latency_p99", lat.p99_us, "us");
    emit(impl_name(impl), "latency_p999", lat.p999_us, "us");
  }
}

void bench_snapshot(const Options& o) {
  const std::size_t bytes = o.snapshot_mib << 20;
  const int threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const std::string name = "kfbench." + std::to_string(getpid()) + ".snap";
  std::vector<unsigned char> blob(bytes), out(bytes);
  for (std::size_t i = 0; i < bytes; i += 4096) blob[i] = static_cast<unsigned char>(i >> 12), out[i] = 1;
  SnapshotStore s = SnapshotStore::create(name, SnapshotConfig{bytes, false});
  auto gbps = [&](int64_t ns) { return bytes / (ns / 1e9) / 1e9; };
  int64_t t = now_ns();
  s.publish(0, blob.data(), bytes, threads);
  emit("snapshot", "publish_first_touch", gbps(now_ns() - t), "GB/s");
  s.publish(1, blob.data(), bytes, threads);  // touch the second buffer too
  double best_pub = 0, best_read = 0;
  for (int r = 0; r < o.snapshot_reps; ++r) {
    t = now_ns();
    s.publish(2 + r, blob.data(), bytes, threads);
    best_pub = std::max(best_pub, gbps(now_ns() - t));
  }
  SnapshotStore reader = SnapshotStore::attach(name);
  auto copy = [threads](void* d, const void* src, std::size_t n) { parallel_copy(d, src, n, threads); };
  reader.read_into(out.data(), out.size(), copy, std::chrono::seconds(60));  // fault in reader's mapping
  for (int r = 0; r < o.snapshot_reps; ++r) {
    t = now_ns();
    reader.read_into(out.data(), out.size(), copy, std::chrono::seconds(60));
    best_read = std::max(best_read, gbps(now_ns() - t));
  }
  emit("snapshot", "publish", best_pub, "GB/s");
  emit("snapshot", "read", best_read, "GB/s");
  emit("snapshot", "blob", static_cast<double>(o.snapshot_mib), "MiB");
  emit("snapshot", "copy_threads", threads, "threads");
  ShmSegment::remove(name);
}
}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"bench_replay: shared-memory queue and snapshot benchmarks"};
  app.add_option("--producers", o.producers, "producer processes")->check(CLI::Range(1, 16));
  app.add_option("--consumers", o.consumers, "consumer processes")->check(CLI::Range(1, 16));
  app.add_option("--record-bytes", o.record_bytes, "record size");
  app.add_option("--batch", o.batch, "batch size (kf_queue_batch pushes, all kf consumers take up to this)");
  app.add_option("--capacity", o.capacity, "queue capacity (records)");
  app.add_option("--seconds", o.seconds, "duration of each queue case");
  app.add_option("--latency-rate", o.latency_rate, "offered records/s in the latency cases");
  app.add_option("--snapshot-mib", o.snapshot_mib, "snapshot blob size in MiB");
  app.add_option("--snapshot-reps", o.snapshot_reps, "publish/read repetitions (best is reported)");
  app.add_option("--threads", o.threads, "snapshot copy threads (0: all cores)");
  app.add_option("--spin-us", o.spin_us, "kf consumers spin this long before sleeping");
  app.add_option("--cases", o.cases, "all | queue | snapshot");
  CLI11_PARSE(app, argc, argv);
  if (o.batch < 1) o.batch = 1;

  if (o.cases == "all" || o.cases == "queue") {
    Shared* sh = make_shared();
    bench_queues(o, sh);
  }
  if (o.cases == "all" || o.cases == "snapshot") bench_snapshot(o);

  std::printf("\n%-18s %-22s %14s  %s\n", "case", "metric", "value", "unit");
  for (const auto& r : rows)
    std::printf("%-18s %-22s %14.4g  %s\n", r.cas.c_str(), r.metric.c_str(), r.value, r.unit.c_str());
  std::printf("(%d producers, %d consumers, %u-byte records, capacity %u, batch %u, %.1f s per case, %u cores)\n",
              o.producers, o.consumers, o.record_bytes, o.capacity, o.batch, o.seconds,
              std::thread::hardware_concurrency());
  return 0;
}
