// libFuzzer target: the safetensors header parser over arbitrary bytes. Every input must
// either parse (and then every tensor lies inside the buffer) or throw kf::Error.
#include <cstdint>
#include <cstdlib>

#include "kf/common/error.h"
#include "kf/policy/policy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto h = kf::policy::st_parse(data, size, "fuzz");
    for (const auto& t : h.tensors) {
      if (t.offset < h.data_begin || t.offset + t.nbytes > size || t.offset + t.nbytes < t.offset) std::abort();
      volatile uint8_t sink = 0;
      if (t.nbytes) sink ^= data[t.offset] ^ data[t.offset + t.nbytes - 1];  // ASan checks the bounds
      (void)sink;
    }
  } catch (const kf::Error&) {
  }
  return 0;
}
