#include "kf/stages/stages.h"

#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kf/common/error.h"
#include "kf/common/log.h"

namespace kf::stages {
namespace {

bool file_exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string slurp(const std::string& path, const std::string& context) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(context + ": cannot read " + path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

nlohmann::json parse_json(const std::string& path) {
  try {
    return nlohmann::json::parse(slurp(path, path));
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": invalid JSON: " + e.what());
  }
}

std::string str_field(const nlohmann::json& e, const std::string& name, const std::string& ctx, bool required = true) {
  if (!e.contains(name) || e[name].is_null()) {
    if (required) throw Error(ctx + ": field '" + name + "' is missing");
    return "";
  }
  if (!e[name].is_string()) throw Error(ctx + ": field '" + name + "' must be a string");
  return e[name].get<std::string>();
}

}  // namespace

std::vector<std::string> Corpus::tasks(const std::string& backend) const {
  std::vector<std::string> out;
  for (const auto& k : kernels)
    if (k.backend == backend) out.push_back(k.task);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

Corpus load_corpus(const std::string& dir) {
  Corpus c;
  c.dir = dir;
  const std::string manifest = dir + "/manifest.json";
  if (!file_exists(manifest)) throw Error(manifest + ": not found (--corpus names the corpus folder)");
  const auto j = parse_json(manifest);
  if (!j.is_array()) throw Error(manifest + ": expected a JSON array of kernel entries");
  std::map<std::string, nlohmann::json> verified;  // backend -> object
  for (const std::string b : {"cpu", "cuda"}) {
    const std::string p = dir + "/verified_" + b + ".json";
    if (!file_exists(p)) continue;
    auto v = parse_json(p);
    if (!v.is_object()) throw Error(p + ": expected an object {file: {verdict, speedup, reason}}");
    verified[b] = std::move(v);
  }
  for (std::size_t i = 0; i < j.size(); ++i) {
    const std::string ctx = manifest + ": entry " + std::to_string(i);
    const auto& e = j[i];
    if (!e.is_object()) throw Error(ctx + ": expected an object");
    CorpusKernel k;
    k.task = str_field(e, "task", ctx);
    k.backend = str_field(e, "backend", ctx);
    if (k.backend != "cpu" && k.backend != "cuda")
      throw Error(ctx + ": field 'backend': '" + k.backend + "' (expected cpu or cuda)");
    k.file = str_field(e, "file", ctx);
    k.family = str_field(e, "family", ctx, false);
    k.variant = str_field(e, "variant", ctx, false);
    k.technique = str_field(e, "technique", ctx, false);
    k.source = slurp(dir + "/" + k.file, ctx + " (field 'file')");
    if (auto v = verified.find(k.backend); v != verified.end() && v->second.contains(k.file)) {
      const auto& m = v->second[k.file];
      const std::string vctx = dir + "/verified_" + k.backend + ".json: entry '" + k.file + "'";
      if (!m.is_object()) throw Error(vctx + ": expected an object");
      k.verdict = str_field(m, "verdict", vctx);
      // The evaluator's verdicts are measurements; anything else (e.g. "compiled, not
      // run" for CUDA kernels checked on a machine without a GPU) leaves it unmeasured.
      static const char* const kVerdicts[] = {"ok",      "compile_error", "runtime_error",
                                              "timeout", "incorrect",     "rejected_cheat"};
      k.measured = std::find(std::begin(kVerdicts), std::end(kVerdicts), k.verdict) != std::end(kVerdicts);
      if (k.verdict == "ok") {
        if (!m.contains("speedup") || !m["speedup"].is_number())
          throw Error(vctx + ": field 'speedup' must be a number for verdict ok");
        k.speedup = m["speedup"].get<double>();
      }
    }
    c.kernels.push_back(std::move(k));
  }
  return c;
}

std::size_t drop_tasks(Corpus& corpus, const std::vector<std::string>& names) {
  auto& k = corpus.kernels;
  const auto before = k.size();
  k.erase(std::remove_if(
              k.begin(), k.end(),
              [&](const CorpusKernel& x) { return std::find(names.begin(), names.end(), x.task) != names.end(); }),
          k.end());
  return before - k.size();
}

}  // namespace kf::stages
