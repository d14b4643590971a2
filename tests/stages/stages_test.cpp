// Stages 1-2: the BPE trainer against HF tokenizers, SFT examples built with the actors'
// own prompt and extraction code, SFT training reducing the loss, and the written policy
// folder loading in policy/, the actors and HF transformers with the same logits.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "../test_support.h"
#include "kf/actors/actors.h"
#include "kf/policy/policy.h"
#include "kf/stages/stages.h"
#include "kf/tasks/tasks.h"
#include "sft_data.h"

using namespace kf::stages;
namespace t = kf::test;

namespace {

bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}
std::string tasks_dir() {
  for (const std::string& d :
       {t::env_or("KF_TASKS_DIR", ""), t::build_dir() + "/tasks", t::source_dir() + "/build/tasks"})
    if (!d.empty() && exists(d + "/001_relu/task.json")) return d;
  return "";
}
#define NEED_TASKS()                                                                                     \
  do {                                                                                                   \
    if (tasks_dir().empty()) GTEST_SKIP() << "task 001_relu is not imported (setup.sh or KF_TASKS_DIR)"; \
  } while (0)

std::string kernel_file(const std::string& name) {
  return t::read_file(t::source_dir() + "/tests/evaluator/kernels/cpu/" + name);
}

// A corpus of three ReLU variants with measured speedups and one unmeasured GELU kernel.
struct SmallCorpus {
  t::TempDir dir{"stages-corpus"};
  std::vector<std::string> sources;
  SmallCorpus() {
    ::mkdir((dir.path + "/k").c_str(), 0755);
    const std::string relu = kernel_file("good_relu.cpp");
    sources = {"// variant a: plain loop\n" + relu, "// variant b: blocked\n" + relu,
               "// variant c: vectorised\n" + relu};
    nlohmann::json m = nlohmann::json::array();
    const char* tech[] = {"One scalar loop over every element.", "Blocks of rows split across threads.",
                          "Vectorised loop with OpenMP threads and no branches."};
    nlohmann::json v = nlohmann::json::object();
    const double speed[] = {0.9, 1.6, 3.2};
    for (int i = 0; i < 3; ++i) {
      const std::string f = "k/relu_" + std::to_string(i) + ".cpp";
      t::write_file(dir.path + "/" + f, sources[i]);
      m.push_back({{"task", "001_relu"},
                   {"backend", "cpu"},
                   {"file", f},
                   {"family", "elementwise"},
                   {"variant", std::to_string(i)},
                   {"technique", tech[i]}});
      v[f] = {{"verdict", "ok"}, {"speedup", speed[i]}, {"reason", ""}};
    }
    t::write_file(dir.path + "/k/gelu.cpp", kernel_file("good_gelu.cpp"));
    m.push_back({{"task", "002_gelu"}, {"backend", "cpu"}, {"file", "k/gelu.cpp"}, {"technique", "Tanh-free erf."}});
    t::write_file(dir.path + "/manifest.json", m.dump());
    t::write_file(dir.path + "/verified_cpu.json", v.dump());
  }
};

SftDataOptions data_options(int64_t context) {
  SftDataOptions o;
  o.tasks_dir = tasks_dir();
  o.backends = {"cpu"};
  o.exemplars = 2;
  o.context_tokens = context;
  o.template_path = t::source_dir() + "/configs/prompts/contrastive.txt";
  o.abi_header_path = t::source_dir() + "/evaluator/include/kf/kernel.h";
  return o;
}

kf::policy::Tokenizer train_tokenizer(const std::vector<std::string>& texts, int64_t vocab) {
  BpeTrainOptions bo;
  bo.vocab_size = vocab;
  return kf::policy::Tokenizer::from_json(train_bpe_tokenizer(texts, bo), "trained tokenizer.json");
}

kf::policy::Policy random_policy(const SmallCorpus& c, uint64_t seed) {
  // A random tiny policy with a tokenizer of the corpus: it writes no kernel, so stage 2
  // over it verifies nothing and stays fast.
  kf::policy::Policy p;
  p.tokenizer = train_tokenizer(c.sources, 512);
  p.config = sft_shape("tiny", p.tokenizer->vocab_size(), 4096, 0);
  p.model = kf::policy::CausalLM(p.config, torch::TensorOptions().dtype(torch::kFloat32));
  p.model->init_random(seed);
  return p;
}

