// The safetensors format details behind st_parse, StFile and st_write (kf/policy/policy.h).
// Format: u64 LE header length N, N bytes of JSON {"name": {"dtype", "shape",
// "data_offsets": [b, e]}, "__metadata__": {...}}, then the data. Torch-free; pure functions.
#pragma once
#include <cstddef>
#include <string>

namespace kf::policy {

// Bytes per element of a safetensors dtype ("F32", "BF16", ...); 0 for an unknown dtype.
std::size_t st_dtype_size(const std::string& dtype);

}  // namespace kf::policy
