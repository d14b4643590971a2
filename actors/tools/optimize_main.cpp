// kf-optimize: inference with an exported policy (tools/optimize, docs/actors.md).
//   kf-optimize --model DIR (--task NAME | --task FILE.py) [-n N] [--backend auto|cpu|cuda]
//               [--out DIR] [--config FILE] [--set k=v]... [--exemplars DB_OR_DIR] [--seed S]
//               [--temperature T] [--max-new-tokens M] [--tasks-dir DIR] [--device D]
// Samples N candidates as one group with the actors' prompt, extracts them, verifies each
// with the real evaluator, writes <out>/best.{cu,cpp} (the fastest ok kernel),
// report.json, report.txt and candidates/, and prints the table.
// Exit: 0 at least one candidate verified ok, 1 none did (the report is still written),
// 2 usage or input error (task, model folder, config, exemplars), 3 evaluator error.
#include <ATen/Parallel.h>

#include <sys/stat.h>

#include "kf/common/cli.h"
#include <cerrno>
#include <cstring>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kf/actors/actors.h"
#include "kf/common/config.h"
#include "kf/common/error.h"
#include "kf/common/fsutil.h"
#include "kf/common/log.h"
#include "kf/common/run_dir.h"
#include "kf/evaluator/evaluator.h"
#include "kf/tasks/tasks.h"
#include "optimize.h"  // actors/src: load_exemplars, import_task_file
#include "prompt.h"    // actors/src: prompt_mode_name

#ifndef KF_PYTHON_BUILT
#define KF_PYTHON_BUILT "python3"
#endif

namespace fsu = kf::fsutil;
namespace ev = kf::evaluator;
using namespace kf::actors;
using Clock = std::chrono::steady_clock;

