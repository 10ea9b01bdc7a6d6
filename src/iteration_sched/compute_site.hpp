// Where a runtime's iterations compute: on the GPU (the default) or on the host
// (RuntimeOptions::host_compute; salus::torch's CPU mode switches it while the runtime runs).
// A strategy: each part that treats the two differently asks the site in force what to do, and
// the reasons are written here once, not at each use. A third site (say, a GPU job whose data
// loader touches its memory from the host) is one more implementation.
//
// Both sites are stateless and immutable. The runtime's choice is one atomic pointer
// (SiteChoice), read without a lock: an iteration asks it as it begins and keeps its answer.
#pragma once

#include <atomic>
#include <memory>

#include "salus/device.hpp"
#include "salus/scheduler.hpp"

namespace salus {

class ComputeSite {
 public:
  virtual ~ComputeSite() = default;

  [[nodiscard]] static const ComputeSite& gpu();
  [[nodiscard]] static const ComputeSite& host();

  // Whether an iteration's time is the host's, between its begin and end, rather than its GPU
  // time, measured with events on its lane's stream (IterationClock).
  [[nodiscard]] virtual bool timed_on_host() const = 0;
  // The stream a job's new block lives on, given its last lane's stream (or the device default
  // before its first iteration). Asked for every block: an answer each site gives at
  // construction, with no virtual call on the allocation path.
  [[nodiscard]] StreamHandle block_stream(StreamHandle lane) const {
    return blocks_on_lane_ ? lane : StreamHandle{};
  }
  // Whether blocks must be readable and writable from the host (AllocationRequest::host_access).
  [[nodiscard]] bool host_access() const { return host_access_; }
  // The curve that plans may place beside others' (JobView::curve), given the one measured;
  // nullptr: plans count the iteration's flat peak instead.
  [[nodiscard]] virtual const MemoryCurve* plan_curve(const MemoryCurve& measured) const = 0;
  // Whether a job's pages may move between tiers while it waits for its turn (a safe point).
  [[nodiscard]] virtual bool pages_rest_while_waiting() const = 0;
  // Whether a waiter may spin on a CPU as its turn nears (RuntimeOptions::turn_spin).
  [[nodiscard]] virtual bool may_spin() const = 0;

 protected:
  // `blocks_on_lane`: block_stream gives the lane's stream, else the device default.
  ComputeSite(bool blocks_on_lane, bool host_access)
      : blocks_on_lane_(blocks_on_lane), host_access_(host_access) {}

 private:
  const bool blocks_on_lane_;
  const bool host_access_;
};

// The site in force for a runtime, shared by its devices' schedulers.
using SiteChoice = std::atomic<const ComputeSite*>;

[[nodiscard]] inline std::shared_ptr<SiteChoice> make_site_choice(bool host_compute) {
  return std::make_shared<SiteChoice>(host_compute ? &ComputeSite::host() : &ComputeSite::gpu());
}

}  // namespace salus
