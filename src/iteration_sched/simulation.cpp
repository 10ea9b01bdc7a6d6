// Simulation: checks the cluster and options once, then every run() is an independent event loop
// (iteration_sched/sim_engine.cpp), so one Simulation can run many job sets.
#include "salus/simulation.hpp"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <utility>

#include "iteration_sched/sim_engine.hpp"
#include "iteration_sched/sim_placement.hpp"
#include "salus/error.hpp"

namespace salus::sched {
namespace {

// Far beyond any study; keeps machines * gpus_per_machine well inside an int.
constexpr int kMaxDevices = 1 << 16;

ClusterSpec checked(ClusterSpec cluster) {
  if (cluster.machines <= 0 || cluster.gpus_per_machine <= 0) {
    throw InvalidArgument(
        fmt::format("simulation: machines and gpus_per_machine must be > 0 (got {} and {})",
                    cluster.machines, cluster.gpus_per_machine));
  }
  if (cluster.machines > kMaxDevices / cluster.gpus_per_machine) {
    throw InvalidArgument(fmt::format("simulation: {} machines x {} GPUs is more than {} devices",
                                      cluster.machines, cluster.gpus_per_machine, kMaxDevices));
  }
  if (cluster.device_budget_bytes == 0) {
    throw InvalidArgument("simulation: device_budget_bytes must be > 0");
  }
  (void)detail::parse_placement(cluster.placement);  // throws naming the known placements
  if (!cluster.contention) cluster.contention = make_contention_model("processor_sharing");
  return cluster;
}

SimOptions checked(SimOptions options) {
  if (!(options.timeline_step_seconds >= 0.0) || !std::isfinite(options.timeline_step_seconds)) {
    throw InvalidArgument(fmt::format(
        "simulation: timeline_step_seconds must be finite and >= 0 (0: no timeline), got {}",
        options.timeline_step_seconds));
  }
  return options;
}

ClusterSpec one_device(std::size_t budget_bytes,
                       std::shared_ptr<const ContentionModel> contention) {
  ClusterSpec cluster;
  cluster.device_budget_bytes = budget_bytes;
  cluster.contention = std::move(contention);
  return cluster;
}

}  // namespace

Simulation::Simulation(const Policy& policy, ClusterSpec cluster, SimOptions options)
    : policy_(policy), cluster_(checked(std::move(cluster))), options_(checked(options)) {}

Simulation::Simulation(std::string_view policy_name, ClusterSpec cluster, SimOptions options)
    : owned_(PolicyRegistry::with_builtins().make(policy_name)),
      policy_(*owned_),
      cluster_(checked(std::move(cluster))),
      options_(checked(options)) {}

Simulation::Simulation(const Policy& policy, std::size_t budget_bytes, SimOptions options,
                       std::shared_ptr<const ContentionModel> contention)
    : Simulation(policy, one_device(budget_bytes, std::move(contention)), options) {}

Simulation::Simulation(std::string_view policy_name, std::size_t budget_bytes, SimOptions options,
                       std::shared_ptr<const ContentionModel> contention)
    : Simulation(policy_name, one_device(budget_bytes, std::move(contention)), options) {}

Simulation::~Simulation() = default;

SimResult Simulation::run(const std::vector<SimJob>& jobs) const {
  return detail::simulate_cluster(policy_, cluster_, options_, jobs);
}

}  // namespace salus::sched
