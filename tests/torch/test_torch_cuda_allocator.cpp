// PyTorch's CUDA allocator object for Salus (libsalus_torch_cuda), on the simulated backend: its
// methods are called directly, as PyTorch calls them (no GPU needed: PyTorch's own allocate()
// would ask the driver for the current device and stream, so blocks come from
// salus_torch_cuda_malloc, which it calls).
#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "salus/runtime.hpp"
#include "salus/sim.hpp"
#include "salus/torch.hpp"
#include "salus/torch_cuda.hpp"
#include "support/stream_gate.hpp"

namespace salus::testing {
namespace {

using namespace std::chrono_literals;
namespace cca = c10::cuda::CUDACachingAllocator;
constexpr auto kAll = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);

class TorchCudaAllocator : public ::testing::Test {
 protected:
  void SetUp() override {
    backend = make_sim_backend(SimConfig::uniform(1, 64 * MiB));
    runtime = std::make_shared<Runtime>(backend, RuntimeOptions{});
    salus::torch::enable_cuda(runtime);
    allocator = salus::torch::make_cuda_allocator();
  }
  void TearDown() override { salus::torch::disable(); }

  // A stream whose handle c10 takes for an external one: c10 tells an external stream by its
  // even id (a pointer's), and simulated handles count 1, 2, 3...
  Stream even_stream() {
    for (;;) {
      Stream s(backend, 0);
      if (s.handle().value % 2 == 0) return s;
      spare_.push_back(std::move(s));
    }
  }

  // As c10::cuda::getStreamFromExternal makes it, without its check of the device count (which
  // asks the driver).
  static c10::cuda::CUDAStream torch_stream(const Stream& s) {
    const c10::Stream stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::CUDA, 0),
                             static_cast<c10::StreamId>(s.handle().value));
    return c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, stream);
  }
  static void* as_cuda(const Stream& s) { return reinterpret_cast<void*>(s.handle().value); }

  std::promise<void> block_stream(const Stream& stream, std::atomic<bool>& done) {
    return test_support::block_stream(*backend, stream.handle(), done);
  }

  DeviceMemoryStats salus_stats() const { return runtime->memory().device_stats(0); }

  std::shared_ptr<DeviceBackend> backend;
  std::shared_ptr<Runtime> runtime;
  std::shared_ptr<cca::CUDAAllocator> allocator;

 private:
  std::vector<Stream> spare_;
};

c10::DataPtr data_ptr(void* ptr) {
  return {ptr, ptr, nullptr, c10::Device(c10::DeviceType::CUDA, 0)};
}

