// Where the cluster simulator puts an arriving job (ClusterSpec::placement). Pure functions of
// what each device holds, so a placement is cheap (O(devices)) and deterministic.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace salus::sched::detail {

enum class PlacementRule : std::uint8_t { least_loaded, most_free, pack_first };

// Throws InvalidArgument naming the known placements.
[[nodiscard]] PlacementRule parse_placement(std::string_view name);

// What placement looks at on one device.
struct DeviceLoad {
  std::uint64_t unfinished = 0;  // placed jobs that have not left
  std::size_t committed = 0;     // bytes its core committed to lanes
  std::size_t pending = 0;       // persistent + peak of its placed jobs not admitted yet
};

// The device for a job that needs `need` bytes (persistent + ephemeral peak) on devices of
// `budget` bytes each; ties go to the lowest index. `devices` is not empty.
[[nodiscard]] int place(PlacementRule rule, std::span<const DeviceLoad> devices, std::size_t budget,
                        std::size_t need);

}  // namespace salus::sched::detail
