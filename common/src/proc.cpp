#include "kf/common/proc.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kf {

uint64_t proc_start_time(pid_t pid) {
  if (pid <= 0) return 0;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "re");
  if (!f) return 0;
  char buf[1024];
  size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = 0;
  // "pid (comm) S ..." where comm may contain spaces and ')': parse after the last ')'.
  char* p = std::strrchr(buf, ')');
  if (!p) return 0;
  p += 2;                                             // now at the state field (field 3)
  if (*p == 'Z' || *p == 'X' || *p == 'x') return 0;  // dead, not yet reaped
  for (int field = 3; field < 22 && *p; ++p)
    if (*p == ' ') ++field;
  return std::strtoull(p, nullptr, 10);
}

}  // namespace kf
