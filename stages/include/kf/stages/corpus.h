// The seed corpus of stages 1-2: corpus/manifest.json lists kernels
//   [{"task", "backend": "cpu"|"cuda", "file" (relative to the corpus folder), "family",
//     "variant", "technique" (one sentence: what the kernel does to be fast)}, ...]
// and corpus/verified_<backend>.json holds the evaluator's measurements
//   {file: {"verdict", "speedup", "reason"}}.
// Entries other than kernel files (e.g. "header") are ignored. A kernel is measured when
// its verdict is one of the evaluator's (ok, compile_error, runtime_error, timeout,
// incorrect, rejected_cheat); a backend without a verified file, or another verdict
// (e.g. "compiled, not run" for CUDA kernels checked without a GPU), leaves it
// unmeasured: usable as a target, never as an exemplar (exemplars show measured speedups).
// Plain data; load once, then read from any thread.
#pragma once
#include <string>
#include <vector>

namespace kf::stages {

struct CorpusKernel {
  std::string task, backend, file, family, variant, technique;
  std::string source;
  bool measured = false;  // the evaluator's verdict is recorded (see above)
  std::string verdict;    // as recorded ("ok", "incorrect", "compiled, not run", ...)
  double speedup = 0;     // (measured ok only)
  bool usable() const { return !measured || verdict == "ok"; }
};

struct Corpus {
  std::string dir;
  std::vector<CorpusKernel> kernels;                                 // manifest order
  std::vector<std::string> tasks(const std::string& backend) const;  // sorted, unique
};

// Throws kf::Error naming the file, entry index and field for a missing or malformed
// manifest, a kernel file that cannot be read, or a malformed verified file.
Corpus load_corpus(const std::string& dir);

// Removes every kernel of the named tasks (the held-out split, tasks/heldout.txt) so no
// tokenizer, example or exemplar is built from them. Returns how many were removed.
std::size_t drop_tasks(Corpus& corpus, const std::vector<std::string>& names);

}  // namespace kf::stages