SelfsupOptions quick_selfsup(const std::string& out_dir, const SftDataOptions& data) {
  // Two short samples a task and one retraining step: the tests check the bookkeeping.
  SelfsupOptions o;
  o.samples = 2;
  o.max_new_tokens = 16;
  o.out_dir = out_dir;
  o.data = data;
  o.train.steps = 1;
  o.train.batch = 1;
  return o;
}

}  // namespace

TEST(StagesTest, BpeTokenizerRoundTripsAndMatchesHfTokenizers) {
  const std::vector<std::string> train = {kernel_file("good_relu.cpp"), kernel_file("good_matmul.cpp"),
                                          kernel_file("good_layernorm.cpp"),
                                          t::read_file(t::source_dir() + "/configs/prompts/contrastive.txt")};
  BpeTrainOptions bo;
  bo.vocab_size = 700;
  BpeTrainStats st;
  const std::string json = train_bpe_tokenizer(train, bo, &st);
  EXPECT_EQ(st.vocab, 700);  // enough distinct pairs in this text
  EXPECT_EQ(st.merges, 700 - 257);
  EXPECT_EQ(train_bpe_tokenizer(train, bo), json) << "training is not deterministic";
  const auto tok = kf::policy::Tokenizer::from_json(json, "trained");
  EXPECT_EQ(tok.vocab_size(), 700);
  ASSERT_TRUE(tok.token_to_id("<|endoftext|>").has_value());
  EXPECT_EQ(*tok.token_to_id("<|endoftext|>"), 0);
  EXPECT_TRUE(tok.is_special(0));
  // Held-out text: kernels not trained on, non-ASCII, whitespace runs, the EOS inside text.
  const std::vector<std::string> held = {kernel_file("good_softmax.cpp"),
                                         kernel_file("good_gelu.cpp"),
                                         "  \t\n\n    x = a[i]*b[i];  // ünïcödé ✓ 中文 🙂\r\n",
                                         "done<|endoftext|>next",
                                         "",
                                         std::string(300, ' ') + "y"};
  // Exact for valid UTF-8 (kernels, prompts); the policy's encoder maps an invalid byte
  // to U+FFFD before splitting, as HF does.
  for (const auto& h : held) EXPECT_EQ(tok.decode(tok.encode(h)), h) << h;
  // Trained merges compress code: far fewer tokens than bytes.
  EXPECT_LT(tok.encode(held[0]).size() * 2, held[0].size());
  // HF tokenizers on the same file: identical ids and decoding (valid UTF-8 cases).
  t::TempDir d("stages-tok");
  t::write_file(d.path + "/tokenizer.json", json);
  nlohmann::json texts(held);
  t::write_file(d.path + "/texts.json", texts.dump());
  const std::string cmd = t::python() + " " + t::source_dir() + "/tests/stages/hf_stages.py tokens --tokenizer " +
                          d.path + "/tokenizer.json --texts " + d.path + "/texts.json --out " + d.path + "/hf.json";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const auto hf = nlohmann::json::parse(t::read_file(d.path + "/hf.json"));
  ASSERT_EQ(hf.size(), held.size());
  for (std::size_t i = 0; i < held.size(); ++i) {
    const auto ours = tok.encode(held[i]);
    EXPECT_EQ(hf[i]["ids"].get<std::vector<int32_t>>(), ours) << "case " << i;
    EXPECT_EQ(hf[i]["decoded"].get<std::string>(), held[i]) << "case " << i;
  }
}

TEST(StagesTest, BpeTrainerRejectsTooSmallVocab) {
  BpeTrainOptions bo;
  bo.vocab_size = 100;
  try {
    train_bpe_tokenizer({"abc"}, bo);
    FAIL() << "expected kf::Error";
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("vocab_size 100"), std::string::npos) << e.what();
  }
}

