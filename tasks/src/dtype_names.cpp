#include "dtype_names.h"

#include <utility>
#include <vector>

#include "kf/common/error.h"

namespace kf::tasks {
namespace {
struct Row {
  const char* name;
  const char* st;
  c10::ScalarType type;
};
const std::vector<Row>& rows() {
  static const std::vector<Row> r = {
      {"float32", "F32", c10::ScalarType::Float}, {"float64", "F64", c10::ScalarType::Double},
      {"float16", "F16", c10::ScalarType::Half},  {"bfloat16", "BF16", c10::ScalarType::BFloat16},
      {"int64", "I64", c10::ScalarType::Long},    {"int32", "I32", c10::ScalarType::Int},
      {"int16", "I16", c10::ScalarType::Short},   {"int8", "I8", c10::ScalarType::Char},
      {"uint8", "U8", c10::ScalarType::Byte},     {"bool", "BOOL", c10::ScalarType::Bool},
  };
  return r;
}
}  // namespace

c10::ScalarType dtype_from_name(const std::string& name, const std::string& ctx) {
  for (const Row& r : rows())
    if (name == r.name) return r.type;
  throw Error(ctx + ": unsupported dtype '" + name + "'");
}

c10::ScalarType dtype_from_safetensors(const std::string& name, const std::string& ctx) {
  for (const Row& r : rows())
    if (name == r.st) return r.type;
  throw Error(ctx + ": unsupported safetensors dtype '" + name + "'");
}

std::string dtype_name(c10::ScalarType t) {
  for (const Row& r : rows())
    if (t == r.type) return r.name;
  return c10::toString(t);
}

}  // namespace kf::tasks
