// MemoryManager's pimpl, shared by the files that implement it:
//   memory_manager.cpp   construction, jobs, trim, stats, and MemoryManager's own members;
//   allocation.cpp       allocate and free: checks, charges, out-of-memory reports;
//   placement.cpp        place: the ordered steps that find pages for a charged request;
//   safe_points.cpp      the safe-point controls (memory/safe_points.hpp).
#pragma once

#include <atomic>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "memory/device_heap.hpp"
#include "memory/harvester.hpp"
#include "memory/job_table.hpp"
#include "memory/curves.hpp"
#include "memory/safe_points.hpp"
#include "memory/tiers.hpp"
#include "salus/memory.hpp"

namespace salus {

class MemoryManager::Impl final : public memory::SafePoints, public memory::Curves {
 public:
  Impl(std::shared_ptr<DeviceBackend> backend, MemoryOptions options);
  ~Impl();
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  static std::shared_ptr<DeviceBackend> checked(std::shared_ptr<DeviceBackend> backend);
  memory::DeviceHeap& heap(int device) const;
  // The device heap and stream heap that own `ptr`.
  std::pair<memory::DeviceHeap*, memory::StreamHeap*> owner_of(DevicePtr ptr,
                                                               const char* what) const;

  // allocation.cpp
  DevicePtr allocate(const AllocationRequest& request);
  FreedBlockInfo deallocate(DevicePtr ptr, std::optional<std::size_t> bytes,
                            std::optional<int> device, std::optional<JobId> job = std::nullopt);

  // placement.cpp: finds pages for a charged request: the device's own first, then (when
  // harvesting) what recalling, demoting and borrowing give. Returns 0 with `why_not` set when
  // nothing fits, and with `why_not` empty when the job went meanwhile.
  DevicePtr place(memory::DeviceHeap& device, memory::StreamHeap& heap,
                  const AllocationRequest& request, std::size_t bytes, std::string& why_not);

  void release_job(JobId id);
  void orphan_job(JobId id);
  std::size_t promote(JobId id);
  // Gives `device`'s unused pages to its pool, then has the pool release (&PagePool::trim: all
  // it keeps; &PagePool::trim_idle: those kept since its previous trim_idle).
  std::size_t trim(memory::DeviceHeap& device,
                   std::size_t (memory::PagePool::*release)() = &memory::PagePool::trim);
  void settle_all(bool wait = true);  // see memory_manager.cpp
  JobMemoryStats job_stats(const memory::JobRecord& job) const;

  // memory::SafePoints (safe_points.cpp)
  void set_job_quiescent(JobId job) override;
  std::size_t activate_job(JobId job) override;
  void prefetch(JobId job) override;
  std::size_t demote(JobId job, int device) override;
  std::size_t demote_quiescent(int device, std::size_t pages) override;

  // memory::Curves (curves.cpp)
  void begin_curve(JobId job) override;
  memory::CurveSamples end_curve(JobId job) override;

  // Declared in the order they must be built; torn down in reverse (see ~Impl).
  std::shared_ptr<DeviceBackend> backend_;
  memory::Tiers tiers_;
  memory::JobTable jobs_;
  std::vector<std::unique_ptr<memory::DeviceHeap>> heaps_;
  std::unique_ptr<memory::Harvester> harvester_;
  std::atomic<CaptureGuard> capture_guard_{CaptureGuard::salus_asks};  // MemoryOptions's, or set

 private:
  // allocation.cpp
  // The stream's heap; the driver out of address space for its first ranges
  // (cuMemAddressReserve) is an out-of-memory, not a device error.
  memory::StreamHeap& heap_for(memory::DeviceHeap& device, const memory::JobRecord& job,
                               const AllocationRequest& request);
  // What place() found, with the charge rolled back and out-of-memory thrown when it found none.
  DevicePtr place_charged(memory::DeviceHeap& device, memory::StreamHeap& heap,
                          memory::JobRecord& job, const AllocationRequest& request,
                          std::size_t bytes);
  static void settle_for_host(memory::DeviceHeap& device, StreamHandle stream);
  // The driver out of memory for a chunk, a map or an address range is the caller's
  // out-of-memory: a framework that frees its cache and retries must see it as such.
  void throw_if_driver_out_of_memory(const DeviceError& e, memory::DeviceHeap& device,
                                     const memory::JobRecord& job,
                                     const AllocationRequest& request);
  OutOfMemoryInfo oom_info(const memory::JobRecord& job, const memory::DeviceHeap& device,
                           const AllocationRequest& request, std::string reason,
                           bool job_budget) const;
  static std::size_t round_up(std::size_t bytes);
};

}  // namespace salus