namespace {

double secs_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// One sampled candidate and how it fared.
struct Candidate {
  std::size_t tokens = 0;
  std::string finish_reason;
  std::string completion;
  Extraction ex;
  long duplicate_of = -1;  // index of an earlier candidate with the same source (its result reused)
  bool evaluated = false;
  ev::Result result;
};

std::string python_path() {
  const char* e = std::getenv("KF_PYTHON");
  return e && *e ? e : KF_PYTHON_BUILT;
}

bool is_dir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool is_py_file(const std::string& s) { return fsu::extension(s) == ".py" && !is_dir(s); }
std::string file_stem(const std::string& p) {
  const std::string name = fsu::filename(p);
  return name.substr(0, name.size() - fsu::extension(name).size());
}

std::string first_line(const std::string& s, std::size_t max) {
  std::string l = s.substr(0, s.find('\n'));
  if (l.size() > max) l = l.substr(0, max - 3) + "...";
  return l;
}

// "1.234x (95 % 1.180–1.290)", and "timing unstable" when the speedup is the interval's lower bound.
std::string speedup_text(const ev::Result& r) {
  char buf[160];
  if (r.speedup_hi > 0)
    std::snprintf(buf, sizeof buf,
                  "%.3fx (95 %% %.3f"
                  "\xe2\x80\x93"
                  "%.3f)%s",
                  r.speedup, r.speedup_lo, r.speedup_hi,
                  r.timing_unstable ? ", timing unstable: conservative estimate" : "");
  else
    std::snprintf(buf, sizeof buf, "%.3fx", r.speedup);
  return buf;
}

std::string table(const std::string& task, const std::string& backend, const std::vector<Candidate>& cands, long best) {
  std::ostringstream o;
  char buf[512];
  std::size_t ok = 0;
  for (const auto& c : cands) ok += c.result.ok();
  o << "task " << task << " (" << backend << "): " << cands.size() << " candidates, " << ok << " verified ok";
  if (best >= 0) o << ", best #" << best << " at " << speedup_text(cands[best].result);
  o << "\n";
  std::snprintf(buf, sizeof buf, "%3s  %-14s %9s %-15s %11s %11s %7s  %s\n", "#", "verdict", "speedup", "95 % interval",
                "kernel ms", "ref ms", "tokens", "reason");
  o << buf;
  for (std::size_t i = 0; i < cands.size(); ++i) {
    const auto& c = cands[i];
    const auto& r = c.result;
    std::string sp = "-", ci = "-", km = "-", rm = "-";
    if (r.ok()) {
      std::snprintf(buf, sizeof buf, "%.3fx", r.speedup);
      sp = buf;
      if (r.speedup_hi > 0) {
        std::snprintf(buf, sizeof buf, "%.3f-%.3f", r.speedup_lo, r.speedup_hi);
        ci = buf;
      }
    }
    if (r.cand_ms.n) {
      std::snprintf(buf, sizeof buf, "%.4f", r.cand_ms.median);
      km = buf;
    }
    if (r.ref_ms.n) {
      std::snprintf(buf, sizeof buf, "%.4f", r.ref_ms.median);
      rm = buf;
    }
    std::string note = first_line(r.reason, 70);
    if (c.duplicate_of >= 0)
      note = "same source as #" + std::to_string(c.duplicate_of) + (note.empty() ? "" : "; " + note);
    auto add = [&note](const std::string& s) { note = note.empty() ? s : note + "; " + s; };
    if (r.ok() && r.timing_unstable) add("timing unstable: conservative estimate");
    if (r.ok() && r.task_degenerate) add("task degenerate: no speed reward");
    if (long(i) == best) note = note.empty() ? "<- best" : "<- best; " + note;
    // A completion with no usable code block is scored as a compile error (as the actors
    // score it), but the table names it for what it is: nothing reached the compiler.
    const char* label = c.ex.ok ? ev::verdict_name(r.verdict) : "no_code_block";
    std::snprintf(buf, sizeof buf, "%3zu  %-14s %9s %-15s %11s %11s %7zu  %s\n", i, label, sp.c_str(), ci.c_str(),
                  km.c_str(), rm.c_str(), c.tokens, note.c_str());
    o << buf;
  }
  return o.str();
}

// The compiler's own lines for every candidate that failed to compile (the first lines of
// its diagnostics, which put errors first), so report.txt says why without opening the JSON.
std::string compiler_errors(const std::vector<Candidate>& cands, std::size_t max_lines) {
  std::ostringstream o;
  for (std::size_t i = 0; i < cands.size(); ++i) {
    const auto& c = cands[i];
    if (!c.ex.ok || c.duplicate_of >= 0 || c.result.verdict != ev::Verdict::compile_error) continue;
    o << "\n#" << i << " " << c.result.reason << ":\n";
    std::istringstream in(c.result.diagnostics);
    std::string line;
    std::size_t n = 0;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      if (n++ == max_lines) {
        o << "    ... (all of it: report.json, candidates[" << i << "].result.diagnostics)\n";
        break;
      }
      o << "    " << line << "\n";
    }
    if (n == 0) o << "    (the compiler printed nothing)\n";
  }
  const auto body = o.str();
  return body.empty() ? body : "\ncompiler errors:" + body;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Sample N kernels for a task with an exported policy, verify them, keep the fastest"};
  std::string model_dir, task_arg, tasks_dir, backend_s, out_dir, config_file, exemplars_path, device;
  std::vector<std::string> sets;
  int n = 8;
  long long seed = -1, max_new_tokens = 0;
  double temperature = -1;
  app.add_option("--model", model_dir, "HF-format policy folder (tools/export)")->required();
  app.add_option("--task", task_arg, "imported task name (under --tasks-dir), task folder, or a KernelBench .py file")
      ->required();
  app.add_option("--tasks-dir", tasks_dir, "imported tasks (default: the config's tasks.dir)");
  app.add_option("-n", n, "candidates to sample (one group)")->check(CLI::Range(1, 256));
  app.add_option("--backend", backend_s, "auto, cpu or cuda (default: the config's run.backend)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--out", out_dir, "output folder (default: optimize-<task>)");
  app.add_option("--config", config_file, "config YAML (default: every key's default)");
  app.add_option("--set", sets, "override a config key: key=value");
  app.add_option("--exemplars", exemplars_path,
                 "kernel_db.json, a run/checkpoint folder holding one, or a seed folder");
  app.add_option("--seed", seed, "seed for sampling and inputs (default: run.seed)")->check(CLI::NonNegativeNumber);
  app.add_option("--temperature", temperature, "sampling temperature, 0 = greedy (default: learner.temperature)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-new-tokens", max_new_tokens, "most completion tokens (default: actors.sampling.max_new_tokens)")
      ->check(CLI::PositiveNumber);
  app.add_option("--device", device, "where the policy samples: cpu, cuda, cuda:N (default: actors.device)");
  KF_CLI_PARSE(app, argc, argv);
  kf::log_init("optimize", 0);
  auto usage_error = [](const std::string& msg) {
    kf::log_error("kf-optimize: ", msg, "; nothing sampled (exit 2)");
    return 2;
  };

