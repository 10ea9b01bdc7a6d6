#include "iteration_sched/stream_bindings.hpp"

#include <iterator>
#include <utility>

#include "iteration_sched/device_scheduler.hpp"

namespace salus {

void StreamBindings::run(StreamHandle lane, std::shared_ptr<JobRecordState> job) {
  std::lock_guard lock(mu_);
  running_[lane.value] = std::move(job);
}

void StreamBindings::stop(StreamHandle lane) {
  std::lock_guard lock(mu_);
  running_.erase(lane.value);
}

void StreamBindings::bind(StreamHandle stream, std::shared_ptr<JobRecordState> job) {
  std::lock_guard lock(mu_);
  bound_[stream.value] = std::move(job);
  if (stream.value == 0) default_bound_.store(true, std::memory_order_release);
}

bool StreamBindings::unbind(StreamHandle stream) {
  std::lock_guard lock(mu_);
  return bound_.erase(stream.value) > 0;
}

void StreamBindings::forget(JobId job) {
  std::lock_guard lock(mu_);
  const auto its = [job](const auto& entry) { return entry.second->id == job; };
  std::erase_if(running_, its);
  std::erase_if(bound_, its);
}

std::shared_ptr<JobRecordState> StreamBindings::job_on(StreamHandle stream) const {
  // Lanes are created streams, never the default stream: unless a framework bound that one, it
  // is nobody's, and the allocations of jobs computing on the host (all on it) skip the lock.
  if (stream.value == 0 && !default_bound_.load(std::memory_order_acquire)) return nullptr;
  std::lock_guard lock(mu_);
  if (const auto it = running_.find(stream.value); it != running_.end()) return it->second;
  if (const auto it = bound_.find(stream.value); it != bound_.end()) return it->second;
  return nullptr;
}

std::shared_ptr<JobRecordState> StreamBindings::running_on(StreamHandle lane) const {
  std::lock_guard lock(mu_);
  const auto it = running_.find(lane.value);
  return it == running_.end() ? nullptr : it->second;
}

}  // namespace salus
