// dtype names as the importer writes them ("float32", "int64", ...) and as safetensors
// writes them ("F32", "I64", ...), mapped to c10::ScalarType.
#pragma once
#include <c10/core/ScalarType.h>

#include <string>

namespace kf::tasks {

c10::ScalarType dtype_from_name(const std::string& name, const std::string& ctx);         // "float32"
c10::ScalarType dtype_from_safetensors(const std::string& name, const std::string& ctx);  // "F32"
std::string dtype_name(c10::ScalarType t);                                                // "float32"

}  // namespace kf::tasks