  // --- configuration
  ActorOptions o;
  ev::EvalOptions eo;
  try {
    if (seed >= 0) sets.push_back("run.seed=" + std::to_string(seed));  // sampling and inputs, as one run seed
    const auto cfg =
        config_file.empty() ? kf::Config::parse("", "defaults", sets) : kf::Config::load(config_file, sets);
    const auto level = cfg.get_string("run.log_level");
    kf::log_set_level(level == "debug"   ? kf::LogLevel::Debug
                      : level == "warn"  ? kf::LogLevel::Warn
                      : level == "error" ? kf::LogLevel::Error
                                         : kf::LogLevel::Info);
    o = actor_options(cfg, 0);
    eo = ev::eval_options(cfg);
    if (!backend_s.empty()) o.backend = kf::tasks::resolve_backend(backend_s);
    // A relative tasks.dir ("build/tasks") is tried in the working directory, then the tree.
    o.tasks_dir = tasks_dir.empty() ? resolve_tree_path(o.tasks_dir) : tasks_dir;
    if (temperature >= 0) o.temperature = temperature;
    if (max_new_tokens > 0) o.max_new_tokens = max_new_tokens;
    if (!device.empty()) o.device = device;
    if (o.device != "cpu" && o.device.rfind("cuda", 0) != 0)
      throw kf::Error("--device: '" + o.device + "' (cpu, cuda, cuda:N)");
    o.group_size = n;
    o.policy_dir = model_dir;  // its chat template (if any) renders the prompts
  } catch (const std::exception& e) {
    return usage_error(std::string("bad configuration: ") + e.what());
  }
  const std::string backend = kf::tasks::backend_name(o.backend);
  if (o.backend == kf::tasks::Backend::CUDA && !kf::tasks::cuda_available())
    return usage_error("backend cuda asked for, but no CUDA device is visible");

  // --- task (a .py file is imported first, into <out>/task/)
  std::shared_ptr<const kf::tasks::Task> task;
  std::string task_from;
  try {
    if (is_py_file(task_arg)) {
      if (out_dir.empty()) out_dir = "optimize-" + file_stem(task_arg);
      kf::log_info("kf-optimize: importing ", task_arg, " (", backend, ") into ", out_dir, "/task");
      task_from = import_task_file(task_arg, out_dir + "/task", o.backend, python_path());
    } else if (fsu::is_file(task_arg + "/task.json")) {
      task_from = task_arg;
    } else {
      task_from = o.tasks_dir + "/" + task_arg;
      if (task_arg.empty() || task_arg.find('/') != std::string::npos || !fsu::is_file(task_from + "/task.json"))
        throw kf::Error("no task '" + task_arg + "' in " + o.tasks_dir +
                        " (import it with tools/import-tasks, or pass a KernelBench .py file)");
    }
    task = kf::tasks::Task::load(task_from);
    if (!task->has_backend(o.backend))
      throw kf::Error("task " + task->name() + " (" + task_from + ") has no " + backend +
                      " artifact (import it with --backends " + backend + ")");
  } catch (const std::exception& e) {
    return usage_error(e.what());
  }
  if (out_dir.empty()) out_dir = "optimize-" + task->name();

  // --- policy
  ActorPolicy pol;
  try {
    if (!is_dir(model_dir)) throw kf::Error("model folder '" + model_dir + "' does not exist");
    if (!fsu::is_file(model_dir + "/config.json"))
      throw kf::Error(model_dir + "/config.json: not found (is '" + model_dir + "' an HF folder from tools/export?)");
    pol = load_actor_policy(model_dir, o.init_shape, o.seed, o.device);
  } catch (const std::exception& e) {
    return usage_error(std::string("cannot load the model: ") + kf::message_of(e));
  }

