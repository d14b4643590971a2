// EvaluatorService: the evaluator process's loop over a CandidateSource: this node's real
// shared memory (replay::shm_candidates over a RunShm), and a source made in the test, with
// the real verifier on the CPU backend.
#include "kf/evaluator/evaluator.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "attempt.h"  // worker_out_of_memory
#include "kf/common/gpu_lock.h"
#include "kf/common/gpu_memory.h"
#include "kf/replay/replay.h"
#include "kf/tasks/tasks.h"
#include "service.h"  // verdict_json_line
#include "test_util.h"

using namespace kf::evaluator;
namespace replay = kf::replay;
namespace counter = kf::replay::counter;

namespace {

std::string build_dir() {
  const char* e = std::getenv("KF_BUILD_DIR");
  return e && *e ? e : KF_BUILD_DIR_DEFAULT;
}

replay::Candidate candidate(uint64_t id, const std::string& task, const std::string& source, uint32_t index) {
  replay::Candidate c;
  c.id = id;
  c.task = task;
  c.group_id = 77;
  c.index_in_group = index;
  c.policy_version = 5;
  c.source = source;
  c.completion_tokens = {1, 2, 3};
  c.behaviour_logprobs = {-0.1f, -0.2f, -0.3f};
  return c;
}

// Quick settings for a loaded 2-core machine.
// As verify_test's: a loaded 2-core CI machine gives spreads of 10 and puts every one of 3
// trials over the timer check's slack now and then; a few more trials (only taken when a
// check is over its line) and no spread limit keep good kernels ok there.
EvalOptions light_options() {
  EvalOptions o;
  o.compile.cache_dir = build_dir() + "/evaluator-test-cache";
  o.warmup = 1;
  o.trials = 3;
  o.max_trials = 8;
  o.max_spread = 100;
  o.min_call_timeout_s = 3;
  o.cpu_threads = 2;
  return o;
}

// As the actor does: publishes the candidates' group through the seam (shm: the group opens
// in the replay and its members' handles go to the candidate queue).
void open_and_queue(replay::RunShm& shm, const std::vector<replay::Candidate>& cands) {
  replay::GroupPublish g;
  g.candidates = cands;
  g.deadline = std::chrono::minutes(10);
  ASSERT_EQ(replay::shm_groups(shm, "test actor")->publish(g, std::chrono::seconds(1), [] { return true; }),
            replay::PublishOutcome::published);
}

// The results the evaluator wrote into the groups that are complete (the learner's view),
// by candidate id.
std::map<uint64_t, replay::Result> scored_results(replay::RunShm& shm) {
  std::vector<replay::ScoredGroup> groups;
  shm.replay().take_ready(groups, 16, 0, 1000, std::chrono::milliseconds(100));
  std::map<uint64_t, replay::Result> out;
  for (const auto& g : groups)
    for (std::size_t i = 0; i < g.results.size(); ++i)
      if (!g.missing[i]) out[g.results[i].candidate_id] = g.results[i];
  return out;
}

// A CandidateSource made in the test: a vector of claims, and a record of what the service
// did with each. Any transport looks like this to the service.
class VectorSource : public replay::CandidateSource {
 public:
  explicit VectorSource(const std::vector<replay::Candidate>& cands) {
    for (const auto& c : cands) {
      replay::Claim cl;
      cl.candidate = c;
      cl.ticket = 1000 + c.id;  // the transport's handle: must come back unchanged
      waiting.push_back(cl);
    }
  }
  std::size_t claim(std::vector<replay::Claim>& out, std::size_t max, replay::Timeout) override {
    if (fail_claim) throw kf::Error("test source: the server is gone");
    std::size_t n = 0;
    for (; n < max && !waiting.empty(); ++n) {
      out.push_back(waiting.front());
      claimed.push_back(waiting.front().candidate.id);
      waiting.pop_front();
    }
    return n;
  }
  replay::Completion complete(const replay::Claim& c, const replay::Result& r) override {
    EXPECT_EQ(c.ticket, 1000 + c.candidate.id);
    EXPECT_EQ(r.candidate_id, c.candidate.id);
    if (fail_complete) throw kf::Error("test source: the result was not stored");
    completed.push_back(r);
    replay::Completion out;
    out.first = !late;
    out.kernel_inserted = r.verdict == replay::Verdict::ok;
    return out;
  }
  void give_back(const replay::Claim& c) override { given_back.push_back(c.candidate.id); }
  void drop(const replay::Claim& c) override { dropped.push_back(c.candidate.id); }
  void keep_alive(const std::vector<replay::Claim>& held) override {
    std::lock_guard<std::mutex> g(mu);
    for (const auto& c : held) kept_alive.insert(c.candidate.id);
  }
  std::string where() const override { return "test source"; }
  std::set<uint64_t> kept() {
    std::lock_guard<std::mutex> g(mu);
    return kept_alive;
  }
  std::map<uint64_t, int> completions() const {
    std::map<uint64_t, int> n;
    for (const auto& r : completed) ++n[r.candidate_id];
    return n;
  }

