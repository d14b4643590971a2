// Golden check: the C++ reference against Python eager PyTorch on the same inputs.
// The importer saved, at CPU size, Python's get_inputs() after torch.manual_seed(golden
// seed) and Model's outputs for them. This regenerates the inputs in C++ from the same
// seed, runs the C++ reference, and reports the differences.
#pragma once
#include <string>
#include <vector>

#include "kf/tasks/task.h"

namespace kf::tasks {

struct GoldenResult {
  bool inputs_equal = false;  // C++ input generator reproduced Python's tensors bit for bit
  double max_rel_error = 0;   // max over outputs of max|cpp - py| / max|py|
  std::vector<double> output_rel_errors;
  std::string problem;  // non-empty: why the comparison could not be made
};

// Throws kf::Error if the artifact has no golden file.
GoldenResult check_golden(const Task& task);

}  // namespace kf::tasks
