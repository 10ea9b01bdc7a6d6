// The cluster simulator's speed at study scale: jobs drawn from salus_workloads.csv, each coarsened
// to at most 200 steps (what the studies do), Poisson arrivals, 8 machines x 8 GPUs of 16 GiB,
// processor sharing, least-loaded placement. Arguments: job count, policy (index into kPolicies).
// The time is one whole simulation (setup excluded); items/s counts simulated iterations.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "salus/error.hpp"
#include "salus/simulation.hpp"

namespace {

using salus::sched::SimJob;

constexpr const char* kPolicies[] = {"fifo", "srtf", "fair", "pack", "priority", "memory_aware"};
constexpr std::uint64_t kMaxSteps = 200;
constexpr int kMachines = 8;
constexpr int kGpusPerMachine = 8;
constexpr std::size_t kDeviceBudget = 16ull << 30;
// Jobs arrive at this many times the rate the cluster's GPUs can serve them one at a time: queues
// form, devices share, and contention matters.
constexpr double kOfferedLoad = 1.2;

std::filesystem::path workloads_csv() {
  const char* env = std::getenv("SALUS_SHARED_DATA");
  const std::filesystem::path dir =
      env != nullptr
          ? std::filesystem::path(env)
          : std::filesystem::path(__FILE__).parent_path().parent_path() / ".." / "shared" / "data";
  return dir / "salus_workloads.csv";
}

// `count` jobs, each a random workload row (fixed seed), coarsened, with a random occupancy and
// Poisson arrivals.
std::vector<SimJob> cluster_jobs(std::size_t count) {
  const std::vector<SimJob> rows = salus::sched::jobs_from_workloads_csv(workloads_csv().string());
  double mean_work = 0.0;
  for (const SimJob& row : rows) {
    mean_work += row.iteration_seconds * static_cast<double>(row.iterations);
  }
  mean_work /= static_cast<double>(rows.size());
  const double rate = kOfferedLoad * kMachines * kGpusPerMachine / mean_work;  // jobs per second
  std::mt19937_64 rng(2024);
  std::uniform_int_distribution<std::size_t> pick(0, rows.size() - 1);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::exponential_distribution<double> gap(rate);
  std::vector<SimJob> jobs;
  jobs.reserve(count);
  double t = 0.0;
  for (std::size_t i = 0; i < count; ++i) {
    SimJob job = salus::sched::coarsened(rows[pick(rng)], kMaxSteps);
    job.name += "#" + std::to_string(i);
    job.occupancy = 0.25 + 0.75 * unit(rng);
    job.arrival_seconds = t += gap(rng);
    jobs.push_back(std::move(job));
  }
  return jobs;
}

void BM_ClusterSimulation(benchmark::State& state) {
  const auto count = static_cast<std::size_t>(state.range(0));
  const char* policy = kPolicies[state.range(1)];
  state.SetLabel(policy);
  if (!std::filesystem::exists(workloads_csv())) {
    state.SkipWithError("salus_workloads.csv not found (set SALUS_SHARED_DATA)");
    return;
  }
  const std::vector<SimJob> jobs = cluster_jobs(count);
  salus::sched::ClusterSpec cluster;
  cluster.machines = kMachines;
  cluster.gpus_per_machine = kGpusPerMachine;
  cluster.device_budget_bytes = kDeviceBudget;
  const salus::sched::Simulation simulation(policy, cluster, {.record_iterations = false});
  std::int64_t iterations = 0;
  salus::sched::SimResult result;
  for (auto _ : state) {
    result = simulation.run(jobs);
    for (const salus::sched::SimJobResult& job : result.jobs) {
      iterations += static_cast<std::int64_t>(job.iterations);
    }
  }
  double over_budget = 0.0;
  for (const salus::sched::SimDeviceResult& device : result.devices) {
    over_budget += device.over_budget_seconds;
  }
  state.SetItemsProcessed(iterations);  // items/s: simulated iterations per second
  state.counters["makespan_h"] = result.makespan_seconds / 3600.0;
  state.counters["over_budget_s"] = over_budget;
}

void cluster_args(benchmark::internal::Benchmark* b) {
  for (const std::int64_t jobs : {100, 1000, 10000}) {
    for (std::int64_t policy = 0; policy < static_cast<std::int64_t>(std::size(kPolicies));
         ++policy) {
      b->Args({jobs, policy});
    }
  }
}

BENCHMARK(BM_ClusterSimulation)
    ->Apply(cluster_args)
    ->ArgNames({"jobs", "policy"})
    ->Unit(benchmark::kMillisecond);

}  // namespace
