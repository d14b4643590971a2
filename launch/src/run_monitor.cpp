// RunMonitor: the launcher's counts for the status, metrics/run.jsonl and the resume state
// (see run_monitor.h).
#include "run_monitor.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <set>

namespace kf::launch {

namespace {
constexpr int kCounters = replay::ControlBlock::kCounters;
using namespace replay::counter;

std::vector<uint64_t>& at_role(std::map<std::string, std::vector<uint64_t>>& m, const std::string& role) {
  auto& v = m[role];
  v.resize(kCounters, 0);
  return v;
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}
}  // namespace

double ResultSummary::frac(const char* verdict) const {
  auto it = window_frac.find(verdict);
  return it == window_frac.end() ? 0.0 : it->second;
}

void CounterTotals::update(const std::vector<replay::PeerInfo>& peers) {
  for (const auto& p : peers) {
    auto it = seen_.find(p.slot);
    if (it != seen_.end() && it->second.pid != p.pid) {
      // The slot now belongs to a new process: keep the old one's final counts.
      auto& r = at_role(retired_, it->second.role);
      for (int c = 0; c < kCounters && c < static_cast<int>(it->second.last.size()); ++c) r[c] += it->second.last[c];
      seen_.erase(it);
    }
    Seen& s = seen_[p.slot];
    s.pid = p.pid;
    s.role = p.role;
    s.last.resize(kCounters, 0);
    for (int c = 0; c < kCounters && c < static_cast<int>(p.counters.size()); ++c)
      s.last[c] = std::max(s.last[c], p.counters[c]);
  }
}

uint64_t CounterTotals::sum(const std::string& role, int counter) const {
  uint64_t n = 0;
  for (const auto& [slot, s] : seen_)
    if (s.role == role && counter < static_cast<int>(s.last.size())) n += s.last[counter];
  for (const auto* m : {&retired_, &base_}) {
    auto it = m->find(role);
    if (it != m->end() && counter < static_cast<int>(it->second.size())) n += it->second[counter];
  }
  return n;
}

nlohmann::json CounterTotals::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  std::set<std::string> roles;
  for (const auto& [slot, s] : seen_) roles.insert(s.role);
  for (const auto* m : {&retired_, &base_})
    for (const auto& [r, v] : *m) roles.insert(r);
  for (const auto& r : roles) {
    std::vector<uint64_t> v(kCounters);
    for (int c = 0; c < kCounters; ++c) v[c] = sum(r, c);
    j[r] = v;
  }
  return j;
}

void CounterTotals::from_json(const nlohmann::json& j) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    auto& b = at_role(base_, it.key());
    const auto v = it.value().get<std::vector<uint64_t>>();
    for (int c = 0; c < kCounters && c < static_cast<int>(v.size()); ++c) b[c] += v[c];
  }
}

void RunMonitor::add(replay::Verdict v, double speedup, double reward) {
  ++total_;
  ++verdicts_[replay::verdict_name(v)];
  if (v == replay::Verdict::ok) best_ever_ = std::max(best_ever_, speedup);
  recent_.push_back({v, speedup, reward});
  while (recent_.size() > window_) recent_.pop_front();
}

void RunMonitor::add_result(const replay::Result& r) {
  std::lock_guard<std::mutex> g(mu_);
  add(r.verdict, r.speedup, r.reward);
}

uint64_t RunMonitor::read_results(const replay::ReplayBuffer& replay) {
  uint64_t missed = 0;
  const auto notes = replay.recent_results(&note_cursor_, &missed);
  std::lock_guard<std::mutex> g(mu_);
  for (const auto& n : notes)
    if (n.evaluator_id >= 0) add(n.verdict, n.speedup, n.reward);
  return missed;
}

ResultSummary RunMonitor::results() const {
  std::lock_guard<std::mutex> g(mu_);
  ResultSummary s;
  s.total = total_;
  s.verdicts = verdicts_;
  s.best_speedup_ever = best_ever_;
  s.window_n = recent_.size();
  if (recent_.empty()) return s;
  std::vector<double> sp;
  double reward = 0;
  std::size_t fast = 0;
  for (const auto& l : recent_) {
    s.window_frac[replay::verdict_name(l.verdict)] += 1.0;
    reward += l.reward;
    if (l.verdict == replay::Verdict::ok) {
      sp.push_back(l.speedup);
      if (l.speedup > 1.0) ++fast;
    }
  }
  const double n = static_cast<double>(recent_.size());
  for (auto& [k, v] : s.window_frac) v /= n;
  s.mean_reward = reward / n;
  s.fast1_frac = static_cast<double>(fast) / n;
  if (!sp.empty()) {
    std::sort(sp.begin(), sp.end());
    s.mean_speedup = std::accumulate(sp.begin(), sp.end(), 0.0) / static_cast<double>(sp.size());
    const std::size_t m = sp.size() / 2;
    s.median_speedup = sp.size() % 2 ? sp[m] : 0.5 * (sp[m - 1] + sp[m]);
    s.best_speedup = sp.back();
  }
  return s;
}

