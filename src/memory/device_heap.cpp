#include "log/log.hpp"
#include "memory/device_heap.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>

#include "memory/job_table.hpp"

namespace salus::memory {

DeviceHeap::DeviceHeap(std::shared_ptr<DeviceBackend> backend, Tiers& tiers, JobTable& jobs,
                       int device, std::size_t limit_bytes, std::size_t va_factor)
    : backend_(std::move(backend)),
      tiers_(tiers),
      jobs_(jobs),
      device_(device),
      va_factor_(va_factor),
      pool_(*backend_, Location::gpu(device), backend_->granularity(Location::gpu(device)),
            limit_bytes),
      grants_(backend_->device_count(), device,
              [&tiers](int from, int to) {
                // The lenders of `from` are the peers it can reach (ranked once, in Tiers).
                const auto& lenders = tiers.lenders(from);
                return std::any_of(lenders.begin(), lenders.end(),
                                   [to](const Lender& l) { return l.device == to; });
              }),
      mover_(backend_, device, pool_.page_bytes(), tiers.options().move_batch_pages),
      events_(EventPool::make(backend_, device)) {
  tiers_.add_device(pool_);
}

DeviceHeap::~DeviceHeap() {
  close();
  pool_.trim();
}

void DeviceHeap::close() {
  std::lock_guard lock(create_mu_);
  published_count_.store(0, std::memory_order_release);
  heaps_.clear();  // unmaps their pages; each goes back to its own pool
}

namespace {

// Segment and offset of published slot `i`: segment k holds kFirst << k slots.
std::pair<std::size_t, std::size_t> locate(std::size_t i, std::size_t first) {
  const std::size_t segment = static_cast<std::size_t>(std::bit_width(i / first + 1)) - 1;
  return {segment, i - first * ((std::size_t{1} << segment) - 1)};
}

}  // namespace

StreamHeap* DeviceHeap::published(std::size_t i) const {
  const auto [segment, offset] = locate(i, kFirstSegment);
  return segments_[segment].load(std::memory_order_acquire)[offset].load(std::memory_order_acquire);
}

StreamHeap* DeviceHeap::find_heap(StreamHandle stream) const {
  if (stream.value == StreamHeap::kRetiredStream) return nullptr;  // retired heaps answer to none
  const std::size_t n = published_count_.load(std::memory_order_acquire);
  for (std::size_t i = 0; i < n; ++i) {
    StreamHeap* heap = published(i);
    if (heap->stream() == stream) return heap;
  }
  return nullptr;
}

void DeviceHeap::validate(StreamHandle stream) const {
  try {
    backend_->validate_stream(stream, device_);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("stream {:#x} refused on device {}: {}", stream.value,
                                      device_, e.what()));
  }
}

StreamHeap& DeviceHeap::heap_for(StreamHandle stream) {
  if (StreamHeap* heap = find_heap(stream)) return *heap;
  // Checked once, when first met, outside the lock: a refused stream changes nothing.
  validate(stream);
  std::lock_guard lock(create_mu_);
  for (const auto& heap : heaps_) {
    if (heap->stream() == stream) return *heap;
  }
  // A retired heap whose blocks are all gone serves the new stream with the same ranges, so that
  // streams coming and going forever use bounded memory and address space.
  for (const auto& heap : heaps_) {
    if (heap->stream().value == StreamHeap::kRetiredStream && heap->rebind(stream)) return *heap;
  }
  return make_heap(stream);
}

StreamHeap& DeviceHeap::make_heap(StreamHandle stream) {
  // Address space is cheap: generous first ranges make growing another (HeapArenas::grow) rare.
  const std::size_t page = granularity();
  const std::size_t limit_pages = (limit() + page - 1) / page;
  const std::size_t large = std::max<std::size_t>(limit_pages * va_factor_, 1) * page;
  // At least a few pages, so that an allocation can step around addresses still retiring.
  const std::size_t small = std::max<std::size_t>(limit_pages / 4, 16) * page;
  const std::size_t index = heaps_.size();
  const auto [segment, offset] = locate(index, kFirstSegment);
  if (segment >= kSegments) throw InvalidArgument("too many streams");  // unreachable in practice
  if (!segment_owner_[segment]) {
    segment_owner_[segment] =
        std::make_unique<std::atomic<StreamHeap*>[]>(kFirstSegment << segment);
    segments_[segment].store(segment_owner_[segment].get(), std::memory_order_release);
  }
  auto& heap = heaps_.emplace_back(std::make_unique<StreamHeap>(*this, stream, small, large));
  segment_owner_[segment][offset].store(heap.get(), std::memory_order_release);
  published_count_.store(heaps_.size(), std::memory_order_release);
  return *heap;
}

