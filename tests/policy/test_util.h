// Shared helpers for the policy tests: where the HF reference files are (made by the
// PolicyHfReferences CTest fixture, tests/policy/hf_reference.py), temp dirs, tensors.
#pragma once
#include <ftw.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "../test_support.h"

namespace kf::policy::test {

using kf::test::build_dir;
using kf::test::env_or;
using kf::test::python;
using kf::test::read_file;
using kf::test::remove_tree;
using kf::test::source_dir;
using kf::test::write_file;
inline std::string refs_dir() { return build_dir() + "/policy_refs"; }
struct TempDir : kf::test::TempDir {
  TempDir() : kf::test::TempDir("policy-test") {}
};

}  // namespace kf::policy::test
