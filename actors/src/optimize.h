// tools/optimize (kf-optimize) and its tests: exemplars from a file and .py task import.
// optimize_prompt, the prompt itself, is public (kf/actors/actors.h): other folders' tests
// build the very prompt the tool samples from. Pure functions (load_exemplars creates and
// unlinks a private shared-memory segment; import_task_file runs the Python importer); any thread.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kf/actors/actors.h"

namespace kf::actors {

// K exemplars of `task` from `path`, ascending speedup: a saved kernel database
// (kernel_db.json, as a run writes it under kernels/ and a learner checkpoint holds it; or a
// folder holding kernel_db.json or kernels/kernel_db.json) or a folder of seed kernels
// (<dir>/<task>/<name>.cu|.cpp with optional <name>.json), loaded into a private KernelDb so
// the CUDA-L1 bucketed draw is the one the actors use. None for the task: an empty list.
// Throws kf::Error naming the file for a missing or malformed source.
std::vector<ExemplarIn> load_exemplars(const std::string& path, const std::string& task, std::size_t k, uint64_t seed);

// Imports one KernelBench-format file with tasks/importer/kf_import.py (run by `python`)
// into `out_dir` for `backend`; the importer's output goes to <out_dir>/import.log.
// Returns the artifact folder (<out_dir>/<file stem>). Throws kf::Error naming the file
// and quoting the importer's last lines when it fails.
std::string import_task_file(const std::string& py_file, const std::string& out_dir, tasks::Backend backend,
                             const std::string& python);

}  // namespace kf::actors
