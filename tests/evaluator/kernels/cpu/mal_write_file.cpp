// malicious: writes a file outside its scratch folder (and one inside it).
#include <kf/kernel.h>
#include <cstdio>

extern "C" int kf_forward(kf::Context*, const kf::Tensor*, int, kf::Tensor*, int) {
  if (FILE* f = std::fopen("/tmp/kf_evaluator_pwned_write", "w")) { std::fputs("pwned\n", f); std::fclose(f); }
  if (FILE* f = std::fopen("local_file", "w")) { std::fputs("pwned\n", f); std::fclose(f); }
  return 0;
}
