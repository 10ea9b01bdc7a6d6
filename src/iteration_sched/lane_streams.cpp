#include "iteration_sched/lane_streams.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace salus {

LaneStreams::LaneStreams(std::shared_ptr<DeviceBackend> backend, int device, bool slots)
    : backend_(std::move(backend)), device_(device), slots_(slots) {}

StreamHandle LaneStreams::take(int& lane, JobKind first_user) {
  std::lock_guard lock(mu_);
  if (slots_) {
    const auto free = std::find(busy_.begin(), busy_.end(), false);
    lane = static_cast<int>(free - busy_.begin());
    if (free == busy_.end()) {
      busy_.push_back(true);
    } else {
      *free = true;
    }
  }
  if (lane < 0) throw InvalidArgument(fmt::format("decision core gave lane {}", lane));
  const auto index = static_cast<std::size_t>(lane);
  if (streams_.size() <= index) streams_.resize(index + 1);
  if (!streams_[index]) {
    const StreamPriorityRange range = backend_->stream_priority_range(device_);
    const int priority = first_user == JobKind::inference ? range.greatest : range.least;
    streams_[index].emplace(backend_, device_, priority);
  }
  return streams_[index]->handle();
}

void LaneStreams::release(int lane) {
  if (!slots_ || lane < 0) return;  // a lane keeps its stream: nothing to do, no lock
  std::lock_guard lock(mu_);
  if (static_cast<std::size_t>(lane) < busy_.size()) busy_[static_cast<std::size_t>(lane)] = false;
}

std::optional<StreamHandle> LaneStreams::stream_of(int lane) const {
  std::lock_guard lock(mu_);
  const auto index = static_cast<std::size_t>(lane);
  if (lane < 0 || index >= streams_.size() || !streams_[index]) return std::nullopt;
  return streams_[index]->handle();
}

std::vector<StreamHandle> LaneStreams::all() const {
  std::lock_guard lock(mu_);
  std::vector<StreamHandle> out;
  for (const auto& s : streams_) {
    if (s) out.push_back(s->handle());
  }
  return out;
}

void LaneStreams::clear() {
  std::vector<std::optional<Stream>> going;
  {
    std::lock_guard lock(mu_);
    going.swap(streams_);
  }
  going.clear();  // drains each, outside the lock
}

}  // namespace salus
