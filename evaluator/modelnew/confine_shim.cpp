// libkf_modelnew_confine.so: the sandbox worker's confinement (evaluator/wire/confine.h)
// for the Python ModelNew worker (worker.py), which loads it with ctypes after its trusted
// set-up and before it imports the candidate. The same rlimits and seccomp filter as
// kf-sandbox-worker; the identity (nobody) comes from the private view it was started in.
#include "wire/confine.h"

#include <string>

extern "C" {

// The SIGSYS handler records a denied call in the Layout's forbidden_syscall slot.
void kf_mn_install_sigsys(volatile int* slot) { kf::evaluator::worker::install_sigsys_handler(slot); }

// Returns null on success, else what failed (static storage; the worker then exits).
const char* kf_mn_confine(int cpu_backend, long cpu_seconds, unsigned long long address_space, int drop_root) {
  static std::string err;
  kf::evaluator::worker::ConfineOptions o;
  o.cpu_backend = cpu_backend != 0;
  o.cpu_seconds = cpu_seconds;
  o.address_space_bytes = address_space;
  o.drop_root = drop_root != 0;
  err = kf::evaluator::worker::confine(o);
  return err.empty() ? nullptr : err.c_str();
}

}  // extern "C"
