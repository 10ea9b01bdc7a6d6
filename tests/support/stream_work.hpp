// "Kernels" for stream-safety tests on simulated GPUs, and the accounting checks that follow them.
//
// A StreamWork item is a host function enqueued on a stream. Like a kernel, it touches the memory
// of its blocks only when the stream reaches it, possibly long after the host has moved on (and
// freed the blocks: a stream-ordered free). It stamps every OS page of every block with a pattern,
// reads it back, and counts what it finds wrong. When Salus unmaps a page under it the sim backend
// raises SIGSEGV (the test process dies: that is a failure too); when Salus hands a page to
// someone else, or moves it while the work writes, the stamps come back wrong.
//
// Stamps rather than full fills: a few words per OS page find an unmapped or reused page just as
// surely, and keep the work cheap under the sanitizers.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <ostream>
#include <thread>
#include <vector>

#include "salus/device.hpp"
#include "salus/memory.hpp"

namespace salus {
// Readable parameter values in test names and ctest listings (gtest finds PrintTo by ADL).
inline void PrintTo(SpillPolicy policy, std::ostream* os) {
  *os << to_string(policy);
}
}  // namespace salus

namespace salus::testing {

// A range the work touches (a block, or part of one).
struct Region {
  DevicePtr ptr = 0;
  std::size_t bytes = 0;
};

inline constexpr std::size_t kStampStride = 4096;  // one stamp per OS page
inline constexpr std::size_t kStampWords = 8;      // 64 bytes

// The word at `offset` of a region stamped with `key`. Depends on both, so a region that another
// block's work stamped (an aliased page) or that kept an older round's stamp never matches.
inline std::uint64_t stamp_word(std::uint64_t key, std::size_t offset) {
  std::uint64_t x = key * 0x9E3779B97F4A7C15ull ^ (offset + 0x632BE59BD9B4E019ull);
  x ^= x >> 31;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 32;
  return x;
}

// Calls visit(offset) for each stamped word of `region`: the first words of every OS page it
// overlaps (its first and last bytes included).
template <class F>
void for_each_stamp(const Region& region, F&& visit) {
  const DevicePtr end = region.ptr + region.bytes;
  // Stamps sit at the region's start and at every OS page boundary inside it.
  for (DevicePtr at = region.ptr; at < end;) {
    const std::size_t words = std::min<std::size_t>(kStampWords, (end - at) / 8);
    for (std::size_t w = 0; w < words; ++w) visit(at - region.ptr + 8 * w);
    at = (at / kStampStride + 1) * kStampStride;
  }
  // The last word of the region, so a block's tail page is touched even when short.
  if (region.bytes >= 8) visit((region.bytes - 8) / 8 * 8);
}

inline void write_stamps(const Region& region, std::uint64_t key) {
  for_each_stamp(region, [&](std::size_t offset) {
    const std::uint64_t v = stamp_word(key, offset);
    std::memcpy(reinterpret_cast<void*>(region.ptr + offset), &v, 8);
  });
}

// Stamped words of `region` that do not hold `key`'s stamp.
inline std::uint64_t count_bad_stamps(const Region& region, std::uint64_t key) {
  std::uint64_t bad = 0;
  for_each_stamp(region, [&](std::size_t offset) {
    std::uint64_t v;
    std::memcpy(&v, reinterpret_cast<const void*>(region.ptr + offset), 8);
    bad += v != stamp_word(key, offset) ? 1 : 0;
  });
  return bad;
}

// What the work items of one StreamWork found. Shared with the queued items, which may outlive
// the test body when it fails early.
struct WorkTally {
  std::atomic<std::uint64_t> enqueued{0};
  std::atomic<std::uint64_t> started{0};
  std::atomic<std::uint64_t> finished{0};
  std::atomic<std::uint64_t> mismatches{0};  // stamped words found wrong
  std::atomic<std::uint64_t> stale{0};       // ... of those, data of an earlier item lost
  std::atomic<DevicePtr> first_bad{0};       // where, for the failure message
};

struct TouchOptions {
  // Before its first touch the item waits like a long kernel queued ahead of the memory's use.
  std::chrono::microseconds delay{0};
  // Round r stamps key + r; from the second round on it first checks the previous round's stamps
  // are still there. Many rounds with a gap keep the item writing while something (a page move)
  // happens under it, and find writes that went to a page that was replaced meanwhile.
  std::uint64_t key = 1;
  int rounds = 1;
  std::chrono::microseconds gap{0};
  // When set, the item first checks the regions still hold this key's stamps (data written by an
  // earlier item, e.g. in an earlier iteration, that must survive moves in between).
  std::optional<std::uint64_t> expect_before;
};

// One round after `delay` (a slow kernel queued ahead of the memory's use).
inline TouchOptions stamp_once(std::uint64_t key, std::chrono::microseconds delay = {}) {
  TouchOptions o;
  o.key = key;
  o.delay = delay;
  return o;
}

// `rounds` rounds `gap` apart, from the moment the stream reaches the item.
inline TouchOptions stamp_rounds(std::uint64_t key, int rounds, std::chrono::microseconds gap) {
  TouchOptions o;
  o.key = key;
  o.rounds = rounds;
  o.gap = gap;
  return o;
}

// The key the last round of an item with `options` stamped.
inline std::uint64_t last_key(const TouchOptions& options) {
  return options.key + static_cast<std::uint64_t>(std::max(options.rounds, 1) - 1);
}

class StreamWork {
 public:
  StreamWork() : tally_(std::make_shared<WorkTally>()) {}

