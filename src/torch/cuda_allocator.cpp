// salus_torch_cuda: PyTorch's pluggable CUDA allocator, with record_stream, statistics, the
// cache and graph capture answered by Salus. See include/salus/torch_cuda.hpp.
#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/Exception.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "salus/torch.hpp"
#include "salus/torch_cuda.hpp"

namespace salus::torch {
namespace {

namespace cca = c10::cuda::CUDACachingAllocator;
using c10::CachingAllocator::Stat;
using c10::CachingAllocator::StatArray;
using c10::CachingAllocator::StatType;
using c10::CachingDeviceAllocator::DeviceStats;
using Pluggable = ::torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;

// Salus's counters that PyTorch calls "accumulated": they only grow, and Salus cannot reset
// them, so a reset records their values and later reports count from there.
struct Accumulated {
  std::uint64_t allocations = 0;
  std::uint64_t frees = 0;
  std::uint64_t out_of_memory = 0;
  std::uint64_t chunk_creates = 0;
  std::uint64_t chunk_releases = 0;
};

Accumulated accumulated(const DeviceMemoryStats& s) {
  return {s.allocations, s.frees, s.out_of_memory, s.chunk_creates, s.chunk_releases};
}

std::int64_t since(std::uint64_t now, std::uint64_t base) {
  return static_cast<std::int64_t>(now >= base ? now - base : now);  // a new runtime: from 0
}

Stat stat(std::int64_t current, std::int64_t peak, std::int64_t allocated = 0,
          std::int64_t freed = 0) {
  Stat s;
  s.current = current;
  s.peak = std::max(peak, current);
  s.allocated = allocated;
  s.freed = freed;
  return s;
}

// Salus has one pool per device: only the aggregate entry is filled.
void set_aggregate(StatArray& array, const Stat& value) {
  array[static_cast<std::size_t>(StatType::AGGREGATE)] = value;
}

DeviceStats to_device_stats(const DeviceMemoryStats& s, const Accumulated& base) {
  const auto i64 = [](std::size_t v) { return static_cast<std::int64_t>(v); };
  std::size_t blocks = 0;
  for (const ClassBytes& c : s.by_class) blocks += c.blocks;
  DeviceStats out;
  const Stat allocations = stat(i64(blocks), i64(blocks), since(s.allocations, base.allocations),
                                since(s.frees, base.frees));
  set_aggregate(out.allocation, allocations);
  set_aggregate(out.active, allocations);
  const Stat allocated = stat(i64(s.allocated), i64(s.peak_allocated));
  set_aggregate(out.allocated_bytes, allocated);
  set_aggregate(out.active_bytes, allocated);
  set_aggregate(out.requested_bytes, allocated);
  set_aggregate(out.reserved_bytes, stat(i64(s.reserved), i64(s.peak_reserved)));
  const std::int64_t chunks = since(s.chunk_creates, s.chunk_releases);
  set_aggregate(out.segment, stat(chunks, chunks, since(s.chunk_creates, base.chunk_creates),
                                  since(s.chunk_releases, base.chunk_releases)));
  out.num_ooms = since(s.out_of_memory, base.out_of_memory);
  out.num_device_alloc = since(s.chunk_creates, base.chunk_creates);
  out.num_device_free = since(s.chunk_releases, base.chunk_releases);
  return out;
}

// The native handle of `stream`. c10 names an external stream (a job's Salus stream, through
// torch.cuda.ExternalStream, or c10::cuda::getStreamFromExternal) by the handle itself, an even
// id; its own streams have odd ids (0: the default stream). Reading the id spares stream(),
// which first initializes c10's stream pools through the driver (so the glue's tests, on the
// simulated backend, can call recordStream); c10's streams go through stream().
StreamHandle native_handle(const c10::cuda::CUDAStream& stream) {
  const c10::StreamId id = stream.id();
  if (id != 0 && id % 2 == 0) return StreamHandle{static_cast<std::uintptr_t>(id)};
  return StreamHandle{reinterpret_cast<std::uintptr_t>(stream.stream())};
}

class SalusCudaAllocator final : public Pluggable {
 public:
  SalusCudaAllocator()
      : Pluggable(
            [](std::size_t size, int device, cudaStream_t stream) {
              return salus_torch_cuda_malloc(static_cast<std::ptrdiff_t>(size), device, stream);
            },
            [](void* ptr, std::size_t size, int device, cudaStream_t stream) {
              salus_torch_cuda_free(ptr, static_cast<std::ptrdiff_t>(size), device, stream);
            }) {}

  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override {
    if (ptr.get() == nullptr) return;
    const StreamHandle handle = native_handle(stream);
    try {
      (void)record_stream(ptr.get(), handle);  // another allocator's block: not Salus's concern
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "Salus: record_stream on stream ", handle.value, " failed: ", e.what());
    }
  }

  DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    const std::shared_ptr<Runtime> runtime = cuda_runtime();
    if (!runtime) return {};  // the glue is off: nothing of Salus's to report
    const DeviceMemoryStats s = device_stats(*runtime, device);
    std::lock_guard lock(mu_);
    return to_device_stats(s, baseline(runtime.get(), device));
  }

  // cuDNN's algorithm search (torch.backends.cudnn.benchmark) asks for the largest block an
  // allocation could get now, and takes no algorithm whose workspace is larger. PyTorch's own
  // answer is the driver's free memory or its largest cached block, whichever is larger; Salus's
  // is the device's pages it has not mapped yet (pooled or still to take from the driver). Free
  // bytes on mapped pages are left out: they may be split among blocks, and a workspace that
  // does not fit fails the search where a smaller one would have run.
  void cacheInfo(c10::DeviceIndex device, std::size_t* largest_block) override {
    TORCH_CHECK(largest_block != nullptr, "Salus: cacheInfo without a place for its answer");
    const std::shared_ptr<Runtime> runtime = cuda_runtime();
    if (!runtime) return;  // the glue is off: nothing of Salus's can be allocated
    const DeviceMemoryStats s = device_stats(*runtime, device);
    const std::size_t unmapped = s.limit > s.mapped ? s.limit - s.mapped : 0;
    *largest_block = std::max(*largest_block, unmapped);
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    const std::shared_ptr<Runtime> runtime = cuda_runtime();
    if (!runtime) return;
    const DeviceMemoryStats s = device_stats(*runtime, device);
    std::lock_guard lock(mu_);
    baselines_[{runtime.get(), device}] = accumulated(s);
  }

  void resetPeakStats(c10::DeviceIndex /*device*/) override {
    // Salus resets the peaks of every device at once.
    if (const std::shared_ptr<Runtime> runtime = cuda_runtime()) runtime->memory().reset_peaks();
  }

  void emptyCache(c10::cuda::MempoolId_t mempool_id) override {
    // No private pools exist (see beginAllocateToPool): only the default pool is trimmed, with a
    // hysteresis (trim_cuda): pages go back one call after they were last used.
    if (mempool_id == c10::cuda::MempoolId_t{0, 0}) (void)trim_cuda();
  }

  void beginAllocateToPool(c10::DeviceIndex device, c10::cuda::MempoolId_t /*mempool_id*/,
                           std::function<bool(cudaStream_t)> /*filter*/) override {
    TORCH_CHECK(false, "Salus: CUDA graphs are not supported (device ", static_cast<int>(device),
                "): graph capture (torch.cuda.graph, torch.compile mode='reduce-overhead') and "
                "torch.cuda.MemPool route allocations to a private memory pool, which Salus's "
                "allocator does not keep; run without CUDA graphs while salus.torch is enabled");
  }
  // Nothing was routed to a pool (beginAllocateToPool refuses): nothing to end or release.
  void endAllocateToPool(c10::DeviceIndex /*device*/, c10::cuda::MempoolId_t /*id*/) override {}
  void releasePool(c10::DeviceIndex /*device*/, c10::cuda::MempoolId_t /*id*/) override {}

  std::string name() override { return "salus"; }

 private:
  static DeviceMemoryStats device_stats(Runtime& runtime, c10::DeviceIndex device) {
    try {
      return runtime.memory().device_stats(device);
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "Salus: no statistics for device ", static_cast<int>(device), ": ",
                  e.what());
    }
  }

  // Caller holds mu_. The runtime's address names it: a baseline of a runtime since destroyed
  // could match a new one at the same address, whose counters then read from 0 (see since()).
  Accumulated baseline(const Runtime* runtime, c10::DeviceIndex device) const {
    const auto it = baselines_.find({runtime, device});
    return it == baselines_.end() ? Accumulated{} : it->second;
  }

  std::mutex mu_;
  std::map<std::pair<const Runtime*, c10::DeviceIndex>, Accumulated> baselines_;
};

}  // namespace

std::shared_ptr<cca::CUDAAllocator> make_cuda_allocator() {
  return std::make_shared<SalusCudaAllocator>();
}

void install_cuda_allocator() {
  static std::mutex mu;
  static std::shared_ptr<cca::CUDAAllocator> installed;
  std::lock_guard lock(mu);
  // PyTorch keeps its CUDA allocator for the life of the process once used: one install.
  if (!installed || cca::get() != installed.get()) {
    auto allocator = make_cuda_allocator();
    ::torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(allocator);
    installed = std::move(allocator);
  }
  // PyTorch announces every capture to its allocator before it begins (beginAllocateToPool),
  // and this one refuses there: the enabled runtime need not ask the driver at each allocation.
  refuse_captures();
}

}  // namespace salus::torch
