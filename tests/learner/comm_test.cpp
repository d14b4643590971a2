// The shared-memory communicator across real processes: sums, bitwise agreement,
// broadcast, and a dead rank detected instead of a hang.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>

#include "checkpoint.h"
#include "comm.h"
#include "grad_buckets.h"
#include "kf/common/error.h"
#include "kf/learner/learner.h"

using namespace kf::learner;

namespace {

std::string seg_name(const char* what) {
  return "kf.test.comm." + std::string(what) + "." + std::to_string(::getpid());
}

// Forks `world` ranks running fn(comm, rank) -> u64 result sent through a pipe. The
// children touch only from_blob tensors and memcpy (no torch thread pools after fork).
template <typename Fn>
std::vector<uint64_t> run_ranks(const std::string& seg, int world, Fn fn, std::vector<int>* codes = nullptr) {
  std::vector<int> fds(world);
  std::vector<pid_t> pids(world);
  for (int r = 0; r < world; ++r) {
    int p[2];
    EXPECT_EQ(::pipe(p), 0);
    pids[r] = ::fork();
    if (pids[r] == 0) {
      ::close(p[0]);
      uint64_t out = 0;
      int code = 0;
      try {
        auto comm = make_shm_comm(seg, r, world, std::chrono::seconds(20), 64 * 1024);
        out = fn(*comm, r);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        code = 3;
      }
      if (::write(p[1], &out, sizeof out) != sizeof out) code = 4;
      ::_exit(code);
    }
    ::close(p[1]);
    fds[r] = p[0];
  }
  std::vector<uint64_t> out(world, 0);
  for (int r = 0; r < world; ++r) {
    if (::read(fds[r], &out[r], sizeof(uint64_t)) != sizeof(uint64_t)) out[r] = 0;
    ::close(fds[r]);
    int status = 0;
    ::waitpid(pids[r], &status, 0);
    if (codes)
      codes->push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128);
    else
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank " << r;
  }
  return out;
}

}  // namespace

TEST(LearnerCommTest, ShmAllReduceSumsOverFourProcessesAndAgreesBitwise) {
  const int64_t n = 100003;  // several 64 KiB rounds, not a multiple of anything
  const auto hashes = run_ranks(seg_name("sum"), 4, [n](Communicator& c, int r) -> uint64_t {
    std::vector<float> buf(n);
    for (int64_t i = 0; i < n; ++i) buf[i] = static_cast<float>(r + 1) * 0.1f + static_cast<float>(i) * 1e-3f;
    auto t = torch::from_blob(buf.data(), {n}, torch::kFloat32);
    c.all_reduce_sum(t);
    // sum over r of (r+1)*0.1 = 1.0; plus 4 * i * 1e-3
    for (int64_t i : {int64_t{0}, int64_t{777}, n - 1})
      if (std::abs(buf[i] - (1.0f + 4.0f * static_cast<float>(i) * 1e-3f)) > 1e-3f * (1 + i * 4e-3f)) return 1;
    std::vector<double> d = {1.0 * r, 2.0};
    auto td = torch::from_blob(d.data(), {2}, torch::kFloat64);
    c.all_reduce_sum(td);
    if (d[0] != 6.0 || d[1] != 8.0) return 2;
    return hash64(buf.data(), n * sizeof(float));
  });
  ASSERT_EQ(hashes.size(), 4u);
  EXPECT_GT(hashes[0], 2u);
  for (int r = 1; r < 4; ++r) EXPECT_EQ(hashes[r], hashes[0]) << "rank " << r << " differs";
}

TEST(LearnerCommTest, ShmReduceScatterMatchesAllReduceBitwiseAndAllGatherAssembles) {
  // 4 ranks, 3 * 40000 elements per slice: several 64 KiB rounds per slice.
  const int world = 4;
  const int64_t m = 120000, n = world * m;
  const auto got = run_ranks(seg_name("rs"), world, [=](Communicator& c, int r) -> uint64_t {
    std::vector<float> a(n), b(n);
    for (int64_t i = 0; i < n; ++i) a[i] = b[i] = std::sin(0.001f * static_cast<float>(i) * (r + 1)) / (r + 3);
    auto ta = torch::from_blob(a.data(), {n}, torch::kFloat32), tb = torch::from_blob(b.data(), {n}, torch::kFloat32);
    c.all_reduce_sum(ta);
    c.reduce_scatter_sum(tb);
    // The owned slice is bitwise what the all-reduce gives (same rank-order sum).
    if (std::memcmp(a.data() + r * m, b.data() + r * m, m * sizeof(float)) != 0) return 1;
    // all_gather: every slice comes from its owner; here each rank writes its rank into
    // its slice of an int buffer and garbage elsewhere.
    std::vector<int32_t> g(n, -7);
    for (int64_t i = 0; i < m; ++i) g[r * m + i] = r * 1000 + static_cast<int32_t>(i % 1000);
    auto tg = torch::from_blob(g.data(), {n}, torch::kInt32);
    c.all_gather(tg);
    for (int q = 0; q < world; ++q)
      for (int64_t i : {int64_t{0}, int64_t{999}, m - 1})
        if (g[q * m + i] != q * 1000 + static_cast<int32_t>(i % 1000)) return 2;
    // bf16 reduce-scatter (summed in fp32, rounded once).
    std::vector<c10::BFloat16> h(n, c10::BFloat16(0.5f));
    auto th = torch::from_blob(h.data(), {n}, torch::kBFloat16);
    c.reduce_scatter_sum(th);
    if (static_cast<float>(h[r * m]) != 2.0f || static_cast<float>(h[r * m + m - 1]) != 2.0f) return 3;
    // A buffer that is not a multiple of the world is refused with the communicator's name.
    std::vector<float> odd(n + 1);
    auto to = torch::from_blob(odd.data(), {n + 1}, torch::kFloat32);
    try {
      c.reduce_scatter_sum(to);
      return 4;
    } catch (const kf::Error& e) {
      if (std::string(e.what()).find("not a multiple of world 4") == std::string::npos) return 5;
    }
    // The gathered all-reduce result: every rank holds the same bits.
    c.all_gather(tb);
    if (std::memcmp(a.data(), b.data(), n * sizeof(float)) != 0) return 6;
    return hash64(b.data(), n * sizeof(float));
  });
  ASSERT_EQ(got.size(), 4u);
  EXPECT_GT(got[0], 6u) << "rank 0 failed check " << got[0];
  for (int r = 1; r < world; ++r) EXPECT_EQ(got[r], got[0]) << "rank " << r;
}

