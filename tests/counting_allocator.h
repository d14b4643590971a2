// A CPU allocator that counts the bytes it hands out (current and peak), for tests that
// measure what a computation keeps or peaks at (tests/policy lean layers, tests/learner
// memory). Install it around one computation with kept_by() or peak_during().
#pragma once
#include <torch/torch.h>

#include <algorithm>
#include <utility>
#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace kf::test {

// Counts the bytes the CPU allocator hands out (current and peak). Data pointer and
// context are the same pointer, as raw_allocate() requires; sizes are looked up by it.
struct CountingCpuAllocator final : c10::Allocator {
  std::mutex mu;
  std::unordered_map<void*, int64_t> sizes;
  int64_t current = 0, peak = 0;
  static CountingCpuAllocator& get() {
    static CountingCpuAllocator a;  // never destroyed: tensors it made may outlive a test
    return a;
  }
  static void release(void* p) {
    auto& a = get();
    {
      std::lock_guard<std::mutex> g(a.mu);
      auto it = a.sizes.find(p);
      if (it != a.sizes.end()) {
        a.current -= it->second;
        a.sizes.erase(it);
      }
    }
    c10::free_cpu(p);
  }
  c10::DataPtr allocate(size_t n) override {
    void* p = c10::alloc_cpu(n);
    {
      std::lock_guard<std::mutex> g(mu);
      sizes[p] = static_cast<int64_t>(n);
      current += static_cast<int64_t>(n);
      peak = std::max(peak, current);
    }
    return {p, p, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
  // Bytes still allocated after fn() above the level before it, with this allocator installed.
  template <class F>
  int64_t kept_by(F&& fn) {
    int64_t start = installed_around(std::forward<F>(fn), /*reset_peak=*/false);
    std::lock_guard<std::mutex> g(mu);
    return current - start;
  }
  // Peak bytes above the level at the start of fn(), with this allocator installed.
  template <class F>
  int64_t peak_during(F&& fn) {
    int64_t start = installed_around(std::forward<F>(fn), /*reset_peak=*/true);
    std::lock_guard<std::mutex> g(mu);
    return peak - start;
  }

 private:
  // Runs fn() with this allocator installed; returns the bytes allocated when it began.
  template <class F>
  int64_t installed_around(F&& fn, bool reset_peak) {
    c10::Allocator* before = c10::GetCPUAllocator();
    c10::SetCPUAllocator(this, /*priority=*/100);
    struct Restore {
      c10::Allocator* a;
      ~Restore() { c10::SetCPUAllocator(a, /*priority=*/100); }
    } restore{before};
    int64_t start;
    {
      std::lock_guard<std::mutex> g(mu);
      start = current;
      if (reset_peak) peak = current;
    }
    fn();
    return start;
  }
};

}  // namespace kf::test
