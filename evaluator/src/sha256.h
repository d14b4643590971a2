// SHA-256 (FIPS 180-4), for the compile cache's content addresses. Small and local so
// the evaluator needs no crypto library.
#pragma once
#include <string>

namespace kf::evaluator {
std::string sha256_hex(const std::string& data);
}