TEST(LearnerCommTest, ShmBroadcastCopiesRootToAll) {
  const auto got = run_ranks(seg_name("bcast"), 3, [](Communicator& c, int r) -> uint64_t {
    std::vector<float> buf(50000, static_cast<float>(r));
    if (r == 1)
      for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i);
    auto t = torch::from_blob(buf.data(), {static_cast<int64_t>(buf.size())}, torch::kFloat32);
    c.broadcast(t, 1);
    c.barrier();
    return buf[49999] == 49999.0f && buf[3] == 3.0f ? 7 : 1;
  });
  for (auto v : got) EXPECT_EQ(v, 7u);
}

TEST(LearnerCommTest, ShmDeadRankMakesTheOthersThrowNotHang) {
  std::vector<int> codes;
  const auto t0 = std::chrono::steady_clock::now();
  run_ranks(
      seg_name("dead"), 2,
      [](Communicator& c, int r) -> uint64_t {
        if (r == 1) ::_exit(0);  // leaves after joining, never calls the collective
        float x = 1;
        auto t = torch::from_blob(&x, {1}, torch::kFloat32);
        c.all_reduce_sum(t);
        return 5;
      },
      &codes);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(codes.size(), 2u);
  EXPECT_EQ(codes[0], 3) << "rank 0 must fail with kf::Error";
  EXPECT_LT(s, 10.0);
}

TEST(LearnerCommTest, NcclIsReportedWhenUnavailable) {
  if (nccl_available() && torch::cuda::is_available())
    GTEST_SKIP() << "NCCL runs in bench/learner/gpu_learner_bench.sh";
  if (nccl_available())
    GTEST_SKIP() << "built with NCCL but no GPU here: the 1-rank NCCL run is in bench/learner/gpu_learner_bench.sh";
  auto rdv = file_rendezvous("/tmp");
  EXPECT_THROW(make_nccl_comm(0, 1, 0, *rdv), kf::Error);
}

namespace {
// Records the order of bucket reductions and whether backward was still running.
class RecordingComm : public Communicator {
 public:
  std::vector<int64_t> sizes;
  int rank() const override { return 0; }
  int world() const override { return 1; }
  std::string name() const override { return "recording"; }
  void all_reduce_sum(torch::Tensor& t) override { sizes.push_back(t.numel()); }
  void broadcast(torch::Tensor&, int) override {}
  void barrier() override {}
};
}  // namespace

TEST(LearnerGradBucketsTest, BucketsReduceDuringBackwardInOrderAndAccumulateMicroBatches) {
  torch::manual_seed(0);
  // Four layers of 64x64 (16 KiB each): 20 KiB buckets hold one layer each.
  std::vector<std::pair<std::string, torch::Tensor>> params;
  for (int i = 0; i < 4; ++i) params.emplace_back("w" + std::to_string(i), torch::randn({64, 64}).requires_grad_(true));
  RecordingComm comm;
  GradBuckets buckets(params, 20 * 1024, &comm);
  ASSERT_EQ(buckets.buckets(), 4u);
  auto forward = [&](const torch::Tensor& x) {
    auto h = x;
    for (auto& p : params) h = torch::tanh(h.matmul(p.second));
    return h.sum();
  };
  const auto x1 = torch::randn({3, 64}), x2 = torch::randn({3, 64});
  buckets.zero();
  forward(x1).backward();  // micro-batch 1: not armed, nothing reduced
  EXPECT_TRUE(comm.sizes.empty());
  buckets.arm();
  forward(x2).backward();  // micro-batch 2: every bucket completes in backward
  EXPECT_EQ(buckets.launched_in_backward(), 4);
  buckets.finish();
  EXPECT_EQ(comm.sizes.size(), 4u);
  // The grads are views into the buckets and hold the sum of both micro-batches.
  std::vector<torch::Tensor> ref;
  for (auto& p : params) ref.push_back(p.second.detach().clone().requires_grad_(true));
  auto h1 = x1, h2 = x2;
  for (auto& r : ref) {
    h1 = torch::tanh(h1.matmul(r));
    h2 = torch::tanh(h2.matmul(r));
  }
  (h1.sum() + h2.sum()).backward();
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(torch::allclose(params[i].second.grad(), ref[i].grad(), 1e-5, 1e-6)) << "param " << i;
    EXPECT_EQ(params[i].second.grad().data_ptr<float>(), buckets.flat()[3 - i].data_ptr<float>())
        << "param " << i << " grad is not a view into its bucket (buckets are filled in reverse order)";
  }
}
