// The cluster simulator's event loop (Simulation::run): one virtual clock and one event queue for
// every device, each device with its own DecisionCore.
#pragma once

#include <vector>

#include "salus/simulation.hpp"

namespace salus::sched::detail {

// `cluster` is already checked (Simulation's constructors) and has a contention model. Checks
// the jobs (InvalidArgument naming the first bad one), then simulates them.
[[nodiscard]] SimResult simulate_cluster(const Policy& policy, const ClusterSpec& cluster,
                                         const SimOptions& options,
                                         const std::vector<SimJob>& jobs);

}  // namespace salus::sched::detail
