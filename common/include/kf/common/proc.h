// A process's identity across the node: its pid plus its start time, so a pid that the
// kernel reused for another process is not taken for the first one (the replay's slot
// owners, the GPU memory claims).
#pragma once
#include <sys/types.h>

#include <cstdint>

namespace kf {

// Start time of `pid` in clock ticks since boot (/proc/<pid>/stat field 22); 0 when the
// process is absent, a zombie or dead but not yet reaped.
uint64_t proc_start_time(pid_t pid);

}  // namespace kf
