#include "iteration_sched/compute_site.hpp"

namespace salus {

namespace {

// Iterations enqueue their work on their lane's stream and the host waits for nothing.
class GpuSite final : public ComputeSite {
 public:
  // A block lives on the stream that uses it first: the job's lane, which also orders its
  // memory's reuse and moves after the work enqueued there. The host never touches it.
  GpuSite() : ComputeSite(/*blocks_on_lane=*/true, /*host_access=*/false) {}
  bool timed_on_host() const override { return false; }
  const MemoryCurve* plan_curve(const MemoryCurve& measured) const override { return &measured; }
  // Waiting for its turn, a job enqueues nothing: nothing touches its pages.
  bool pages_rest_while_waiting() const override { return true; }
  bool may_spin() const override { return true; }
};

// Iterations compute on the host's cores (a CPU build of a framework, or tests that read their
// tensors on the host).
class HostSite final : public ComputeSite {
 public:
  // No stream orders host work: every job's blocks live on the device's default stream, one
  // heap whose partly used pages serve every job, not one heap per lane. The host reads and
  // writes them.
  HostSite() : ComputeSite(/*blocks_on_lane=*/false, /*host_access=*/true) {}
  // The work is done by the time its iteration ends: the host time is the time it took.
  bool timed_on_host() const override { return true; }
  // A curve's time axis is the iteration's wall time alone. Jobs that compute on the host share
  // the cores when they run at once, so their memory does not rise and fall on that schedule.
  const MemoryCurve* plan_curve(const MemoryCurve& /*measured*/) const override { return nullptr; }
  // A job's other threads (a data loader, a tensor's holder) may touch its memory at any moment,
  // so it never moves (new pages may still come from other tiers).
  bool pages_rest_while_waiting() const override { return false; }
  // The cores are the work's: a spinning waiter would take one from the iterations it waits for.
  bool may_spin() const override { return false; }
};

}  // namespace

const ComputeSite& ComputeSite::gpu() {
  static const GpuSite site;
  return site;
}

const ComputeSite& ComputeSite::host() {
  static const HostSite site;
  return site;
}

}  // namespace salus
