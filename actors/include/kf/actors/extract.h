// Extraction: the kernel source out of one completion.
//
// The prompt asks for exactly one fenced block whose info string carries the marker
// word (default "kernel"): ```cuda kernel ... ``` or ```cpp kernel ... ```. Other fenced
// blocks (snippets in the analysis) are allowed and ignored. What counts as a failure,
// each with a stable code so metrics can count them and the learner sees the reason:
//   no_code          no fenced block at all
//   no_marked_block  fenced blocks, but none marked (and the unmarked fallback did not apply)
//   several_blocks   more than one marked block
//   unterminated     the marked block never closes (usually: the completion hit max tokens)
//   empty_block      the marked block holds only whitespace
//   no_entry_point   no `extern "C"` definition of kf_forward(...) { ... }
//   too_large        the source exceeds max_bytes (it would not fit a queue slot / the DB)
// Fallback (allow_unmarked): with no marked block, exactly one unmarked block that
// defines kf_forward is taken. Pure functions; any thread.
#pragma once
#include <cstddef>
#include <string>

namespace kf::actors {

struct ExtractOptions {
  std::string marker = "kernel";  // a word of the fence's info string
  bool allow_unmarked = true;
  std::size_t max_bytes = 64 * 1024;
};

struct Extraction {
  bool ok = false;
  std::string source;  // the block's contents (ok only)
  std::string code;    // failure code (see above); empty when ok
  std::string error;   // "extract: <code>: <detail>", what the Candidate carries
};

Extraction extract_kernel(const std::string& completion, const ExtractOptions& opts = {});

// True if `source` has an extern "C" kf_forward definition (a body, not just a declaration).
bool defines_entry_point(const std::string& source);

}  // namespace kf::actors
