// The memory manager on the CUDA backend, over the fake driver table: every page it maps gets
// access descriptors right after the map, granularity comes from the driver, and driver failures
// surface as errors naming the call while leaving the manager usable. What the memory manager does
// on every backend is the contract in contract/test_memory_basic_contract.cpp.
#include <gtest/gtest.h>

#include <algorithm>

#include "cuda/cuda_backend.hpp"
#include "salus/memory.hpp"
#include "support/fake_driver.hpp"

namespace salus::testing {
namespace {

using test::FakeCall;
using test::FakeDriver;
using test::FakeDriverConfig;

constexpr std::size_t kPage = 2 * MiB;

class MemoryOnCudaFake : public ::testing::Test {
 protected:
  MemoryOnCudaFake()
      : fake_(FakeDriverConfig::uniform(2, 64 * MiB)),
        backend_(std::make_shared<cuda::CudaBackend>(fake_.api())),
        memory_(std::make_unique<MemoryManager>(backend_)) {}

  // Every cuMemMap must be followed, before the next map, by a cuMemSetAccess that covers the
  // mapped range and grants `device` read-write.
  void expect_access_after_every_map(int device) {
    const std::vector<FakeCall> calls = fake_.calls();
    std::vector<std::pair<std::uint64_t, std::uint64_t>> pending;  // mapped ranges awaiting access
    std::size_t maps = 0;
    for (const FakeCall& call : calls) {
      if (call.name == "cuMemMap") {
        pending.emplace_back(call.args[0], call.args[1]);
        ++maps;
      } else if (call.name == "cuMemSetAccess") {
        const std::uint64_t va = call.args[0], size = call.args[1], count = call.args[2];
        bool grants_device = false;
        for (std::uint64_t i = 0; i < count; ++i) {
          const auto* d = &call.args[3 + 3 * i];
          if (d[0] == CU_MEM_LOCATION_TYPE_DEVICE && d[1] == static_cast<std::uint64_t>(device) &&
              d[2] == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
            grants_device = true;
          }
        }
        ASSERT_TRUE(grants_device) << "cuMemSetAccess at " << std::hex << va
                                   << " leaves out device " << device;
        std::erase_if(pending, [&](const auto& r) { return r.first >= va && r.first + r.second <= va + size; });
      } else if (call.name == "cuMemUnmap") {
        std::erase_if(pending, [&](const auto& r) { return r.first == call.args[0]; });
      }
    }
    EXPECT_TRUE(pending.empty()) << pending.size() << " mapped ranges never got access";
    EXPECT_GT(maps, 0u);
  }

