// cheat (forged clock): the candidate rewrites the sandbox worker's dynamic-linking table
// (its GOT entry for clock_gettime, made writable with mprotect), so the worker's own clock
// says a tenth of each call's real time. It tells the truth on every eighth call, so that
// the smallest gap between the worker's clock and the evaluator's stays small. The ReLU itself
// is honest. The evaluator's own clock around the worker must time it.
#include <kf/kernel.h>
#include <elf.h>
#include <link.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <cstdint>
#include <cstring>

namespace {
using ClockFn = int (*)(clockid_t, timespec*);
ClockFn real_clock = nullptr;
long g_calls = 0;
int64_t g_stolen = 0;  // ns taken off the worker's monotonic clock so far

int64_t ns(const timespec& t) { return int64_t(t.tv_sec) * 1000000000 + t.tv_nsec; }

// The worker's monotonic clock, less what the calls stole: monotonic, and slow across them.
int slow_clock(clockid_t c, timespec* t) {
  const int rc = real_clock(c, t);
  if (rc != 0 || c != CLOCK_MONOTONIC) return rc;
  const int64_t fake = ns(*t) - g_stolen;
  t->tv_sec = fake / 1000000000;
  t->tv_nsec = fake % 1000000000;
  return rc;
}

void** got_slot(const char* name) {
  struct Find {
    const char* name;
    void** slot;
  } f{name, nullptr};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) -> int {
        auto* f = static_cast<Find*>(data);
        if (info->dlpi_name && info->dlpi_name[0]) return 0;
        const ElfW(Dyn)* dyn = nullptr;
        for (int i = 0; i < info->dlpi_phnum; ++i)
          if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
            dyn = reinterpret_cast<const ElfW(Dyn)*>(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
        if (!dyn) return 1;
        auto abs = [&](ElfW(Addr) a) { return a < info->dlpi_addr ? a + info->dlpi_addr : a; };
        const ElfW(Sym)* sym = nullptr;
        const char* str = nullptr;
        const ElfW(Rela) * rel[2] = {nullptr, nullptr};
        size_t rel_n[2] = {0, 0};
        for (const ElfW(Dyn)* d = dyn; d->d_tag != DT_NULL; ++d) {
          if (d->d_tag == DT_SYMTAB) sym = reinterpret_cast<const ElfW(Sym)*>(abs(d->d_un.d_ptr));
          if (d->d_tag == DT_STRTAB) str = reinterpret_cast<const char*>(abs(d->d_un.d_ptr));
          if (d->d_tag == DT_JMPREL) rel[0] = reinterpret_cast<const ElfW(Rela)*>(abs(d->d_un.d_ptr));
          if (d->d_tag == DT_PLTRELSZ) rel_n[0] = d->d_un.d_val / sizeof(ElfW(Rela));
          if (d->d_tag == DT_RELA) rel[1] = reinterpret_cast<const ElfW(Rela)*>(abs(d->d_un.d_ptr));
          if (d->d_tag == DT_RELASZ) rel_n[1] = d->d_un.d_val / sizeof(ElfW(Rela));
        }
        if (!sym || !str) return 1;
        for (int k = 0; k < 2 && !f->slot; ++k)
          for (size_t i = 0; rel[k] && i < rel_n[k]; ++i) {
            const size_t s = ELF64_R_SYM(rel[k][i].r_info);
            if (s && std::strcmp(str + sym[s].st_name, f->name) == 0) {
              f->slot = reinterpret_cast<void**>(info->dlpi_addr + rel[k][i].r_offset);
              break;
            }
          }
        return 1;
      },
      &f);
  return f.slot;
}
bool hooked = false;
}  // namespace

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  if (n_in != 1 || n_out != 1) return 1;
  if (!hooked) {
    hooked = true;
    if (void** slot = got_slot("clock_gettime")) {
      const long page = sysconf(_SC_PAGESIZE);
      void* p = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(slot) & ~uintptr_t(page - 1));
      if (mprotect(p, size_t(page), PROT_READ | PROT_WRITE) == 0) {
        real_clock = reinterpret_cast<ClockFn>(*slot);
        *slot = reinterpret_cast<void*>(&slow_clock);
      }
    }
  }
  timespec a{}, b{};
  clock_gettime(CLOCK_MONOTONIC, &a);  // the candidate's own (libc's) clock, not the worker's
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
  const long n = in[0].numel();
#pragma omp parallel for schedule(static) num_threads(ctx->num_threads)
  for (long i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
  clock_gettime(CLOCK_MONOTONIC, &b);
  if (real_clock && ++g_calls % 8 != 0) g_stolen += (ns(b) - ns(a)) * 9 / 10;  // 10x faster, but one call in 8
  return 0;
}