void RunMonitor::merge_node_seconds(const std::map<std::string, NodeSeconds>& by_session) {
  for (const auto& [k, v] : by_session) node_seconds_[k].raise_to(v);
}

NodeSeconds RunMonitor::node_seconds() const {
  NodeSeconds t;
  for (const auto& [k, v] : node_seconds_) {
    t.generate_s += v.generate_s;
    t.compile_s += v.compile_s;
    t.verify_s += v.verify_s;
    t.gpu_wait_s += v.gpu_wait_s;
    t.verdicts += v.verdicts;
    t.pushed += v.pushed;
    t.extraction_failures += v.extraction_failures;
    t.lag_sum += v.lag_sum;
  }
  return t;
}

void RunMonitor::sample_rates(double elapsed_s, Status& s) {
  const NodeSeconds nodes = node_seconds();  // evaluator and actor nodes (a head only)
  // The lag: this node's actors' (counted when they hand a candidate over) and the actor
  // nodes' (reported), over the candidates they counted.
  RateSample now{elapsed_s, counters_.sum("actor", kActorPushed), counters_.sum("evaluator", kEvalScored),
                 counters_.sum("actor", kActorPushed) + nodes.pushed,
                 counters_.sum("actor", kActorLagSum) + nodes.lag_sum};
  if (network_) {  // every candidate and result of the run passed the head's server
    now.samples = net_created_base_ + net_created_;
    now.verified = net_scored_base_ + net_scored_;
  }
  rate_.push_back(now);
  while (rate_.size() > 2 && rate_.front().t < elapsed_s - 10.0) rate_.pop_front();
  s.samples = now.samples;
  s.verified = now.verified;
  s.extraction_failures = counters_.sum("actor", kActorExtractFail) + nodes.extraction_failures;
  using CB = replay::ControlBlock;
  auto secs = [&](const char* role, int c) { return 1e-3 * static_cast<double>(counters_.sum(role, c)); };
  s.generate_s = secs("actor", CB::kWorkMs) + nodes.generate_s;
  s.compile_s = secs("evaluator", CB::kCompileMs) + nodes.compile_s;
  s.verify_s = secs("evaluator", CB::kWorkMs) + nodes.verify_s;
  s.learn_s = secs("learner", CB::kWorkMs);
  s.gpu_wait_s = secs("actor", CB::kGpuWaitMs) + secs("learner", CB::kGpuWaitMs) + nodes.gpu_wait_s;
  const RateSample& old = rate_.front();
  const double dt = now.t - old.t;
  if (dt > 0.5) {
    s.samples_per_s = static_cast<double>(now.samples - old.samples) / dt;
    s.verified_per_min = 60.0 * static_cast<double>(now.verified - old.verified) / dt;
  }
  const uint64_t counted = now.lag_n - old.lag_n;
  s.policy_lag = counted ? static_cast<double>(now.lag_sum - old.lag_sum) / static_cast<double>(counted) : 0.0;
  s.results = results();
  fill_eta(elapsed_s, s);
}

void RunMonitor::fill_eta(double elapsed_s, Status& s) {
  // The pace is measured from the first step this launcher saw, not from the start: start-up
  // (model load, first compiles) would otherwise stretch every estimate.
  if (first_step_t_ < 0 && s.step > 0) {
    first_step_t_ = elapsed_s;
    first_step_ = s.step;
  }
  s.eta_s = -1;
  s.eta_reason.clear();
  if (s.step_budget > 0 && first_step_t_ >= 0 && s.step > first_step_) {
    const double per_step = (elapsed_s - first_step_t_) / static_cast<double>(s.step - first_step_);
    s.eta_s = std::max(0.0, per_step * static_cast<double>(s.step_budget - s.step));
    s.eta_reason = "step budget";
  }
  if (s.time_budget_s > 0) {
    const double left = std::max(0.0, s.time_budget_s - elapsed_s);
    if (s.eta_s < 0 || left < s.eta_s) {
      s.eta_s = left;
      s.eta_reason = "time cap";
    }
  }
}

std::string format_duration(double seconds) {
  const auto t = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  if (t >= 3600) return fmt("%.0fh", double(t / 3600)) + fmt("%02.0fm", double((t % 3600) / 60));
  if (t >= 60) return fmt("%.0fm", double(t / 60)) + fmt("%02.0fs", double(t % 60));
  return fmt("%.0fs", double(t));
}

std::string eta_text(const Status& s) {
  return s.eta_s < 0 ? std::string("ETA n/a") : "ETA " + format_duration(s.eta_s) + " (" + s.eta_reason + ")";
}

