#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "memory/memory_manager_impl.hpp"

namespace salus {

using memory::DeviceHeap;
using memory::FreedBlock;
using memory::JobRecord;
using memory::StreamHeap;

const char* to_string(Lifetime lifetime) noexcept {
  return lifetime == Lifetime::persistent ? "persistent" : "ephemeral";
}

const char* to_string(Tier tier) noexcept {
  switch (tier) {
    case Tier::local:
      return "local";
    case Tier::peer:
      return "peer";
    case Tier::host:
      return "host";
  }
  return "unknown";
}

const char* to_string(SpillPolicy policy) noexcept {
  switch (policy) {
    case SpillPolicy::none:
      return "none";
    case SpillPolicy::host_only:
      return "host_only";
    case SpillPolicy::peer_then_host:
      return "peer_then_host";
  }
  return "unknown";
}

const char* to_string(MoveReason reason) noexcept {
  switch (reason) {
    case MoveReason::demote:
      return "demote";
    case MoveReason::recall:
      return "recall";
    case MoveReason::fetch:
      return "fetch";
    case MoveReason::prefetch:
      return "prefetch";
    case MoveReason::remap:
      return "remap";
  }
  return "unknown";
}

MemoryManager::Impl::Impl(std::shared_ptr<DeviceBackend> backend, MemoryOptions options)
    : backend_(checked(std::move(backend))), tiers_(*backend_, options.harvest) {
  if (options.va_factor == 0) throw InvalidArgument("MemoryOptions::va_factor must be at least 1");
  if (options.capture_guard != CaptureGuard::salus_asks &&
      options.capture_guard != CaptureGuard::framework_refuses) {
    throw InvalidArgument("MemoryOptions::capture_guard is not a CaptureGuard");
  }
  capture_guard_.store(options.capture_guard, std::memory_order_relaxed);
  const int count = backend_->device_count();
  std::size_t largest = 0;
  if (static_cast<std::size_t>(count) < options.device_limits.size()) {
    throw InvalidArgument(
        fmt::format("MemoryOptions::device_limits names {} devices; the {} "
                    "backend has {}",
                    options.device_limits.size(), backend_->name(), count));
  }
  for (int d = 0; d < count; ++d) {
    const DeviceProperties props = backend_->properties(d);
    std::size_t limit = d < static_cast<int>(options.device_limits.size())
                            ? options.device_limits[static_cast<std::size_t>(d)]
                            : 0;
    if (limit == 0) {
      limit = props.total_memory > options.device_headroom_bytes
                  ? props.total_memory - options.device_headroom_bytes
                  : 0;
    }
    if (limit > props.total_memory) {
      throw InvalidArgument(fmt::format("device {} limit of {} bytes is beyond its {} bytes", d,
                                        limit, props.total_memory));
    }
    // Only whole pages can be held.
    limit -= limit % props.granularity;
    if (limit == 0) {
      throw InvalidArgument(fmt::format("device {} would get no memory (limit below one page)", d));
    }
    largest = std::max(largest, limit);
    heaps_.push_back(
        std::make_unique<DeviceHeap>(backend_, tiers_, jobs_, d, limit, options.va_factor));
  }
  // One reserve for every device: above a small device's limit it only means that device never
  // lends; above every device's, nothing could ever be lent, which is a mistake (a unit).
  if (const auto& reserve = options.harvest.lend_reserve_bytes; reserve && *reserve > largest) {
    throw InvalidArgument(fmt::format(
        "HarvestOptions::lend_reserve_bytes ({} bytes) is more than any device may hold (at "
        "most {} bytes): no device could ever lend",
        *reserve, largest));
  }
  harvester_ = std::make_unique<memory::Harvester>(heaps_, tiers_, jobs_);
}

MemoryManager::Impl::~Impl() {
  harvester_.reset();
  // Pages go home to their pools as each device's ranges close, so every pool must still be
  // there when any device closes.
  for (const auto& device : heaps_) device->close();
}

std::shared_ptr<DeviceBackend> MemoryManager::Impl::checked(
    std::shared_ptr<DeviceBackend> backend) {
  if (!backend) throw InvalidArgument("MemoryManager needs a device backend, got none");
  return backend;
}

DeviceHeap& MemoryManager::Impl::heap(int device) const {
  if (device < 0 || device >= static_cast<int>(heaps_.size())) {
    throw InvalidArgument(fmt::format("device {} does not exist (the {} backend has {} devices)",
                                      device, backend_->name(), heaps_.size()));
  }
  return *heaps_[static_cast<std::size_t>(device)];
}

std::pair<DeviceHeap*, StreamHeap*> MemoryManager::Impl::owner_of(DevicePtr ptr,
                                                                  const char* what) const {
  for (const auto& device : heaps_) {
    if (StreamHeap* heap = device->heap_of(ptr)) return {device.get(), heap};
  }
  throw InvalidArgument(
      fmt::format("{}: {:#x} is not memory Salus handed out (unknown pointer)", what, ptr));
}

void MemoryManager::Impl::release_job(JobId id) {
  if (id == kUnattributedJob)
    throw InvalidArgument("release_job: the unattributed job is permanent");
  JobRecord& job = jobs_.live(id);
  job.alive.store(false, std::memory_order_release);
  try {
    // The heaps it used, read after marking it gone: see JobRecord::heaps.
    for (StreamHeap* heap : job.heaps_used()) {
      heap->release_job(id, [&](const FreedBlock& f) { job.uncharge(f.lifetime, f.bytes); });
    }
  } catch (...) {
    // A block whose free failed (its fence could not be recorded) is still the job's, and so
    // is everything after it: the job stays registered with them, and a later call finishes.
    job.alive.store(true, std::memory_order_release);
    throw;
  }
}

void MemoryManager::Impl::orphan_job(JobId id) {
  if (id == kUnattributedJob)
    throw InvalidArgument("orphan_job: the unattributed job is permanent");
  JobRecord& job = jobs_.live(id);
  JobRecord& nobody = jobs_.live(kUnattributedJob);
  job.alive.store(false, std::memory_order_release);
  for (StreamHeap* heap : job.heaps_used()) {  // read after marking it gone: see JobRecord::heaps
    heap->orphan_job(id, [&](Lifetime was, std::size_t bytes) {
      job.uncharge(was, bytes);
      JobRecord::Charge charge;
      if (!nobody.try_charge(Lifetime::persistent, bytes, charge)) {  // unlimited: no refusal
        nobody.raise_peaks(Lifetime::persistent, charge);
      }
    });
  }
}

std::size_t MemoryManager::Impl::promote(JobId id) {
  JobRecord& job = jobs_.live(id);
  std::size_t total = 0;
  for (StreamHeap* heap : job.heaps_used()) {
    const std::size_t bytes = heap->promote(id).first;
    if (bytes == 0) continue;
    job.move_class(Lifetime::ephemeral, Lifetime::persistent, bytes);
    total += bytes;
  }
  job.promoted.fetch_add(total, std::memory_order_relaxed);
  return total;
}

std::size_t MemoryManager::Impl::trim(DeviceHeap& device,
                                      std::size_t (memory::PagePool::*release)()) {
  // A prefetch round's pages are in no pool until it has moved them: trim would miss them.
  const auto rounds = harvester_->hold_prefetches();
  // A backend that gives pages back behind their work (a process of salusd: the next process
  // waits for it on the GPU) needs no wait here; the old addresses of pages given up that way
  // are unmapped by a later settle, once their work has finished. Others wait, so that a page
  // released to the driver is mapped nowhere.
  const bool wait = !device.backend().defers_release();
  settle_all(wait);  // blocks set aside while their addresses retired are free again
  device.for_each_stream_heap(
      [](StreamHeap& heap) { heap.reclaim_pages(std::numeric_limits<std::size_t>::max()); });
  settle_all(wait);
  return (device.pool().*release)();
}

// Old addresses of handed-off pages go once their work has finished (waiting for it), so that
// a page released to the driver is mapped nowhere. A page of one device may be retiring in
// another device's range (it was lent), so every device settles.
void MemoryManager::Impl::settle_all(bool wait) {
  for (const auto& device : heaps_) device->settle(wait);
}

JobMemoryStats MemoryManager::Impl::job_stats(const JobRecord& job) const {
  JobMemoryStats s;
  s.job = job.id;
  s.name = job.name;
  s.alive = job.alive.load(std::memory_order_relaxed);
  std::size_t blocks[kLifetimeCount] = {};
  s.in_use_by_device.assign(heaps_.size(), 0);
  const std::vector<StreamHeap*> used = job.heaps_used();
  for (StreamHeap* heap : used) {
    const StreamHeap::JobUsage usage = heap->job_usage(job.id);
    for (std::size_t c = 0; c < kLifetimeCount; ++c) {
      s.in_use_by_device[static_cast<std::size_t>(heap->device())] += usage.bytes[c];
      blocks[c] += usage.blocks[c];
    }
  }
  for (std::size_t c = 0; c < kLifetimeCount; ++c) {
    s.by_class[c] = {job.by_class[c].value(), job.by_class[c].peak(), blocks[c]};
  }
  s.in_use = job.in_use.value();
  s.peak = job.in_use.peak();
  s.promoted_bytes = job.promoted.load(std::memory_order_relaxed);
  for (StreamHeap* heap : used) heap->add_tier_usage(job.id, s.in_use_by_tier);
  {
    std::lock_guard lock(job.activity_mu);
    s.quiescent = job.active ? 0 : 1;
  }
  s.activations = job.activations.load(std::memory_order_relaxed);
  s.activations_after_move = job.activations_after_move.load(std::memory_order_relaxed);
  s.activations_waited = job.activations_waited.load(std::memory_order_relaxed);
  s.fetched_bytes = job.fetched_bytes.load(std::memory_order_relaxed);
  s.prefetched_bytes = job.prefetched_bytes.load(std::memory_order_relaxed);
  return s;
}

MemoryManager::MemoryManager(std::shared_ptr<DeviceBackend> backend, MemoryOptions options)
    : impl_(std::make_unique<Impl>(std::move(backend), std::move(options))) {}

MemoryManager::~MemoryManager() = default;

DeviceBackend& MemoryManager::backend() const noexcept {
  return *impl_->backend_;
}
int MemoryManager::device_count() const noexcept {
  return static_cast<int>(impl_->heaps_.size());
}

JobId MemoryManager::register_job(std::string name, JobMemoryLimits limits) {
  return impl_->jobs_.add(std::move(name), limits);
}

void MemoryManager::set_job_limits(JobId job, JobMemoryLimits limits) {
  impl_->jobs_.live(job).set_limits(limits);
}

void MemoryManager::release_job(JobId job) {
  impl_->release_job(job);
}
void MemoryManager::orphan_job(JobId job) {
  impl_->orphan_job(job);
}
std::size_t MemoryManager::promote_ephemeral(JobId job) {
  return impl_->promote(job);
}
DevicePtr MemoryManager::allocate(const AllocationRequest& request) {
  return impl_->allocate(request);
}
void MemoryManager::deallocate(DevicePtr ptr) {
  impl_->deallocate(ptr, std::nullopt, std::nullopt);
}

void MemoryManager::deallocate(DevicePtr ptr, std::size_t bytes, int device) {
  impl_->deallocate(ptr, bytes, device);
}

MemoryManager::FreedBlockInfo MemoryManager::deallocate(DevicePtr ptr, const FreeCheck& check) {
  return impl_->deallocate(ptr, check.bytes, check.device, check.job);
}

void MemoryManager::record_stream_use(DevicePtr ptr, StreamHandle stream) {
  auto [device, heap] = impl_->owner_of(ptr, "record_stream_use");
  device->validate(stream);  // its fences will be recorded on it: a bogus handle goes now
  heap->record_stream_use(ptr, stream);
}

void MemoryManager::add_job_stream(JobId job, int device, StreamHandle stream) {
  DeviceHeap& heap = impl_->heap(device);
  (void)impl_->jobs_.live(job);
  heap.validate(stream);
  impl_->jobs_.add_stream(job, device, stream);
  // What a framework does when it uses a block on a stream other than the one it was allocated
  // on: that stream waits for the allocation stream. Idle streams have nothing to wait for; a
  // retired stream's work is what its retire fence caught.
  std::vector<StreamHandle> busy;
  std::vector<memory::FencePtr> retired;
  heap.for_each_stream_heap([&](StreamHeap& other) {
    const StreamHandle s = other.stream();
    if (s == stream || !other.has_job(job)) return;
    if (s.value == StreamHeap::kRetiredStream) {
      if (auto fence = other.retire_fence()) retired.push_back(std::move(fence));
    } else if (!heap.backend().query_stream(s, device)) {
      busy.push_back(s);
    }
  });
  if (!busy.empty()) {
    if (const auto fence = memory::Fence::after(heap.events(), busy)) {
      fence->order(heap.backend(), stream, device);
    }
  }
  for (const auto& fence : retired) fence->order(heap.backend(), stream, device);
}

void MemoryManager::retire_stream(int device, StreamHandle stream) {
  DeviceHeap& heap = impl_->heap(device);
  if (stream.value == 0) {
    throw InvalidArgument(
        "retire_stream: stream 0 is the default stream, which is never destroyed");
  }
  StreamHeap* own = heap.find_heap(stream);
  // A stream the device has a heap for was checked when first met. Any other handle must be a
  // live stream of this device: one that is no stream (never made, destroyed) or another
  // device's is refused here, before anything changes, rather than retired as a no-op.
  if (own == nullptr) heap.validate(stream);
  memory::FencePtr fence = own != nullptr ? own->retire() : nullptr;
  // A stream without a heap is fenced only if something names it: the stream is still alive here.
  bool fenced = own != nullptr;
  auto fence_now = [&]() -> const memory::FencePtr& {
    if (!std::exchange(fenced, true) && !heap.backend().query_stream(stream, device)) {
      const StreamHandle s[] = {stream};
      fence = memory::Fence::after(heap.events(), s);
    }
    return fence;
  };
  // Jobs that worked on the stream, and blocks recorded on it, stop naming it: their memory
  // waits for the fence instead of recording on a destroyed stream.
  const std::vector<JobId> jobs = impl_->jobs_.remove_stream(device, stream);
  heap.for_each_stream_heap([&](StreamHeap& h) { h.forget_stream(stream, fence_now, jobs); });
}

std::optional<BlockInfo> MemoryManager::find(DevicePtr ptr) const {
  for (const auto& device : impl_->heaps_) {
    if (StreamHeap* heap = device->heap_of(ptr)) return heap->find(ptr);
  }
  return std::nullopt;
}

std::size_t MemoryManager::trim() {
  std::size_t released = 0;
  for (const auto& device : impl_->heaps_) released += impl_->trim(*device);
  memory::PageSource* host = impl_->tiers_.host();
  return released + (host != nullptr ? host->trim() : 0);
}

std::size_t MemoryManager::trim(int device) {
  return impl_->trim(impl_->heap(device));
}

std::size_t MemoryManager::trim_idle() {
  std::size_t released = 0;
  for (const auto& device : impl_->heaps_) {
    released += impl_->trim(*device, &memory::PagePool::trim_idle);
  }
  return released;
}

void MemoryManager::remap(DevicePtr ptr, Location where) {
  impl_->owner_of(ptr, "remap").second->remap(ptr, where);
}

std::size_t MemoryManager::reachable_bytes(int device) const {
  const DeviceHeap& heap = impl_->heap(device);
  const memory::Tiers& tiers = impl_->tiers_;
  std::size_t total = heap.limit();
  auto add = [&](std::size_t bytes) {
    total = bytes > kUnlimited - total ? kUnlimited : total + bytes;
  };
  if (tiers.options().spill == SpillPolicy::peer_then_host) {
    for (const Lender& lender : tiers.lenders(device)) {
      const std::size_t limit = impl_->heap(lender.device).limit();
      const std::size_t reserve = tiers.reserve_bytes(lender.device);
      add(limit > reserve ? limit - reserve : 0);
    }
  }
  if (tiers.spills() && tiers.has_host()) add(tiers.options().host_limit_bytes);
  return total;
}

std::vector<Lender> MemoryManager::lenders(int device) const {
  (void)impl_->heap(device);
  return impl_->tiers_.lenders(device);
}

const char* to_string(CaptureGuard guard) noexcept {
  switch (guard) {
    case CaptureGuard::salus_asks:
      return "salus_asks";
    case CaptureGuard::framework_refuses:
      return "framework_refuses";
  }
  return "unknown";
}

void MemoryManager::set_capture_guard(CaptureGuard guard) {
  if (guard != CaptureGuard::salus_asks && guard != CaptureGuard::framework_refuses) {
    throw InvalidArgument("set_capture_guard: not a CaptureGuard");
  }
  impl_->capture_guard_.store(guard, std::memory_order_relaxed);
}

CaptureGuard MemoryManager::capture_guard() const {
  return impl_->capture_guard_.load(std::memory_order_relaxed);
}

void MemoryManager::set_move_observer(std::function<void(const MoveRecord&)> observer) {
  impl_->tiers_.set_observer(std::move(observer));
}

MemoryStats MemoryManager::stats() const {
  MemoryStats s;
  s.host_spill_bytes = impl_->tiers_.host_held_bytes();
  s.host_tier_available = impl_->tiers_.has_host();
  for (const auto& device : impl_->heaps_) s.devices.push_back(device->stats());
  for (std::size_t j = 0; j < impl_->jobs_.size(); ++j) {
    // A job being registered right now has a slot but no record yet.
    if (const auto* job = impl_->jobs_.find(JobId{static_cast<std::uint32_t>(j)})) {
      s.jobs.push_back(impl_->job_stats(*job));
    }
  }
  return s;
}

DeviceMemoryStats MemoryManager::device_stats(int device) const {
  return impl_->heap(device).stats();
}

JobMemoryStats MemoryManager::job_stats(JobId job) const {
  return impl_->job_stats(impl_->jobs_.any(job));
}

void MemoryManager::reset_peaks() {
  for (const auto& device : impl_->heaps_) device->reset_peaks();
}

}  // namespace salus
