// Internal: the compute of one simulated device. Simulated kernels (launch_sim_kernel) of
// different streams that run at once share the device: each progresses at the rate the contention
// model gives for the set running now. A kernel runs on its stream's worker thread, which waits
// here until the kernel's work is done.
//
// Progress is integrated exactly, piece by piece: between two changes of the running set the
// rates are constant, so advancing the clock splits the elapsed time at every completion that
// falls inside it and recomputes the rates there. A kernel therefore finishes when its work is
// done, not when its worker happens to wake up, and a late wakeup on a loaded host neither slows
// the others nor inflates the activity counters.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stop_token>
#include <vector>

#include "salus/contention.hpp"
#include "salus/sim.hpp"

namespace salus::sim {

class ComputeEngine {
 public:
  using Clock = std::chrono::steady_clock;

  explicit ComputeEngine(std::shared_ptr<const ContentionModel> model);
  ComputeEngine(const ComputeEngine&) = delete;
  ComputeEngine& operator=(const ComputeEngine&) = delete;

  // Runs one kernel of `seconds` of work alone at `occupancy` on the calling thread and returns
  // the wall seconds it took, from its start to the instant its work was done. When `stop` is
  // requested first (the stream shuts down), the kernel leaves unfinished and the seconds it ran
  // are returned. Expects validated arguments (seconds >= 0 and finite, occupancy in (0, 1]).
  double run(double seconds, double occupancy, const std::stop_token& stop);

  // The totals so far, with the running kernels' progress brought up to now.
  [[nodiscard]] SimDeviceActivity activity();

 private:
  struct Kernel {
    std::uint64_t id = 0;
    double seconds = 0.0;    // work when alone
    double occupancy = 1.0;  // share of the device it keeps busy alone
    double remaining = 0.0;  // work left, in seconds alone
    double rate = 1.0;       // work-seconds per second under the current set
    bool done = false;       // its work is done; its worker has not collected it yet
    Clock::time_point finished_at{};
  };

  // All below expect mu_ held.
  // Brings progress up to `now`, completing kernels at the exact instants their work runs out.
  void advance(Clock::time_point now);
  // Moves the clock `dt` seconds on at the current rates.
  void progress(double dt);
  // Rates (and device utilization) for the kernels not done yet; wakes every waiting worker, as
  // their completion times moved.
  void reschedule();
  [[nodiscard]] Kernel& find(std::uint64_t id);
  void remove(std::uint64_t id);

  const std::shared_ptr<const ContentionModel> model_;
  std::mutex mu_;  // guards everything below
  std::condition_variable_any changed_;
  std::vector<Kernel> kernels_;  // running, or done and not yet collected by their worker
  std::uint64_t next_id_ = 1;
  std::uint64_t generation_ = 0;  // bumped whenever the set of running kernels changes
  Clock::time_point now_;         // progress is up to date as of this instant
  std::size_t active_ = 0;        // kernels not done
  double utilization_ = 0.0;      // device_utilization of the current rates
  SimDeviceActivity totals_;
  // Scratch for the model's spans, kept to avoid allocating at every change.
  std::vector<double> occupancies_;
  std::vector<double> rates_;
};

}  // namespace salus::sim
