#include "memory/job_table.hpp"

#include "memory/stream_heap.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace salus::memory {

namespace {
constexpr std::size_t index(Lifetime lifetime) {
  return static_cast<std::size_t>(lifetime);
}
}  // namespace

JobRecord::JobRecord(JobId job, std::string job_name, JobMemoryLimits limits)
    : id(job), name(std::move(job_name)) {
  set_limits(limits);
}

void JobRecord::set_limits(const JobMemoryLimits& limits) {
  limit_total.store(limits.total, std::memory_order_relaxed);
  limit_by_class[index(Lifetime::persistent)].store(limits.persistent, std::memory_order_relaxed);
  limit_by_class[index(Lifetime::ephemeral)].store(limits.ephemeral, std::memory_order_relaxed);
}

std::optional<std::string> JobRecord::try_charge(Lifetime lifetime, std::size_t bytes,
                                                Charge& produced) {
  const std::size_t total_limit = limit_total.load(std::memory_order_relaxed);
  const std::optional<std::size_t> total = in_use.try_add_unpeaked(bytes, total_limit);
  if (!total) return fmt::format("job budget of {} bytes would be exceeded", total_limit);
  const std::size_t class_limit = limit_by_class[index(lifetime)].load(std::memory_order_relaxed);
  const std::optional<std::size_t> in_class =
      by_class[index(lifetime)].try_add_unpeaked(bytes, class_limit);
  if (!in_class) {
    in_use.sub(bytes);
    return fmt::format("job {} budget of {} bytes would be exceeded", to_string(lifetime),
                       class_limit);
  }
  produced = {*total, *in_class};
  return std::nullopt;
}

void JobRecord::raise_peaks(Lifetime lifetime, const Charge& produced) {
  // Each placed charge raises the peaks to the counts it produced: the peak of the counts'
  // history, without the charges that were refused or could not be placed.
  in_use.raise_peak(produced.total);
  by_class[index(lifetime)].raise_peak(produced.in_class);
}

void JobRecord::uncharge(Lifetime lifetime, std::size_t bytes) {
  by_class[index(lifetime)].sub(bytes);
  in_use.sub(bytes);
}

void JobRecord::move_class(Lifetime from, Lifetime to, std::size_t bytes) {
  by_class[index(to)].add(bytes);
  by_class[index(from)].sub(bytes);
}

void JobRecord::sample_curve() {
  if (!sampling.load(std::memory_order_relaxed)) return;
  const auto now = std::chrono::steady_clock::now();
  const std::size_t level = by_class[index(Lifetime::ephemeral)].value();
  std::lock_guard lock(curve_mu);
  if (!sampling.load(std::memory_order_relaxed)) return;  // the iteration ended meanwhile
  curve.emplace_back(std::chrono::duration<double>(now - curve_start).count(),
                     level > curve_base ? level - curve_base : 0);
}

void JobRecord::note_heap(StreamHeap* heap) {
  std::lock_guard lock(heaps_mu);
  if (std::find(heaps.begin(), heaps.end(), heap) == heaps.end()) heaps.push_back(heap);
}

std::vector<StreamHeap*> JobRecord::heaps_used(int device) const {
  std::lock_guard lock(heaps_mu);
  std::vector<StreamHeap*> out;
  for (StreamHeap* heap : heaps) {
    if (device < 0 || heap->device() == device) out.push_back(heap);
  }
  return out;
}

JobTable::JobTable() {
  add("unattributed", {});
}

JobId JobTable::add(std::string name, JobMemoryLimits limits) {
  // The index is only known after the slot exists, so grow first and fill the slot after.
  // Registration is rare; serializing it keeps every slot below `registered_` complete.
  std::lock_guard lock(add_mu_);
  auto slot = jobs_.grow_by(1);
  const JobId job{static_cast<std::uint32_t>(slot - jobs_.begin())};
  slot->owner = std::make_unique<JobRecord>(job, std::move(name), limits);
  slot->published.store(slot->owner.get(), std::memory_order_release);
  registered_.store(job.value + 1, std::memory_order_release);
  return job;
}

JobRecord* JobTable::find(JobId job) const {
  if (job.value >= size()) return nullptr;
  return jobs_[job.value].published.load(std::memory_order_acquire);
}

JobRecord& JobTable::any(JobId job) const {
  JobRecord* record = find(job);
  if (record == nullptr) throw UnknownJob(job);
  return *record;
}

JobRecord& JobTable::live(JobId job) const {
  JobRecord& record = any(job);
  if (!record.alive.load(std::memory_order_acquire)) throw UnknownJob(job);
  return record;
}

bool JobTable::try_hold(JobId job) {
  JobRecord* record = find(job);
  if (record == nullptr) return false;
  std::lock_guard lock(record->activity_mu);
  if (record->active || record->activating) return false;
  ++record->moving;
  return true;
}

std::shared_ptr<const Event> JobTable::quiet_mark(JobId job, int device, StreamHandle stream) {
  JobRecord* record = find(job);
  if (record == nullptr) return nullptr;
  std::lock_guard lock(record->activity_mu);
  for (const auto& mark : record->quiet_marks) {
    if (mark.device == device && mark.stream == stream) return mark.event;
  }
  return nullptr;
}

void JobTable::streams_of(JobId job, int device, std::vector<StreamHandle>& out) const {
  if (const JobRecord* record = find(job)) streams_of(*record, device, out);
}

void JobTable::streams_of(const JobRecord& record, int device, std::vector<StreamHandle>& out) {
  if (!record.has_streams.load(std::memory_order_acquire)) return;
  std::lock_guard lock(record.streams_mu);
  for (const auto& [d, stream] : record.streams) {
    if (d == device) out.push_back(stream);
  }
}

void JobTable::add_stream(JobId job, int device, StreamHandle stream) {
  JobRecord& record = live(job);
  std::lock_guard lock(record.streams_mu);
  const std::pair<int, StreamHandle> entry{device, stream};
  if (std::find(record.streams.begin(), record.streams.end(), entry) != record.streams.end()) {
    return;
  }
  record.streams.push_back(entry);
  record.has_streams.store(true, std::memory_order_release);
}

std::vector<JobId> JobTable::remove_stream(int device, StreamHandle stream) {
  std::vector<JobId> had;
  const std::pair<int, StreamHandle> entry{device, stream};
  for (std::size_t j = 0; j < size(); ++j) {
    JobRecord* record = find(JobId{static_cast<std::uint32_t>(j)});
    if (record == nullptr || !record->has_streams.load(std::memory_order_acquire)) continue;
    std::lock_guard lock(record->streams_mu);
    if (std::erase(record->streams, entry) > 0) had.push_back(record->id);
  }
  return had;
}

bool JobTable::may_move(JobId job) {
  JobRecord* record = find(job);
  if (record == nullptr) return false;
  std::lock_guard lock(record->activity_mu);
  return !record->active && !record->activating;
}

void JobTable::release(JobId job) {
  JobRecord* record = find(job);
  if (record == nullptr) return;
  std::lock_guard lock(record->activity_mu);
  if (--record->moving == 0) record->activity_cv.notify_all();
}

}  // namespace salus::memory
