// The tiers below a device's own memory: idle pages of peers (lent) and host memory. Tiers knows
// every location's page source (PageSource), ranks each device's lenders by link, and routes pages
// home.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "memory/page_pool.hpp"
#include "salus/memory.hpp"

namespace salus::memory {

// Ranks every device's peers by how fast the device reaches their memory: NVLink-class links
// first, then the driver's performance rank, then bandwidth. Peers it cannot access are left out.
std::vector<std::vector<Lender>> rank_lenders(const DeviceBackend& backend);

// The tier of a page at `where` as seen from `device`.
inline Tier tier_of(Location where, int device) {
  if (where.is_host()) return Tier::host;
  return where.index == device ? Tier::local : Tier::peer;
}

// Says whether a job's pages may move now; a holder keeps the answer true until release.
class JobGate {
 public:
  virtual ~JobGate() = default;
  virtual bool try_hold(JobId job) = 0;
  virtual void release(JobId job) = 0;
  // What try_hold would answer now, without holding (for counting candidates).
  virtual bool may_move(JobId job) = 0;
  // An event recorded on `stream` of `device` when the job turned quiescent: its work there is
  // all before it. Null when there is none (then the stream's work so far has to do).
  virtual std::shared_ptr<const Event> quiet_mark(JobId job, int device, StreamHandle stream) = 0;
};

// What JobGate::quiet_mark answers from.
struct QuietMark {
  int device = 0;
  StreamHandle stream;
  std::shared_ptr<const Event> event;
};

class Tiers {
 public:
  Tiers(DeviceBackend& backend, HarvestOptions options);
  Tiers(const Tiers&) = delete;
  Tiers& operator=(const Tiers&) = delete;

  // Called once per device, in device order, with the device's own pages.
  void add_device(PageSource& pool);

  [[nodiscard]] const HarvestOptions& options() const { return options_; }
  [[nodiscard]] bool spills() const { return options_.spill != SpillPolicy::none; }
  [[nodiscard]] const std::vector<Lender>& lenders(int device) const;
  [[nodiscard]] PageSource& pool(Location where);
  // The host tier; null when the backend offers no host chunks.
  [[nodiscard]] PageSource* host() { return host_ ? &*host_ : nullptr; }
  [[nodiscard]] std::size_t host_held_bytes() const { return host_ ? host_->held_bytes() : 0; }
  [[nodiscard]] bool has_host() const { return host_.has_value(); }
  [[nodiscard]] std::size_t reserve_bytes(int device) const;
  // Whether pages of `pool` can be mapped into `device`'s ranges (same page size).
  [[nodiscard]] bool fits(int device, const PageSource& pool) const;

  // Appends up to `count` pages a level below `device`'s own memory, by the spill policy: lenders
  // with room beyond their reserve, best first, then the host. Returns how many.
  std::size_t borrow(int device, std::size_t count, std::vector<Page>& out);
  // As borrow, from one location, ignoring the lender's reserve (explicit remap).
  std::size_t borrow_from(int device, Location where, std::size_t count, std::vector<Page>& out);
  // Pages that `device` no longer maps go back to their pools. Empties `pages`.
  void give_back(int device, std::vector<Page>& pages);
  void give_back(int device, Page page);

  // Move reports.
  void set_observer(std::function<void(const MoveRecord&)> observer);
  void report(const MoveRecord& record);

  // Safe points: lenders waiting for running borrowers sleep here until some job turns quiescent.
  void notify_safe_point();
  // Waits until notify_safe_point or the deadline; returns false at the deadline.
  bool wait_safe_point(std::chrono::steady_clock::time_point deadline, std::uint64_t seen);
  [[nodiscard]] std::uint64_t safe_points() const;

 private:
  DeviceBackend& backend_;
  const HarvestOptions options_;
  std::vector<std::vector<Lender>> lenders_;
  std::vector<PageSource*> device_pools_;
  std::optional<PagePool> host_;

  std::mutex observer_mu_;
  std::shared_ptr<const std::function<void(const MoveRecord&)>> observer_;

  mutable std::mutex safe_mu_;
  std::condition_variable safe_cv_;
  std::uint64_t safe_points_ = 0;  // guarded by safe_mu_
};

}  // namespace salus::memory
