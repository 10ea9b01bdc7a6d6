#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "memory/device_heap.hpp"
#include "memory/job_table.hpp"
#include "salus/memory.hpp"

namespace salus {

using memory::DeviceHeap;
using memory::FreedBlock;
using memory::JobRecord;
using memory::StreamHeap;

const char* to_string(Lifetime lifetime) noexcept {
  return lifetime == Lifetime::persistent ? "persistent" : "ephemeral";
}

class MemoryManager::Impl {
 public:
  Impl(std::shared_ptr<DeviceBackend> backend, MemoryOptions options)
      : backend_(std::move(backend)) {
    if (!backend_) throw InvalidArgument("MemoryManager needs a device backend, got none");
    if (options.va_factor == 0) throw InvalidArgument("MemoryOptions::va_factor must be at least 1");
    const int count = backend_->device_count();
    if (static_cast<std::size_t>(count) < options.device_limits.size()) {
      throw InvalidArgument(fmt::format("MemoryOptions::device_limits names {} devices; the {} "
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
      heaps_.push_back(std::make_unique<DeviceHeap>(backend_, d, limit, options.va_factor));
    }
  }

  DeviceHeap& heap(int device) const {
    if (device < 0 || device >= static_cast<int>(heaps_.size())) {
      throw InvalidArgument(
          fmt::format("device {} does not exist (the {} backend has {} devices)", device,
                      backend_->name(), heaps_.size()));
    }
    return *heaps_[static_cast<std::size_t>(device)];
  }

  // The device heap and stream heap that own `ptr`.
  std::pair<DeviceHeap*, StreamHeap*> owner_of(DevicePtr ptr, const char* what) const {
    for (const auto& device : heaps_) {
      if (StreamHeap* heap = device->heap_of(ptr)) return {device.get(), heap};
    }
    throw InvalidArgument(
        fmt::format("{}: {:#x} is not memory Salus handed out (unknown pointer)", what, ptr));
  }

  DevicePtr allocate(const AllocationRequest& request) {
    DeviceHeap& device = heap(request.device);
    if (request.bytes == 0) throw InvalidArgument("allocate: size 0 (a block needs at least a byte)");
    if (request.bytes > device.limit()) {
      throw InvalidArgument(fmt::format(
          "allocate: {} bytes can never fit device {}, which may hold {} bytes", request.bytes,
          request.device, device.limit()));
    }
    if (request.lifetime != Lifetime::persistent && request.lifetime != Lifetime::ephemeral) {
      throw InvalidArgument("allocate: lifetime is neither persistent nor ephemeral");
    }
    const std::size_t bytes = round_up(request.bytes);
    JobRecord& job = jobs_.live(request.job);
    if (auto refusal = job.try_charge(request.lifetime, bytes)) {
      device.counters().out_of_memory.fetch_add(1, std::memory_order_relaxed);
      throw OutOfMemory(oom_info(job, device, request, *refusal, true));
    }
    std::string why_not;
    DevicePtr ptr = 0;
    try {
      ptr = device.allocate(request, bytes, why_not);
    } catch (...) {
      job.uncharge(request.lifetime, bytes);
      throw;
    }
    if (ptr == 0) {
      job.uncharge(request.lifetime, bytes);
      throw OutOfMemory(oom_info(job, device, request, why_not, false));
    }
    // A release_job that raced with this allocation may have walked past the new block.
    if (!job.alive.load(std::memory_order_acquire)) {
      deallocate(ptr, std::nullopt, std::nullopt);
      throw UnknownJob(request.job.value);
    }
    return ptr;
  }

  void deallocate(DevicePtr ptr, std::optional<std::size_t> bytes, std::optional<int> device) {
    auto [owner, heap] = owner_of(ptr, "free");
    if (device && *device != owner->device()) {
      throw InvalidArgument(fmt::format("free: {:#x} lives on device {}, not device {}", ptr,
                                        owner->device(), *device));
    }
    const FreedBlock freed = heap->deallocate(ptr, bytes);
    jobs_.any(freed.job).uncharge(freed.lifetime, freed.bytes);
  }

  OutOfMemoryInfo oom_info(const JobRecord& job, const DeviceHeap& device,
                           const AllocationRequest& request, std::string reason,
                           bool job_budget) const {
    return {.job = job.id.value,
            .job_name = job.name,
            .device = device.device(),
            .requested_bytes = request.bytes,
            .job_in_use_bytes = job.in_use_total.load(std::memory_order_relaxed),
            .job_limit_bytes = job_budget ? job.limit_total.load(std::memory_order_relaxed) : 0,
            .device_in_use_bytes = device.counters().allocated.load(std::memory_order_relaxed),
            .device_limit_bytes = device.limit(),
            .reason = std::move(reason)};
  }

  static std::size_t round_up(std::size_t bytes) {
    constexpr std::size_t a = kBlockAlignment;
    return (bytes + a - 1) / a * a;
  }

  void release_job(JobId id) {
    if (id == kUnattributedJob) throw InvalidArgument("release_job: the unattributed job is permanent");
    JobRecord& job = jobs_.live(id);
    job.alive.store(false, std::memory_order_release);
    for (const auto& device : heaps_) {
      device->for_each_stream_heap([&](StreamHeap& heap) {
        heap.release_job(id, [&](const FreedBlock& f) { job.uncharge(f.lifetime, f.bytes); });
      });
    }
  }

  std::size_t promote(JobId id) {
    JobRecord& job = jobs_.live(id);
    std::size_t total = 0;
    for (const auto& device : heaps_) {
      device->for_each_stream_heap([&](StreamHeap& heap) {
        const std::size_t bytes = heap.promote(id).first;
        if (bytes == 0) return;
        job.move_class(Lifetime::ephemeral, Lifetime::persistent, bytes);
        total += bytes;
      });
    }
    job.promoted.fetch_add(total, std::memory_order_relaxed);
    return total;
  }

  std::size_t trim(DeviceHeap& device) {
    device.for_each_stream_heap(
        [](StreamHeap& heap) { heap.reclaim_pages(std::numeric_limits<std::size_t>::max()); });
    return device.pool().trim();
  }

  JobMemoryStats job_stats(const JobRecord& job) const {
    JobMemoryStats s;
    s.job = job.id;
    s.name = job.name;
    s.alive = job.alive.load(std::memory_order_relaxed);
    std::size_t blocks[kLifetimeCount] = {};
    for (const auto& device : heaps_) {
      std::size_t bytes = 0;
      device->for_each_stream_heap([&](StreamHeap& heap) {
        const StreamHeap::JobUsage usage = heap.job_usage(job.id);
        for (std::size_t c = 0; c < kLifetimeCount; ++c) {
          bytes += usage.bytes[c];
          blocks[c] += usage.blocks[c];
        }
      });
      s.in_use_by_device.push_back(bytes);
    }
    for (std::size_t c = 0; c < kLifetimeCount; ++c) {
      s.by_class[c] = {job.in_use_by_class[c].load(std::memory_order_relaxed),
                       job.peak_by_class[c].load(std::memory_order_relaxed), blocks[c]};
    }
    s.in_use = job.in_use_total.load(std::memory_order_relaxed);
    s.peak = job.peak_total.load(std::memory_order_relaxed);
    s.promoted_bytes = job.promoted.load(std::memory_order_relaxed);
    return s;
  }

  std::shared_ptr<DeviceBackend> backend_;
  std::vector<std::unique_ptr<DeviceHeap>> heaps_;
  memory::JobTable jobs_;
};

MemoryManager::MemoryManager(std::shared_ptr<DeviceBackend> backend, MemoryOptions options)
    : impl_(std::make_unique<Impl>(std::move(backend), std::move(options))) {}

MemoryManager::~MemoryManager() = default;

DeviceBackend& MemoryManager::backend() const noexcept { return *impl_->backend_; }
int MemoryManager::device_count() const noexcept { return static_cast<int>(impl_->heaps_.size()); }

JobId MemoryManager::register_job(std::string name, JobMemoryLimits limits) {
  return impl_->jobs_.add(std::move(name), limits);
}

void MemoryManager::set_job_limits(JobId job, JobMemoryLimits limits) {
  impl_->jobs_.live(job).set_limits(limits);
}

void MemoryManager::release_job(JobId job) { impl_->release_job(job); }
std::size_t MemoryManager::promote_ephemeral(JobId job) { return impl_->promote(job); }
DevicePtr MemoryManager::allocate(const AllocationRequest& request) { return impl_->allocate(request); }
void MemoryManager::deallocate(DevicePtr ptr) { impl_->deallocate(ptr, std::nullopt, std::nullopt); }

void MemoryManager::deallocate(DevicePtr ptr, std::size_t bytes, int device) {
  impl_->deallocate(ptr, bytes, device);
}

void MemoryManager::record_stream_use(DevicePtr ptr, StreamHandle stream) {
  impl_->owner_of(ptr, "record_stream_use").second->record_stream_use(ptr, stream);
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
  return released;
}

std::size_t MemoryManager::trim(int device) { return impl_->trim(impl_->heap(device)); }

void MemoryManager::remap(DevicePtr ptr, Location where) {
  impl_->owner_of(ptr, "remap").second->remap(ptr, where);
}

MemoryStats MemoryManager::stats() const {
  MemoryStats s;
  for (const auto& device : impl_->heaps_) s.devices.push_back(device->stats());
  for (std::size_t j = 0; j < impl_->jobs_.size(); ++j) {
    // A job being registered right now has a slot but no record yet.
    if (const auto* job = impl_->jobs_.find(JobId{static_cast<std::uint32_t>(j)})) {
      s.jobs.push_back(impl_->job_stats(*job));
    }
  }
  return s;
}

DeviceMemoryStats MemoryManager::device_stats(int device) const { return impl_->heap(device).stats(); }

JobMemoryStats MemoryManager::job_stats(JobId job) const {
  return impl_->job_stats(impl_->jobs_.any(job));
}

void MemoryManager::reset_peaks() {
  for (const auto& device : impl_->heaps_) device->reset_peaks();
}

}  // namespace salus
