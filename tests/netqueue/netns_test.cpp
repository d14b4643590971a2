// Several "nodes" on one machine: network namespaces joined by veth pairs (made by the
// test, removed after). A redis-server runs in the server namespace, the producer and
// the results consumer (the "replay node") in another, and two evaluator processes in
// namespaces of their own. One evaluator node is SIGKILLed holding candidates; the other
// claims them. Every candidate yields exactly one result: 0 lost, 0 duplicates.
// Needs CAP_NET_ADMIN and `ip` (iproute2); skips with a message without them.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "kf/common/error.h"
#include "test_util.h"

using namespace kf::netqueue;
using kf::netqueue::test::random_password;
using kf::netqueue::test::seconds_since;
using Clock = std::chrono::steady_clock;

namespace {

bool has_cap_net_admin() {
  std::ifstream in("/proc/self/status");
  for (std::string l; std::getline(in, l);)
    if (l.rfind("CapEff:", 0) == 0) return (std::stoull(l.substr(7), nullptr, 16) >> 12) & 1;  // CAP_NET_ADMIN = 12
  return false;
}

// Runs a shell command; returns its output and sets *ok.
std::string sh(const std::string& cmd, bool* ok) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) {
    *ok = false;
    return "popen failed";
  }
  char buf[512];
  while (fgets(buf, sizeof(buf), p)) out += buf;
  *ok = pclose(p) == 0;
  return out;
}

// Enters the named network namespace (this thread; threads and children made later inherit it).
void enter_netns(const std::string& name) {
  int fd = open(("/var/run/netns/" + name).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) throw kf::Error("cannot enter network namespace " + name);
  close(fd);
}

// Namespaces: <p>s (server), <p>r (producer + results consumer), <p>1 and <p>2 (evaluators).
// veth pairs server <-> each other namespace, one /24 each: 10.77.<k>.1 server side.
struct Netns {
  std::string p = "kf" + std::to_string(getpid());
  std::vector<std::string> made;
  std::string error;
  bool setup() {
    const char* sides[] = {"r", "1", "2"};
    std::vector<std::string> cmds = {"ip netns add " + p + "s", "ip -n " + p + "s link set lo up"};
    for (int k = 0; k < 3; ++k) {
      std::string ns = p + sides[k], a = p + "a" + sides[k], b = p + "b" + sides[k],
                  net = "10.77." + std::to_string(k + 1);
      cmds.push_back("ip netns add " + ns);
      cmds.push_back("ip -n " + ns + " link set lo up");
      cmds.push_back("ip link add " + a + " type veth peer name " + b);
      cmds.push_back("ip link set " + a + " netns " + p + "s");
      cmds.push_back("ip link set " + b + " netns " + ns);
      cmds.push_back("ip -n " + p + "s addr add " + net + ".1/24 dev " + a);
      cmds.push_back("ip -n " + ns + " addr add " + net + ".2/24 dev " + b);
      cmds.push_back("ip -n " + p + "s link set " + a + " up");
      cmds.push_back("ip -n " + ns + " link set " + b + " up");
    }
    for (const auto& c : cmds) {
      bool ok = false;
      std::string out = sh(c, &ok);
      if (c.rfind("ip netns add ", 0) == 0 && ok) made.push_back(c.substr(13));
      if (!ok) {
        error = "'" + c + "' failed: " + out;
        return false;
      }
    }
    return true;
  }
  ~Netns() {
    bool ok;
    for (const auto& n : made) sh("ip netns del " + n, &ok);  // removes the veths too
  }
};

// An evaluator node: takes candidates, "evaluates" (sleeps), finishes each batch with
// ack_forward of one result per candidate. Reports each batch it holds on `report`;
// stops when `stop_fd` reaches EOF, writing how many records it claimed.
int evaluator_node(const StreamConfig& cfg, const std::string& name, int report, int stop_fd) {
  try {
    StreamConfig c = cfg;
    c.consumer = name;
    StreamQueue q = StreamQueue::open(c);
    fcntl(stop_fd, F_SETFL, O_NONBLOCK);
    for (;;) {
      char b;
      if (read(stop_fd, &b, 1) == 0) break;
      auto got = q.take(8, Millis(100));
      if (got.empty()) continue;
      char n = static_cast<char>(got.size());
      if (write(report, &n, 1) != 1) return 3;
      std::this_thread::sleep_for(Millis(40));  // evaluation time: the batch is pending meanwhile
      std::vector<std::string> ids;
      std::vector<Outgoing> results;
      for (auto& m : got) {
        ids.push_back(m.id);
        results.push_back({m.tag, name + ":" + std::to_string(m.data.size())});
      }
      q.ack_forward(ids, results, "kf:results");
    }
    char claimed = static_cast<char>(std::min<uint64_t>(q.stats().claimed, 120));
    claimed = static_cast<char>(-1 - claimed);  // negative = the final claimed count
    if (write(report, &claimed, 1) != 1) return 3;
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "evaluator %s: %s\n", name.c_str(), e.what());
    return 2;
  }
}

}  // namespace