  std::deque<replay::Claim> waiting;
  std::vector<uint64_t> claimed, given_back, dropped;
  std::vector<replay::Result> completed;
  bool fail_claim = false, fail_complete = false, late = false;

 private:
  std::mutex mu;  // keep_alive comes from the service's keeper thread
  std::set<uint64_t> kept_alive;
};

}  // namespace

TEST(EvaluatorServiceTest, ScoresQueuedCandidatesWritesResultsIntoTheGroupAndStoresOkKernels) {
  const std::string run = "kft" + std::to_string(getpid()) + ".evsvc";
  auto shm = replay::RunShm::create(run);
  Evaluator ev(light_options());
  ServiceOptions so;
  so.evaluator_id = 3;
  so.tasks_dir = build_dir() + "/tasks";
  so.batch = 8;
  const std::string log = build_dir() + "/evaluator-test-verdicts-" + std::to_string(getpid()) + ".jsonl";
  std::remove(log.c_str());
  so.verdict_log = log;
  auto source = replay::shm_candidates(*shm, "evaluator 3");
  EvaluatorService service(ev, *source, &shm->control(), so);

  const std::string good = test::read_kernel("cpu/good_relu.cpp");
  replay::Candidate no_code = candidate(103, "001_relu", "", 2);
  no_code.extraction_error = "extract: no_code: the completion has no fenced code block";
  const std::string broken = "#include \"kf/kernel.h\"\nint helper() { return undefined_name; }\n";
  // A group of four for 001_relu, and one of one for a task the evaluator cannot load.
  ASSERT_NO_FATAL_FAILURE(open_and_queue(
      *shm,
      {candidate(101, "001_relu", good, 0), candidate(102, "001_relu", test::read_kernel("cpu/cheat_partial.cpp"), 1),
       no_code, candidate(105, "001_relu", broken, 3)}));
  replay::Candidate unknown = candidate(104, "no_such_task", good, 0);
  unknown.group_id = 78;
  ASSERT_NO_FATAL_FAILURE(open_and_queue(*shm, {unknown}));

  std::size_t scored = 0;
  for (int i = 0; i < 10 && scored < 5; ++i) scored += service.step();
  ASSERT_EQ(scored, 5u);

  // The results are in the group, which is complete; nothing went through another queue.
  std::map<uint64_t, replay::Result> by_id = scored_results(*shm);
  ASSERT_EQ(by_id.size(), 5u);
  EXPECT_EQ(shm->replay().stats().results_joined, 5u);
  EXPECT_EQ(shm->candidate_ledger().scored, 5u);
  EXPECT_TRUE(shm->candidate_ledger().balanced());
  EXPECT_EQ(by_id[101].verdict, replay::Verdict::ok) << by_id[101].reason;
  EXPECT_GT(by_id[101].speedup, 0);
  EXPECT_GT(by_id[101].cand_time_median_us, 0);
  EXPECT_EQ(by_id[101].group_id, 77u);
  EXPECT_EQ(by_id[101].evaluator_id, 3);
  EXPECT_EQ(by_id[102].verdict, replay::Verdict::rejected_cheat);
  EXPECT_NE(by_id[102].reason.find("not fully written"), std::string::npos) << by_id[102].reason;
  EXPECT_EQ(by_id[103].verdict, replay::Verdict::compile_error);
  EXPECT_NE(by_id[103].reason.find("no_code"), std::string::npos) << by_id[103].reason;
  EXPECT_EQ(by_id[104].verdict, replay::Verdict::runtime_error);
  EXPECT_NE(by_id[104].reason.find("no_such_task"), std::string::npos) << by_id[104].reason;
  EXPECT_EQ(by_id[104].cause, replay::Cause::environment) << "an unknown task is the setup's fault, not the kernel's";
  EXPECT_EQ(by_id[105].verdict, replay::Verdict::compile_error);
  for (uint64_t id : {102, 103, 104, 105}) EXPECT_LT(by_id[id].reward, 0) << id;
  for (uint64_t id : {101, 102, 103, 105}) EXPECT_EQ(by_id[id].cause, replay::Cause::kernel) << id;

  // Only the verified kernel entered the database, with its speedup and policy version.
  auto entries = shm->kernels().entries("001_relu");
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].source, good);
  EXPECT_EQ(entries[0].policy_version, 5);
  EXPECT_DOUBLE_EQ(entries[0].speedup, by_id[101].speedup);
  EXPECT_EQ(service.stats().ok, 1u);
  EXPECT_EQ(service.stats().kernels_inserted, 1u);

  // The verdict log: one line per scored candidate, with what the candidate record knows
  // (task, policy version) and what only the evaluator knows (level, times, reason).
  std::map<uint64_t, nlohmann::json> logged;
  {
    std::ifstream f(log);
    for (std::string line; std::getline(f, line);) {
      const auto j = nlohmann::json::parse(line);
      logged[j.at("candidate").get<uint64_t>()] = j;
    }
  }
  ASSERT_EQ(logged.size(), 5u);
  EXPECT_EQ(logged[101]["task"], "001_relu");
  EXPECT_EQ(logged[101]["level"], 1);
  EXPECT_EQ(logged[101]["verdict"], "ok");
  EXPECT_EQ(logged[101]["policy_version"], 5);
  EXPECT_EQ(logged[101]["evaluator"], 3);
  EXPECT_EQ(logged[101]["group"], 77);
  EXPECT_EQ(logged[101]["index"], 0);  // the candidate's place in its group
  EXPECT_EQ(logged[102]["index"], 1);
  EXPECT_EQ(logged[101]["turn"], 1);  // a single-turn candidate: no parent
  EXPECT_EQ(logged[101]["parent_group"], 0);
  EXPECT_EQ(logged[101]["parent_index"], 0);
  EXPECT_DOUBLE_EQ(logged[101]["speedup"].get<double>(), by_id[101].speedup);
  EXPECT_GT(logged[101]["compile_s"].get<double>(), 0);
  EXPECT_GT(logged[101]["t"].get<double>(), 1.7e9);           // unix seconds
  EXPECT_EQ(logged[101]["gpu_claim_gb"].get<double>(), 0.0);  // a CPU candidate claims no GPU memory
  EXPECT_EQ(logged[101]["gpu_peak_gb"].get<double>(), 0.0);
  EXPECT_EQ(logged[102]["verdict"], "rejected_cheat");
  EXPECT_EQ(logged[102]["speedup"], 0.0);
  EXPECT_NE(logged[102]["reason"].get<std::string>().find("not fully written"), std::string::npos);
  EXPECT_EQ(logged[103]["verdict"], "compile_error");
  EXPECT_EQ(logged[103]["diagnostic"], "");  // nothing was compiled: the reason says why
  // A compile error logs the compiler's first error line, the cache path cut to the file name.
  const std::string diag = logged[105]["diagnostic"].get<std::string>();
  EXPECT_NE(diag.find("error"), std::string::npos) << diag;
  EXPECT_NE(diag.find("undefined_name"), std::string::npos) << diag;
  EXPECT_EQ(diag.find('/'), std::string::npos) << diag;
  EXPECT_EQ(logged[101]["diagnostic"], "");
  EXPECT_EQ(logged[104]["level"], 0);  // unknown task: no level
  std::remove(log.c_str());

  // The control block shows the evaluator and its counters.
  bool seen = false;
  for (const auto& p : shm->control().peers(std::chrono::seconds(60)))
    if (p.role == "evaluator" && p.id == 3) {
      seen = true;
      EXPECT_EQ(p.counters[counter::kEvalScored], 5u);
      EXPECT_EQ(p.counters[counter::kEvalOk], 1u);
      EXPECT_EQ(p.counters[counter::kEvalCheat], 1u);
      EXPECT_EQ(p.counters[counter::kEvalKernelsInserted], 1u);
    }
  EXPECT_TRUE(seen);
  shm->shutdown();
}

