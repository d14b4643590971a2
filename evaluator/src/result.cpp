// Result: checks_passed and its JSON and text renderings (the facade's verdict type).
#include "kf/evaluator/evaluator.h"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

namespace kf::evaluator {

int Result::checks_passed() const {
  int n = 0;
  for (const auto& c : checks) n += c.passed;
  return n;
}

namespace {
nlohmann::json times(const TimeSummary& s) {
  return {{"n", s.n},        {"median_ms", s.median}, {"p10_ms", s.p10},     {"p90_ms", s.p90},
          {"min_ms", s.min}, {"max_ms", s.max},       {"spread", s.spread()}};
}
// "1.234x (95 % 1.180–1.290)"; just "1.234x" when no interval was measured.
std::string speedup_text(const Result& r) {
  char buf[128];
  if (r.speedup_hi > 0)
    std::snprintf(buf, sizeof buf,
                  "%.3fx (95 %% %.3f"
                  "\xe2\x80\x93"
                  "%.3f)",
                  r.speedup, r.speedup_lo, r.speedup_hi);
  else
    std::snprintf(buf, sizeof buf, "%.3fx", r.speedup);
  return buf;
}

}  // namespace

std::string to_json(const Result& r, int indent) {
  nlohmann::json j = {{"task", r.task},
                      {"backend", r.backend},
                      {"candidate_key", r.candidate_key},
                      {"verdict", verdict_name(r.verdict)},
                      {"cause", cause_name(r.cause)},
                      {"reason", r.reason},
                      {"diagnostics", r.diagnostics},
                      {"reference", times(r.ref_ms)},
                      {"candidate", times(r.cand_ms)},
                      {"speedup", r.speedup},
                      {"speedup_lo", r.speedup_lo},
                      {"speedup_hi", r.speedup_hi},
                      {"speedup_confidence", 0.95},
                      {"timing_unstable", r.timing_unstable},
                      {"max_abs_error", r.max_abs_error},
                      {"max_rel_error", r.max_rel_error},
                      {"nondeterministic", r.nondeterministic},
                      {"task_degenerate", r.task_degenerate},
                      {"degenerate_reason", r.degenerate_reason},
                      {"speed_rewarded", r.ok() && !r.task_degenerate},
                      {"checks_passed", r.checks_passed()},
                      {"checks_total", r.checks.size()},
                      {"reward", r.reward},
                      {"compile_s", r.compile_s},
                      {"verify_s", r.verify_s},
                      {"gpu_claim_gb", r.gpu_claim_gb},
                      {"gpu_peak_gb", r.gpu_peak_gb},
                      {"claim_wait_s", r.claim_wait_s},
                      {"lock_wait_s", r.lock_wait_s},
                      {"timing_s", r.timing_s},
                      {"timed_trials", r.timed_trials}};
  nlohmann::json cs = nlohmann::json::array();
  for (const auto& c : r.checks) cs.push_back({{"name", c.name}, {"passed", c.passed}, {"detail", c.detail}});
  j["checks"] = cs;
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string to_text(const Result& r) {
  std::ostringstream o;
  char buf[256];
  o << "task       " << r.task << " (" << r.backend << ")\n";
  o << "verdict    " << verdict_name(r.verdict)
    << (r.cause == Cause::environment ? " (caused by the machine, not the kernel)" : "") << "\n";
  if (!r.reason.empty()) o << "reason     " << r.reason << "\n";
  if (r.ref_ms.n) {
    std::snprintf(buf, sizeof buf, "reference  median %.4f ms  [p10 %.4f, p90 %.4f]  n=%d\n", r.ref_ms.median,
                  r.ref_ms.p10, r.ref_ms.p90, r.ref_ms.n);
    o << buf;
  }
  if (r.cand_ms.n) {
    std::snprintf(buf, sizeof buf, "candidate  median %.4f ms  [p10 %.4f, p90 %.4f]  n=%d\n", r.cand_ms.median,
                  r.cand_ms.p10, r.cand_ms.p90, r.cand_ms.n);
    o << buf;
  }
  if (r.verdict == Verdict::ok) {
    o << "speedup    " << speedup_text(r) << "\n";
    if (r.timing_unstable) o << "           timing unstable: conservative estimate (the interval's lower bound)\n";
  }
  std::snprintf(buf, sizeof buf, "max error  abs %.3g  rel %.3g%s\n", r.max_abs_error, r.max_rel_error,
                r.nondeterministic ? "  (nondeterministic across identical calls)" : "");
  o << buf;
  if (r.task_degenerate)
    o << "task       DEGENERATE: " << r.degenerate_reason << (r.ok() ? "; no speed reward (scored as speedup 1.0)" : "")
      << "\n";
  std::snprintf(buf, sizeof buf, "reward     %.3f   compile %.2f s   verify %.2f s\n", r.reward, r.compile_s,
                r.verify_s);
  o << buf;
  o << "checks     " << r.checks_passed() << "/" << r.checks.size() << " passed\n";
  for (const auto& c : r.checks)
    o << "  [" << (c.passed ? "pass" : "FAIL") << "] " << c.name << (c.detail.empty() ? "" : ": " + c.detail) << "\n";
  if (!r.diagnostics.empty()) o << "diagnostics:\n" << r.diagnostics << (r.diagnostics.back() == '\n' ? "" : "\n");
  return o.str();
}

}  // namespace kf::evaluator