  // Enqueues on `stream` an item that touches every region as `options` says.
  void touch(DeviceBackend& backend, StreamHandle stream, std::vector<Region> regions,
             TouchOptions options) {
    tally_->enqueued.fetch_add(1);
    backend.launch_host_func(stream, [tally = tally_, regions = std::move(regions), options] {
      tally->started.fetch_add(1);
      if (options.delay.count() > 0) std::this_thread::sleep_for(options.delay);
      auto check = [&](std::uint64_t key, bool earlier) {
        for (const Region& r : regions) {
          if (const std::uint64_t bad = count_bad_stamps(r, key); bad > 0) {
            tally->mismatches.fetch_add(bad);
            if (earlier) tally->stale.fetch_add(bad);
            DevicePtr none = 0;
            tally->first_bad.compare_exchange_strong(none, r.ptr);
          }
        }
      };
      if (options.expect_before) check(*options.expect_before, true);
      for (int round = 0; round < std::max(options.rounds, 1); ++round) {
        const std::uint64_t key = options.key + static_cast<std::uint64_t>(round);
        if (round > 0) {
          if (options.gap.count() > 0) std::this_thread::sleep_for(options.gap);
          check(key - 1, true);
        }
        for (const Region& r : regions) write_stamps(r, key);
        check(key, false);
      }
      tally->finished.fetch_add(1);
    });
  }

  [[nodiscard]] std::uint64_t mismatches() const { return tally_->mismatches.load(); }
  [[nodiscard]] std::uint64_t stale() const { return tally_->stale.load(); }
  [[nodiscard]] std::uint64_t enqueued() const { return tally_->enqueued.load(); }
  [[nodiscard]] std::uint64_t started() const { return tally_->started.load(); }
  [[nodiscard]] std::uint64_t finished() const { return tally_->finished.load(); }
  [[nodiscard]] bool all_finished() const { return finished() == enqueued(); }
  [[nodiscard]] DevicePtr first_bad() const { return tally_->first_bad.load(); }

  // Waits until `count` items have started (so what follows overlaps them); false on timeout.
  bool wait_started(std::uint64_t count,
                    std::chrono::milliseconds limit = std::chrono::seconds(10)) const {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (started() < count) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return true;
  }

 private:
  std::shared_ptr<WorkTally> tally_;
};

// Nothing is allocated, lent or borrowed anywhere; every job holds nothing; and once trimmed, the
// pools hold no pages (nothing leaked). Call with every stream synchronized.
inline void expect_balanced(MemoryManager& memory) {
  const MemoryStats stats = memory.stats();
  for (const DeviceMemoryStats& d : stats.devices) {
    SCOPED_TRACE(::testing::Message() << "device " << d.device);
    EXPECT_EQ(d.allocated, 0u);
    for (const ClassBytes& c : d.by_class) {
      EXPECT_EQ(c.in_use, 0u);
      EXPECT_EQ(c.blocks, 0u);
    }
    EXPECT_EQ(d.allocations, d.frees);
    EXPECT_EQ(d.lent, 0u);
    EXPECT_EQ(d.borrowed_peer, 0u);
    EXPECT_EQ(d.borrowed_host, 0u);
  }
  for (const JobMemoryStats& j : stats.jobs) {
    SCOPED_TRACE(::testing::Message() << "job " << j.job.value << " '" << j.name << "'");
    EXPECT_EQ(j.in_use, 0u);
    for (const ClassBytes& c : j.by_class) {
      EXPECT_EQ(c.in_use, 0u);
      EXPECT_EQ(c.blocks, 0u);
    }
    for (std::size_t bytes : j.in_use_by_device) EXPECT_EQ(bytes, 0u);
  }
  memory.trim();
  const MemoryStats trimmed = memory.stats();
  for (const DeviceMemoryStats& d : trimmed.devices) {
    SCOPED_TRACE(::testing::Message() << "device " << d.device << " after trim");
    EXPECT_EQ(d.mapped, 0u);
    EXPECT_EQ(d.reserved, 0u);
    EXPECT_EQ(d.chunk_creates, d.chunk_releases);
  }
  EXPECT_EQ(trimmed.host_spill_bytes, 0u);
}

}  // namespace salus::testing