// Tensor.record_stream reaches Salus: the block, freed and taken again on its own stream, is not
// written there before the recorded stream's work is done.
TEST_F(TorchCudaAllocator, RecordStreamOrdersTheBlocksReuseAfterThatStreamsWork) {
  Stream a = even_stream();
  Stream b = even_stream();
  void* p = salus_torch_cuda_malloc(2 * MiB, 0, as_cuda(a));
  allocator->recordStream(data_ptr(p), torch_stream(b));
  std::atomic<bool> b_done{false};
  auto gate = block_stream(b, b_done);
  salus_torch_cuda_free(p, 2 * MiB, 0, as_cuda(a));
  void* q = salus_torch_cuda_malloc(2 * MiB, 0, as_cuda(a));
  ASSERT_EQ(q, p) << "a takes its freed block back at once (stream-ordered reuse)";
  std::atomic<bool> a_ran{false};
  std::atomic<bool> a_ran_before_b{false};
  backend->launch_host_func(a.handle(), [&] {
    a_ran_before_b = !b_done.load();
    a_ran = true;
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(a_ran.load()) << "a wrote the block while b, which record_stream named, used it";
  gate.set_value();
  a.synchronize();
  EXPECT_TRUE(a_ran.load());
  EXPECT_FALSE(a_ran_before_b.load());
  salus_torch_cuda_free(q, 2 * MiB, 0, as_cuda(a));
  // Another allocator's pointer is left alone.
  int other = 0;
  EXPECT_NO_THROW(allocator->recordStream(data_ptr(&other), torch_stream(b)));
}

// torch.cuda.memory_stats / memory_allocated / max_memory_allocated / reset_peak_memory_stats.
TEST_F(TorchCudaAllocator, DeviceStatsAreSalusStatisticsAndPeaksReset) {
  void* x = salus_torch_cuda_malloc(4 * MiB, 0, nullptr);
  void* y = salus_torch_cuda_malloc(8 * MiB, 0, nullptr);
  salus_torch_cuda_free(y, 8 * MiB, 0, nullptr);
  const DeviceMemoryStats s = salus_stats();
  const auto stats = allocator->getDeviceStats(0);
  EXPECT_EQ(stats.allocated_bytes[kAll].current, static_cast<std::int64_t>(s.allocated));
  EXPECT_EQ(stats.allocated_bytes[kAll].current, 4 * MiB);
  EXPECT_EQ(stats.allocated_bytes[kAll].peak, static_cast<std::int64_t>(s.peak_allocated));
  EXPECT_EQ(stats.allocated_bytes[kAll].peak, 12 * MiB);
  EXPECT_EQ(stats.reserved_bytes[kAll].current, static_cast<std::int64_t>(s.reserved));
  EXPECT_EQ(stats.active_bytes[kAll].current, 4 * MiB);
  EXPECT_EQ(stats.allocation[kAll].current, 1);
  EXPECT_EQ(stats.allocation[kAll].allocated, 2);
  EXPECT_EQ(stats.allocation[kAll].freed, 1);
  EXPECT_EQ(stats.num_alloc_retries, 0);

  allocator->resetPeakStats(0);
  EXPECT_EQ(allocator->getDeviceStats(0).allocated_bytes[kAll].peak, 4 * MiB);
  allocator->resetAccumulatedStats(0);
  void* z = salus_torch_cuda_malloc(1 * MiB, 0, nullptr);
  const auto after = allocator->getDeviceStats(0);
  EXPECT_EQ(after.allocation[kAll].allocated, 1) << "counted from the reset";
  EXPECT_EQ(after.allocation[kAll].freed, 0);
  salus_torch_cuda_free(z, 1 * MiB, 0, nullptr);
  salus_torch_cuda_free(x, 4 * MiB, 0, nullptr);
}

TEST_F(TorchCudaAllocator, OutOfMemoryIsCounted) {
  void* most = salus_torch_cuda_malloc(48 * MiB, 0, nullptr);
  EXPECT_THROW((void)salus_torch_cuda_malloc(32 * MiB, 0, nullptr), c10::OutOfMemoryError);
  EXPECT_EQ(allocator->getDeviceStats(0).num_ooms,
            static_cast<std::int64_t>(salus_stats().out_of_memory));
  EXPECT_GE(allocator->getDeviceStats(0).num_ooms, 1);
  salus_torch_cuda_free(most, 48 * MiB, 0, nullptr);
}

// torch.cuda.empty_cache() unmaps Salus's cached pages, and returns to the driver (or salusd)
// those nothing used since the previous call: a script that calls it every step does not give up
// and take back the pages of every step.
TEST_F(TorchCudaAllocator, EmptyCacheReleasesPagesOneCallAfterTheirLastUse) {
  // What the simulated device has free counts the chunks made and not released.
  const auto made = [&] { return 64 * MiB - backend->free_memory(0); };
  const auto reserved = [&] { return allocator->getDeviceStats(0).reserved_bytes[kAll].current; };
  void* x = salus_torch_cuda_malloc(8 * MiB, 0, nullptr);
  salus_torch_cuda_free(x, 8 * MiB, 0, nullptr);
  ASSERT_GT(salus_stats().mapped, 0u) << "a freed block stays cached";
  const std::size_t step = made();
  ASSERT_GE(step, 8 * MiB);
  allocator->emptyCache({0, 0});
  EXPECT_EQ(salus_stats().mapped, 0u);
  EXPECT_EQ(made(), step) << "pages used since the previous call are kept";
  EXPECT_GT(reserved(), 0);

  // A step between the calls uses the kept pages (no new chunk): still kept.
  x = salus_torch_cuda_malloc(8 * MiB, 0, nullptr);
  salus_torch_cuda_free(x, 8 * MiB, 0, nullptr);
  EXPECT_EQ(made(), step) << "the step reused the kept pages";
  allocator->emptyCache({0, 0});
  EXPECT_EQ(made(), step);

  // Unused from one call to the next: released.
  allocator->emptyCache({0, 0});
  EXPECT_EQ(made(), 0u);
  EXPECT_EQ(reserved(), 0);
}

// torch.cuda.graph (and MemPool) start by routing allocations to a private pool: refused before
// any capture begins.
TEST_F(TorchCudaAllocator, GraphCaptureIsRefusedWithAClearError) {
  try {
    allocator->beginAllocateToPool(0, {1, 0}, [](cudaStream_t) { return true; });
    FAIL() << "capture was accepted";
  } catch (const c10::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("Salus"), std::string::npos) << what;
    EXPECT_NE(what.find("CUDA graphs are not supported"), std::string::npos) << what;
  }
  EXPECT_NO_THROW(allocator->releasePool(0, {1, 0}));
}

// torch.backends.cudnn.benchmark: cuDNN's search asks for the largest block it could get
// (CUDAPluggableAllocator refuses the call, which ended the first convolution).
TEST_F(TorchCudaAllocator, CacheInfoAnswersTheBytesAnAllocationCouldStillMap) {
  std::size_t largest = 0;
  allocator->cacheInfo(0, &largest);
  EXPECT_EQ(largest, 64 * MiB) << "nothing mapped yet: the whole device";
  void* x = salus_torch_cuda_malloc(40 * MiB, 0, nullptr);
  largest = 0;
  allocator->cacheInfo(0, &largest);
  EXPECT_EQ(largest, 64 * MiB - salus_stats().mapped);
  EXPECT_LE(largest, 24 * MiB);
  void* workspace = salus_torch_cuda_malloc(static_cast<std::ptrdiff_t>(largest), 0, nullptr);
  EXPECT_NE(workspace, nullptr) << "a workspace of the size answered can be allocated";
  salus_torch_cuda_free(workspace, static_cast<std::ptrdiff_t>(largest), 0, nullptr);
  std::size_t floor = 100 * MiB;  // PyTorch's callers may pass a floor in: it is kept
  allocator->cacheInfo(0, &floor);
  EXPECT_EQ(floor, 100 * MiB);
  salus_torch_cuda_free(x, 40 * MiB, 0, nullptr);
}

// Installed, it is the process's CUDA allocator: PyTorch's free functions reach it.
TEST_F(TorchCudaAllocator, InstalledItAnswersPyTorchsAllocatorCalls) {
  salus::torch::install_cuda_allocator();
  cca::CUDAAllocator* installed = cca::get();
  EXPECT_EQ(installed->name(), "salus");
  salus::torch::install_cuda_allocator();  // once per process
  EXPECT_EQ(cca::get(), installed);
  void* x = salus_torch_cuda_malloc(2 * MiB, 0, nullptr);
  EXPECT_EQ(cca::getDeviceStats(0).allocated_bytes[kAll].current, 2 * MiB);
  salus_torch_cuda_free(x, 2 * MiB, 0, nullptr);
  std::size_t largest = 0;
  cca::cacheInfo(0, &largest);  // what cuDNN's benchmark mode calls
  EXPECT_GT(largest, 0u);
  cca::emptyCache();
  EXPECT_EQ(salus_stats().mapped, 0u);
  cca::emptyCache();
  EXPECT_EQ(cca::getDeviceStats(0).reserved_bytes[kAll].current, 0);
}

}  // namespace
}  // namespace salus::testing
