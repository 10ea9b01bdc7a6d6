#include "daemon/turn_fences.hpp"

namespace salus::daemon {

std::shared_ptr<const TurnFences::Fence> TurnFences::began(const void* job, std::uint64_t lane,
                                                           SessionId asking) {
  std::lock_guard lock(mu_);
  lane_of_[job] = lane;
  const auto it = by_lane_.find(lane);
  if (it == by_lane_.end() || it->second->from == asking) return nullptr;
  return it->second;
}

void TurnFences::ended(const void* job, std::shared_ptr<const Fence> fence, bool settled) {
  std::lock_guard lock(mu_);
  const auto it = lane_of_.find(job);
  if (it == lane_of_.end()) return;  // a turn granted through no begin here (none today)
  const std::uint64_t lane = it->second;
  lane_of_.erase(it);
  // No fence (a turn given back unused, or a process without interprocess events): the lane's
  // last one still stands for the work before.
  if (fence) {
    by_lane_[lane] = std::move(fence);
  } else if (settled) {
    by_lane_.erase(lane);
  }
}

void TurnFences::forget(SessionId session) {
  std::lock_guard lock(mu_);
  for (auto it = by_lane_.begin(); it != by_lane_.end();) {
    it = it->second->from == session ? by_lane_.erase(it) : std::next(it);
  }
}

}  // namespace salus::daemon
