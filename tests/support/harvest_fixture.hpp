// Shared by the harvesting tests: options, page size and small helpers.
#pragma once

#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>
#include <vector>

#include "salus/memory.hpp"
#include "salus/sim.hpp"

namespace salus::testing::harvest {

using namespace std::chrono_literals;

inline constexpr std::size_t kPage = 2 * MiB;

constexpr std::size_t tier(Tier t) {
  return static_cast<std::size_t>(t);
}

// The tier of a page at `where` seen from `device` (the test's own, not the library's).
inline Tier tier_of(Location where, int device) {
  if (where.is_host()) return Tier::host;
  return where.index == device ? Tier::local : Tier::peer;
}

inline std::size_t round_up(std::size_t bytes) {
  constexpr std::size_t a = MemoryManager::kBlockAlignment;
  return (bytes + a - 1) / a * a;
}

inline MemoryOptions harvesting(std::vector<std::size_t> limits, SpillPolicy spill,
                                std::optional<std::size_t> reserve = 0,
                                std::size_t host_limit = kUnlimited) {
  MemoryOptions options;
  options.device_limits = std::move(limits);
  options.harvest.spill = spill;
  options.harvest.lend_reserve_bytes = reserve;
  options.harvest.host_limit_bytes = host_limit;
  // Single-threaded tests: nobody else reaches a safe point while an allocation waits.
  options.harvest.recall_wait = 0ms;
  return options;
}

// Polls `done` every millisecond for at most `limit`; returns its last answer.
template <class F>
bool eventually(F&& done, std::chrono::milliseconds limit = 10s) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return done();
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

}  // namespace salus::testing::harvest