TEST(StagesTest, CorpusErrorsNameFileAndField) {
  t::TempDir d("stages-bad");
  t::write_file(d.path + "/manifest.json", R"([{"task": "001_relu", "backend": "cpu"}])");
  try {
    load_corpus(d.path);
    FAIL() << "expected kf::Error";
  } catch (const kf::Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("manifest.json: entry 0"), std::string::npos) << w;
    EXPECT_NE(w.find("'file'"), std::string::npos) << w;
  }
}

TEST(StagesTest, HeldOutTasksLeaveTheCorpusAndTheShippedListNamesCorpusTasks) {
  NEED_TASKS();
  SmallCorpus c;
  auto corpus = load_corpus(c.dir.path);
  EXPECT_EQ(drop_tasks(corpus, {"002_gelu", "999_absent"}), 1u);
  ASSERT_EQ(corpus.kernels.size(), 3u);
  for (const auto& e : build_sft_examples(corpus, kf::actors::TextCodec::bytes(), 0, data_options(1 << 20)))
    EXPECT_EQ(e.task, "001_relu");

  // The list the shipped policy was trained with: every name is a corpus task and a suite
  // task, and none is a quickstart task (configs/quickstart.yaml trains on those).
  const auto heldout = kf::tasks::read_task_list(t::source_dir() + "/tasks/heldout.txt");
  EXPECT_GE(heldout.size(), 8u);
  const auto full = load_corpus(t::source_dir() + "/corpus");
  std::set<std::string> corpus_tasks;
  for (const auto& k : full.kernels) corpus_tasks.insert(k.task);
  for (const auto& name : heldout) {
    EXPECT_TRUE(corpus_tasks.count(name)) << name << " has no corpus kernel";
    const bool in_suite = exists(t::source_dir() + "/tasks/suite/level1/" + name + ".py") ||
                          exists(t::source_dir() + "/tasks/suite/level2/" + name + ".py");
    EXPECT_TRUE(in_suite) << name << " is not a level-1/2 suite task";
  }
  const std::string quickstart = t::read_file(t::source_dir() + "/configs/quickstart.yaml");
  for (const auto& name : heldout) EXPECT_EQ(quickstart.find(name), std::string::npos) << name;

  // Parsing: comments, blank lines and repeats are fine; a bad line names file and line.
  EXPECT_EQ(kf::tasks::parse_task_list("# c\n a_1 # x\n\nb-2\na_1\n", "l.txt"),
            (std::vector<std::string>{"a_1", "b-2"}));
  try {
    kf::tasks::parse_task_list("a\n../b\n", "l.txt");
    FAIL() << "a path was accepted as a task name";
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("l.txt:2:"), std::string::npos) << e.what();
  }
  EXPECT_THROW(kf::tasks::read_task_list(c.dir.path + "/missing.txt"), kf::Error);
}