// A signal during a batch: the candidate in hand is scored, the rest of the batch is not
// (without this, an evaluator kept verifying its whole batch of 8 after SIGTERM and the
// launcher killed it 15 s later).
TEST(EvaluatorServiceTest, StopFlagEndsTheBatchAfterTheCandidateInHand) {
  const std::string run = "kft" + std::to_string(getpid()) + ".evstop";
  auto shm = replay::RunShm::create(run);
  Evaluator ev(light_options());
  std::atomic<bool> stop{false};
  ServiceOptions so;
  so.tasks_dir = build_dir() + "/tasks";
  so.batch = 8;
  so.stop = &stop;
  auto source = replay::shm_candidates(*shm, "evaluator 0");
  EvaluatorService service(ev, *source, &shm->control(), so);
  service.on_result([&](const replay::Result&, const Result&) { stop = true; });  // the signal arrives meanwhile
  const std::string good = test::read_kernel("cpu/good_relu.cpp");
  std::vector<replay::Candidate> first;
  for (uint64_t id = 301; id <= 303; ++id) first.push_back(candidate(id, "001_relu", good, uint32_t(id - 301)));
  ASSERT_NO_FATAL_FAILURE(open_and_queue(*shm, first));
  EXPECT_EQ(service.step(), 1u);
  EXPECT_EQ(shm->replay().stats().results_joined, 1u);
  uint64_t cursor = 0;
  const auto notes = shm->replay().recent_results(&cursor);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[0].candidate_id, 301u);
  EXPECT_TRUE(notes[0].joined);
  EXPECT_EQ(service.stats().scored, 1u);
  // The rest of the stopped batch went back to the queue, not lost: without the flag the
  // next step scores those two and the two new ones.
  stop = false;
  auto plain_source = replay::shm_candidates(*shm, "evaluator 1");
  EvaluatorService plain(ev, *plain_source, &shm->control(), [&] {
    ServiceOptions o = so;
    o.stop = nullptr;
    return o;
  }());
  std::vector<replay::Candidate> second;
  for (uint64_t id = 304; id <= 305; ++id) {
    second.push_back(candidate(id, "001_relu", good, uint32_t(id - 304)));
    second.back().group_id = 78;
  }
  ASSERT_NO_FATAL_FAILURE(open_and_queue(*shm, second));
  EXPECT_EQ(plain.step(), 4u);
  std::set<uint64_t> ids;
  for (const auto& [id, r] : scored_results(*shm)) ids.insert(id);
  EXPECT_EQ(ids, (std::set<uint64_t>{301, 302, 303, 304, 305})) << "both groups complete, each result once";
  shm->shutdown();
}

