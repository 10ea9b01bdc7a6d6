// A discrete-event simulation of a cluster of devices under a policy, on one virtual clock: jobs
// arrive, are placed on a device, ask for iterations, think between them and leave, all through
// the same DecisionCore that drives a real GPU (one core per device, the same policy on each).
// Iterations that run at the same time on one device share its compute through a contention
// model (salus/contention.hpp), so an iteration's wall time stretches when the device is
// saturated, and its ephemeral memory follows its progress, not the wall clock.
//
// Used by the policy tests, the studies (thousands of jobs on tens of GPUs) and Python
// (_salus.simulate). Runs are deterministic: the same inputs give the same results, bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "salus/contention.hpp"
#include "salus/export.hpp"
#include "salus/scheduler.hpp"

namespace salus::sched {

struct SimJob {
  std::string name;
  JobKind kind = JobKind::training;
  int priority = 0;
  double arrival_seconds = 0.0;
  std::uint64_t iterations = 1;
  double iteration_seconds = 1.0;  // one iteration's time alone on a device (its work)
  std::size_t persistent_bytes = 0;
  // Ephemeral bytes over one iteration; its shape is stretched to `iteration_seconds` of work.
  // Empty: no ephemeral memory.
  MemoryCurve curve;
  double think_seconds = 0.0;  // between the end of an iteration and asking for the next
  // The share of a device the job keeps busy alone, in (0, 1] (what the contention model weighs).
  double occupancy = 1.0;
  // The device (0 .. machines * gpus_per_machine - 1) it runs on; -1: placement picks one when
  // it arrives.
  int device = -1;
};

// The devices: `machines` x `gpus_per_machine` identical devices with one budget each, numbered
// machine by machine (device d is GPU d % gpus_per_machine of machine d / gpus_per_machine).
struct ClusterSpec {
  int machines = 1;
  int gpus_per_machine = 1;
  std::size_t device_budget_bytes = 0;  // what one device may hold for all its jobs (> 0)
  // Where an arriving job goes (placement_names()):
  //  - "least_loaded": the device with the fewest placed and unfinished jobs;
  //  - "most_free": the device with the most budget left after what its core committed to lanes
  //    and the persistent + ephemeral peak of the jobs placed there but not yet admitted;
  //  - "pack_first": the lowest-index device where the job's persistent + ephemeral peak fits
  //    beside what that device committed or has pending, else "least_loaded".
  // Ties go to the lowest device index.
  std::string placement = "least_loaded";
  std::shared_ptr<const ContentionModel> contention;  // null: "processor_sharing"
};

struct SimOptions {
  // Record, for every iteration start, which other jobs on its device were waiting (for checking
  // policies; costs O(jobs on the device) per start).
  bool record_waiting = false;
  // Counts the events that change something (not finish events made stale by a rate change).
  std::size_t max_events = 10'000'000;  // a guard against a policy that never settles
  // Keep SimResult::iterations (one record per iteration). Runs of millions of iterations turn
  // it off.
  bool record_iterations = true;
  // > 0: per device, a timeline sampled every this many virtual seconds (SimResult::timelines).
  double timeline_step_seconds = 0.0;
};

struct SimIteration {
  std::uint32_t job = 0;  // index into the input jobs
  int device = 0;
  int lane = 0;
  double asked = 0.0;  // when the job started waiting for it
  double start = 0.0;
  double end = 0.0;
  std::vector<std::uint32_t> others_waiting;  // only with SimOptions::record_waiting
};

struct SimJobResult {
  std::string name;
  int device = 0;
  double arrival_seconds = 0.0;
  double first_start_seconds = 0.0;  // when its first iteration started
  double finish_seconds = 0.0;
  // Wall time its iterations ran (start to end, summed): its work when nothing slowed it, more
  // under contention.
  double attained_seconds = 0.0;
  double work_seconds = 0.0;      // iterations x iteration_seconds: its time alone
  double waiting_seconds = 0.0;   // summed over its iterations
  double max_wait_seconds = 0.0;  // the longest wait for one iteration
  std::uint64_t iterations = 0;
};

struct SimDeviceResult {
  double busy_seconds = 0.0;         // time at least one iteration ran
  double utilization_seconds = 0.0;  // integral of device_utilization over time
  double work_seconds = 0.0;         // alone time of the iterations that ran here
  // The most that persistent (admitted) + the running iterations' ephemeral curves (at their
  // progress) held at once, and the most the core had committed to lanes.
  std::size_t peak_combined_bytes = 0;
  std::size_t peak_committed_bytes = 0;
  // Time the combined bytes above exceeded the device budget. The memory-aware plan predicts
  // memory from wall time since an iteration started; under contention iterations progress
  // slower, their curves stretch, and the plan can be wrong: this shows by how much.
  double over_budget_seconds = 0.0;
  std::uint64_t jobs = 0;  // placed here
};

// One device's state on the grid 0, step, 2 step, ... up to the makespan: at each time, the
// state right after the events of that instant.
struct SimTimeline {
  int device = 0;
  std::vector<double> time;
  std::vector<double> utilization;        // device_utilization of what runs
  std::vector<std::uint32_t> running;     // iterations running
  std::vector<std::size_t> memory_bytes;  // combined bytes (as peak_combined_bytes counts them)
  std::vector<std::uint32_t> waiting;     // jobs placed here that asked and have not started
};

struct SimResult {
  std::vector<SimJobResult> jobs;        // in input order
  std::vector<SimIteration> iterations;  // in start order (empty without record_iterations)
  std::vector<SimDeviceResult> devices;  // by device index
  std::vector<SimTimeline> timelines;    // by device index (only with timeline_step_seconds)
  double makespan_seconds = 0.0;         // from time 0 to the last job leaving
  double throughput = 0.0;               // iterations per second over the makespan
  // The largest of the devices' peaks.
  std::size_t peak_combined_bytes = 0;
  std::size_t peak_committed_bytes = 0;
};

class SALUS_API Simulation {
 public:
  // `policy` must outlive the simulation. Throws InvalidArgument for a malformed cluster
  // (machines or GPUs per machine <= 0, a zero budget, an unknown placement) or options.
  Simulation(const Policy& policy, ClusterSpec cluster, SimOptions options = {});
  // One of the built-in policies; throws InvalidArgument naming the known ones.
  Simulation(std::string_view policy_name, ClusterSpec cluster, SimOptions options = {});
  // One device of `budget_bytes`, under `contention` (null: processor sharing).
  Simulation(const Policy& policy, std::size_t budget_bytes, SimOptions options = {},
             std::shared_ptr<const ContentionModel> contention = nullptr);
  Simulation(std::string_view policy_name, std::size_t budget_bytes, SimOptions options = {},
             std::shared_ptr<const ContentionModel> contention = nullptr);
  ~Simulation();
  Simulation(const Simulation&) = delete;
  Simulation& operator=(const Simulation&) = delete;

