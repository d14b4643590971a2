// The OpenMP settings a process that times references needs before main's work starts
// (defined in sandbox.cpp; called first by kf-eval, kf-evaluator and the verifier's tests).
#pragma once

namespace kf::evaluator {

// Reference and candidate under the same OpenMP settings: the sandbox worker's threads
// sleep as soon as they wait (OMP_WAIT_POLICY=PASSIVE, GOMP_SPINCOUNT=0: its checks read
// threads that keep working outside the call as cheating). The evaluator's OpenMP runtime
// (torch's) reads these at load, before main; left spinning, its idle threads took the
// CPU from the reference's working ones on a loaded host (a 1.5 ms ReLU timed at 4-16 ms)
// and made a copy of the reference 1.7-3x "faster". A process that times references
// calls this first: unless the environment already says so, it sets both and executes
// itself again (/proc/self/exe, the same arguments); if that fails it logs and goes on.
void exec_with_worker_openmp();

}  // namespace kf::evaluator
