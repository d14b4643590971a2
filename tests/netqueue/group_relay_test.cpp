// Scored groups for learner ranks on other nodes: the byte form round-trips every field
// and rejects damage naming the field; through a real redis-server, a remote rank's
// requests are answered in step order by a "rank 0" in another process, and a rank
// that never gets a reply (or asks out of step) gets an error naming the rank and step.
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "kf/common/error.h"
#include "kf/netqueue/netqueue.h"
#include "records.h"  // netqueue/src: the groups' byte form
#include "relay.h"    // netqueue/src: GroupRelay
#include "test_util.h"

namespace kf::netqueue {
namespace {

using detail::decode_groups;
using detail::encode_groups;

replay::ScoredGroup group(uint64_t id, int g) {
  replay::ScoredGroup s;
  s.group_id = id;
  s.task = "task_" + std::to_string(id);
  s.policy_version = static_cast<int64_t>(id) * 3;
  s.prompt_tokens = {1, 2, 3, static_cast<int32_t>(id)};
  for (int i = 0; i < g; ++i) {
    replay::Candidate c;
    c.id = id * 100 + static_cast<uint64_t>(i);
    c.task = s.task;
    c.group_id = id;
    c.index_in_group = static_cast<uint32_t>(i);
    c.policy_version = s.policy_version;
    c.completion_tokens = {7, 8, i};
    c.behaviour_logprobs = {-0.5f, -1.25f, -2.0f - i};
    c.source = "extern \"C\" int kf_forward() { return " + std::to_string(i) + "; }\n";
    replay::Result r;
    r.candidate_id = c.id;
    r.group_id = id;
    r.index_in_group = c.index_in_group;
    r.verdict = i % 2 ? replay::Verdict::ok : replay::Verdict::incorrect;
    r.speedup = 1.5 + i;
    r.reward = i % 2 ? 0.5 : -1.0;
    s.candidates.push_back(c);
    s.results.push_back(r);
    s.missing.push_back(i == g - 1 ? 1 : 0);
  }
  s.deadline_hit = id % 2 == 1;
  return s;
}

void expect_same(const replay::ScoredGroup& a, const replay::ScoredGroup& b) {
  EXPECT_EQ(a.group_id, b.group_id);
  EXPECT_EQ(a.task, b.task);
  EXPECT_EQ(a.policy_version, b.policy_version);
  EXPECT_EQ(a.prompt_tokens, b.prompt_tokens);
  EXPECT_EQ(a.missing, b.missing);
  EXPECT_EQ(a.deadline_hit, b.deadline_hit);
  ASSERT_EQ(a.candidates.size(), b.candidates.size());
  for (std::size_t i = 0; i < a.candidates.size(); ++i) {
    EXPECT_EQ(a.candidates[i].id, b.candidates[i].id);
    EXPECT_EQ(a.candidates[i].completion_tokens, b.candidates[i].completion_tokens);
    EXPECT_EQ(a.candidates[i].behaviour_logprobs, b.candidates[i].behaviour_logprobs);
    EXPECT_EQ(a.candidates[i].source, b.candidates[i].source);
    EXPECT_EQ(a.results[i].candidate_id, b.results[i].candidate_id);
    EXPECT_EQ(a.results[i].verdict, b.results[i].verdict);
    EXPECT_EQ(a.results[i].speedup, b.results[i].speedup);
    EXPECT_EQ(a.results[i].reward, b.results[i].reward);
  }
}

TEST(NetqueueGroupRelayTest, GroupsRoundTripAndDamageIsNamed) {
  const std::vector<replay::ScoredGroup> gs = {group(1, 4), group(2, 1), group(3, 8)};
  const std::string b = encode_groups(gs);
  const auto back = decode_groups(b, "test");
  ASSERT_EQ(back.size(), gs.size());
  for (std::size_t i = 0; i < gs.size(); ++i) expect_same(gs[i], back[i]);
  EXPECT_TRUE(decode_groups(encode_groups({}), "test").empty());
  try {
    decode_groups(b.substr(0, b.size() - 3), "relay test");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("relay test: scored groups record: field"), std::string::npos) << e.what();
  }
  EXPECT_THROW(decode_groups(b + "xx", "t"), Error);
  EXPECT_THROW(decode_groups("KFG0" + b.substr(4), "t"), Error);
  auto bad = gs[0];
  bad.results.pop_back();
  EXPECT_THROW(encode_groups({bad}), Error);
}

TEST(NetqueueGroupRelayTest, RemoteRankGetsItsShareForEachStepFromRankZero) {
  auto srv = test::start_server();
  const pid_t rank0 = fork();
  if (rank0 == 0) {
    int code = 0;
    try {
      GroupRelay relay(srv.client_config(), "runR");
      for (int64_t step = 0; step < 3; ++step) {
        const auto q = relay.next_request(2, Millis(10000));
        if (q.step != step || q.version != step + 10 || q.max_lag != 4) code = 3;
        std::vector<replay::ScoredGroup> out;
        for (int64_t k = 0; k < q.groups; ++k) out.push_back(group(static_cast<uint64_t>(step * 10 + k), 2));
        relay.reply(2, q.step, out);
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank 0: %s\n", e.what());
      code = 2;
    }
    _exit(code);
  }
  GroupRelay relay(srv.client_config(), "runR");
  for (int64_t step = 0; step < 3; ++step) {
    GroupRequest q;
    q.step = step;
    q.groups = step;  // 0, 1, 2 groups
    q.version = step + 10;
    q.max_lag = 4;
    const auto got = relay.request(2, q, Millis(10000));
    ASSERT_EQ(got.size(), static_cast<std::size_t>(step)) << "step " << step;
    for (int64_t k = 0; k < step; ++k) expect_same(got[k], group(static_cast<uint64_t>(step * 10 + k), 2));
  }
  int st = 0;
  waitpid(rank0, &st, 0);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

TEST(NetqueueGroupRelayTest, NoReplyOrAReplyForAnotherStepIsAnError) {
  auto srv = test::start_server();
  GroupRelay remote(srv.client_config(), "runT"), head(srv.client_config(), "runT");
  GroupRequest q;
  q.step = 7;
  q.groups = 1;
  try {
    remote.request(1, q, Millis(600));
    FAIL();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("run 'runT': no reply from rank 0 to rank 1's request for step 7"), std::string::npos) << m;
    EXPECT_NE(m.find("within 600 ms"), std::string::npos) << m;
  }
  // The unanswered request is there; rank 0 answers it for another step.
  EXPECT_EQ(head.next_request(1, Millis(1000)).step, 7);
  head.reply(1, 8, {});
  q.step = 9;
  try {
    remote.request(1, q, Millis(2000));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the reply is for step 8, the request was for step 9"), std::string::npos)
        << e.what();
  }
  try {
    head.next_request(3, Millis(300));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no request from rank 3"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kf::netqueue
