// Poison bit patterns, shared by the worker (which fills) and the evaluator (which
// recognises unwritten elements). Two patterns, so a value that happens to equal one
// pattern (an int output of -1) still differs under the other.
//   POISON_FF: every byte 0xFF (a NaN for every float type, -1 for signed ints)
//   POISON_5A: every byte 0x5A (a large finite float: 1.5e16 in fp32; a kernel that
//              tests its output for NaN to skip work is caught by this one)
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kf/kernel.h"

namespace kf::evaluator {

// The element pattern of (dtype, pattern) in its low `dtype_size` bytes.
inline uint64_t poison_element(int /*dtype*/, uint32_t pattern) { return pattern == 0 ? ~0ull : 0x5A5A5A5A5A5A5A5Aull; }

inline void poison_fill_host(void* data, std::size_t nbytes, int /*dtype*/, uint32_t pattern) {
  std::memset(data, pattern == 0 ? 0xFF : 0x5A, nbytes);
}

}  // namespace kf::evaluator