TEST(StagesTest, SftExamplesUseActorsPromptAndExtractToTheCorpusKernel) {
  NEED_TASKS();
  SmallCorpus c;
  const auto corpus = load_corpus(c.dir.path);
  ASSERT_EQ(corpus.kernels.size(), 4u);
  EXPECT_FALSE(corpus.kernels[3].measured);
  std::vector<std::string> texts = c.sources;
  texts.push_back(t::read_file(t::source_dir() + "/configs/prompts/contrastive.txt"));
  const auto tok = train_tokenizer(texts, 600);
  const auto codec = kf::actors::TextCodec::bpe(tok);
  SftBuildStats st;
  const auto opt = data_options(8192);
  const auto ex = build_sft_examples(corpus, codec, 0, opt, &st);
  // Each ReLU variant: one contrastive + one no-exemplar example; the unmeasured GELU
  // kernel: one no-exemplar example.
  EXPECT_EQ(st.examples, 7);
  ASSERT_EQ(ex.size(), 7u);
  int contrastive = 0;
  for (const auto& e : ex) {
    // The prompt is what the actors build: their template, the task, its reference.
    const auto task = kf::tasks::Task::load(tasks_dir() + "/" + e.task);
    EXPECT_NE(e.prompt.find("## Reference program (task " + e.task + ")"), std::string::npos);
    EXPECT_NE(e.prompt.find(task->source()), std::string::npos);
    EXPECT_EQ(std::vector<int32_t>(e.ids.begin(), e.ids.begin() + e.prompt_len), codec.encode(e.prompt));
    // The completion: its tokens, then EOS; the extractor gives back the corpus kernel.
    const auto comp = codec.encode(e.completion);
    ASSERT_EQ(e.ids.size(), static_cast<std::size_t>(e.prompt_len) + comp.size() + 1);
    EXPECT_EQ(std::vector<int32_t>(e.ids.begin() + e.prompt_len, e.ids.end() - 1), comp);
    EXPECT_EQ(e.ids.back(), 0);
    const auto x = kf::actors::extract_kernel(e.completion);
    ASSERT_TRUE(x.ok) << x.error;
    const auto* k = &*std::find_if(corpus.kernels.begin(), corpus.kernels.end(),
                                   [&](const CorpusKernel& k) { return k.file == e.file; });
    EXPECT_EQ(x.source, k->source);
    EXPECT_NE(e.completion.find("Plan: " + k->technique.substr(0, k->technique.size() - 1)), std::string::npos);
    if (e.exemplars_shown > 0) {
      ++contrastive;
      // Two exemplars = the other two variants, slowest first, with their speedups.
      EXPECT_EQ(e.exemplars_shown, 2);
      EXPECT_NE(e.prompt.find("## Earlier kernels for this task (2, slowest first)"), std::string::npos);
      EXPECT_EQ(e.prompt.find(k->source), std::string::npos) << "the target must not be its own exemplar";
      EXPECT_NE(e.completion.find("- Kernel 1 ("), std::string::npos);
      std::vector<double> shown;
      for (const auto& o : corpus.kernels)
        if (&o != k && o.task == "001_relu") shown.push_back(o.speedup);
      char a[64], b[64];
      std::snprintf(a, sizeof a, "speedup %.2fx", shown[0]);
      std::snprintf(b, sizeof b, "speedup %.2fx", shown[1]);
      EXPECT_NE(e.prompt.find(a), std::string::npos);
      EXPECT_LT(e.prompt.find(a), e.prompt.find(b));
    } else {
      EXPECT_EQ(e.prompt.find("Earlier kernels"), std::string::npos);
    }
  }
  EXPECT_EQ(contrastive, 3);

  // A tight context: the prompt is fitted (exemplars cut) so prompt + completion fit.
  const auto& longest =
      *std::max_element(ex.begin(), ex.end(), [](auto& a, auto& b) { return a.ids.size() < b.ids.size(); });
  auto tight = data_options(static_cast<int64_t>(longest.ids.size()) - 200);
  const auto ex2 = build_sft_examples(corpus, codec, 0, tight);
  ASSERT_FALSE(ex2.empty());
  for (const auto& e : ex2) {
    EXPECT_LE(static_cast<int64_t>(e.ids.size()), tight.context_tokens);
    EXPECT_TRUE(kf::actors::extract_kernel(e.completion).ok);
  }

  // The actors' budget (context - max_new_tokens) caps the prompt even where the context
  // has room: the contrastive prompts are the ones the actors build at that budget.
  int64_t longest_prompt = 0;
  for (const auto& e : ex)
    if (e.exemplars_shown > 0) longest_prompt = std::max(longest_prompt, e.prompt_len);
  auto capped = data_options(8192);
  capped.max_prompt_tokens = longest_prompt - 150;
  const auto ex3 = build_sft_examples(corpus, codec, 0, capped);
  ASSERT_EQ(ex3.size(), ex.size());
  int cut = 0;
  for (std::size_t i = 0; i < ex3.size(); ++i) {
    EXPECT_LE(ex3[i].prompt_len, capped.max_prompt_tokens) << ex3[i].file;
    EXPECT_TRUE(kf::actors::extract_kernel(ex3[i].completion).ok);
    if (ex3[i].prompt != ex[i].prompt) {
      ++cut;
      EXPECT_GT(ex[i].exemplars_shown, 0) << "only exemplars are cut: " << ex3[i].file;
      EXPECT_LT(ex3[i].prompt_len, ex[i].prompt_len);
    }
  }
  EXPECT_GE(cut, 1);
}

