// Counter: a count that statistics read at any time, with its high-water mark. The one shape of
// every value/peak pair in the memory layer (a device's and a job's live bytes, by class too; a
// pool's held bytes).
//
// No running total (everything ever added): nothing reads one, and on the allocation path it cost
// four more atomic adds per allocation, about a tenth of an alloc/free pair (perf on
// BM_AllocFreePair: DeviceCounters::on_allocate and JobRecord::try_charge took 24% of the pair
// with it, 15% with the plain atomics before). A count that needs one can keep it beside.
#pragma once

#include <atomic>
#include <cstddef>
#include <optional>

#include "salus/memory.hpp"

namespace salus::memory {

class Counter {
 public:
  // The count now, and the most it has been (since the last reset_peak).
  [[nodiscard]] std::size_t value() const { return value_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::size_t peak() const { return peak_.load(std::memory_order_relaxed); }

  // Adds `n` and raises the peak to the new value, which it returns.
  std::size_t add(std::size_t n) {
    const std::size_t now = add_unpeaked(n);
    raise_peak(now);
    return now;
  }
  // Adds `n` but leaves the peak to the caller (raise_peak), for counts that may still be taken
  // back before they are real (a job's charge whose placement fails); returns the new value.
  std::size_t add_unpeaked(std::size_t n) {
    return value_.fetch_add(n, std::memory_order_relaxed) + n;
  }
  // As add_unpeaked, unless the value would pass `limit`: then nothing changes (nullopt).
  std::optional<std::size_t> try_add_unpeaked(std::size_t n, std::size_t limit);
  void sub(std::size_t n) { value_.fetch_sub(n, std::memory_order_relaxed); }
  void raise_peak(std::size_t to) {
    std::size_t seen = peak_.load(std::memory_order_relaxed);
    while (seen < to && !peak_.compare_exchange_weak(seen, to, std::memory_order_relaxed)) {
    }
  }
  void reset_peak() { peak_.store(value(), std::memory_order_relaxed); }

 private:
  // Relaxed: each is read on its own, as a statistic or against a budget, never to order other
  // memory. Side by side: an update touches both.
  std::atomic<std::size_t> value_{0};
  std::atomic<std::size_t> peak_{0};
};

inline std::optional<std::size_t> Counter::try_add_unpeaked(std::size_t n, std::size_t limit) {
  if (limit == kUnlimited) return add_unpeaked(n);  // nothing to refuse: no compare-and-swap loop
  // A budget: compare-and-swap, so that a refused request never shows in the count (a fetch_add
  // rolled back on refusal could make a concurrent request that fits fail).
  std::size_t seen = value_.load(std::memory_order_relaxed);
  do {
    if (n > limit || seen > limit - n) return std::nullopt;
  } while (!value_.compare_exchange_weak(seen, seen + n, std::memory_order_relaxed));
  return seen + n;
}

}  // namespace salus::memory
