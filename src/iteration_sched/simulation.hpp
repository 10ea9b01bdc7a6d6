// A discrete-event simulation of one device under a policy, on a virtual clock: jobs arrive, ask
// for iterations, think between them and leave, all through the same DecisionCore that drives a
// real GPU. Used by the policy tests and for studies over workload traces.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "salus/scheduler.hpp"

namespace salus::sched {

struct SimJob {
  std::string name;
  JobKind kind = JobKind::training;
  int priority = 0;
  double arrival_seconds = 0.0;
  std::uint64_t iterations = 1;
  double iteration_seconds = 1.0;
  std::size_t persistent_bytes = 0;
  // Ephemeral bytes over one iteration; its shape is stretched to `iteration_seconds`. Empty:
  // no ephemeral memory.
  MemoryCurve curve;
  double think_seconds = 0.0;  // between the end of an iteration and asking for the next
};

struct SimOptions {
  // Record, for every iteration start, which other jobs were waiting (for checking policies).
  bool record_waiting = false;
  std::size_t max_events = 10'000'000;  // a guard against a policy that never settles
};

struct SimIteration {
  std::uint32_t job = 0;  // index into the input jobs
  int lane = 0;
  double asked = 0.0;  // when the job started waiting for it
  double start = 0.0;
  double end = 0.0;
  std::vector<std::uint32_t> others_waiting;  // only with SimOptions::record_waiting
};

struct SimJobResult {
  std::string name;
  double finish_seconds = 0.0;
  double attained_seconds = 0.0;
  double waiting_seconds = 0.0;   // summed over its iterations
  double max_wait_seconds = 0.0;  // the longest wait for one iteration
  std::uint64_t iterations = 0;
};

struct SimResult {
  std::vector<SimJobResult> jobs;        // in input order
  std::vector<SimIteration> iterations;  // in start order
  double makespan_seconds = 0.0;         // from time 0 to the last job leaving
  double throughput = 0.0;               // iterations per second over the makespan
  // The most that persistent(admitted) + the running iterations' ephemeral curves held at once,
  // and the most the core had committed to lanes.
  std::size_t peak_combined_bytes = 0;
  std::size_t peak_committed_bytes = 0;
};

class Simulation {
 public:
  // `policy` must outlive the simulation.
  Simulation(const Policy& policy, std::size_t budget_bytes, SimOptions options = {});
  // One of the built-in policies; throws InvalidArgument naming the known ones.
  Simulation(std::string_view policy_name, std::size_t budget_bytes, SimOptions options = {});
  ~Simulation();
  Simulation(const Simulation&) = delete;
  Simulation& operator=(const Simulation&) = delete;

  // Throws InvalidArgument for malformed jobs, or when jobs are left that can never run (one
  // that does not fit the budget even alone).
  [[nodiscard]] SimResult run(const std::vector<SimJob>& jobs) const;

 private:
  std::unique_ptr<Policy> owned_;
  const Policy& policy_;
  std::size_t budget_;
  SimOptions options_;
};

// A training-like ephemeral curve: rising linearly through forward (the first `forward_fraction`
// of the iteration) to `peak_bytes`, falling back through backward. Each sample holds the most
// the triangle reaches in its slice, so the curve never underestimates.
[[nodiscard]] MemoryCurve training_curve(double seconds, std::size_t peak_bytes,
                                         std::size_t samples = 20, double forward_fraction = 0.6);

// A job from one row of salus_workloads.csv: iteration seconds = jct / iterations; persistent is
// 30% of the peak, the ephemeral curve peaks at the other 70% (training_curve).
[[nodiscard]] SimJob workload_job(std::string name, double jct_seconds, double peak_memory_mb,
                                  std::uint64_t iterations);

// Every row of a salus_workloads.csv file (columns workload, jct_seconds, peak_memory_mb,
// iterations, in any order). `max_iterations` > 0 caps each job's iterations. Throws
// InvalidArgument if the file cannot be read or a row is malformed.
[[nodiscard]] std::vector<SimJob> jobs_from_workloads_csv(const std::string& path,
                                                          std::uint64_t max_iterations = 0);

}  // namespace salus::sched
