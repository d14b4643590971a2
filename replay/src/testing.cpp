#include "testing.h"

#include "shm_util.h"

namespace kf::replay::testing {
void set_stall_hook(StallHook hook) { detail::g_stall_hook.store(hook); }
}  // namespace kf::replay::testing