TEST(NetqueueNetnsTest, EvaluatorNodeKilledLosesNoCandidate) {
  if (!has_cap_net_admin()) GTEST_SKIP() << "needs CAP_NET_ADMIN to make network namespaces (run as root)";
  Netns ns;
  if (!ns.setup()) GTEST_SKIP() << "cannot make network namespaces here: " << ns.error;

  int home = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(home, 0);
  // The server, in its namespace, reachable on one address per link.
  enter_netns(ns.p + "s");
  ServerOptions so;
  so.password = random_password();
  so.bind = {"10.77.1.1", "10.77.2.1", "10.77.3.1"};
  RedisServer srv = RedisServer::start(so);
  StreamConfig cfg = srv.client_config();
  cfg.claim_idle = Millis(1000);
  cfg.claim_every = Millis(100);
  cfg.bound = 64;  // back-pressure across the link too

  // Evaluator nodes: forked before any thread exists, each into its own namespace.
  enter_netns(ns.p + "r");
  pid_t ev[2];
  int report[2], stop[2];
  for (int k = 0; k < 2; ++k) {
    int rp[2], sp[2];
    ASSERT_EQ(pipe(rp), 0);
    ASSERT_EQ(pipe(sp), 0);
    ev[k] = fork();
    ASSERT_GE(ev[k], 0);
    if (ev[k] == 0) {
      close(rp[0]);
      close(sp[1]);
      enter_netns(ns.p + std::to_string(k + 1));
      StreamConfig c = cfg;
      c.host = "10.77." + std::to_string(k + 2) + ".1";  // its own link to the server
      _exit(evaluator_node(c, "evaluator-node-" + std::to_string(k + 1), rp[1], sp[0]));
    }
    close(rp[1]);
    close(sp[0]);
    report[k] = rp[0];
    stop[k] = sp[1];
  }

  // This process is the replay node now: producer thread + results consumer.
  constexpr uint64_t kN = 400;
  StreamConfig rcfg = cfg;  // host 10.77.1.1: the replay node's link
  rcfg.stream = "kf:results";
  rcfg.group = "replay";
  rcfg.bound = 1 << 20;
  StreamQueue results = StreamQueue::open(rcfg);
  std::thread producer([&] {
    StreamQueue q = StreamQueue::open(cfg);
    for (uint64_t i = 0; i < kN; i += 16) {
      std::vector<Outgoing> recs;
      for (uint64_t j = i; j < std::min(kN, i + 16); ++j) recs.push_back({j, std::string(4096, static_cast<char>(j))});
      std::size_t n = q.push_batch(recs, Millis(30000));
      EXPECT_EQ(n, recs.size());
    }
  });

  // Kill evaluator node 1 once it has taken its 5th batch (it is then holding it).
  int batches1 = 0;
  char c;
  while (batches1 < 5 && read(report[0], &c, 1) == 1) ++batches1;
  ASSERT_EQ(batches1, 5);
  ASSERT_EQ(kill(ev[0], SIGKILL), 0);
  int status = 0;
  waitpid(ev[0], &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status));

  std::map<uint64_t, int> got;  // candidate tag -> results
  std::map<std::string, int> by_node;
  auto t0 = Clock::now();
  while (got.size() < kN && seconds_since(t0) < 60) {
    auto r = results.take(64, Millis(200));
    std::vector<std::string> ids;
    for (auto& m : r) {
      ++got[m.tag];
      by_node[m.data.substr(0, m.data.find(':'))]++;
      ids.push_back(m.id);
    }
    results.ack(ids);
  }
  producer.join();
  close(stop[1]);  // evaluator node 2 stops and reports its claims
  int claimed2 = -1;
  while (read(report[1], &c, 1) == 1)
    if (c < 0) claimed2 = -1 - c;
  waitpid(ev[1], &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "evaluator node 2 failed";

  EXPECT_EQ(got.size(), kN) << "candidates lost";
  int dup = 0;
  for (const auto& [tag, n] : got) dup += n - 1;
  EXPECT_EQ(dup, 0) << "candidates scored twice";
  EXPECT_GE(by_node["evaluator-node-1"], 4);  // it finished 4 batches before it died
  EXPECT_GE(claimed2, 1) << "node 2 claimed none of node 1's pending candidates";
  EXPECT_LE(claimed2, 8);
  StreamQueue check = StreamQueue::open(cfg);
  StreamDepth d = check.depth();
  EXPECT_EQ(d.length, 0u);
  EXPECT_EQ(d.pending, 0u);
  EXPECT_EQ(d.dead, 0u);
  std::printf("netns: %zu candidates, %d results from node 1 (killed), %d from node 2, node 2 claimed %d\n", got.size(),
              by_node["evaluator-node-1"], by_node["evaluator-node-2"], claimed2);

  srv.stop();
  ASSERT_EQ(setns(home, CLONE_NEWNET), 0);
  close(home);
}