  // --- prompt
  Prompt prompt;
  try {
    std::vector<ExemplarIn> ex;
    if (!exemplars_path.empty() && (o.mode != PromptMode::contrastive || o.exemplars == 0))
      kf::log_warn("kf-optimize: --exemplars ignored: actors.prompt.mode is ", prompt_mode_name(o.mode),
                   " and actors.prompt.exemplars ", o.exemplars, " (contrastive with K > 0 shows them)");
    if (!exemplars_path.empty() && o.mode == PromptMode::contrastive && o.exemplars > 0)
      ex = load_exemplars(exemplars_path, task->name(), static_cast<std::size_t>(o.exemplars), o.seed);
    prompt = optimize_prompt(o, pol, *task, std::move(ex));
  } catch (const std::exception& e) {
    return usage_error(e.what());
  }
  kf::log_info("kf-optimize: task ", task->name(), " (", backend, "), prompt ", prompt.tokens.size(), " tokens (",
               prompt_mode_name(prompt.mode), ", ", prompt.shown.size(), " exemplars), sampling ", n, " candidates on ",
               o.device, " at temperature ", o.temperature);

  // --- sample and extract
  std::vector<Candidate> cands;
  const auto t_sample = Clock::now();
  try {
    const kf::policy::SamplingParams sp = kf::actors::sampling_params_of(o, pol.eos_ids, o.seed);
    for (auto& r :
         rollout_group(pol.model, pol.codec, prompt.tokens, n, sp, pol.valid_vocab, o.extract, o.shared_prefill)) {
      Candidate k;
      k.tokens = r.completion.tokens.size();
      k.finish_reason = r.completion.finish_reason;
      k.completion = std::move(r.text);
      k.ex = std::move(r.kernel);
      cands.push_back(std::move(k));
    }
  } catch (const std::exception& e) {
    kf::log_error("kf-optimize: sampling failed: ", kf::message_of(e), "; exiting (code 3)");
    return 3;
  }
  const double sample_s = secs_since(t_sample);
  pol.model = nullptr;  // the weights are not needed while kernels are verified

  // --- verify (identical sources once: a low temperature often repeats a kernel)
  if (eo.cpu_threads > 0) at::set_num_threads(eo.cpu_threads);
  const auto t_verify = Clock::now();
  try {
    ev::Evaluator evaluator(eo);
    std::map<std::string, std::size_t> seen;
    for (std::size_t i = 0; i < cands.size(); ++i) {
      auto& c = cands[i];
      if (!c.ex.ok) {
        // Scored as the actors score it: a compile error whose reason is the extraction error.
        c.result.task = task->name();
        c.result.backend = backend;
        c.result.verdict = ev::Verdict::compile_error;
        c.result.reason = c.ex.error;
        c.result.reward = eo.reward.compile_error;
        continue;
      }
      if (auto it = seen.find(c.ex.source); it != seen.end()) {
        c.duplicate_of = long(it->second);
        c.result = cands[it->second].result;
        continue;
      }
      seen.emplace(c.ex.source, i);
      kf::log_info("kf-optimize: verifying candidate ", i, " of ", cands.size());
      // Out of GPU memory is the GPU's state (another process holds it), not the kernel's:
      // tried again as tools/selfsup and the evaluators do (the service's default tries).
      const ev::ServiceOptions retry;
      c.result = ev::evaluate_retrying_oom(evaluator, *task, o.backend, c.ex.source, 0, retry.oom_attempts,
                                           retry.oom_retry_delay);
      c.evaluated = true;
    }
  } catch (const std::exception& e) {
    kf::log_error("kf-optimize: evaluator error: ", e.what(), "; exiting (code 3)");
    return 3;
  }
  const double verify_s = secs_since(t_verify);

  long best = -1;
  for (std::size_t i = 0; i < cands.size(); ++i)
    if (cands[i].result.ok() && (best < 0 || cands[i].result.speedup > cands[best].result.speedup)) best = long(i);