  FakeDriver fake_;
  std::shared_ptr<cuda::CudaBackend> backend_;
  std::unique_ptr<MemoryManager> memory_;
};

TEST_F(MemoryOnCudaFake, EveryMappedPageGetsAccessForItsDevice) {
  for (int device = 0; device < 2; ++device) {
    fake_.clear_calls();
    std::vector<DevicePtr> blocks;
    for (std::size_t bytes : {std::size_t{300}, 3 * MiB, 700 * KiB, 9 * MiB + 1}) {
      blocks.push_back(memory_->allocate({bytes, device}));
      const DevicePtr p = blocks.back();
      for (DevicePtr at = p; at < p + bytes; at += kPage) {
        EXPECT_EQ(fake_.access_of(at, device), Access::read_write);
      }
      EXPECT_EQ(fake_.access_of(p + bytes - 1, device), Access::read_write);
    }
    expect_access_after_every_map(device);
    for (const FakeCall& call : fake_.calls("cuMemMap")) {
      EXPECT_EQ(call.args[1], kPage) << "pages are mapped one granule at a time";
      EXPECT_EQ(call.args[0] % kPage, 0u);
    }
    for (const FakeCall& call : fake_.calls("cuMemCreate")) {
      EXPECT_EQ(call.args[0], kPage) << "chunks are whole granules";
      EXPECT_EQ(call.args[2], static_cast<std::uint64_t>(device));
    }
    for (DevicePtr p : blocks) memory_->deallocate(p);
  }
}

TEST(MemoryOnCudaFakeGranularity, GranularityComesFromTheDriver) {
  FakeDriver fake(FakeDriverConfig::uniform(1, 64 * MiB, 4 * MiB));
  auto backend = std::make_shared<cuda::CudaBackend>(fake.api());
  MemoryManager memory(backend);
  EXPECT_EQ(memory.device_stats(0).granularity, 4 * MiB);
  const DevicePtr p = memory.allocate({5 * MiB, 0});
  EXPECT_EQ(memory.device_stats(0).reserved, 8 * MiB) << "5 MiB needs two 4 MiB pages";
  for (const FakeCall& call : fake.calls("cuMemMap")) EXPECT_EQ(call.args[1], 4 * MiB);
  memory.deallocate(p);
}

TEST_F(MemoryOnCudaFake, RemapGrantsAccessAfterTheNewMap) {
  const DevicePtr p = memory_->allocate({3 * MiB, 0});
  fake_.clear_calls();
  memory_->remap(p, Location::gpu(1));
  expect_access_after_every_map(0);
  EXPECT_EQ(fake_.access_of(p, 0), Access::read_write);
  EXPECT_GE(fake_.count("cuMemcpyAsync"), 2u) << "each page's bytes are copied";
  memory_->deallocate(p);
}

// A failing driver call surfaces as an error naming it; the manager's state is as before.
class MemoryOnCudaFakeFailures : public MemoryOnCudaFake,
                                 public ::testing::WithParamInterface<const char*> {};

TEST_P(MemoryOnCudaFakeFailures, FailingCallIsNamedAndStateIsIntact) {
  const std::string call = GetParam();
  const DevicePtr kept = memory_->allocate({kPage, 0});
  const auto before = memory_->device_stats(0);
  const std::size_t mapped_before = fake_.mapped_bytes();
  fake_.fail_next(call, CUDA_ERROR_INVALID_VALUE);
  try {
    (void)memory_->allocate({3 * kPage, 0});
    ADD_FAILURE() << "allocation should fail when " << call << " fails";
  } catch (const DeviceError& e) {
    EXPECT_EQ(e.call(), call);
    EXPECT_EQ(e.status(), "CUDA_ERROR_INVALID_VALUE");
  }
  const auto after = memory_->device_stats(0);
  EXPECT_EQ(after.allocated, before.allocated);
  EXPECT_EQ(after.mapped, before.mapped);
  EXPECT_EQ(fake_.mapped_bytes(), mapped_before) << "a half-done map was rolled back";
  // The manager is still usable and the failed request now succeeds.
  const DevicePtr p = memory_->allocate({3 * kPage, 0});
  EXPECT_EQ(fake_.access_of(p, 0), Access::read_write);
  memory_->deallocate(p);
  memory_->deallocate(kept);
}

INSTANTIATE_TEST_SUITE_P(DriverCalls, MemoryOnCudaFakeFailures,
                         ::testing::Values("cuMemCreate", "cuMemMap", "cuMemSetAccess"));

TEST_F(MemoryOnCudaFake, DriverOutOfMemoryBecomesATypedOutOfMemory) {
  const DevicePtr kept = memory_->allocate({kPage, 0});
  // The driver refusing every chunk is the device being full (a single refusal is retried):
  // a clean OutOfMemory, not a crash.
  for (int i = 0; i < 3; ++i) fake_.fail_next("cuMemCreate", CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_THROW((void)memory_->allocate({kPage, 0, {}, kUnattributedJob, Lifetime::persistent}),
               OutOfMemory);
  EXPECT_EQ(memory_->device_stats(0).allocated, kPage);
  const DevicePtr p = memory_->allocate({kPage, 0});
  memory_->deallocate(p);
  memory_->deallocate(kept);
}

// A free of a block its job may also use on another stream fences that stream with an event.
// The events come from a pool: after the first frees, each free records one (the GPU needs it)
// and creates and destroys none.
TEST_F(MemoryOnCudaFake, FencesReuseTheirEvents) {
  const StreamHandle own = backend_->create_stream(0, 0);
  const StreamHandle other = backend_->create_stream(0, 0);
  const JobId job = memory_->register_job("two streams");
  memory_->add_job_stream(job, 0, other);  // its blocks may be used on `other` too
  auto pair = [&] {
    memory_->deallocate(memory_->allocate({.bytes = 4096, .device = 0, .stream = own, .job = job}));
  };
  for (int i = 0; i < 4; ++i) pair();  // warm-up: the pool fills
  fake_.clear_calls();
  constexpr int kPairs = 200;
  for (int i = 0; i < kPairs; ++i) pair();
  EXPECT_EQ(fake_.count("cuEventCreate"), 0u);
  EXPECT_EQ(fake_.count("cuEventDestroy"), 0u);
  EXPECT_EQ(fake_.count("cuEventRecord"), static_cast<std::size_t>(kPairs));
  memory_->release_job(job);
  memory_->retire_stream(0, own);
  memory_->retire_stream(0, other);
  backend_->destroy_stream(own);
  backend_->destroy_stream(other);
}

}  // namespace
}  // namespace salus::testing
