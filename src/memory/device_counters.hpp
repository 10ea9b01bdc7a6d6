// A device's counters: what every stream heap of the device adds to, read as one view (peaks).
// Lock story: none; every field is atomic.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "memory/counter.hpp"
#include "salus/device.hpp"
#include "salus/memory.hpp"

namespace salus::memory {

// Device-wide counters that need one view across streams (peaks). Counts that do not are kept by
// each stream heap under the lock it holds anyway, to keep shared cache lines off the hot path.
struct DeviceCounters {
  Counter allocated;  // live block bytes
  std::atomic<std::size_t> mapped{0};
  Counter by_class[kLifetimeCount];
  std::atomic<std::uint64_t> page_maps{0};
  std::atomic<std::uint64_t> page_unmaps{0};
  std::atomic<std::uint64_t> cross_stream_reuses{0};
  std::atomic<std::uint64_t> out_of_memory{0};
  std::atomic<std::size_t> borrowed[kTierCount] = {};  // mapped bytes by tier ([local] unused)
  std::atomic<std::uint64_t> pages_moved{0};
  std::atomic<std::uint64_t> bytes_moved{0};
  std::atomic<std::uint64_t> move_nanoseconds{0};
  std::atomic<std::uint64_t> recalled_pages{0};
  // Pages handed to a new user while work enqueued before their free might still touch them:
  // their old addresses stay mapped until it has finished (`retiring` bytes right now).
  std::atomic<std::uint64_t> deferred_unmaps{0};
  std::atomic<std::size_t> retiring{0};
  // Allocations that waited on the host for such work (their address was still retiring).
  std::atomic<std::uint64_t> allocation_waits{0};

  void on_allocate(Lifetime lifetime, std::size_t bytes);
  void on_free(Lifetime lifetime, std::size_t bytes);
  void on_promote(std::size_t bytes);
};

}  // namespace salus::memory
