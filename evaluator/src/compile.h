// The compile service's inside (compile.cpp; the service itself, CompileService, is public).
//
// The cache key is SHA-256 of (backend, compiler identity, flags, source), so a source
// compiles once per compiler and flag set; failures are cached too (a policy repeats
// itself). Each compile runs in its own process group with a wall-clock limit (the
// whole group is killed), an address-space limit, and bounded output; diagnostics come
// back truncated to the first errors.
//
// The compiler runs confined (docs/evaluator.md, "Compile service"): as nobody, without
// network, in a private filesystem view holding only the toolchain and system headers
// (/usr), the ABI headers and the job's own folder. Files it opened (its dependency
// output) and files its diagnostics point into must be allowed headers, or the source is
// rejected naming the file. If the confinement cannot be set up the compile fails with
// the reason (and a log line); it never runs unconfined. Torch-free; any thread.
#pragma once
#include <string>

namespace kf::evaluator {

// Source checks applied before compiling, a cheap first filter: #include of absolute paths
// or "..", #embed and .incbin are refused. Returns "" if fine. (Macros, digraphs and line
// splices get past any text filter; the compiler's confinement is what holds.)
std::string check_source_policy(const std::string& source);

}  // namespace kf::evaluator
