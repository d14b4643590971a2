// Multi-turn refinement (actors.turns, docs/actors.md): a group whose members may revise is
// held in replay until the actor has read its results; each scored member then gets a next
// turn whose prompt is its conversation so far (first prompt, its answer, the verifier's
// feedback). Real components: tiny byte-level policies, the real replay segments, and for the
// compile-error case the real CPU evaluator in serial mode.
#include <gtest/gtest.h>

#include <torch/cuda.h>

#include <chrono>
#include <set>
#include <thread>

#include "kf/actors/actors.h"
#include "kf/common/config.h"
#include "kf/common/error.h"
#include "kf/common/run_dir.h"
#include "kf/evaluator/evaluator.h"
#include "feedback.h"  // actors/src: FeedbackTemplate
#include "kf/policy/policy.h"
#include "test_util.h"

using namespace kf::actors;
namespace rp = kf::replay;
using namespace std::chrono_literals;

namespace {

const rp::ScoredGroup* find_turn(const std::vector<rp::ScoredGroup>& gs, uint32_t turn) {
  for (const auto& g : gs)
    if (!g.candidates.empty() && g.candidates[0].turn == turn) return &g;
  return nullptr;
}

std::string prompt_text(const rp::ScoredGroup& g, std::size_t i) {
  const auto& c = g.candidates[i];
  return TextCodec::bytes().decode(c.prompt_tokens.empty() ? g.prompt_tokens : c.prompt_tokens);
}

// Random tiny policy: every completion fails extraction and the actor scores it itself, so a
// group is complete the moment it is opened (no evaluator needed).
ActorOptions random_policy_options(int64_t turns) {
  auto o = test::small_options();
  o.turns = turns;
  o.feedback_path = test::source_dir() + "/configs/prompts/feedback.txt";
  o.score_extraction_failures = true;
  o.max_new_tokens = 16;
  return o;
}

// The text of a completion as the actor keeps it: without the stopping EOS (byte 0).
std::string answer_text(const rp::Candidate& c) {
  std::vector<int32_t> t = c.completion_tokens;
  if (!t.empty() && t.back() == 0) t.pop_back();
  return TextCodec::bytes().decode(t);
}

bool have_jinja2() {
  const std::string cmd = kf::test::python() + " -c 'import jinja2' >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

// Largest |behaviour log-prob - the log-prob of the distribution the actor sampled from
// (temperature, top-k, top-p of `o`)| over a candidate's tokens, its prompt being `prompt`.
double logprob_gap(kf::policy::CausalLM& m, const std::vector<int32_t>& prompt, const rp::Candidate& c,
                   const ActorOptions& o) {
  kf::policy::SamplingParams sp;
  sp.temperature = o.temperature;
  sp.top_k = o.top_k;
  sp.top_p = o.top_p;
  return test::sampler_logprob_gap(m, prompt, c.completion_tokens, c.behaviour_logprobs, sp);
}

}  // namespace

TEST(ActorTurnsTest, SingleTurnGroupsAreNotHeldAndCarryTurnOne) {
  KF_NEED_TASKS();
  test::RunFixture run("t1");
  auto o = random_policy_options(1);
  Actor actor(o, test::tiny_policy(3), load_actor_tasks(o), *run.shm);
  ASSERT_EQ(actor.step(), StepResult::pushed);
  std::vector<rp::ScoredGroup> out;
  ASSERT_EQ(run.shm->replay().take_ready(out, 8, 0, 100, 0ms), 1u) << "a single-turn group is ready when scored";
  for (const auto& c : out[0].candidates) {
    EXPECT_EQ(c.turn, 1u);
    EXPECT_EQ(c.turns, 1u);
    EXPECT_EQ(c.parent_group_id, 0u);
    EXPECT_TRUE(c.prompt_tokens.empty()) << "turn 1 members share the group's prompt";
  }
  EXPECT_EQ(actor.metrics_json().find("followup"), std::string::npos);
  EXPECT_EQ(actor.metrics().followup_groups, 0u);
}

TEST(ActorTurnsTest, NoCodeAnswerGetsASecondTurnWithItsAnswerAndTheFeedback) {
  KF_NEED_TASKS();
  test::RunFixture run("t2");
  auto o = random_policy_options(2);
  Actor actor(o, test::tiny_policy(4), load_actor_tasks(o), *run.shm);
  ASSERT_EQ(actor.step(), StepResult::pushed);
  std::vector<rp::ScoredGroup> out;
  EXPECT_EQ(run.shm->replay().take_ready(out, 8, 0, 100, 0ms), 0u) << "turn 1 is held until the actor read it";
  ASSERT_EQ(actor.step(), StepResult::pushed);  // turn 2 goes before a new task
  EXPECT_EQ(actor.metrics().followup_groups, 1u);
  EXPECT_EQ(actor.metrics().followup_members, 2u);
  ASSERT_EQ(run.shm->replay().take_ready(out, 8, 0, 100, 1s), 2u);
  const auto* t1 = find_turn(out, 1);
  const auto* t2 = find_turn(out, 2);
  ASSERT_TRUE(t1 && t2);
  ASSERT_EQ(t2->candidates.size(), 2u);
  const std::string first_prompt = TextCodec::bytes().decode(t1->prompt_tokens);
  for (std::size_t i = 0; i < 2; ++i) {
    const auto& c = t2->candidates[i];
    EXPECT_EQ(c.turn, 2u);
    EXPECT_EQ(c.turns, 2u);
    EXPECT_EQ(c.parent_group_id, t1->group_id);
    EXPECT_EQ(c.parent_index, i);
    EXPECT_EQ(c.behaviour_logprobs.size(), c.completion_tokens.size());
    const std::string text = prompt_text(*t2, i);
    const auto& first = t1->candidates[i];
    std::string answer = TextCodec::bytes().decode(first.completion_tokens);
    if (!answer.empty() && answer.back() == '\0') answer.pop_back();  // the EOS byte is not text
    EXPECT_EQ(text.rfind(first_prompt, 0), 0u) << "the conversation starts with the first prompt";
    EXPECT_NE(text.find(first_prompt + answer), std::string::npos) << "then the member's own answer";
    EXPECT_NE(text.find("no usable kernel"), std::string::npos) << text;
    EXPECT_NE(text.find(first.extraction_error), std::string::npos) << "the extraction error is the reason";
    EXPECT_NE(text.find("turn 2 of 2"), std::string::npos);
  }
  EXPECT_NE(prompt_text(*t2, 0), prompt_text(*t2, 1)) << "each member has its own conversation";
}

TEST(ActorTurnsTest, CompileErrorGetsASecondTurnWithTheCompilersWordsAndTheFirstAnswer) {
  KF_NEED_TASKS();
  test::TempDir tmp;
  torch::manual_seed(0);
  at::set_num_threads(2);
  const std::string tpl = tmp.path + "/short.txt";
  test::write_file(tpl, "=== plain ===\nTask {{task}} ({{lang}} {{marker}}):\n");
  const std::string completion =
      "```cpp kernel\n#include <kf/kernel.h>\nextern \"C\" int kf_forward(kf::Context*, const kf::Tensor*, int, "
      "kf::Tensor*, int) { return kf_undeclared_name; }\n```\n";
  test::RunFixture run("t3");
  ActorOptions o = test::small_options();
  o.mode = PromptMode::plain;
  o.template_path = tpl;
  o.turns = 2;
  o.feedback_path = test::source_dir() + "/configs/prompts/feedback.txt";
  o.temperature = 0;  // greedy: both members write the memorised kernel
  o.max_new_tokens = static_cast<int64_t>(completion.size()) + 8;
  auto pol = test::tiny_policy(0);
  auto model = pol.model;
  auto tasks = load_actor_tasks(o);
  Actor actor(o, std::move(pol), tasks, *run.shm);
  const auto prompt = actor.build_task_prompt(*tasks[0], 0).tokens;
  ASSERT_GE(test::memorise(model, prompt, completion, 0.0f, 1500), 0) << "tiny model did not memorise the kernel";

  kf::evaluator::EvalOptions eo;
  eo.compile.cache_dir = test::build_dir() + "/actors-test-eval-cache";
  eo.correctness_sets = 1;
  eo.stress_sets = 1;
  eo.cpu_threads = 2;
  kf::evaluator::Evaluator ev(eo);
  SerialRunner serial(actor, ev, *run.shm, tasks, kf::tasks::Backend::CPU);
  ASSERT_EQ(serial.step(), StepResult::pushed);
  ASSERT_EQ(serial.results().size(), 2u);
  const rp::Result first_result = serial.results()[0];
  ASSERT_EQ(first_result.verdict, rp::Verdict::compile_error) << first_result.reason;
  std::vector<rp::ScoredGroup> out;
  EXPECT_EQ(run.shm->replay().take_ready(out, 8, 0, 100, 0ms), 0u) << "turn 1 is held until the actor read it";

  serial.step();  // reads turn 1, samples and pushes turn 2, which is evaluated
  EXPECT_EQ(actor.metrics().followup_members, 2u);
  ASSERT_EQ(run.shm->replay().take_ready(out, 8, 0, 100, 5s), 2u);
  const auto* t1 = find_turn(out, 1);
  const auto* t2 = find_turn(out, 2);
  ASSERT_TRUE(t1 && t2);
  ASSERT_EQ(t2->candidates.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    const std::string text = prompt_text(*t2, i);
    EXPECT_EQ(t2->candidates[i].parent_group_id, t1->group_id);
    EXPECT_NE(text.find(completion), std::string::npos) << "the first answer is in the conversation";
    EXPECT_NE(text.find("did not compile"), std::string::npos) << text;
    EXPECT_NE(text.find(t1->results[i].reason), std::string::npos) << "the verifier's stored reason is the feedback";
    // The evaluator keeps the compiler's lines in the stored reason, paths cut to the file name.
    EXPECT_NE(t1->results[i].reason.find("kf_undeclared_name"), std::string::npos) << t1->results[i].reason;
    std::istringstream lines(t1->results[i].reason);
    for (std::string line; std::getline(lines, line);)  // no folder before a line's first colon
      EXPECT_EQ(line.substr(0, line.find(':')).find('/'), std::string::npos) << line;
    EXPECT_NE(text.find("kf_undeclared_name"), std::string::npos) << "the compiler's error line";
  }
}

TEST(ActorTurnsTest, UnscoredMembersAndEvictedGroupsAreCountedAndNothingHangs) {
  KF_NEED_TASKS();
  test::RunFixture run("t4", /*replay_groups=*/1);
  auto o = random_policy_options(2);
  o.score_extraction_failures = false;  // results must come from an evaluator: none runs here
  o.group_deadline_s = 0.3;
  Actor actor(o, test::tiny_policy(5), load_actor_tasks(o), *run.shm);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(actor.step(), StepResult::pushed);  // group A, held, never scored
  std::this_thread::sleep_for(400ms);
  // A is past its deadline with no result: both members end (counted); a new group B opens
  // (evicting A from the one-slot buffer).
  ASSERT_EQ(actor.step(), StepResult::pushed);
  EXPECT_EQ(actor.metrics().turn_members_unscored, 2u);
  EXPECT_EQ(actor.metrics().followup_groups, 0u);
  // Someone else's group evicts B before the actor read it.
  std::vector<rp::Candidate> other(1);
  other[0].id = 77;
  other[0].task = "001_relu";
  other[0].group_id = 4242;
  other[0].prompt_tokens = {1, 2};
  ASSERT_TRUE(run.shm->replay().open_group(other, 10s));
  EXPECT_GE(run.shm->replay().stats().evicted, 2u);
  actor.step();
  EXPECT_EQ(actor.metrics().turn_groups_lost, 1u);
  EXPECT_EQ(actor.metrics().followup_groups, 0u);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);
  EXPECT_NE(actor.metrics_json().find("\"turn_groups_lost\":1"), std::string::npos) << actor.metrics_json();
}