TEST(StagesTest, SftLossCoversCompletionOnlyAndTrainingReducesIt) {
  NEED_TASKS();
  at::set_num_threads(2);
  SmallCorpus c;
  const auto corpus = load_corpus(c.dir.path);
  const auto tok = train_tokenizer(c.sources, 512);
  const auto codec = kf::actors::TextCodec::bpe(tok);
  auto opt = data_options(4096);
  opt.exemplars = 1;
  opt.no_exemplar_copy = false;
  auto ex = build_sft_examples(corpus, codec, 0, opt);
  ASSERT_GE(ex.size(), 3u);
  const auto cfg = sft_shape("tiny", tok.vocab_size(), 4096, 0);
  kf::policy::CausalLM model(cfg, torch::TensorOptions().dtype(torch::kFloat32));
  model->init_random(1);
  // The loss is the mean cross-entropy of the completion tokens, prompt excluded.
  const auto& e = ex[0];
  {
    torch::NoGradGuard g;
    const auto ids = torch::tensor(std::vector<int64_t>(e.ids.begin(), e.ids.end())).unsqueeze(0);
    const auto logp = torch::log_softmax(model->forward(ids)[0], -1);
    double sum = 0;
    for (std::size_t i = e.prompt_len; i < e.ids.size(); ++i) sum -= logp[i - 1][e.ids[i]].item<double>();
    EXPECT_NEAR(example_loss(model, e), sum / double(e.ids.size() - e.prompt_len), 1e-4);
  }
  // Training: two examples cut to their last 32 prompt and first 96 completion tokens
  // (fast on a 2-core CI machine; the loss is still over completion tokens only).
  std::vector<SftExample> two(ex.begin(), ex.begin() + 2);
  for (auto& s : two) {
    std::vector<int32_t> ids(s.ids.begin() + s.prompt_len - 32, s.ids.begin() + s.prompt_len + 96);
    s.ids = ids;
    s.prompt_len = 32;
  }
  const double before = example_loss(model, two[0]) + example_loss(model, two[1]);
  SftOptions so;
  so.steps = 30;
  so.batch = 2;
  so.lr = 3e-3;
  so.warmup_steps = 3;
  int logged = 0;
  const auto rep = train_sft(model, two, so, [&](const SftStepLog& l) {
    ++logged;
    EXPECT_GT(l.tokens, 0);
  });
  EXPECT_EQ(logged, 30);
  EXPECT_EQ(rep.steps, 30);
  const double after = example_loss(model, two[0]) + example_loss(model, two[1]);
  EXPECT_LT(after, 0.7 * before) << "loss " << before << " -> " << after;
  EXPECT_LT(rep.final_loss, rep.first_loss);
}

