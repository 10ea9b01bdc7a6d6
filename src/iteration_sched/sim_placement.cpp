#include "iteration_sched/sim_placement.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "salus/error.hpp"
#include "salus/simulation.hpp"

namespace salus::sched {

std::vector<std::string> placement_names() {
  return {"least_loaded", "most_free", "pack_first"};
}

namespace detail {
namespace {

int least_loaded(std::span<const DeviceLoad> devices) {
  int best = 0;
  for (std::size_t d = 1; d < devices.size(); ++d) {
    if (devices[d].unfinished < devices[static_cast<std::size_t>(best)].unfinished) {
      best = static_cast<int>(d);
    }
  }
  return best;
}

// Bytes spoken for on a device: committed to lanes, or asked for by jobs waiting for admission.
// (Sums of real job sizes: far from overflowing 64 bits.)
std::size_t spoken_for(const DeviceLoad& device) {
  return device.committed + device.pending;
}

// Every device has the same budget, so the most budget left is the least spoken for.
int most_free(std::span<const DeviceLoad> devices) {
  int best = 0;
  for (std::size_t d = 1; d < devices.size(); ++d) {
    if (spoken_for(devices[d]) < spoken_for(devices[static_cast<std::size_t>(best)])) {
      best = static_cast<int>(d);
    }
  }
  return best;
}

int pack_first(std::span<const DeviceLoad> devices, std::size_t budget, std::size_t need) {
  for (std::size_t d = 0; d < devices.size(); ++d) {
    const std::size_t used = spoken_for(devices[d]);
    if (used <= budget && need <= budget - used) return static_cast<int>(d);
  }
  return least_loaded(devices);
}

}  // namespace

PlacementRule parse_placement(std::string_view name) {
  if (name == "least_loaded") return PlacementRule::least_loaded;
  if (name == "most_free") return PlacementRule::most_free;
  if (name == "pack_first") return PlacementRule::pack_first;
  throw InvalidArgument(fmt::format("simulation: unknown placement '{}' (known: {})", name,
                                    fmt::join(placement_names(), ", ")));
}

int place(PlacementRule rule, std::span<const DeviceLoad> devices, std::size_t budget,
          std::size_t need) {
  switch (rule) {
    case PlacementRule::least_loaded:
      return least_loaded(devices);
    case PlacementRule::most_free:
      return most_free(devices);
    case PlacementRule::pack_first:
      return pack_first(devices, budget, need);
  }
  return least_loaded(devices);
}

}  // namespace detail
}  // namespace salus::sched