TEST(ActorTurnsTest, TurnsOutOfRangeIsAnErrorNamingTheKey) {
  bool declared = false;
  for (const auto& k : kf::config_schema()) declared = declared || k.path == "actors.turns";
  if (!declared) GTEST_SKIP() << "actors.turns is not in this build's config schema (common/src/config_schema.cpp)";
  for (const char* bad : {"actors.turns=0", "actors.turns=9"}) {
    try {
      actor_options(kf::Config::parse("", "turns_test", {bad}), 0);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const kf::Error& e) {
      EXPECT_NE(std::string(e.what()).find("actors.turns"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(actor_options(kf::Config::parse("", "turns_test", {"actors.turns=3"}), 0).turns, 3);
  EXPECT_EQ(actor_options(kf::Config::parse("", "turns_test"), 0).turns, 1);
}

TEST(ActorTurnsTest, ChatModelsGetTheConversationThroughTheirTemplate) {
  KF_NEED_TASKS();
  if (!have_jinja2()) GTEST_SKIP() << "jinja2 is not installed for " << kf::test::python();
  test::TempDir model;  // Qwen2.5-Coder-Instruct's chat template beside a tiny byte-level policy
  kf::write_file_atomic(
      model.path + "/tokenizer_config.json",
      kf::read_file(test::source_dir() +
                    "/tests/policy/data/chat_templates/qwen2.5-coder-instruct/tokenizer_config.json"));
  test::RunFixture run("t5");
  auto o = random_policy_options(2);
  o.policy_dir = model.path;
  Actor actor(o, test::tiny_policy(6), load_actor_tasks(o), *run.shm);
  const auto first = actor.build_task_prompt(*load_actor_tasks(o)[0], 0);
  ASSERT_EQ(actor.step(), StepResult::pushed);
  ASSERT_EQ(actor.step(), StepResult::pushed);
  std::vector<rp::ScoredGroup> out;
  ASSERT_EQ(run.shm->replay().take_ready(out, 8, 0, 100, 1s), 2u);
  const auto* t1 = find_turn(out, 1);
  const auto* t2 = find_turn(out, 2);
  ASSERT_TRUE(t1 && t2);
  const auto fb = FeedbackTemplate::load(o.feedback_path);
  const std::string sys =
      "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n";
  for (std::size_t i = 0; i < t2->candidates.size(); ++i) {
    const auto& c1 = t1->candidates[i];
    // Qwen's layout written out by hand: system, user, assistant (the answer), user (feedback).
    const std::string want = sys + "<|im_start|>user\n" + first.user + "<|im_end|>\n<|im_start|>assistant\n" +
                             answer_text(c1) + "<|im_end|>\n<|im_start|>user\n" +
                             fb.feedback(c1, t1->results[i], 2, 2, "cpp", "kernel") +
                             "<|im_end|>\n<|im_start|>assistant\n";
    EXPECT_EQ(prompt_text(*t2, i), want) << "member " << i;
  }
}

namespace {
void engine_turns(bool cuda) {
  test::RunFixture run(cuda ? "t7" : "t6", 32);
  auto o = random_policy_options(2);
  o.max_new_tokens = 10;
  o.exemplars = 0;
  o.temperature = 0.9;
  o.top_k = 16;
  o.engine_max_sequences = 4;
  o.engine_kv_budget_mb = 16;
  o.engine_check_every = 4;
  if (cuda) o.device = "cuda";
  auto pol = cuda ? load_actor_policy("", "tiny", 7, "cuda") : test::tiny_policy(7);  // bf16 on CUDA
  auto model = pol.model;
  Actor actor(o, std::move(pol), load_actor_tasks(o), *run.shm);
  std::vector<rp::ScoredGroup> out;
  for (int i = 0; i < 40 && actor.metrics().followup_groups < 1; ++i) actor.step();
  ASSERT_GE(actor.metrics().followup_groups, 1u);
  run.shm->replay().take_ready(out, 64, 0, 100, 1s);
  const rp::ScoredGroup* t2 = find_turn(out, 2);
  ASSERT_NE(t2, nullptr);
  const rp::ScoredGroup* t1 = nullptr;
  for (const auto& g : out)
    if (g.group_id == t2->candidates[0].parent_group_id) t1 = &g;
  ASSERT_NE(t1, nullptr) << "the turn-1 group was released to the learner";
  for (std::size_t i = 0; i < t2->candidates.size(); ++i) {
    const auto& c = t2->candidates[i];
    const auto& prompt = c.prompt_tokens.empty() ? t2->prompt_tokens : c.prompt_tokens;
    const std::string text = TextCodec::bytes().decode(prompt);
    EXPECT_EQ(text.rfind(TextCodec::bytes().decode(t1->prompt_tokens) + answer_text(t1->candidates[c.parent_index]), 0),
              0u)
        << "member " << i << " continues its own turn-1 answer";
    ASSERT_EQ(c.behaviour_logprobs.size(), c.completion_tokens.size());
    // fp32 on the CPU; bf16 on CUDA (the engine's kernels and the full forward round differently)
    EXPECT_LT(logprob_gap(model, prompt, c, o), cuda ? 0.1 : 1e-4) << "behaviour log-probs under its own prompt";
  }
}
}  // namespace

TEST(ActorTurnsTest, EngineSamplesEachMemberOfALaterTurnWithItsOwnPrompt) {
  KF_NEED_TASKS();
  engine_turns(false);
}

TEST(ActorTurnsTest, CudaEngineSamplesEachMemberOfALaterTurnWithItsOwnPrompt) {
  KF_NEED_TASKS();
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  engine_turns(true);
}

namespace {
// A run whose candidate queue holds `queue` handles: the actor meets back-pressure at once.
struct SmallQueueRun {
  std::string name;
  std::unique_ptr<rp::RunShm> shm;
  SmallQueueRun(const std::string& tag, uint32_t queue) : name(test::run_name(tag)) {
    rp::RunShmConfig c;
    c.candidates.capacity = queue;
    c.replay.capacity = 16;
    c.replay.group_bytes = 4u << 20;
    c.kernels = {64, 64 * 1024, 16};
    c.snapshot.max_bytes = 8u << 20;
    shm = rp::RunShm::create(name, c);
    shm->control().set_state(rp::RunState::running);
  }
  ~SmallQueueRun() { shm->shutdown(); }
};

void score_all(rp::ReplayBuffer& replay, const std::vector<rp::Candidate>& cands) {
  for (const auto& c : cands) {
    rp::Result r;
    r.candidate_id = c.id;
    r.group_id = c.group_id;
    r.index_in_group = c.index_in_group;
    r.verdict = rp::Verdict::compile_error;
    r.reason = "error: expected ';' before '}' token";
    r.reward = -1;
    r.evaluator_id = 0;
    ASSERT_TRUE(replay.add_result(r));
  }
}
}  // namespace

// A held group whose results come in while the actor waits for room in the candidate queue
// goes to the learner then, not after the actor's next group: the learner is not held up
// by the actor's back-pressure.
TEST(ActorTurnsTest, HeldGroupReachesTheLearnerWhileTheActorWaitsForQueueRoom) {
  KF_NEED_TASKS();
  SmallQueueRun run("t8", 2);  // one group of 2
  auto o = random_policy_options(2);
  o.score_extraction_failures = false;  // every candidate goes through the queue
  Actor actor(o, test::tiny_policy(8), load_actor_tasks(o), *run.shm);
  ASSERT_EQ(actor.step(), StepResult::pushed);  // group A, held; its 2 handles fill the queue
  // The test is A's evaluator: while it verifies (its claims open) the queue stays full, so
  // the actor's next group must wait.
  test::Evaluators ev(*run.shm);
  std::vector<rp::Claim> claims;
  ASSERT_EQ(ev.source->claim(claims, 2, 1s), 2u);
  std::vector<rp::Candidate> a;
  for (const auto& c : claims) a.push_back(c.candidate);

  std::thread stepper([&] { actor.step(); });  // polls A (pending), picks a new task, waits for room
  std::this_thread::sleep_for(300ms);
  score_all(run.shm->replay(), a);  // A's results arrive while the actor waits (claims still open)
  std::vector<rp::ScoredGroup> out;
  const std::size_t got = run.shm->replay().take_ready(out, 8, 0, 100, 3s);
  const bool waiting = run.shm->replay().stats().opened == 1;  // A only: the step's group is not open yet
  for (const auto& c : claims) ev.complete(c);  // acknowledged: room again, the step samples and publishes
  stepper.join();
  ev.score(2, 1s);  // and room for the next
  ASSERT_EQ(got, 1u) << "the scored turn-1 group stayed held while the actor waited for queue room";
  EXPECT_EQ(out[0].group_id, a[0].group_id);
  EXPECT_TRUE(waiting) << "the group was taken while the actor still waited";
  EXPECT_EQ(actor.metrics().turn_groups_read, 1u);
  EXPECT_EQ(actor.metrics().followup_members, 2u) << "A's members go on to turn 2";
  EXPECT_GT(actor.metrics().backpressure_s, 0.2);
  EXPECT_EQ(actor.metrics().groups, 2u);
  EXPECT_EQ(actor.step(), StepResult::pushed);  // turn 2 of A goes before a new task
  EXPECT_EQ(actor.metrics().followup_groups, 1u);
}

// A member whose prompt and answer already fill the context budget cannot get a next turn;
// the actor knows it when it samples. A group none of whose members can go on is not held:
// the learner takes it once scored, as with one turn.
TEST(ActorTurnsTest, GroupWithNoMemberThatFitsANextTurnIsNotHeld) {
  KF_NEED_TASKS();
  test::RunFixture run("t9");
  auto o = random_policy_options(2);
  o.exemplars = 0;
  auto tasks = load_actor_tasks(o);
  std::size_t prompt_len = 0;
  {
    test::RunFixture probe("t9p");
    Actor a(o, test::tiny_policy(9), tasks, *probe.shm);
    prompt_len = a.build_task_prompt(*tasks[0], 0).tokens.size();
  }
  // Room for the prompt and one more token: any answer fills the budget.
  o.context_tokens = static_cast<int64_t>(prompt_len) + o.max_new_tokens + 1;
  Actor actor(o, test::tiny_policy(9), tasks, *run.shm);
  ASSERT_EQ(actor.step(), StepResult::pushed);
  std::vector<rp::ScoredGroup> out;
  ASSERT_EQ(run.shm->replay().take_ready(out, 8, 0, 100, 0ms), 1u)
      << "the group was held though no member's conversation can fit a next turn";
  EXPECT_EQ(out[0].candidates[0].turn, 1u);
  EXPECT_EQ(actor.metrics().turn_members_too_long, 2u);
  ASSERT_EQ(actor.step(), StepResult::pushed);  // a new task: there is no next turn to sample
  EXPECT_EQ(actor.metrics().followup_groups, 0u);
  EXPECT_EQ(actor.metrics().followup_members, 0u);
  EXPECT_EQ(actor.metrics().turn_members_too_long, 4u);
}

// Turn 2 without the engine: the members' conversations differ, and they decode together,
// each under its own prompt (behaviour log-probs as the learner recomputes them).
TEST(ActorTurnsTest, LaterTurnMembersDecodeTogetherEachUnderItsOwnPrompt) {
  KF_NEED_TASKS();
  test::RunFixture run("t10");
  auto o = random_policy_options(2);
  o.group_size = 4;
  o.exemplars = 0;
  o.temperature = 1.0;
  o.max_new_tokens = 256;  // long enough for some answers to end at EOS: conversations of different lengths
  auto pol = test::tiny_policy(10);
  auto model = pol.model;
  Actor actor(o, std::move(pol), load_actor_tasks(o), *run.shm);
  ASSERT_EQ(actor.step(), StepResult::pushed);
  ASSERT_EQ(actor.step(), StepResult::pushed);
  ASSERT_EQ(actor.metrics().followup_groups, 1u);
  std::vector<rp::ScoredGroup> out;
  ASSERT_EQ(run.shm->replay().take_ready(out, 8, 0, 100, 1s), 2u);
  const auto* t2 = find_turn(out, 2);
  ASSERT_NE(t2, nullptr);
  ASSERT_EQ(t2->candidates.size(), 4u);
  std::set<std::size_t> lengths;
  for (const auto& c : t2->candidates)
    lengths.insert((c.prompt_tokens.empty() ? t2->prompt_tokens : c.prompt_tokens).size());
  EXPECT_GT(lengths.size(), 1u) << "the members' conversations differ in length: the batch is left-padded ("
                                << *lengths.begin() << " tokens each)";
  for (std::size_t i = 0; i < t2->candidates.size(); ++i) {
    const auto& c = t2->candidates[i];
    const auto& prompt = c.prompt_tokens.empty() ? t2->prompt_tokens : c.prompt_tokens;
    ASSERT_EQ(c.behaviour_logprobs.size(), c.completion_tokens.size());
    EXPECT_LT(logprob_gap(model, prompt, c, o), 1e-4) << "member " << i;
  }
}
