// The address ranges a stream heap has reserved, published for readers that take no lock: which
// heap holds an address (StreamHeap::contains) is asked on every free, from any thread.
//
// One writer at a time (its heap, under the heap's lock) adds ranges; any thread reads. A slot is
// written once, before the count covers it (release), and a reader reads only the slots the count
// it loaded covers (acquire), so it never sees half a range.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>

#include "salus/device.hpp"

namespace salus::memory {

class AddressRanges {
 public:
  // Each range a heap adds is at least as large as all its earlier ones of that class together,
  // so 64 never binds.
  static constexpr std::size_t kMax = 64;

  // Lock-free: whether `p` lies in one of the ranges.
  [[nodiscard]] bool contains(DevicePtr p) const {
    const std::size_t n = count_.load(std::memory_order_acquire);
    for (std::size_t i = 0; i < n; ++i) {
      const Range& r = ranges_[i];
      if (p >= r.base.load(std::memory_order_relaxed) &&
          p < r.end.load(std::memory_order_relaxed)) {
        return true;
      }
    }
    return false;
  }
  // Lock-free: how many ranges there are.
  [[nodiscard]] std::size_t count() const { return count_.load(std::memory_order_acquire); }
  [[nodiscard]] bool full() const { return count() == kMax; }
  // The writer only (one at a time): publishes [base, base + bytes). The caller checks full().
  void add(DevicePtr base, std::size_t bytes) {
    const std::size_t index = count_.load(std::memory_order_relaxed);
    ranges_[index].base.store(base, std::memory_order_relaxed);
    ranges_[index].end.store(base + bytes, std::memory_order_relaxed);
    count_.store(index + 1, std::memory_order_release);
  }

 private:
  struct Range {
    std::atomic<DevicePtr> base{0};
    std::atomic<DevicePtr> end{0};
  };
  std::array<Range, kMax> ranges_;
  std::atomic<std::size_t> count_{0};
};

}  // namespace salus::memory
