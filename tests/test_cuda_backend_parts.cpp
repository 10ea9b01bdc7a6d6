// Parts of the CUDA backend, alone, against the fake driver: the devices' primary contexts
// (PrimaryContexts, ScopedContext), what the driver supports (DeviceCapabilities) and which
// device each handle belongs to (HandleRegistry). The backend itself is tested in
// test_cuda_backend_fake.cpp and the other *cuda* suites.
#include <gtest/gtest.h>

#include <atomic>
#include <bit>
#include <cstdint>
#include <thread>
#include <utility>
#include <vector>

#include "cuda/device_capabilities.hpp"
#include "cuda/handle_registry.hpp"
#include "cuda/primary_contexts.hpp"
#include "support/fake_driver.hpp"
#include "support/framework_streams.hpp"

namespace salus::cuda {
namespace {

using test::FakeDriver;
using test::FakeDriverConfig;

// The driver initialized, and its devices named as the backend names them.
std::vector<CUdevice> open(const DriverApi& api) {
  EXPECT_EQ(api.cuInit(0), CUDA_SUCCESS);
  int count = 0;
  EXPECT_EQ(api.cuDeviceGetCount(&count), CUDA_SUCCESS);
  std::vector<CUdevice> devices(static_cast<std::size_t>(count));
  for (int i = 0; i < count; ++i) {
    EXPECT_EQ(api.cuDeviceGet(&devices[static_cast<std::size_t>(i)], i), CUDA_SUCCESS);
  }
  return devices;
}

// A context as the application would see it: retained through the driver directly.
CUcontext retain_elsewhere(const DriverApi& api, int device) {
  CUcontext context = nullptr;
  EXPECT_EQ(api.cuDevicePrimaryCtxRetain(&context, device), CUDA_SUCCESS);
  return context;
}

CUcontext current(const DriverApi& api) {
  CUcontext context = nullptr;
  EXPECT_EQ(api.cuCtxGetCurrent(&context), CUDA_SUCCESS);
  return context;
}

struct FakeDevices : ::testing::Test {
  explicit FakeDevices(int count = 3) : fake(FakeDriverConfig::uniform(count)) {}
  FakeDriver fake;
  DriverApi api = fake.api();
  std::vector<CUdevice> devices = open(api);
};

// --- PrimaryContexts ---------------------------------------------------------------------------

using CudaPrimaryContexts = FakeDevices;

TEST_F(CudaPrimaryContexts, NothingIsRetainedUntilADeviceIsUsed) {
  const PrimaryContexts contexts(api, devices);
  EXPECT_EQ(contexts.count(), 3);
  EXPECT_EQ(fake.count("cuDevicePrimaryCtxRetain"), 0U);
  EXPECT_EQ(contexts.any_retained(), 0) << "device 0 when none is retained";
  for (int d = 0; d < 3; ++d) EXPECT_EQ(fake.retained_contexts(d), 0) << d;
}

TEST_F(CudaPrimaryContexts, AContextIsRetainedOnFirstUseOnly) {
  const PrimaryContexts contexts(api, devices);
  const CUcontext first = contexts.context(2);
  EXPECT_NE(first, nullptr);
  EXPECT_EQ(contexts.context(2), first);
  EXPECT_EQ(fake.count("cuDevicePrimaryCtxRetain"), 1U);
  EXPECT_EQ(fake.retained_contexts(2), 1);
  EXPECT_EQ(fake.retained_contexts(0), 0);
  EXPECT_EQ(contexts.any_retained(), 2) << "the one already retained, not device 0";
}

TEST_F(CudaPrimaryContexts, DestructionReleasesEachRetainedContextExactlyOnce) {
  {
    const PrimaryContexts contexts(api, devices);
    static_cast<void>(contexts.context(0));
    static_cast<void>(contexts.context(2));
    static_cast<void>(contexts.context(2));
    EXPECT_EQ(fake.count("cuDevicePrimaryCtxRelease"), 0U);
  }
  const auto releases = fake.calls("cuDevicePrimaryCtxRelease");
  ASSERT_EQ(releases.size(), 2U);
  EXPECT_EQ(releases[0].args.at(0), 0U);
  EXPECT_EQ(releases[1].args.at(0), 2U);
  for (int d = 0; d < 3; ++d) EXPECT_EQ(fake.retained_contexts(d), 0) << d;
}

TEST_F(CudaPrimaryContexts, AFailedRetainIsTriedAgainOnTheNextUse) {
  {
    const PrimaryContexts contexts(api, devices);
    fake.fail_next("cuDevicePrimaryCtxRetain", CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_THROW(static_cast<void>(contexts.context(1)), DeviceError);
    EXPECT_EQ(contexts.any_retained(), 0) << "a failed retain leaves the slot empty";
    EXPECT_NE(contexts.context(1), nullptr);
    EXPECT_EQ(fake.retained_contexts(1), 1);
  }
  EXPECT_EQ(fake.count("cuDevicePrimaryCtxRelease"), 1U) << "the failed retain is not released";
  EXPECT_EQ(fake.retained_contexts(1), 0);
}

TEST_F(CudaPrimaryContexts, DeviceOfRetainsDevicesOnlyUntilTheMatch) {
  const PrimaryContexts contexts(api, devices);
  const CUcontext theirs = retain_elsewhere(api, 1);
  EXPECT_EQ(contexts.device_of(theirs), 1);
  EXPECT_EQ(fake.retained_contexts(0), 1) << "device 0 was looked at first";
  EXPECT_EQ(fake.retained_contexts(2), 0) << "the search stopped at device 1";
  fake.clear_calls();
  EXPECT_EQ(contexts.device_of(theirs), 1);
  EXPECT_EQ(fake.count("cuDevicePrimaryCtxRetain"), 0U) << "retained ones are compared only";
  EXPECT_EQ(api.cuDevicePrimaryCtxRelease(1), CUDA_SUCCESS);
}

TEST_F(CudaPrimaryContexts, AContextOfNoDeviceIsMinusOneAndADeviceThatRefusesIsSkipped) {
  const PrimaryContexts contexts(api, devices);
  const CUcontext theirs = retain_elsewhere(api, 2);
  fake.fail_next("cuDevicePrimaryCtxRetain", CUDA_ERROR_UNKNOWN, /*skip=*/1);  // device 1's
  EXPECT_EQ(contexts.device_of(theirs), 2);
  EXPECT_EQ(fake.retained_contexts(1), 0);
  const auto application_made = std::bit_cast<CUcontext>(std::uintptr_t{0xdead0000});
  EXPECT_EQ(contexts.device_of(application_made), -1);
  EXPECT_EQ(fake.retained_contexts(1), 1) << "looking again retried device 1";
  EXPECT_EQ(api.cuDevicePrimaryCtxRelease(2), CUDA_SUCCESS);
}

TEST_F(CudaPrimaryContexts, BindMakesTheContextCurrentAndRestoresTheCallersAfterwards) {
  const PrimaryContexts contexts(api, devices);
  const CUcontext callers = retain_elsewhere(api, 0);
  ASSERT_EQ(api.cuCtxSetCurrent(callers), CUDA_SUCCESS);
  {
    const ScopedContext scope = contexts.bind(1);
    EXPECT_EQ(current(api), contexts.context(1));
  }
  EXPECT_EQ(current(api), callers);
  fake.clear_calls();
  {
    const ScopedContext scope = contexts.bind(0);  // already current: nothing to set
    EXPECT_EQ(current(api), callers);
  }
  EXPECT_EQ(fake.count("cuCtxSetCurrent"), 0U);
  ASSERT_EQ(api.cuCtxSetCurrent(nullptr), CUDA_SUCCESS);
  EXPECT_EQ(api.cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
}

TEST_F(CudaPrimaryContexts, AFailedRestoreIsLoggedNotThrown) {
  const PrimaryContexts contexts(api, devices);
  {
    const ScopedContext scope = contexts.bind(2);
    fake.fail_next("cuCtxSetCurrent", CUDA_ERROR_UNKNOWN);
  }
  const auto sets = fake.calls("cuCtxSetCurrent");
  ASSERT_EQ(sets.size(), 2U);
  EXPECT_EQ(sets[1].result, CUDA_ERROR_UNKNOWN);
  ASSERT_EQ(api.cuCtxSetCurrent(nullptr), CUDA_SUCCESS);
}

using ConcurrentCudaPrimaryContexts = FakeDevices;

TEST_F(ConcurrentCudaPrimaryContexts, AContextIsRetainedOnceHoweverManyThreadsAsk) {
  constexpr int kThreads = 8;
  {
    const PrimaryContexts contexts(api, devices);
    std::atomic<int> ready{0};
    std::vector<CUcontext> seen(kThreads * 3, nullptr);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        ready.fetch_add(1);
        while (ready.load() < kThreads) std::this_thread::yield();
        for (int d = 0; d < 3; ++d) {
          seen[static_cast<std::size_t>(t * 3 + d)] = contexts.context((t + d) % 3);
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
    for (int d = 0; d < 3; ++d) EXPECT_EQ(fake.retained_contexts(d), 1) << d;
    EXPECT_EQ(fake.count("cuDevicePrimaryCtxRetain"), 3U);
    for (int t = 0; t < kThreads; ++t) {
      for (int d = 0; d < 3; ++d) {
        EXPECT_EQ(seen[static_cast<std::size_t>(t * 3 + d)], contexts.context((t + d) % 3));
      }
    }
  }
  EXPECT_EQ(fake.count("cuDevicePrimaryCtxRelease"), 3U);
}

// --- DeviceCapabilities ------------------------------------------------------------------------

FakeDriverConfig mixed_devices() {
  FakeDriverConfig config = FakeDriverConfig::uniform(2);
  config.devices[0].granularity = 4 * MiB;
  config.devices[1].granularity = 8 * MiB;
  config.devices[1].posix_fd = false;
  config.devices[1].gpu_direct_rdma_vmm = false;
  config.devices[1].ipc_events = false;
  config.devices[1].host_numa_id = 1;
  config.host_granularity = 2 * MiB;
  return config;
}

struct CudaDeviceCapabilities : ::testing::Test {
  explicit CudaDeviceCapabilities(FakeDriverConfig config = mixed_devices())
      : fake(std::move(config)) {}
  FakeDriver fake;
  DriverApi api = fake.api();
  PrimaryContexts contexts{api, open(api)};
};

TEST_F(CudaDeviceCapabilities, EachDeviceIsReadWithoutRetainingAContext) {
  const DeviceCapabilities caps(api, contexts);
  ASSERT_EQ(caps.count(), 2);
  EXPECT_EQ(fake.count("cuDevicePrimaryCtxRetain"), 0U);
  EXPECT_EQ(caps.device(0).granularity, 4 * MiB);
  EXPECT_EQ(caps.device(1).granularity, 8 * MiB);
  EXPECT_TRUE(caps.device(0).posix_fd && caps.device(0).gpu_direct_rdma);
  EXPECT_FALSE(caps.device(1).posix_fd || caps.device(1).gpu_direct_rdma);
  EXPECT_TRUE(caps.device(0).ipc_events);
  EXPECT_FALSE(caps.device(1).ipc_events);
  EXPECT_EQ(caps.device(1).host_numa_id, 1);
  EXPECT_EQ(caps.granularity(Location::gpu(1)), 8 * MiB);
  EXPECT_EQ(caps.granularity(Location::host()), 2 * MiB);
  EXPECT_EQ(caps.address_granularity(), 2 * MiB) << "the smallest of devices and host";
}

TEST_F(CudaDeviceCapabilities, AllocationPropsAskOnlyForWhatTheDeviceSupports) {
  const DeviceCapabilities caps(api, contexts);
  const CUmemAllocationProp able = caps.allocation_prop(Location::gpu(0));
  EXPECT_EQ(able.location.type, CU_MEM_LOCATION_TYPE_DEVICE);
  EXPECT_EQ(able.location.id, 0);
  EXPECT_EQ(able.requestedHandleTypes, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  EXPECT_EQ(able.allocFlags.gpuDirectRDMACapable, 1);
  const CUmemAllocationProp plain = caps.allocation_prop(Location::gpu(1));
  EXPECT_EQ(plain.requestedHandleTypes, CU_MEM_HANDLE_TYPE_NONE);
  EXPECT_EQ(plain.allocFlags.gpuDirectRDMACapable, 0);
  const CUmemAllocationProp host = caps.allocation_prop(Location::host());
  EXPECT_EQ(host.location.type, CU_MEM_LOCATION_TYPE_HOST) << "a 13.0 driver takes HOST";
  EXPECT_EQ(host.requestedHandleTypes, CU_MEM_HANDLE_TYPE_NONE);
}

TEST_F(CudaDeviceCapabilities, PropertiesAskTheDriverForWhatWasNotReadBefore) {
  const DeviceCapabilities caps(api, contexts);
  fake.clear_calls();
  const DeviceProperties props = caps.properties(1);
  EXPECT_EQ(fake.count("cuDeviceGetName"), 1U);
  EXPECT_EQ(fake.count("cuDeviceGetAttribute"), 0U) << "attributes were read once, before";
  EXPECT_EQ(props.total_memory, 16 * GiB);
  EXPECT_EQ(props.granularity, 8 * MiB);
  EXPECT_FALSE(props.shareable_handles);
  EXPECT_FALSE(props.gpu_direct_rdma);
  EXPECT_TRUE(props.host_chunks);
  EXPECT_EQ(props.host_chunk_location, "HOST");
  EXPECT_TRUE(caps.properties(0).shareable_handles);
}

TEST_F(CudaDeviceCapabilities, PeerLinksAreTakenFromTheDriversP2PAttributes) {
  const DeviceCapabilities caps(api, contexts);
  fake.set_peer(0, 1, {.access = true, .performance_rank = 2, .native_atomics = false});
  fake.set_peer(1, 0, {.access = false});
  fake.clear_calls();
  EXPECT_EQ(caps.peer_link(0, 0).kind, LinkKind::self);
  EXPECT_EQ(fake.count("cuDeviceGetP2PAttribute"), 0U) << "a device reaches itself";
  const PeerLink pcie = caps.peer_link(0, 1);
  EXPECT_EQ(pcie.kind, LinkKind::pcie) << "no native atomics";
  EXPECT_TRUE(pcie.can_access);
  EXPECT_EQ(pcie.performance_rank, 2);
  const PeerLink none = caps.peer_link(1, 0);
  EXPECT_EQ(none.kind, LinkKind::none);
  EXPECT_FALSE(none.can_access);
  EXPECT_EQ(fake.count("cuDeviceGetP2PAttribute"), 4U) << "three, then one without access";
  EXPECT_EQ(fake.count("cuDevicePrimaryCtxRetain"), 0U);
}

TEST_F(CudaDeviceCapabilities, IpcEventsAreRequiredPerDevice) {
  const DeviceCapabilities caps(api, contexts);
  EXPECT_NO_THROW(caps.require_ipc_events(0, "probe"));
  EXPECT_THROW(caps.require_ipc_events(1, "probe"), NotSupported);
}

TEST_F(CudaDeviceCapabilities, AGranularityQueryThatWantsAContextRetainsThatDeviceOnly) {
  fake.fail_next("cuMemGetAllocationGranularity", CUDA_ERROR_INVALID_CONTEXT, /*skip=*/1);
  const DeviceCapabilities caps(api, contexts);
  EXPECT_EQ(caps.device(1).granularity, 8 * MiB);
  EXPECT_EQ(fake.retained_contexts(0), 0);
  EXPECT_EQ(fake.retained_contexts(1), 1);
  const auto queries = fake.calls("cuMemGetAllocationGranularity");
  ASSERT_GE(queries.size(), 3U);
  EXPECT_EQ(queries[2].context_device, 1) << "asked again in device 1's context";
}

TEST_F(CudaDeviceCapabilities, AFailedGranularityQueryIsADeviceError) {
  fake.fail_next("cuMemGetAllocationGranularity", CUDA_ERROR_UNKNOWN);
  EXPECT_THROW(DeviceCapabilities(api, contexts), DeviceError);
}

struct CudaDeviceCapabilitiesOn12 : CudaDeviceCapabilities {
  static FakeDriverConfig driver12() {
    FakeDriverConfig config = mixed_devices();
    config.driver_version = 12040;
    config.devices[0].host_numa_id = 3;
    return config;
  }
  CudaDeviceCapabilitiesOn12() : CudaDeviceCapabilities(driver12()) {}
};

TEST_F(CudaDeviceCapabilitiesOn12, HostChunksAreAskedForOnDevice0sNumaNode) {
  const DeviceCapabilities caps(api, contexts);
  EXPECT_TRUE(caps.properties(0).host_chunks);
  EXPECT_EQ(caps.properties(0).host_chunk_location, "HOST_NUMA:3");
  const CUmemLocation host = caps.cu_location(Location::host());
  EXPECT_EQ(host.type, CU_MEM_LOCATION_TYPE_HOST_NUMA);
  EXPECT_EQ(host.id, 3);
}

struct CudaDeviceCapabilitiesWithoutHostChunks : CudaDeviceCapabilities {
  static FakeDriverConfig no_host() {
    FakeDriverConfig config = mixed_devices();
    config.host_chunks = false;
    return config;
  }
  CudaDeviceCapabilitiesWithoutHostChunks() : CudaDeviceCapabilities(no_host()) {}
};

TEST_F(CudaDeviceCapabilitiesWithoutHostChunks, HostGranularityIsNotSupported) {
  const DeviceCapabilities caps(api, contexts);
  EXPECT_FALSE(caps.properties(1).host_chunks);
  EXPECT_EQ(caps.properties(1).host_chunk_location, "");
  EXPECT_THROW(static_cast<void>(caps.granularity(Location::host())), NotSupported);
  EXPECT_EQ(caps.address_granularity(), 4 * MiB) << "devices only";
}

// --- HandleRegistry ----------------------------------------------------------------------------

struct CudaHandleRegistry : FakeDevices {
  PrimaryContexts contexts{api, devices};
  HandleRegistry handles{api, contexts};
};

CUstream fake_stream(std::uintptr_t n) {
  return std::bit_cast<CUstream>(std::uintptr_t{0x7000000} + 0x10 * n);
}
CUevent fake_event(std::uintptr_t n) {
  return std::bit_cast<CUevent>(std::uintptr_t{0x8000000} + 0x10 * n);
}

TEST_F(CudaHandleRegistry, AStreamThisBackendMadeIsLookedUpWithoutTheDriver) {
  const StreamHandle stream = handles.adopt_stream(2, fake_stream(1));
  EXPECT_EQ(stream.value, std::bit_cast<std::uint64_t>(fake_stream(1)));
  fake.clear_calls();
  EXPECT_EQ(handles.device_of(stream), 2);
  EXPECT_EQ(handles.device_of(stream, 1), 2) << "the fallback is for default streams only";
  EXPECT_TRUE(fake.calls().empty());
}

TEST_F(CudaHandleRegistry, DefaultStreamsBelongToTheFallbackWithoutTheDriver) {
  fake.clear_calls();
  for (const CUstream stream : {CUstream{nullptr}, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD}) {
    const StreamHandle handle{std::bit_cast<std::uint64_t>(stream)};
    EXPECT_TRUE(is_default_stream(handle));
    EXPECT_EQ(handles.device_of(handle, 1), 1);
    EXPECT_EQ(handles.device_of(handle), 0);
  }
  EXPECT_TRUE(fake.calls().empty());
}

TEST_F(CudaHandleRegistry, AStreamThisBackendDidNotMakeIsLookedUpThroughTheDriverEveryTime) {
  const StreamHandle theirs = testing::driver_framework_stream(api, 1);
  fake.clear_calls();
  EXPECT_EQ(handles.device_of(theirs), 1);
  EXPECT_EQ(handles.device_of(theirs), 1);
  EXPECT_EQ(fake.count("cuStreamGetCtx"), 2U) << "nothing cached: its handle may be reused";
  EXPECT_EQ(fake.retained_contexts(2), 0) << "the context search stopped at device 1";
}

TEST_F(CudaHandleRegistry, AForgottenStreamIsAskedOfTheDriver) {
  const StreamHandle stream = handles.adopt_stream(0, fake_stream(2));
  handles.forget_stream(stream);
  fake.clear_calls();
  EXPECT_THROW(static_cast<void>(handles.device_of(stream)), InvalidArgument);
  EXPECT_EQ(fake.count("cuStreamGetCtx"), 1U);
}

TEST_F(CudaHandleRegistry, ADriverFailureLookingUpAStreamIsADeviceError) {
  const StreamHandle theirs = testing::driver_framework_stream(api, 0);
  fake.fail_next("cuStreamGetCtx", CUDA_ERROR_UNKNOWN);
  EXPECT_THROW(static_cast<void>(handles.device_of(theirs)), DeviceError);
}

TEST_F(CudaHandleRegistry, AChunkImportedTwiceIsForgottenWithItsLastReference) {
  const ChunkHandle chunk = handles.adopt_chunk(0x42, Location::gpu(1), 2 * MiB);
  EXPECT_EQ(chunk.value, 0x42U);
  static_cast<void>(handles.adopt_chunk(0x42, Location::gpu(1), 2 * MiB));
  ASSERT_TRUE(handles.find_chunk(chunk));
  EXPECT_EQ(handles.find_chunk(chunk)->references, 2);
  EXPECT_EQ(handles.find_chunk(chunk)->where, Location::gpu(1));
  EXPECT_EQ(handles.find_chunk(chunk)->bytes, 2 * MiB);
  handles.drop_chunk_reference(chunk);
  ASSERT_TRUE(handles.find_chunk(chunk));
  EXPECT_EQ(handles.find_chunk(chunk)->references, 1);
  handles.drop_chunk_reference(chunk);
  EXPECT_FALSE(handles.find_chunk(chunk));
  EXPECT_FALSE(handles.find_chunk(ChunkHandle{0x43}));
}

TEST_F(CudaHandleRegistry, EventsKnowTheirDeviceAndWhetherTheyAreShareable) {
  const EventHandle plain = handles.adopt_event(1, fake_event(1));
  const EventHandle shared = handles.adopt_event(2, fake_event(2), /*shareable=*/true);
  EXPECT_EQ(handles.device_of(plain), 1);
  EXPECT_EQ(handles.device_of(shared), 2);
  EXPECT_FALSE(handles.shareable(plain));
  EXPECT_TRUE(handles.shareable(shared));
  handles.forget_event(shared);
  EXPECT_FALSE(handles.shareable(shared));
  EXPECT_THROW(static_cast<void>(handles.device_of(shared)), InvalidArgument);
  EXPECT_THROW(static_cast<void>(handles.device_of(EventHandle{0x99})), InvalidArgument);
}

using ConcurrentCudaHandleRegistry = CudaHandleRegistry;

TEST_F(ConcurrentCudaHandleRegistry, ThreadsListingAndLookingUpHandlesEachSeeTheirOwn) {
  constexpr int kThreads = 8;
  constexpr int kEach = 200;
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        const auto n = static_cast<std::uintptr_t>(t * kEach + i + 1);
        const int device = (t + i) % 3;
        const StreamHandle stream = handles.adopt_stream(device, fake_stream(n));
        const EventHandle event = handles.adopt_event(device, fake_event(n), i % 2 == 0);
        if (handles.device_of(stream) != device || handles.device_of(event) != device ||
            handles.shareable(event) != (i % 2 == 0)) {
          wrong.fetch_add(1);
        }
        if (i % 3 == 0) {
          handles.forget_stream(stream);
          handles.forget_event(event);
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(fake.count("cuStreamGetCtx"), 0U) << "every lookup was of a listed stream";
}

}  // namespace
}  // namespace salus::cuda
