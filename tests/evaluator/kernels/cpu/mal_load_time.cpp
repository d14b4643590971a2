// malicious: acts from a static constructor, i.e. while the worker loads the object,
// before kf_forward is ever called.
#include <kf/kernel.h>
#include <sys/socket.h>

namespace {
struct AtLoad {
  AtLoad() { socket(AF_INET6, SOCK_DGRAM, 0); }
} at_load;
}  // namespace

extern "C" int kf_forward(kf::Context*, const kf::Tensor*, int, kf::Tensor*, int) { return 0; }
