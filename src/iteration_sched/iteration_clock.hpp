// How one device's iterations are timed, and the timings that wait for their work to finish.
//
// An iteration is timed on the GPU with a pair of timing events on its stream (iteration_timers.hpp),
// or on the host where the site in force says so (compute_site.hpp: RuntimeOptions::host_compute,
// which may change while the runtime runs; each iteration asks as it begins). An ended iteration's pair waits here
// until settle() finds its end event complete and reads it; the turn queue charges what it read.
//
// Lock rule: every public method takes mu_ (the pending timings) and calls the backend without
// it (IterationTimers has its own lock), and nothing here calls the turn queue. So mu_ is a leaf.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

#include "iteration_sched/compute_site.hpp"
#include "iteration_sched/iteration_timers.hpp"

namespace salus {

struct JobRecordState;

class IterationClock {
 public:
  using Timer = IterationTimers::Pair;

  IterationClock(std::shared_ptr<DeviceBackend> backend, int device,
                 std::shared_ptr<const SiteChoice> site);

  // Where iterations compute now (lock-free).
  [[nodiscard]] const ComputeSite& site() const { return *site_->load(std::memory_order_relaxed); }

  // A timer whose start is recorded on `stream`; none when the backend refused (the iteration of
  // `job` then goes unmeasured, and the log says so).
  [[nodiscard]] std::optional<Timer> start(std::string_view job, StreamHandle stream);
  // Records the timer's end on `stream`; false when the backend refused (as start).
  [[nodiscard]] bool stop(std::string_view job, const Timer& timer, StreamHandle stream);
  // The ended iteration's timer: read by a later settle when its end was recorded (`timed`),
  // else back to the pool at once.
  void hand_off(std::shared_ptr<JobRecordState> job, const Timer& timer, bool timed);
  // Back to the pool, unread (re-recording supersedes its pending records).
  void release(const Timer& timer);

  struct Settled {
    std::shared_ptr<JobRecordState> job;
    double seconds;  // the iteration's GPU time, >= 0
  };
  // The timings whose work has finished since the last call, polled now; their timers are back
  // in the pool. A timing the backend fails to read is dropped, and the log says so.
  [[nodiscard]] std::vector<Settled> settle();

 private:
  struct Pending {
    std::shared_ptr<JobRecordState> job;
    Timer timer;
  };

  const std::shared_ptr<const SiteChoice> site_;
  IterationTimers timers_;
  std::mutex mu_;                 // guards pending_
  std::vector<Pending> pending_;  // ended iterations whose GPU time is not read yet
};

}  // namespace salus
