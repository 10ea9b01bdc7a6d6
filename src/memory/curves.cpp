// The memory manager's curves (memory/curves.hpp): its Impl implements them over JobRecord.
#include "memory/curves.hpp"

#include "memory/memory_manager_impl.hpp"

namespace salus {

memory::Curves& memory_curves(MemoryManager& memory) noexcept {
  return *memory.impl_;
}

void MemoryManager::Impl::begin_curve(JobId job) {
  memory::JobRecord& record = jobs_.live(job);
  std::lock_guard lock(record.curve_mu);
  record.curve.clear();
  record.curve_start = std::chrono::steady_clock::now();
  record.curve_base = record.by_class[static_cast<std::size_t>(Lifetime::ephemeral)].value();
  record.sampling.store(true, std::memory_order_relaxed);
}

memory::CurveSamples MemoryManager::Impl::end_curve(JobId job) {
  memory::JobRecord* record = jobs_.find(job);
  if (record == nullptr) return {};
  std::lock_guard lock(record->curve_mu);
  record->sampling.store(false, std::memory_order_relaxed);
  return std::exchange(record->curve, {});
}

}  // namespace salus
