// MemoryManager::Impl: allocate and free (checks, charges, out-of-memory reports). Where a charged
// request's pages come from is placement.cpp's.
#include <fmt/format.h>

#include <limits>
#include <utility>

#include "memory/memory_manager_impl.hpp"

namespace salus {

using memory::DeviceHeap;
using memory::FreedBlock;
using memory::JobRecord;
using memory::StreamHeap;

DevicePtr MemoryManager::Impl::allocate(const AllocationRequest& request) {
  DeviceHeap& device = heap(request.device);
  if (request.bytes == 0) throw InvalidArgument("allocate: size 0 (a block needs at least a byte)");
  if (request.lifetime != Lifetime::persistent && request.lifetime != Lifetime::ephemeral) {
    throw InvalidArgument("allocate: lifetime is neither persistent nor ephemeral");
  }
  JobRecord& job = jobs_.live(request.job);
  // With spilling, a block may be larger than the device: its pages come from other tiers.
  // Without, a request beyond the device is out of memory (as PyTorch's own allocator says),
  // not a bad argument: a framework that catches out-of-memory to shrink its batch sees it.
  if (request.bytes > device.limit() && !tiers_.spills()) {
    throw OutOfMemory(oom_info(job, device, request,
                               fmt::format("{} bytes can never fit device {}, which may hold "
                                           "{} bytes",
                                           request.bytes, request.device, device.limit()),
                               false));
  }
  const std::size_t bytes = round_up(request.bytes);
  // The stream is checked (and its heap made) before anything is charged: a refused stream
  // leaves every count as it was. Looked up once: place() works on this heap.
  StreamHeap& heap = heap_for(device, job, request);
  // A capture records work for later replays: memory handed out now would have to stay the
  // graph's for as long as it lives, and the fences below would query the capturing stream,
  // which invalidates the capture. Not supported: refused before anything is touched.
  if (capture_guard_.load(std::memory_order_relaxed) == CaptureGuard::salus_asks &&
      device.backend().stream_capturing(request.stream)) {
    throw NotSupported(fmt::format(
        "allocate: stream {:#x} is capturing a CUDA graph; Salus does not serve allocations "
        "during graph capture (allocate the graph's memory before capturing)",
        request.stream.value));
  }
  JobRecord::Charge charge;
  if (auto refusal = job.try_charge(request.lifetime, bytes, charge)) {
    device.counters().out_of_memory.fetch_add(1, std::memory_order_relaxed);
    throw OutOfMemory(oom_info(job, device, request, *refusal, true));
  }
  const DevicePtr ptr = place_charged(device, heap, job, request, bytes);
  if (request.host_access) {
    try {
      settle_for_host(device, request.stream);
    } catch (...) {
      deallocate(ptr, std::nullopt, std::nullopt);
      throw;
    }
  }
  job.raise_peaks(request.lifetime, charge);
  if (request.lifetime == Lifetime::ephemeral) job.sample_curve();
  return ptr;
}

DevicePtr MemoryManager::Impl::place_charged(DeviceHeap& device, StreamHeap& heap, JobRecord& job,
                                             const AllocationRequest& request, std::size_t bytes) {
  std::string why_not;
  DevicePtr ptr = 0;
  (void)memory::take_driver_refusal();  // only this request's refusals are its reason
  try {
    ptr = place(device, heap, request, bytes, why_not);
  } catch (const DeviceError& e) {
    job.uncharge(request.lifetime, bytes);
    // The driver out of memory for a map or an address range (cuMemMap, cuMemAddressReserve)
    // is the caller's out-of-memory as much as a refused chunk is: a framework that frees its
    // cache and retries must see it as such. Anything else is a device error.
    throw_if_driver_out_of_memory(e, device, job, request);
    throw;
  } catch (...) {
    job.uncharge(request.lifetime, bytes);
    throw;
  }
  if (ptr == 0) {
    job.uncharge(request.lifetime, bytes);
    // A release_job or orphan_job that raced with this allocation: no block was made.
    if (why_not.empty()) throw UnknownJob(request.job);
    if (std::string refusal = memory::take_driver_refusal(); !refusal.empty()) {
      why_not += "; " + refusal;
    }
    throw OutOfMemory(oom_info(job, device, request, why_not, false));
  }
  return ptr;
}

// The block's stream was made to wait (on the GPU) for whatever its pages still had pending
// from other streams, and the block may be reused from this stream's own free space: once the
// stream's work so far has finished, nothing can touch the block but its new holder.
void MemoryManager::Impl::settle_for_host(DeviceHeap& device, StreamHandle stream) {
  if (device.backend().query_stream(stream, device.device())) return;
  if (const auto fence = memory::Fence::after(device.events(), std::span(&stream, 1))) {
    fence->wait();
  }
}

MemoryManager::FreedBlockInfo MemoryManager::Impl::deallocate(DevicePtr ptr,
                                                              std::optional<std::size_t> bytes,
                                                              std::optional<int> device,
                                                              std::optional<JobId> job) {
  auto [owner, heap] = owner_of(ptr, "free");
  if (device && *device != owner->device()) {
    throw InvalidArgument(fmt::format("free: {:#x} lives on device {}, not device {}", ptr,
                                      owner->device(), *device));
  }
  const FreedBlock freed = heap->deallocate(ptr, bytes, job);
  freed.record->uncharge(freed.lifetime, freed.bytes);  // no lookup by id on the free path
  if (freed.lifetime == Lifetime::ephemeral) freed.record->sample_curve();
  harvester_->on_free();
  return {freed.bytes, owner->device(), freed.job, freed.lifetime};
}

StreamHeap& MemoryManager::Impl::heap_for(DeviceHeap& device, const JobRecord& job,
                                          const AllocationRequest& request) {
  try {
    return device.heap_for(request.stream);
  } catch (const DeviceError& e) {
    throw_if_driver_out_of_memory(e, device, job, request);
    throw;
  }
}

void MemoryManager::Impl::throw_if_driver_out_of_memory(const DeviceError& e, DeviceHeap& device,
                                                        const JobRecord& job,
                                                        const AllocationRequest& request) {
  if (!e.is_out_of_memory()) return;
  device.counters().out_of_memory.fetch_add(1, std::memory_order_relaxed);
  throw OutOfMemory(oom_info(
      job, device, request, fmt::format("the driver refused {}: {}", e.call(), e.status()), false));
}

OutOfMemoryInfo MemoryManager::Impl::oom_info(const JobRecord& job, const DeviceHeap& device,
                                              const AllocationRequest& request, std::string reason,
                                              bool job_budget) const {
  return {.job = job.id,
          .job_name = job.name,
          .device = device.device(),
          .requested_bytes = request.bytes,
          .job_in_use_bytes = job.in_use.value(),
          .job_limit_bytes = job_budget ? job.limit_total.load(std::memory_order_relaxed) : 0,
          .device_in_use_bytes = device.counters().allocated.value(),
          .device_limit_bytes = device.limit(),
          .reason = std::move(reason)};
}

std::size_t MemoryManager::Impl::round_up(std::size_t bytes) {
  constexpr std::size_t a = kBlockAlignment;
  // Within an alignment of SIZE_MAX the sum wraps to a tiny block (found by fuzz_c_api).
  if (bytes > std::numeric_limits<std::size_t>::max() - (a - 1)) {
    throw InvalidArgument(fmt::format("allocate: {} bytes is more than any block can hold", bytes));
  }
  return (bytes + a - 1) / a * a;
}

}  // namespace salus