nlohmann::json RunMonitor::to_json() const {
  std::lock_guard<std::mutex> g(mu_);
  nlohmann::json nodes = nlohmann::json::object();
  for (const auto& [k, v] : node_seconds_)
    nodes[k] = {{"generate_s", v.generate_s},
                {"compile_s", v.compile_s},
                {"verify_s", v.verify_s},
                {"gpu_wait_s", v.gpu_wait_s},
                {"verdicts", v.verdicts},
                {"pushed", v.pushed},
                {"extraction_failures", v.extraction_failures},
                {"lag_sum", v.lag_sum}};
  nlohmann::json j = {{"results_total", total_},
                      {"verdicts", verdicts_},
                      {"best_speedup", best_ever_},
                      {"counters", counters_.to_json()},
                      {"node_seconds", nodes}};
  if (network_ || net_created_base_ || net_scored_base_)
    j["network"] = {{"created", net_created_base_ + net_created_}, {"scored", net_scored_base_ + net_scored_}};
  return j;
}

void RunMonitor::from_json(const nlohmann::json& j) {
  std::lock_guard<std::mutex> g(mu_);
  total_ += j.value("results_total", uint64_t{0});
  if (j.contains("verdicts"))
    for (auto it = j["verdicts"].begin(); it != j["verdicts"].end(); ++it)
      verdicts_[it.key()] += it.value().get<uint64_t>();
  best_ever_ = std::max(best_ever_, j.value("best_speedup", 0.0));
  if (j.contains("counters")) counters_.from_json(j["counters"]);
  if (j.contains("node_seconds")) {
    std::map<std::string, NodeSeconds> saved;
    for (auto it = j["node_seconds"].begin(); it != j["node_seconds"].end(); ++it) {
      const auto& v = it.value();
      saved[it.key()] = {v.value("generate_s", 0.0),
                         v.value("compile_s", 0.0),
                         v.value("verify_s", 0.0),
                         v.value("gpu_wait_s", 0.0),
                         v.value("verdicts", uint64_t{0}),
                         v.value("pushed", uint64_t{0}),
                         v.value("extraction_failures", uint64_t{0}),
                         v.value("lag_sum", uint64_t{0})};
    }
    for (const auto& [k, v] : saved) node_seconds_[k].raise_to(v);  // under mu_ already
  }
  if (j.contains("network")) {
    net_created_base_ += j["network"].value("created", uint64_t{0});
    net_scored_base_ += j["network"].value("scored", uint64_t{0});
  }
}

void apply_probe_brief(const std::string& brief, Status& s) {
  const auto j = nlohmann::json::parse(brief, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("version") || !j["version"].is_number_integer()) return;
  s.probe_version = j["version"].get<int64_t>();
  s.probe_reward = j.value("reward", 0.0);
  s.probe_pass = j.value("pass", 0.0);
  s.probe_scored = j.value("scored", uint64_t{0});
}

namespace {
// "probe v10: reward -0.53, pass 41%" or "probe: none yet".
std::string probe_text(const Status& s) {
  if (s.probe_version < 0) return "probe: none yet";
  return "probe v" + std::to_string(s.probe_version) + ": reward " + fmt("%.2f", s.probe_reward) + ", pass " +
         fmt("%.0f%%", 100 * s.probe_pass) + " (" + std::to_string(s.probe_scored) + " scored)";
}
}  // namespace

