// Everything Salus holds on one device: the page pool, one StreamHeap per stream that allocated
// there, and the device's counters.
#pragma once

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "memory/device_counters.hpp"
#include "memory/event_pool.hpp"
#include "memory/job_table.hpp"
#include "memory/page_mover.hpp"
#include "memory/page_pool.hpp"
#include "memory/stream_heap.hpp"
#include "salus/device.hpp"
#include "salus/memory.hpp"

namespace salus::memory {

class DeviceHeap {
 public:

  DeviceHeap(std::shared_ptr<DeviceBackend> backend, Tiers& tiers, JobTable& jobs, int device,
             std::size_t limit_bytes, std::size_t va_factor);
  ~DeviceHeap();
  DeviceHeap(const DeviceHeap&) = delete;
  DeviceHeap& operator=(const DeviceHeap&) = delete;

  [[nodiscard]] int device() const { return device_; }
  [[nodiscard]] std::size_t granularity() const { return pool_.page_bytes(); }
  [[nodiscard]] std::size_t limit() const { return pool_.limit_bytes(); }
  [[nodiscard]] DeviceBackend& backend() const { return *backend_; }
  [[nodiscard]] const std::shared_ptr<DeviceBackend>& shared_backend() const { return backend_; }
  // Where this device's fences get their events.
  [[nodiscard]] EventPool& events() const { return *events_; }
  // The device's own pages. PagePool, not PageSource: stream heaps ask it on the allocation path
  // (HeapArenas::place, PageSupply::gather), where no virtual call goes; pages of other sources
  // come through tiers(), whose pools are PageSources.
  [[nodiscard]] PagePool& pool() { return pool_; }
  [[nodiscard]] const PagePool& pool() const { return pool_; }
  [[nodiscard]] DeviceCounters& counters() { return counters_; }
  [[nodiscard]] const DeviceCounters& counters() const { return counters_; }
  [[nodiscard]] Tiers& tiers() const { return tiers_; }
  [[nodiscard]] JobTable& jobs() const { return jobs_; }
  [[nodiscard]] PageMover& mover() { return mover_; }
  // Devices that must be able to access a page mapped here that lives at `where`.
  [[nodiscard]] std::span<const AccessGrant> grants(Location where) const {
    return grants_.of(where);
  }
  [[nodiscard]] const AccessGrants& access_grants() const { return grants_; }
  // The parts of this device a stream heap's PageMigrator uses, for one call.
  [[nodiscard]] MigratorDevice migrator_device();

  // The heap of `stream`, made on first use (the backend checks the stream then, so the hot path
  // never does): a retired heap ready for reuse is re-bound, else a new one is made. Throws
  // InvalidArgument naming the stream and the device when the stream is refused (nothing changes).
  StreamHeap& heap_for(StreamHandle stream);
  // The heap of `stream`, or nullptr. Lock-free.
  [[nodiscard]] StreamHeap* find_heap(StreamHandle stream) const;
  // Throws InvalidArgument naming the stream and this device unless the backend knows `stream`
  // as one of this device's.
  void validate(StreamHandle stream) const;
  // Stream heaps, retired ones included.
  [[nodiscard]] std::size_t heap_count() const {
    return published_count_.load(std::memory_order_acquire);
  }
  // Unmaps every stream heap's pages (they go home to their pools); the heap is unusable after.
  void close();
  // The heap that owns `ptr`, or nullptr. Lock-free.
  [[nodiscard]] StreamHeap* heap_of(DevicePtr ptr) const;
  // Takes up to `pages` pages from the free blocks of streams other than `except`: first those
  // that nothing may still touch, then those the taker must wait for on the GPU.
  std::size_t reclaim_from_others(const StreamHeap* except, std::size_t pages);
  // Takes up to `pages` spare pages (StreamHeap::Take::spare) from the free blocks of streams
  // other than `except` into the pool: what a new block takes before a fresh chunk.
  std::size_t spare_from_others(const StreamHeap* except, std::size_t pages);
  // Unmaps the old addresses of handed-off pages (StreamHeap::settle) in every stream heap.
  void settle(bool wait);

  template <class F>
  void for_each_stream_heap(F&& visit) const {
    const std::size_t n = published_count_.load(std::memory_order_acquire);
    for (std::size_t i = 0; i < n; ++i) visit(*published(i));
  }

  [[nodiscard]] DeviceMemoryStats stats() const;
  void reset_peaks();

 private:
  std::shared_ptr<DeviceBackend> backend_;
  Tiers& tiers_;
  JobTable& jobs_;
  const int device_;
  const std::size_t va_factor_;
  PagePool pool_;
  AccessGrants grants_;
  DeviceCounters counters_;
  PageMover mover_;
  const std::shared_ptr<EventPool> events_;

  // Published heap `i` (below published_count_).
  [[nodiscard]] StreamHeap* published(std::size_t i) const;
  StreamHeap& make_heap(StreamHandle stream);  // with create_mu_ held

  // Heaps are published once built and live as long as the DeviceHeap, so lookups need no lock.
  // The published list grows in segments of doubling size, each published once through an
  // atomic pointer: slots never move, so readers need no lock and streams have no fixed cap.
  static constexpr std::size_t kFirstSegment = 16;
  static constexpr std::size_t kSegments = 40;  // 16 * (2^40 - 1) heaps: never the limit
  std::mutex create_mu_;
  std::vector<std::unique_ptr<StreamHeap>> heaps_;  // owner; guarded by create_mu_
  std::array<std::unique_ptr<std::atomic<StreamHeap*>[]>, kSegments> segment_owner_;  // ditto
  std::array<std::atomic<std::atomic<StreamHeap*>*>, kSegments> segments_{};
  std::atomic<std::size_t> published_count_{0};
};

}  // namespace salus::memory
