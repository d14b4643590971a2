// Inference with an exported policy (tools/optimize, kf-optimize): the pieces the tool
// shares with its tests, so a test can build the very prompt the tool will sample from.
//
// The prompt is an actor's prompt (Actor::build_task_prompt): the same template, ABI
// header, task info, exemplars and context fitting, driven by the same ActorOptions
// (actors.prompt.*, actors.sampling.max_new_tokens). The exemplars come from a file
// instead of the run's shared memory: a saved kernel database (kernel_db.json, as a
// run writes it under kernels/ and a learner checkpoint holds it) or a folder of seed
// kernels (<dir>/<task>/<name>.cu|.cpp with optional <name>.json), loaded into a
// private KernelDb so the CUDA-L1 bucketed draw is the one the actors use.
// Pure functions (load_exemplars creates and unlinks a private shared-memory segment;
// import_task_file runs the Python importer); any thread.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kf/actors/actor_options.h"
#include "kf/actors/actor_policy.h"
#include "kf/actors/prompt.h"
#include "kf/tasks/tasks.h"

namespace kf::actors {

// K exemplars of `task` from `path` (a kernel_db.json, a folder holding kernel_db.json
// or kernels/kernel_db.json, or a seed folder), ascending speedup. None for the task:
// an empty list. Throws kf::Error naming the file for a missing or malformed source.
std::vector<ExemplarIn> load_exemplars(const std::string& path, const std::string& task, std::size_t k, uint64_t seed);

// The prompt for `task` as an actor with options `o` and policy `policy` builds it:
// o.template_path / o.abi_header_path (empty: the tree's defaults), o.mode, o.backend,
// budget = (o.context_tokens or the model's max positions) - o.max_new_tokens, at most
// o.exemplars of `exemplars` (which must be ascending, as load_exemplars returns them).
// Throws kf::Error when the budget is not positive or the prompt cannot fit.
Prompt optimize_prompt(const ActorOptions& o, const ActorPolicy& policy, const tasks::Task& task,
                       std::vector<ExemplarIn> exemplars);

// Imports one KernelBench-format file with tasks/importer/kf_import.py (run by `python`)
// into `out_dir` for `backend`; the importer's output goes to <out_dir>/import.log.
// Returns the artifact folder (<out_dir>/<file stem>). Throws kf::Error naming the file
// and quoting the importer's last lines when it fails.
std::string import_task_file(const std::string& py_file, const std::string& out_dir, tasks::Backend backend,
                             const std::string& python);

}  // namespace kf::actors