// The loop needs nothing but the seam: over a source made here, with no control block (an
// evaluator node has none), every claim is completed once; the out-of-memory retry holds its
// claim and completes it through the source (never claimed again); a stop signal and a
// stopping service give claims back through it; a result it could not store is dropped
// through it; its failure to claim reaches the caller as SourceError.
TEST(EvaluatorServiceTest, RunsOverAnyCandidateSource) {
  Evaluator ev(light_options());
  const std::string good = test::read_kernel("cpu/good_relu.cpp");
  const std::string oom = test::read_kernel("cpu/fake_worker_oom.cpp");
  ServiceOptions so;
  so.evaluator_id = 6;
  so.tasks_dir = build_dir() + "/tasks";
  so.batch = 8;
  so.oom_attempts = 2;
  so.oom_retry_delay = std::chrono::milliseconds(20);
  so.keep_alive_every = std::chrono::milliseconds(20);
  replay::Candidate no_code = candidate(602, "001_relu", "", 1);
  no_code.extraction_error = "extract: no_code: the completion has no fenced code block";
  {
    VectorSource src({candidate(601, "001_relu", good, 0), no_code, candidate(603, "001_relu", oom, 2)});
    EvaluatorService service(ev, src, nullptr, so);
    std::size_t scored = 0;
    for (int i = 0; i < 300 && scored < 3; ++i) {
      scored += service.step();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_EQ(scored, 3u);
    EXPECT_EQ(service.pending_retries(), 0u);
    EXPECT_EQ(src.claimed, (std::vector<uint64_t>{601, 602, 603})) << "the retry went through its claim";
    EXPECT_EQ(src.completions(), (std::map<uint64_t, int>{{601, 1}, {602, 1}, {603, 1}}));
    std::map<uint64_t, replay::Result> by_id;
    for (const auto& r : src.completed) by_id[r.candidate_id] = r;
    EXPECT_EQ(by_id[601].verdict, replay::Verdict::ok) << by_id[601].reason;
    EXPECT_EQ(by_id[601].evaluator_id, 6);
    EXPECT_EQ(by_id[602].verdict, replay::Verdict::compile_error);
    EXPECT_EQ(by_id[603].verdict, replay::Verdict::runtime_error);
    EXPECT_EQ(by_id[603].cause, replay::Cause::environment);
    EXPECT_NE(by_id[603].reason.find("out of GPU memory on 2 tries"), std::string::npos) << by_id[603].reason;
    EXPECT_TRUE(src.given_back.empty());
    EXPECT_TRUE(src.dropped.empty());
    EXPECT_EQ(service.stats().scored, 3u);
    EXPECT_EQ(service.stats().kernels_inserted, 1u) << "counted from the source's Completion";
    // Held while 601 was verified: the whole batch, the retry included.
    EXPECT_EQ(src.kept(), (std::set<uint64_t>{601, 602, 603}));
  }
  {
    std::atomic<bool> stop{false};
    ServiceOptions o = so;
    o.stop = &stop;
    VectorSource src({candidate(611, "001_relu", good, 0), candidate(612, "001_relu", good, 1),
                      candidate(613, "001_relu", good, 2)});
    EvaluatorService service(ev, src, nullptr, o);
    service.on_result([&](const replay::Result&, const Result&) { stop = true; });  // the signal arrives meanwhile
    EXPECT_EQ(service.step(), 1u);
    EXPECT_EQ(src.completions(), (std::map<uint64_t, int>{{611, 1}}));
    EXPECT_EQ(src.given_back, (std::vector<uint64_t>{612, 613}));
    EXPECT_EQ(service.stats().given_back, 2u);
  }
  {
    VectorSource src({candidate(621, "001_relu", oom, 0)});
    {
      EvaluatorService service(ev, src, nullptr, so);
      EXPECT_EQ(service.step(), 0u);
      EXPECT_EQ(service.pending_retries(), 1u);
    }
    EXPECT_TRUE(src.completed.empty());
    EXPECT_EQ(src.given_back, (std::vector<uint64_t>{621})) << "a stopping service gives its held retry back";
  }
  {
    VectorSource src({no_code});
    src.fail_complete = true;
    EvaluatorService service(ev, src, nullptr, so);
    EXPECT_EQ(service.step(), 1u);
    EXPECT_EQ(src.dropped, (std::vector<uint64_t>{602}));
    EXPECT_EQ(service.stats().results_dropped, 1u);
    src.fail_complete = false;
    src.late = true;
    src.waiting.push_back([&] {
      replay::Claim c;
      c.candidate = candidate(604, "001_relu", "", 3);
      c.ticket = 1604;
      return c;
    }());
    EXPECT_EQ(service.step(), 1u);
    EXPECT_EQ(service.stats().late, 1u) << "another evaluator's result for it counted";
    src.fail_claim = true;
    EXPECT_THROW(service.step(), SourceError);
  }
}

// The queue carries handles; the candidates live in their groups. A handle whose group was
// evicted before an evaluator claimed it is counted lost (service stats, control counter,
// candidate ledger: dropped) and nothing is scored for it; the group that evicted it is
// scored normally.
TEST(EvaluatorServiceTest, HandleOfAnEvictedGroupIsCountedLostAndNotScored) {
  const std::string run = "kft" + std::to_string(getpid()) + ".evgone";
  replay::RunShmConfig rc;
  rc.replay.capacity = 1;  // a second group evicts the first
  auto shm = replay::RunShm::create(run, rc);
  Evaluator ev(light_options());
  ServiceOptions so;
  so.evaluator_id = 4;
  so.tasks_dir = build_dir() + "/tasks";
  so.batch = 8;
  auto source = replay::shm_candidates(*shm, "evaluator 4");
  EvaluatorService service(ev, *source, &shm->control(), so);
  std::vector<uint64_t> scored_ids;
  service.on_result([&](const replay::Result& r, const Result&) { scored_ids.push_back(r.candidate_id); });
  const std::string good = test::read_kernel("cpu/good_relu.cpp");
  ASSERT_NO_FATAL_FAILURE(
      open_and_queue(*shm, {candidate(401, "001_relu", good, 0), candidate(402, "001_relu", good, 1)}));
  replay::Candidate later = candidate(403, "001_relu", good, 0);
  later.group_id = 79;
  ASSERT_NO_FATAL_FAILURE(open_and_queue(*shm, {later}));
  ASSERT_EQ(shm->replay().stats().evicted, 1u);

  std::size_t scored = 0;
  for (int i = 0; i < 5 && scored < 1; ++i) scored += service.step();
  EXPECT_EQ(scored, 1u);
  EXPECT_EQ(scored_ids, (std::vector<uint64_t>{403})) << "only the candidate whose group exists is scored";
  EXPECT_EQ(service.stats().lost_group_gone, 2u);
  EXPECT_EQ(service.stats().scored, 1u);
  EXPECT_EQ(shm->replay().stats().refs_unresolved, 2u);
  EXPECT_EQ(shm->replay().stats().results_orphan, 0u) << "no result was made for the lost candidates";
  const replay::QueueLedger l = shm->candidate_ledger();
  EXPECT_EQ(l.dropped, 2u);
  EXPECT_EQ(l.scored, 1u);
  EXPECT_TRUE(l.balanced());
  uint64_t lost_counter = 0;
  for (const auto& p : shm->control().peers(std::chrono::hours(1)))
    if (p.role == "evaluator") lost_counter += p.counters.at(counter::kEvalLost);
  EXPECT_EQ(lost_counter, 2u);
  shm->shutdown();
}

TEST(EvaluatorServiceTest, OutOfGpuMemoryIsRetriedThenScoredAndNeverKillsTheService) {
  const std::string run = "kft" + std::to_string(getpid()) + ".evoom";
  auto shm = replay::RunShm::create(run);
  Evaluator ev(light_options());
  ServiceOptions so;
  so.tasks_dir = build_dir() + "/tasks";
  so.oom_attempts = 3;
  so.oom_retry_delay = std::chrono::milliseconds(20);
  auto source = replay::shm_candidates(*shm, "evaluator 0");
  EvaluatorService service(ev, *source, &shm->control(), so);
  ASSERT_NO_FATAL_FAILURE(
      open_and_queue(*shm, {candidate(201, "001_relu", test::read_kernel("cpu/fake_worker_oom.cpp"), 0)}));
  // First try: put back, nothing scored or written.
  EXPECT_EQ(service.step(), 0u);
  EXPECT_EQ(service.pending_retries(), 1u);
  EXPECT_EQ(shm->replay().stats().results_joined, 0u);
  // Two more tries (after the delays), then it is scored once, as runtime_error.
  std::size_t scored = 0;
  for (int i = 0; i < 200 && scored == 0; ++i) {
    scored += service.step();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(scored, 1u);
  EXPECT_EQ(service.pending_retries(), 0u);
  const auto results = scored_results(*shm);
  ASSERT_EQ(results.size(), 1u);
  const replay::Result& oom = results.begin()->second;
  EXPECT_EQ(oom.candidate_id, 201u);
  EXPECT_EQ(oom.verdict, replay::Verdict::runtime_error);
  EXPECT_NE(oom.reason.find("out of GPU memory on 3 tries"), std::string::npos) << oom.reason;
  EXPECT_EQ(oom.cause, replay::Cause::environment) << "the learner must leave it out: " << oom.reason;
  EXPECT_EQ(service.stats().scored, 1u);
  // The classifier: only the harness's allocation failure counts, not any runtime error.
  Result r;
  r.verdict = Verdict::runtime_error;
  r.reason = "crashed: worker exit 3: fatal: cudaMalloc output: out of memory";
  EXPECT_TRUE(worker_out_of_memory(r));
  r.reason = "crashed: worker exit 3: fatal: cudaSetDevice: out of memory";
  EXPECT_TRUE(worker_out_of_memory(r));
  r.reason = "crashed: worker exit 3: fatal: cublasCreate failed";
  EXPECT_TRUE(worker_out_of_memory(r));
  r.reason = "cuda_error: CUDA error after kf_forward: cudaErrorMemoryAllocation (out of memory)";
  EXPECT_FALSE(worker_out_of_memory(r));
  r.reason = "crashed: worker exit 3: fatal: cudaMalloc output: out of memory";
  r.verdict = Verdict::incorrect;
  EXPECT_FALSE(worker_out_of_memory(r));
  shm->shutdown();
}

// The one-process stages (tools/selfsup) retry in place: the same out-of-memory verdict
// is tried `attempts` times, the delay x try apart, then returned with gave_up set; a kernel
// that verifies is returned at once.
TEST(EvaluatorServiceTest, InPlaceRetryTriesAgainThenGivesUpAndPassesGoodKernelsThrough) {
  Evaluator ev(light_options());
  const auto relu = kf::tasks::Task::load(build_dir() + "/tasks/001_relu");
  bool gave_up = false;
  const auto t0 = std::chrono::steady_clock::now();
  const Result oom =
      evaluate_retrying_oom(ev, *relu, kf::tasks::Backend::CPU, test::read_kernel("cpu/fake_worker_oom.cpp"), 401, 3,
                            std::chrono::milliseconds(100), &gave_up);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(gave_up);
  EXPECT_EQ(oom.verdict, Verdict::runtime_error);
  EXPECT_TRUE(worker_out_of_memory(oom)) << oom.reason;
  EXPECT_GE(waited, 0.3) << "three tries wait 100 + 200 ms between them";
  gave_up = true;
  const Result good = evaluate_retrying_oom(ev, *relu, kf::tasks::Backend::CPU, test::read_kernel("cpu/good_relu.cpp"),
                                            402, 3, std::chrono::milliseconds(100), &gave_up);
  EXPECT_FALSE(gave_up);
  EXPECT_TRUE(good.ok()) << good.reason;
}

// Several evaluators share one GPU: each gives its allocator cache back above
// ServiceOptions::cache_limit_bytes, and keeps it (fast re-allocation) below; with GPU
// memory claims on, the evaluator gives it back at the end of every verification.
TEST(EvaluatorServiceTest, CudaCacheAboveTheLimitIsGivenBackAfterACandidate) {
  if (!kf::tasks::cuda_available()) GTEST_SKIP() << "no CUDA device visible: runs on the GPU machine";
  const std::string run = "kft" + std::to_string(getpid()) + ".evcache";
  auto shm = replay::RunShm::create(run);
  EvalOptions eo = light_options();
  eo.correctness_sets = 2;
  eo.stress_sets = 1;
  eo.gpu_memory_fraction = 0;  // no claims: only the service's cache limit
  eo.gpu_lock_dir = build_dir() + "/evaluator-test-locks";
  Evaluator ev(eo);
  eo.gpu_memory_fraction = 0.6;
  Evaluator claiming(eo);
  auto reserved_after_one = [&](std::size_t limit, uint64_t id, Evaluator& ev) {
    ServiceOptions so;
    so.backend = kf::tasks::Backend::CUDA;
    so.tasks_dir = build_dir() + "/tasks";
    so.cache_limit_bytes = limit;
    auto source = replay::shm_candidates(*shm, "evaluator 0");
    EvaluatorService service(ev, *source, &shm->control(), so);
    replay::Candidate c = candidate(id, "001_relu", test::read_kernel("cuda/good_relu.cu"), 0);
    c.group_id = id;
    open_and_queue(*shm, {c});
    std::size_t scored = 0;
    for (int i = 0; i < 10 && scored == 0; ++i) scored += service.step();
    EXPECT_EQ(scored, 1u);
    const auto results = scored_results(*shm);
    EXPECT_EQ(results.size(), 1u);
    if (!results.empty())
      EXPECT_EQ(results.begin()->second.verdict, replay::Verdict::ok) << results.begin()->second.reason;
    return kf::tasks::device_cache_reserved_bytes();
  };
  const std::size_t kept = reserved_after_one(0, 301, ev);     // 0: never given back
  const std::size_t limited = reserved_after_one(1, 302, ev);  // any cache is above 1 byte
  EXPECT_GT(kept, 64u << 20) << "a GPU-sized task's inputs stay cached without a limit";
  EXPECT_LT(limited, kept / 4) << "kept " << kept << " bytes, with the limit " << limited;
  (void)reserved_after_one(0, 303, ev);                              // cache it again
  const std::size_t claimed = reserved_after_one(0, 304, claiming);  // no service limit
  EXPECT_LT(claimed, kept / 4) << "the evaluator kept its cache after a claimed verification";
  // The claim went with the verification: the GPU's claims file is empty again.
  const kf::GpuMemoryBudget same_gpu(eo.gpu_lock_dir, gpu_lock_key(eo.device), 1);
  std::ifstream claims(same_gpu.path());
  const std::string left((std::istreambuf_iterator<char>(claims)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(left.empty()) << same_gpu.path() << " still holds: " << left;
  shm->shutdown();

  // What the claim is for: the most this process held for one verification (allocator peak
  // plus the sandbox's device arena) stays within what it claimed.
  const auto relu = kf::tasks::Task::load(build_dir() + "/tasks/001_relu");
  const Result r = claiming.evaluate(*relu, kf::tasks::Backend::CUDA, test::read_kernel("cuda/good_relu.cu"), 305);
  EXPECT_TRUE(r.ok()) << r.reason;
  std::printf("001_relu: claimed %.2f GiB, peak %.2f GiB\n", r.gpu_claim_gb, r.gpu_peak_gb);
  EXPECT_GT(r.gpu_claim_gb, 1.0);
  EXPECT_GT(r.gpu_peak_gb, 0.0);
  EXPECT_LE(r.gpu_peak_gb, r.gpu_claim_gb);
}

// The checks before the timing are GPU work too: they wait for a process that holds the
// timing lock exclusively (another evaluator's trial) instead of running beside it.
TEST(EvaluatorServiceTest, CudaChecksWaitForAnotherProcesssTimedTrial) {
  if (!kf::tasks::cuda_available()) GTEST_SKIP() << "no CUDA device visible: runs on the GPU machine";
  EvalOptions eo = light_options();
  eo.correctness_sets = 2;
  eo.stress_sets = 1;
  eo.gpu_lock_dir = build_dir() + "/evaluator-test-locks-" + std::to_string(getpid());
  Evaluator ev(eo);
  const auto relu = kf::tasks::Task::load(build_dir() + "/tasks/001_relu");
  const std::string src = test::read_kernel("cuda/good_relu.cu");
  ASSERT_TRUE(ev.evaluate(*relu, kf::tasks::Backend::CUDA, src, 1).ok());  // compiled and warm
  // A separate open of the lock file conflicts like another process's.
  kf::GpuTimingLock timer(eo.gpu_lock_dir, gpu_lock_key(eo.device));
  ASSERT_TRUE(timer.lock_exclusive(std::chrono::seconds(5)));
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::seconds(3));
    timer.unlock();
  });
  const Result r = ev.evaluate(*relu, kf::tasks::Backend::CUDA, src, 2);
  release.join();
  EXPECT_TRUE(r.ok()) << r.reason;
  double at_s = -1;
  for (const auto& c : r.checks)
    if (c.name == "correct.distribution")
      std::sscanf(c.detail.substr(c.detail.rfind("[at ")).c_str(), "[at %lf", &at_s);
  EXPECT_GE(at_s, 2.9) << "the correctness sets ran while another process held the lock exclusively";
}

TEST(EvaluatorServiceTest, ServiceOptionsComeFromTheConfigAndABadCacheLimitIsNamed) {
  const auto so =
      service_options(kf::Config::parse("run:\n  backend: cpu\nevaluator:\n  cache_limit_gb: 0.5\n", "run.yaml"));
  EXPECT_EQ(so.cache_limit_bytes, std::size_t(512) << 20);
  EXPECT_EQ(so.backend, kf::tasks::Backend::CPU);
  try {
    (void)service_options(kf::Config::parse("evaluator:\n  cache_limit_gb: -1\n", "run.yaml"));
    FAIL() << "a negative cache limit was accepted";
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("run.yaml"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("evaluator.cache_limit_gb"), std::string::npos) << e.what();
  }
}

// The verdict log line of a learning-curve probe sample (Candidate::probe, actors.probe) says
// so ("probe": true); other lines carry no probe field.
TEST(EvaluatorServiceTest, VerdictLineOfAProbeSampleSaysSo) {
  replay::Candidate c = candidate(9, "001_relu", "int x;", 2);
  Result r;
  r.verdict = Verdict::incorrect;
  r.reward = -3.0;
  c.probe = true;
  const auto probe = nlohmann::json::parse(verdict_json_line(c, r, 1, 0));
  EXPECT_EQ(probe.value("probe", false), true) << probe;
  EXPECT_EQ(probe["candidate"], 9);
  EXPECT_EQ(probe["policy_version"], 5);
  EXPECT_EQ(probe["verdict"], "incorrect");
  c.probe = false;
  const auto plain = nlohmann::json::parse(verdict_json_line(c, r, 1, 0));
  EXPECT_FALSE(plain.contains("probe")) << plain;
}