StreamHeap* DeviceHeap::heap_of(DevicePtr ptr) const {
  const std::size_t n = published_count_.load(std::memory_order_acquire);
  for (std::size_t i = 0; i < n; ++i) {
    StreamHeap* heap = published(i);
    if (heap->contains(ptr)) return heap;
  }
  return nullptr;
}

std::size_t DeviceHeap::reclaim_from_others(const StreamHeap* except, std::size_t pages) {
  std::size_t taken = 0;
  // Idle streams first: their pages cost the taker nothing; then pages whose old work the taker
  // waits for on the GPU.
  for (const bool idle_only : {true, false}) {
    for_each_stream_heap([&](StreamHeap& heap) {
      if (&heap == except || taken >= pages) return;
      const std::size_t got = heap.reclaim_pages(
          pages - taken, idle_only ? StreamHeap::Take::idle : StreamHeap::Take::any);
      taken += got;
      counters_.cross_stream_reuses.fetch_add(got, std::memory_order_relaxed);
    });
  }
  return taken;
}

std::size_t DeviceHeap::spare_from_others(const StreamHeap* except, std::size_t pages) {
  std::size_t taken = 0;
  for_each_stream_heap([&](StreamHeap& heap) {
    if (&heap == except || taken >= pages) return;
    std::size_t got = 0;
    try {
      got = heap.reclaim_pages(pages - taken, StreamHeap::Take::spare);
    } catch (const Error& e) {
      // A saving, not a need: fresh chunks do instead (the pages stay where they were).
      log::debug("device {}: taking another stream's spare pages failed: {}", device_,
                    e.what());
    }
    taken += got;
    counters_.cross_stream_reuses.fetch_add(got, std::memory_order_relaxed);
  });
  return taken;
}

void DeviceHeap::settle(bool wait) {
  for_each_stream_heap([&](StreamHeap& heap) { heap.settle(wait); });
}

MigratorDevice DeviceHeap::migrator_device() {
  return {.backend = backend_,
          .counters = counters_,
          .tiers = tiers_,
          .jobs = jobs_,
          .mover = mover_,
          .grants = grants_,
          .device = device_,
          .page_bytes = granularity(),
          .limit_bytes = limit()};
}

DeviceMemoryStats DeviceHeap::stats() const {
  DeviceMemoryStats s;
  s.device = device_;
  s.limit = limit();
  s.granularity = granularity();
  s.allocated = counters_.allocated.value();
  s.peak_allocated = counters_.allocated.peak();
  s.reserved = pool_.held_bytes();
  s.peak_reserved = pool_.peak_held_bytes();
  s.mapped = counters_.mapped.load(std::memory_order_relaxed);
  s.cached = s.mapped > s.allocated ? s.mapped - s.allocated : 0;
  HeapTally tally;
  for_each_stream_heap([&](StreamHeap& heap) { tally += heap.tally(); });
  for (std::size_t c = 0; c < kLifetimeCount; ++c) {
    s.by_class[c] = {counters_.by_class[c].value(), counters_.by_class[c].peak(), tally.blocks[c]};
  }
  s.allocations = tally.allocations;
  s.frees = tally.frees;
  s.page_maps = counters_.page_maps.load(std::memory_order_relaxed);
  s.page_unmaps = counters_.page_unmaps.load(std::memory_order_relaxed);
  s.chunk_creates = pool_.creates();
  s.chunk_releases = pool_.releases();
  s.cross_stream_reuses = counters_.cross_stream_reuses.load(std::memory_order_relaxed);
  s.out_of_memory = counters_.out_of_memory.load(std::memory_order_relaxed);
  s.lent = pool_.lent_bytes();
  s.borrowed_peer =
      counters_.borrowed[static_cast<std::size_t>(Tier::peer)].load(std::memory_order_relaxed);
  s.borrowed_host =
      counters_.borrowed[static_cast<std::size_t>(Tier::host)].load(std::memory_order_relaxed);
  s.pages_moved = counters_.pages_moved.load(std::memory_order_relaxed);
  s.bytes_moved = counters_.bytes_moved.load(std::memory_order_relaxed);
  s.move_seconds =
      static_cast<double>(counters_.move_nanoseconds.load(std::memory_order_relaxed)) * 1e-9;
  s.recalled_pages = counters_.recalled_pages.load(std::memory_order_relaxed);
  s.deferred_unmaps = counters_.deferred_unmaps.load(std::memory_order_relaxed);
  s.retiring = counters_.retiring.load(std::memory_order_relaxed);
  s.allocation_waits = counters_.allocation_waits.load(std::memory_order_relaxed);
  s.stream_heaps = heap_count();
  return s;
}

void DeviceHeap::reset_peaks() {
  counters_.allocated.reset_peak();
  for (Counter& c : counters_.by_class) c.reset_peak();
  pool_.reset_peak();
}

}  // namespace salus::memory