  // --- outputs
  const std::string ext = o.backend == kf::tasks::Backend::CUDA ? ".cu" : ".cpp";
  const std::string text = table(task->name(), backend, cands, best);
  try {
    // A previous run's outputs must not pass for this one's.
    for (const char* f : {"/best.cu", "/best.cpp"}) ::remove((out_dir + f).c_str());
    fsu::remove_tree(out_dir + "/candidates");
    if (!fsu::make_dirs(out_dir + "/candidates"))
      throw kf::Error(out_dir + "/candidates: cannot create the folder: " + std::strerror(errno));

    nlohmann::json jc = nlohmann::json::array();
    for (std::size_t i = 0; i < cands.size(); ++i) {
      const auto& c = cands[i];
      char stem[32];
      std::snprintf(stem, sizeof stem, "candidates/%02zu", i);
      kf::write_file_atomic(out_dir + "/" + stem + ".completion.txt", c.completion);
      nlohmann::json j = {{"index", i},
                          {"completion_tokens", c.tokens},
                          {"finish_reason", c.finish_reason},
                          {"completion_file", std::string(stem) + ".completion.txt"},
                          {"extracted", c.ex.ok},
                          {"extraction_error", c.ex.error},
                          {"verdict", ev::verdict_name(c.result.verdict)},
                          {"reason", c.result.reason},
                          {"cause", ev::cause_name(c.result.cause)},
                          {"speedup", c.result.speedup},
                          {"speedup_lo", c.result.speedup_lo},
                          {"speedup_hi", c.result.speedup_hi},
                          {"timing_unstable", c.result.timing_unstable},
                          {"task_degenerate", c.result.task_degenerate},
                          {"kernel_median_ms", c.result.cand_ms.median},
                          {"reference_median_ms", c.result.ref_ms.median},
                          {"duplicate_of", c.duplicate_of >= 0 ? nlohmann::json(c.duplicate_of) : nlohmann::json()},
                          {"best", long(i) == best}};
      if (c.ex.ok) {
        kf::write_file_atomic(out_dir + "/" + stem + ext, c.ex.source);
        j["source_file"] = std::string(stem) + ext;
      }
      if (c.evaluated) j["result"] = nlohmann::json::parse(ev::to_json(c.result));
      jc.push_back(std::move(j));
    }
    nlohmann::json rep = {
        {"task", task->name()},
        {"task_from", task_from},
        {"backend", backend},
        {"model", model_dir},
        {"n", n},
        {"seed", o.seed},
        {"temperature", o.temperature},
        {"top_p", o.top_p},
        {"top_k", o.top_k},
        {"max_new_tokens", o.max_new_tokens},
        {"device", o.device},
        {"prompt_mode", prompt_mode_name(prompt.mode)},
        {"prompt_tokens", prompt.tokens.size()},
        {"exemplars_shown", prompt.shown.size()},
        {"exemplars_from", exemplars_path},
        {"sample_s", sample_s},
        {"verify_s", verify_s},
        {"verified_ok", std::count_if(cands.begin(), cands.end(), [](const Candidate& c) { return c.result.ok(); })},
        {"best", best >= 0 ? nlohmann::json(best) : nlohmann::json()},
        {"best_file", best >= 0 ? nlohmann::json("best" + ext) : nlohmann::json()},
        {"best_speedup", best >= 0 ? cands[best].result.speedup : 0.0},
        {"best_speedup_lo", best >= 0 ? cands[best].result.speedup_lo : 0.0},
        {"best_speedup_hi", best >= 0 ? cands[best].result.speedup_hi : 0.0},
        {"candidates", jc}};
    kf::write_file_atomic(out_dir + "/prompt.txt", prompt.text);
    std::string txt = text + compiler_errors(cands, 12);
    if (best >= 0) {
      kf::write_file_atomic(out_dir + "/best" + ext, cands[best].ex.source);
      txt += "\nbest: candidate " + std::to_string(best) + " -> best" + ext + "\n" + ev::to_text(cands[best].result);
    }
    kf::write_file_atomic(out_dir + "/report.txt", txt);
    kf::write_file_atomic(out_dir + "/report.json",
                          rep.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  } catch (const std::exception& e) {
    std::cout << text;
    kf::log_error("kf-optimize: writing the outputs to ", out_dir, " failed: ", e.what(), "; exiting (code 3)");
    return 3;
  }
  std::cout << text;
  std::cout << (best >= 0 ? "best kernel: " + out_dir + "/best" + ext : "no candidate verified ok")
            << "; report: " << out_dir << "/report.txt\n";
  kf::log_info("kf-optimize: sampled in ", sample_s, " s, verified in ", verify_s, " s");
  return best >= 0 ? 0 : 1;
}