TEST(StagesTest, WrittenPolicyLoadsInPolicyActorsAndHfWithSameLogits) {
  const std::vector<std::string> texts = {kernel_file("good_relu.cpp"), kernel_file("good_softmax.cpp")};
  const auto tok = train_tokenizer(texts, 400);
  kf::policy::Policy p;
  p.tokenizer = tok;
  p.config = sft_shape("tiny", tok.vocab_size(), 1024, 0);
  p.model = kf::policy::CausalLM(p.config, torch::TensorOptions().dtype(torch::kFloat32));
  p.model->init_random(7);
  t::TempDir d("stages-policy");
  const std::string dir = d.path + "/policy";
  save_hf_policy(p, dir);
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"})
    EXPECT_TRUE(exists(dir + "/" + f)) << f;
  auto back = kf::policy::load_policy(dir, torch::kCPU);
  ASSERT_TRUE(back.tokenizer.has_value());
  ASSERT_EQ(back.config.eos_token_ids, std::vector<int64_t>{0});
  const auto ids = torch::tensor(back.tokenizer->encode("extern \"C\" int kf_forward(")).to(torch::kInt64).unsqueeze(0);
  torch::Tensor ours;
  {
    torch::NoGradGuard g;
    ours = p.model->forward(ids).contiguous();
    EXPECT_TRUE(torch::equal(ours, back.model->forward(ids)));
  }
  // The actors load it with its tokenizer and stop at its EOS.
  const auto ap = kf::actors::load_actor_policy(dir, "tiny", 0, "cpu");
  EXPECT_FALSE(ap.codec.is_bytes());
  EXPECT_EQ(ap.eos_ids, std::vector<int64_t>{0});
  EXPECT_EQ(ap.valid_vocab, tok.vocab_size());
  // HF transformers: same logits.
  const std::string ref = d.path + "/ours.safetensors";
  kf::policy::st_write(ref, {{"ids", "I64", ids.sizes().vec()}, {"logits", "F32", ours.sizes().vec()}},
                       [&](std::size_t i, std::string& out) {
                         const auto& x = i == 0 ? ids : ours;
                         out.assign(static_cast<const char*>(x.data_ptr()), x.numel() * x.element_size());
                       });
  const std::string cmd =
      t::python() + " " + t::source_dir() + "/tests/stages/hf_stages.py logits --dir " + dir + " --ref " + ref;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

// Stage 2 samples only the --include tasks (a run's focus tasks) and names a task it does
// not know. A random policy writes no kernel, so nothing compiles and this stays fast.
TEST(StagesTest, SelfsupSamplesOnlyIncludedTasksStopsAtItsTimeLimitAndNamesAnUnknownOne) {
  NEED_TASKS();
  at::set_num_threads(2);
  SmallCorpus c;
  const auto corpus = load_corpus(c.dir.path);
  auto p = random_policy(c, 3);
  const auto codec = kf::actors::TextCodec::bpe(*p.tokenizer);
  auto data = data_options(4096);
  const auto base = build_sft_examples(corpus, codec, 0, data);
  ASSERT_FALSE(base.empty());
  t::TempDir out("stages-selfsup");
  kf::evaluator::EvalOptions eo;
  eo.compile.cache_dir = out.path + "/cache";
  kf::evaluator::Evaluator ev(eo);
  auto o = quick_selfsup(out.path, data);
  o.include = {"002_gelu"};
  const auto rounds = run_selfsup(p, corpus, base, ev, o);
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].tasks, 1) << "001_relu has corpus kernels too, but only 002_gelu was included";
  EXPECT_EQ(rounds[0].samples, 2);
  // A time limit already reached: the first task is sampled, nothing verified, one round.
  o.include = {"001_relu", "002_gelu"};
  o.rounds = 2;
  o.time_limit_s = 1e-9;
  const auto capped = run_selfsup(p, corpus, base, ev, o);
  ASSERT_EQ(capped.size(), 1u) << "a second round started after the time limit";
  EXPECT_EQ(capped[0].tasks, 1);
  EXPECT_EQ(capped[0].samples, 0);
  EXPECT_EQ(capped[0].unexamined, 2);
  EXPECT_TRUE(std::filesystem::exists(out.path + "/config.json")) << "no policy saved after a capped round";
  o.rounds = 1;
  o.time_limit_s = 0;
  o.include = {"002_gelu", "099_no_such_task"};
  try {
    (void)run_selfsup(p, corpus, base, ev, o);
    FAIL() << "an unknown --include task was accepted";
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("099_no_such_task"), std::string::npos) << e.what();
  }
}