std::string render_status(const Status& s) {
  std::string o;
  const int width = 30;
  double frac = s.step_budget > 0 ? std::min(1.0, static_cast<double>(s.step) / static_cast<double>(s.step_budget)) : 0;
  const int fill = static_cast<int>(std::lround(frac * width));
  o += "[" + std::string(fill, '#') + std::string(width - fill, '.') + "] step " + std::to_string(s.step);
  if (s.step_budget > 0) o += "/" + std::to_string(s.step_budget);
  o += "  " + s.phase + "  " + fmt("%.0f s", s.elapsed_s) + "  " + eta_text(s) + "  policy v" +
       std::to_string(s.policy_version) + "\n";
  const auto& r = s.results;
  auto pct = [&](const char* v) { return fmt("%.0f%%", 100.0 * r.frac(v)); };
  o += "samples " + fmt("%.2f/s", s.samples_per_s) + "  verified " + fmt("%.1f/min", s.verified_per_min) + "  (total " +
       std::to_string(s.verified) + ", extraction failures " + std::to_string(s.extraction_failures) + ")\n";
  o += "last " + std::to_string(r.window_n) + ": correct " + pct("ok") + "  cheat " + pct("rejected_cheat") +
       "  compile err " + pct("compile_error") + "  wrong " + pct("incorrect") + "  fast_1 " +
       fmt("%.0f%%", 100 * r.fast1_frac) + "\n";
  o += "speedup mean " + fmt("%.2fx", r.mean_speedup) + "  median " + fmt("%.2fx", r.median_speedup) + "  best " +
       fmt("%.2fx", r.best_speedup) + " (ever " + fmt("%.2fx", r.best_speedup_ever) + ")  reward " +
       fmt("%.2f", r.mean_reward) + "  " + probe_text(s) + "\n";
  o += "queue: candidates " + std::to_string(s.candidate_queue) + "  ready groups " + std::to_string(s.ready_groups) +
       "  open " + std::to_string(s.open_groups) + "  lag " + fmt("%.1f", s.policy_lag) + "  GPU busy " +
       (s.gpu_busy < 0 ? std::string("n/a") : fmt("%.0f%%", 100 * s.gpu_busy)) + "\n";
  o += "time: generate " + fmt("%.0f s", s.generate_s) + "  compile " + fmt("%.0f s", s.compile_s) + "  verify " +
       fmt("%.0f s", s.verify_s) + "  learn " + fmt("%.0f s", s.learn_s) + "  GPU wait " + fmt("%.0f s", s.gpu_wait_s) +
       "\n";
  std::string w;
  for (const auto& x : s.workers) w += (w.empty() ? "" : ", ") + x;
  o += "workers: " + w + "\n";
  return o;
}

std::string render_status_line(const Status& s) {
  const auto& r = s.results;
  auto frac = [&](const char* v) { return 100.0 * r.frac(v); };
  std::string o = "status: " + s.phase + " step " + std::to_string(s.step);
  if (s.step_budget > 0) o += "/" + std::to_string(s.step_budget);
  o += fmt(", %.0f s", s.elapsed_s) + ", " + eta_text(s) + fmt(", samples %.2f/s", s.samples_per_s) +
       fmt(", verified %.1f/min", s.verified_per_min) + " (" + std::to_string(s.verified) + ")" +
       fmt(", correct %.0f%%", frac("ok")) + fmt(", cheat %.0f%%", frac("rejected_cheat")) +
       fmt(", speedup mean %.2fx", r.mean_speedup) + fmt(" median %.2fx", r.median_speedup) +
       fmt(" best %.2fx", r.best_speedup_ever) + ", queue " + std::to_string(s.candidate_queue) + ", ready " +
       std::to_string(s.ready_groups) + fmt(", lag %.1f", s.policy_lag) +
       (s.gpu_busy < 0 ? std::string(", GPU n/a") : fmt(", GPU %.0f%%", 100 * s.gpu_busy));
  if (s.probe_version >= 0) o += ", " + probe_text(s);
  return o;
}

std::vector<std::pair<std::string, double>> status_scalars(const Status& s) {
  const auto& r = s.results;
  auto frac = [&](const char* v) { return r.frac(v); };
  std::vector<std::pair<std::string, double>> v = {
      {"elapsed_s", s.elapsed_s},
      {"samples_per_s", s.samples_per_s},
      {"candidates_per_min", s.verified_per_min},
      {"samples_total", static_cast<double>(s.samples)},
      {"verified_total", static_cast<double>(s.verified)},
      {"extraction_failures_total", static_cast<double>(s.extraction_failures)},
      {"correct_frac", frac("ok")},
      {"cheat_frac", frac("rejected_cheat")},
      {"compile_error_frac", frac("compile_error")},
      {"incorrect_frac", frac("incorrect")},
      {"runtime_error_frac", frac("runtime_error")},
      {"timeout_frac", frac("timeout")},
      {"mean_speedup", r.mean_speedup},
      {"median_speedup", r.median_speedup},
      {"best_speedup", r.best_speedup_ever},
      {"fast1_frac", r.fast1_frac},
      {"mean_reward", r.mean_reward},
      {"policy_lag", s.policy_lag},
      {"policy_version", static_cast<double>(s.policy_version)},
      {"candidate_queue_depth", static_cast<double>(s.candidate_queue)},
      {"ready_groups", static_cast<double>(s.ready_groups)},
      {"generate_s", s.generate_s},
      {"compile_s", s.compile_s},
      {"verify_s", s.verify_s},
      {"learn_s", s.learn_s},
      {"gpu_wait_s", s.gpu_wait_s},
  };
  if (s.gpu_busy >= 0) v.push_back({"gpu_busy_frac", s.gpu_busy});
  if (s.eta_s >= 0) v.push_back({"eta_s", s.eta_s});
  if (s.probe_version >= 0) {
    v.push_back({"probe_version", static_cast<double>(s.probe_version)});
    v.push_back({"probe_reward", s.probe_reward});
    v.push_back({"probe_pass_rate", s.probe_pass});
  }
  return v;
}

}  // namespace kf::launch
