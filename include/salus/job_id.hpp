// The one name of a job throughout the C++ API (the C ABI carries its value as a uint32_t).
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>

namespace salus {

// Ids are handed out by the runtime (or MemoryManager::register_job) and never reused.
struct JobId {
  std::uint32_t value = 0;
  friend constexpr auto operator<=>(const JobId&, const JobId&) = default;
};

// Memory that no registered job claimed (e.g. a framework's own allocations) is charged here.
inline constexpr JobId kUnattributedJob{0};

}  // namespace salus

template <>
struct std::hash<salus::JobId> {
  std::size_t operator()(const salus::JobId& job) const noexcept {
    return std::hash<std::uint32_t>{}(job.value);
  }
};
