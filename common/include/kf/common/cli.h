// One command-line contract for every KernelForge tool: `--help` and `--version` print and
// exit 0, a usage error prints the reason and exits 2 (CLI11 alone exits 105-109, which a
// script cannot tell from a tool's own failure codes).
// Header-only so that kf_common does not depend on CLI11; the version string comes from
// CMake (KF_VERSION: project version + the commit the build was configured at).
#pragma once
#include <CLI/CLI.hpp>
#include <string>

#ifndef KF_VERSION
#define KF_VERSION "unknown"
#endif

namespace kf::cli {

inline std::string version_text() { return std::string("KernelForge ") + KF_VERSION; }

// Parses argv into `app` (adding --version). Returns -1 when the tool should go on, else the
// exit code it must return: 0 after --help or --version, 2 after a usage error.
inline int parse(CLI::App& app, int argc, char** argv) {
  app.set_version_flag("--version", version_text(), "print the KernelForge version and exit");
  try {
    app.parse(argc, argv);
    return -1;
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints help, version or the error with its hint
    return rc == 0 ? 0 : 2;
  }
}

}  // namespace kf::cli

// Use in main(): KF_CLI_PARSE(app, argc, argv); returns from main when the tool should stop.
#define KF_CLI_PARSE(app, argc, argv)                               \
  do {                                                              \
    const int kf_cli_rc_ = ::kf::cli::parse((app), (argc), (argv)); \
    if (kf_cli_rc_ >= 0) return kf_cli_rc_;                         \
  } while (0)
