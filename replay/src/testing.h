// Test seam: stall points inside the replay components, so a test can freeze a
// process at an exact instruction (mid-record, holding a lock) and SIGKILL it there.
// Points: queue.write_mid, queue.acquire_locked, queue.commit_locked,
// queue.reap_journaled, snapshot.publish_mid, replay.fill_mid, replay.result_locked,
// replay.take_mid, kdb.insert_mid.
// Contract: set once per process (typically in a forked child); the hook runs on the
// calling thread. Production code never installs one (cost: one load and a branch).
#pragma once

namespace kf::replay::testing {

using StallHook = void (*)(const char* point);
void set_stall_hook(StallHook hook);  // nullptr removes it

}  // namespace kf::replay::testing