  // Throws InvalidArgument, before simulating, for a malformed job (naming it): no iterations,
  // non-positive or non-finite iteration time, negative or non-finite arrival or think time,
  // occupancy outside (0, 1], a device out of range, or memory that fits no device even alone.
  [[nodiscard]] SimResult run(const std::vector<SimJob>& jobs) const;

 private:
  std::unique_ptr<Policy> owned_;
  const Policy& policy_;
  ClusterSpec cluster_;
  SimOptions options_;
};

// The placements ClusterSpec::placement knows.
[[nodiscard]] SALUS_API std::vector<std::string> placement_names();

// A training-like ephemeral curve: rising linearly through forward (the first `forward_fraction`
// of the iteration) to `peak_bytes`, falling back through backward. Each sample holds the most
// the triangle reaches in its slice, so the curve never underestimates.
[[nodiscard]] SALUS_API MemoryCurve training_curve(double seconds, std::size_t peak_bytes,
                                                   std::size_t samples = 20,
                                                   double forward_fraction = 0.6);

// A job from one row of salus_workloads.csv: iteration seconds = jct / iterations; persistent is
// 30% of the peak, the ephemeral curve peaks at the other 70% (training_curve).
[[nodiscard]] SALUS_API SimJob workload_job(std::string name, double jct_seconds,
                                            double peak_memory_mb, std::uint64_t iterations);

// Every row of a salus_workloads.csv file (columns workload, jct_seconds, peak_memory_mb,
// iterations, in any order). `max_iterations` > 0 caps each job's iterations (a capped job keeps
// its iteration time, so it gets shorter). Throws InvalidArgument if the file cannot be read or a
// row is malformed.
[[nodiscard]] SALUS_API std::vector<SimJob> jobs_from_workloads_csv(
    const std::string& path, std::uint64_t max_iterations = 0);
// The same from a stream (a file's contents or a string); messages name `source`.
[[nodiscard]] SALUS_API std::vector<SimJob> jobs_from_workloads_csv(
    std::istream& in, std::uint64_t max_iterations = 0, const std::string& source = "<stream>");

// The same job in at most `max_steps` longer iterations ("steps") of iteration_seconds *
// iterations / steps each: its total work and memory curve shape are kept, the number of
// scheduling boundaries drops (what the studies do to simulate long jobs quickly). Throws
// InvalidArgument when `max_steps` is 0.
[[nodiscard]] SALUS_API SimJob coarsened(SimJob job, std::uint64_t max_steps);

}  // namespace salus::sched
