// cheat (work before the worker's clock starts): the candidate rewrites the sandbox
// worker's dynamic-linking table (its GOT entry for read(), made writable with mprotect),
// so the worker's read of the next command runs the candidate's code: it computes the
// call's ReLU there (launched and synchronised on the kernel's stream) before the
// worker's clock starts; kf_forward then returns at once. The worker's clock says almost nothing, and no other thread works
// outside the call. The evaluator's own clock around the worker must time it.
#include <cuda_runtime.h>
#include <kf/kernel.h>
#include <elf.h>
#include <link.h>
#include <sys/mman.h>
#include <unistd.h>
#include <cstdint>
#include <cstring>

namespace {
using ReadFn = ssize_t (*)(int, void*, size_t);
ReadFn real_read = nullptr;
const float* g_x[4] = {};
float* g_y[4] = {};
long g_n = 0;
bool g_done[4] = {};
unsigned g_slot = 0;

__global__ void relu_k(const float* x, float* y, long n) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
    y[i] = fmaxf(x[i], 0.f);
}
cudaStream_t g_stream = nullptr;
void relu(const float* x, float* y, long n) {
  relu_k<<<2048, 256, 0, g_stream>>>(x, y, n);
  cudaStreamSynchronize(g_stream);
}

// The worker's command pipe is fd 4; a command starts with (op, slot); op 2 runs a call.
ssize_t hooked_read(int fd, void* buf, size_t n) {
  const ssize_t r = real_read(fd, buf, n);
  if (fd == 4 && r >= 8) {
    uint32_t op = 0, slot = 0;
    std::memcpy(&op, buf, 4);
    std::memcpy(&slot, static_cast<char*>(buf) + 4, 4);
    if (op == 2 && slot < 4) {
      g_slot = slot;
      if (g_x[slot]) {
        relu(g_x[slot], g_y[slot], g_n);
        g_done[slot] = true;
      }
    }
  }
  return r;
}

// The GOT slot of `name` in the main program (the worker), or null.
void** got_slot(const char* name) {
  struct Find {
    const char* name;
    void** slot;
  } f{name, nullptr};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) -> int {
        auto* f = static_cast<Find*>(data);
        if (info->dlpi_name && info->dlpi_name[0]) return 0;  // the main program comes first, unnamed
        const ElfW(Dyn)* dyn = nullptr;
        for (int i = 0; i < info->dlpi_phnum; ++i)
          if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
            dyn = reinterpret_cast<const ElfW(Dyn)*>(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
        if (!dyn) return 1;
        auto abs = [&](ElfW(Addr) a) { return a < info->dlpi_addr ? a + info->dlpi_addr : a; };
        const ElfW(Sym)* sym = nullptr;
        const char* str = nullptr;
        const ElfW(Rela)* rel[2] = {nullptr, nullptr};
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

bool hook(const char* name, void* fn, void** old) {
  void** slot = got_slot(name);
  if (!slot) return false;
  const long page = sysconf(_SC_PAGESIZE);
  void* p = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(slot) & ~uintptr_t(page - 1));
  if (mprotect(p, size_t(page), PROT_READ | PROT_WRITE) != 0) return false;  // full RELRO: read-only
  *old = *slot;
  *slot = fn;
  return true;
}
bool hooked = false;
}  // namespace

extern "C" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out) {
  if (n_in != 1 || n_out != 1) return 1;
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
  const long n = in[0].numel();
  g_stream = static_cast<cudaStream_t>(ctx->stream);
  if (!hooked) {
    hooked = true;
    void* old = nullptr;
    if (hook("read", reinterpret_cast<void*>(&hooked_read), &old)) real_read = reinterpret_cast<ReadFn>(old);
  }
  const unsigned s = g_slot;
  if (g_done[s] && g_x[s] == x) {  // done inside the worker's read, before its clock
    g_done[s] = false;
    return 0;
  }
  g_x[s] = x;
  g_y[s] = y;
  g_n = n;
  relu(x, y, n);
  return 0;
}