// Each task's line in selfsup.jsonl says what its prompt showed. A budget just under the
// full prompt cuts an exemplar (as the actors do); with min_exemplar_tokens above every
// exemplar's length the same budget drops one and shows the other in full.
TEST(StagesTest, SelfsupRecordsEachTasksPromptAndCutsOrDropsExemplarsAsConfigured) {
  NEED_TASKS();
  at::set_num_threads(2);
  SmallCorpus c;
  const auto corpus = load_corpus(c.dir.path);
  auto p = random_policy(c, 5);
  const auto codec = kf::actors::TextCodec::bpe(*p.tokenizer);
  auto data = data_options(4096);
  // The full prompt of each pair of the three ReLU exemplars (the round picks one pair).
  const auto tpl = load_template(data);
  const auto abi = load_abi(data);
  const auto task = kf::tasks::Task::load(tasks_dir() + "/001_relu");
  const auto info = kf::actors::task_info(*task, kf::tasks::Backend::CPU);
  std::vector<const CorpusKernel*> relu;
  for (const auto& k : corpus.kernels)
    if (k.task == "001_relu") relu.push_back(&k);
  ASSERT_EQ(relu.size(), 3u);
  std::size_t shortest = SIZE_MAX;
  for (std::size_t a = 0; a < 3; ++a)
    for (std::size_t b = a + 1; b < 3; ++b) {
      const auto full = task_prompt(tpl, abi, codec, info, {relu[a], relu[b]}, 2, 0, 1 << 20, data);
      ASSERT_EQ(full.prompt.shown.size(), 2u);
      ASSERT_EQ(full.prompt.truncated, 0u);
      shortest = std::min(shortest, full.prompt.tokens.size());
    }
  const auto base = build_sft_examples(corpus, codec, 0, data);
  t::TempDir out("stages-selfsup-prompt");
  kf::evaluator::EvalOptions eo;
  eo.compile.cache_dir = out.path + "/cache";
  kf::evaluator::Evaluator ev(eo);
  auto o = quick_selfsup(out.path, data);
  o.data.context_tokens = static_cast<int64_t>(shortest) - 30 + o.max_new_tokens;  // budget: 30 under any pair
  o.include = {"001_relu", "002_gelu"};
  auto rounds = run_selfsup(p, corpus, base, ev, o);
  ASSERT_EQ(rounds.size(), 1u);
  ASSERT_EQ(rounds[0].per_task.size(), 2u);
  const auto& cut = rounds[0].per_task[0];
  EXPECT_EQ(cut.task, "001_relu");
  EXPECT_EQ(cut.exemplars_offered, 2u);
  EXPECT_EQ(cut.exemplars_shown, 2u);
  EXPECT_GE(cut.exemplars_cut, 1u);  // near-equal exemplars: the fitting may cut both in turn
  EXPECT_EQ(cut.prompt_kind(), "an exemplar cut");
  EXPECT_EQ(cut.samples, 2);
  const auto& none = rounds[0].per_task[1];
  EXPECT_EQ(none.task, "002_gelu");
  EXPECT_EQ(none.exemplars_shown, 0u) << "002_gelu's only corpus kernel is unmeasured: no exemplar";
  EXPECT_EQ(none.prompt_kind(), "no exemplars");
  // The task counts add up to the round's.
  EXPECT_EQ(cut.samples + none.samples, rounds[0].samples);
  EXPECT_EQ(cut.extracted + none.extracted, rounds[0].extracted);
  EXPECT_EQ(cut.correct + none.correct, rounds[0].correct);
  const auto line = nlohmann::json::parse(rounds[0].json());
  ASSERT_EQ(line["per_task"].size(), 2u) << line;
  EXPECT_EQ(line["per_task"][0]["prompt"], "an exemplar cut") << line;
  EXPECT_EQ(line["per_task"][0]["exemplars_cut"], cut.exemplars_cut) << line;
  EXPECT_EQ(line["per_task"][1]["prompt"], "no exemplars") << line;

  // Never cut: the slower exemplar is dropped and the faster one shown whole.
  o.data.min_exemplar_tokens = 1 << 20;
  o.include = {"001_relu"};
  rounds = run_selfsup(p, corpus, base, ev, o);
  ASSERT_EQ(rounds.size(), 1u);
  ASSERT_EQ(rounds[0].per_task.size(), 1u);
  const auto& dropped = rounds[0].per_task[0];
  EXPECT_EQ(dropped.exemplars_offered, 2u);
  EXPECT_EQ(dropped.exemplars_shown, 1u);
  EXPECT_EQ(dropped.exemplars_cut, 0u);
  EXPECT_EQ(dropped.prompt_kind(), "exemplars in full");
}
