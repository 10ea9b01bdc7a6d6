// The fake driver's memory rules that a first run on a real GPU would enforce (driver-version
// profiles, granularities, access before work, device attributes, sticky errors), each tested on
// the fake itself, and the backend and memory manager fixes they caught: peers granted access,
// host chunks on 12.x drivers, shareable/RDMA-capable chunks, out-of-memory from any VMM call,
// no retries after a sticky error, primary contexts retained only where used.
#include <gtest/gtest.h>

#include <string>

#include "cuda/cuda_backend.hpp"
#include "salus/memory.hpp"
#include "support/fake_driver.hpp"

namespace salus::testing {
namespace {

using test::FakeCall;
using test::FakeDriver;
using test::FakeDriverConfig;

constexpr std::size_t kPage = 2 * MiB;

FakeDriverConfig profile(int driver_version, int devices = 2) {
  FakeDriverConfig config = FakeDriverConfig::uniform(devices, 64 * MiB);
  config.driver_version = driver_version;
  return config;
}

CUmemAllocationProp prop_at(CUmemLocationType type, int id) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = type;
  prop.location.id = id;
  return prop;
}

// --- the fake's rules --------------------------------------------------------------------------

TEST(FakeDriverRules, Driver12RefusesHostChunksButTakesHostNuma) {
  for (const int version : {12040, 13000}) {
    FakeDriver fake(profile(version));
    const cuda::DriverApi api = fake.api();
    ASSERT_EQ(api.cuInit(0), CUDA_SUCCESS);
    int reported = 0;
    ASSERT_EQ(api.cuDriverGetVersion(&reported), CUDA_SUCCESS);
    EXPECT_EQ(reported, version);
    std::size_t granularity = 0;
    const CUmemAllocationProp host = prop_at(CU_MEM_LOCATION_TYPE_HOST, 0);
    const CUmemAllocationProp numa = prop_at(CU_MEM_LOCATION_TYPE_HOST_NUMA, 0);
    const CUresult want_host = version < 13000 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
    EXPECT_EQ(api.cuMemGetAllocationGranularity(&granularity, &host,
                                                CU_MEM_ALLOC_GRANULARITY_MINIMUM),
              want_host);
    EXPECT_EQ(api.cuMemGetAllocationGranularity(&granularity, &numa,
                                                CU_MEM_ALLOC_GRANULARITY_MINIMUM),
              CUDA_SUCCESS);
    CUmemGenericAllocationHandle handle = 0;
    EXPECT_EQ(api.cuMemCreate(&handle, kPage, &host, 0), want_host) << version;
    if (want_host == CUDA_SUCCESS) EXPECT_EQ(api.cuMemRelease(handle), CUDA_SUCCESS);
    ASSERT_EQ(api.cuMemCreate(&handle, kPage, &numa, 0), CUDA_SUCCESS) << version;
    EXPECT_EQ(api.cuMemRelease(handle), CUDA_SUCCESS);
  }
}

TEST(FakeDriverRules, RecommendedGranularityIsLargerThanMinimum) {
  FakeDriver fake(profile(13000));
  const cuda::DriverApi api = fake.api();
  ASSERT_EQ(api.cuInit(0), CUDA_SUCCESS);
  const CUmemAllocationProp device = prop_at(CU_MEM_LOCATION_TYPE_DEVICE, 0);
  std::size_t minimum = 0;
  std::size_t recommended = 0;
  ASSERT_EQ(api.cuMemGetAllocationGranularity(&minimum, &device, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            CUDA_SUCCESS);
  ASSERT_EQ(api.cuMemGetAllocationGranularity(&recommended, &device,
                                              CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
            CUDA_SUCCESS);
  EXPECT_EQ(minimum, kPage);
  EXPECT_GT(recommended, minimum);
}

TEST(FakeDriverRules, MapChecksAlignmentBoundsAndCanRunOutOfMemory) {
  FakeDriver fake(profile(13000));
  const cuda::DriverApi api = fake.api();
  ASSERT_EQ(api.cuInit(0), CUDA_SUCCESS);
  const CUmemAllocationProp device = prop_at(CU_MEM_LOCATION_TYPE_DEVICE, 0);
  CUmemGenericAllocationHandle chunk = 0;
  ASSERT_EQ(api.cuMemCreate(&chunk, 2 * kPage, &device, 0), CUDA_SUCCESS);
  CUdeviceptr va = 0;
  ASSERT_EQ(api.cuMemAddressReserve(&va, 4 * kPage, 0, 0, 0), CUDA_SUCCESS);
  EXPECT_EQ(api.cuMemMap(va, kPage, kPage / 2, chunk, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(api.cuMemMap(va + 4096, kPage, 0, chunk, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(api.cuMemMap(va, 2 * kPage, kPage, chunk, 0), CUDA_ERROR_INVALID_VALUE)
      << "offset + size beyond the chunk";
  fake.fail_next("cuMemMap", CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(api.cuMemMap(va, kPage, 0, chunk, 0), CUDA_ERROR_OUT_OF_MEMORY);
  ASSERT_EQ(api.cuMemMap(va, 2 * kPage, 0, chunk, 0), CUDA_SUCCESS);
  EXPECT_EQ(api.cuMemUnmap(va, 2 * kPage), CUDA_SUCCESS);
  EXPECT_EQ(api.cuMemRelease(chunk), CUDA_SUCCESS);
  EXPECT_EQ(api.cuMemAddressFree(va, 4 * kPage), CUDA_SUCCESS);
}

TEST(FakeDriverRules, WorkNeedsTheStreamDevicesAccessNotJustAMapping) {
  FakeDriver fake(profile(13000));
  cuda::CudaBackend backend(fake.api());
  const ChunkHandle chunk = backend.create_chunk(Location::gpu(0), 2 * kPage);
  const DevicePtr va = backend.reserve_address(2 * kPage, kPage);
  backend.map(va, 2 * kPage, chunk, 0);
  const StreamHandle on0 = backend.create_stream(0, 0);
  const StreamHandle on1 = backend.create_stream(1, 0);

  fake.enqueue_work(on0, va, kPage);
  ASSERT_EQ(fake.violations().size(), 1u) << "mapped, but nobody was granted access";
  EXPECT_NE(fake.violations()[0].find("device 0"), std::string::npos) << fake.violations()[0];
  fake.clear_violations();

  const AccessGrant grants[] = {{0, Access::read_write}, {1, Access::read}};
  backend.set_access(va, 2 * kPage, grants);
  fake.enqueue_work(on0, va, 2 * kPage);
  backend.copy_async(va, va + kPage, kPage, on0);
  EXPECT_TRUE(fake.violations().empty());
  backend.copy_async(va, va + kPage, kPage, on1);  // device 1 may only read
  fake.enqueue_work(on1, va, kPage);
  EXPECT_EQ(fake.violations().size(), 2u);

  fake.finish_all_work();
  fake.clear_violations();
  backend.destroy_stream(on0);
  backend.destroy_stream(on1);
  backend.unmap(va, 2 * kPage);
  backend.free_address(va, 2 * kPage);
  backend.release_chunk(chunk);
}

TEST(FakeDriverRules, DeviceAttributesArePerDeviceAndVersioned) {
  FakeDriverConfig config = profile(12040);
  config.devices[1].host_numa_id = 3;
  config.devices[1].gpu_direct_rdma_vmm = false;
  config.devices[1].posix_fd = false;
  FakeDriver fake(config);
  const cuda::DriverApi api = fake.api();
  ASSERT_EQ(api.cuInit(0), CUDA_SUCCESS);
  const auto get = [&](CUdevice_attribute attribute, int device) {
    int value = -7;
    const CUresult rc = api.cuDeviceGetAttribute(&value, attribute, device);
    return rc == CUDA_SUCCESS ? value : -100 - static_cast<int>(rc);
  };
  EXPECT_EQ(get(CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, 1), 3);
  EXPECT_EQ(get(CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, 0), 0);
  EXPECT_EQ(get(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, 0), 1);
  EXPECT_EQ(get(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, 1), 0);
  EXPECT_EQ(get(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 1), 0);
  EXPECT_EQ(get(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0), 1);
  EXPECT_EQ(get(CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0), 1);
  EXPECT_EQ(get(CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0),
            -100 - static_cast<int>(CUDA_ERROR_INVALID_VALUE))
      << "a 12.x driver does not know the HOST attribute";
}

TEST(FakeDriverRules, CreateRefusesHandleTypesAndRdmaTheDeviceLacks) {
  FakeDriverConfig config = profile(13000);
  config.devices[1].gpu_direct_rdma_vmm = false;
  config.devices[1].posix_fd = false;
  FakeDriver fake(config);
  const cuda::DriverApi api = fake.api();
  ASSERT_EQ(api.cuInit(0), CUDA_SUCCESS);
  for (const int device : {0, 1}) {
    CUmemAllocationProp fd = prop_at(CU_MEM_LOCATION_TYPE_DEVICE, device);
    fd.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CUmemAllocationProp rdma = prop_at(CU_MEM_LOCATION_TYPE_DEVICE, device);
    rdma.allocFlags.gpuDirectRDMACapable = 1;
    CUmemGenericAllocationHandle handle = 0;
    const CUresult fd_rc = api.cuMemCreate(&handle, kPage, &fd, 0);
    if (fd_rc == CUDA_SUCCESS) EXPECT_EQ(api.cuMemRelease(handle), CUDA_SUCCESS);
    const CUresult rdma_rc = api.cuMemCreate(&handle, kPage, &rdma, 0);
    if (rdma_rc == CUDA_SUCCESS) EXPECT_EQ(api.cuMemRelease(handle), CUDA_SUCCESS);
    EXPECT_EQ(fd_rc, device == 0 ? CUDA_SUCCESS : CUDA_ERROR_NOT_SUPPORTED);
    EXPECT_EQ(rdma_rc, device == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE);
  }
  const auto creates = fake.calls("cuMemCreate");
  ASSERT_EQ(creates.size(), 4u);
  EXPECT_EQ(creates[0].args.at(4), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  EXPECT_EQ(creates[1].args.at(5), 1u);
}

TEST(FakeDriverRules, StickyErrorFailsThatCallAndEveryLaterOne) {
  FakeDriver fake(profile(13000));
  const cuda::DriverApi api = fake.api();
  ASSERT_EQ(api.cuInit(0), CUDA_SUCCESS);
  int count = 0;
  fake.fail_sticky("cuDeviceGetCount", CUDA_ERROR_ILLEGAL_ADDRESS, 1);
  EXPECT_EQ(api.cuDeviceGetCount(&count), CUDA_SUCCESS) << "skipped once";
  EXPECT_EQ(api.cuInit(0), CUDA_SUCCESS) << "other calls do not trigger it";
  EXPECT_EQ(api.cuDeviceGetCount(&count), CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(api.cuInit(0), CUDA_ERROR_ILLEGAL_ADDRESS);
  CUdevice device = 0;
  EXPECT_EQ(api.cuDeviceGet(&device, 0), CUDA_ERROR_ILLEGAL_ADDRESS);
  const char* name = nullptr;
  EXPECT_EQ(api.cuGetErrorName(CUDA_ERROR_ILLEGAL_ADDRESS, &name), CUDA_SUCCESS);
  EXPECT_STREQ(name, "CUDA_ERROR_ILLEGAL_ADDRESS");
}

// --- backend and memory manager ----------------------------------------------------------------

// Every page of [p, p + bytes) has `access` for `device`.
::testing::AssertionResult all_pages(const FakeDriver& fake, DevicePtr p, std::size_t bytes,
                                     int device, Access access) {
  for (DevicePtr at = p - p % kPage; at < p + bytes; at += kPage) {
    if (fake.access_of(at, device) != access) {
      return ::testing::AssertionFailure() << "page " << std::hex << at << " of device "
                                           << device;
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(PeerAccessOnCudaFake, EveryPeerThatCanReachThePageIsGranted) {
  FakeDriver fake(profile(13000));
  auto backend = std::make_shared<cuda::CudaBackend>(fake.api());
  MemoryManager memory(backend);
  const DevicePtr p = memory.allocate({3 * MiB, 0});
  EXPECT_TRUE(all_pages(fake, p, 3 * MiB, 0, Access::read_write));
  EXPECT_TRUE(all_pages(fake, p, 3 * MiB, 1, Access::read_write));
  // A peer's kernel on the block faults on a GPU unless granted.
  const Stream peer(backend, 1);
  fake.enqueue_work(peer.handle(), p, 3 * MiB);
  fake.finish_all_work();
  EXPECT_TRUE(fake.violations().empty()) << fake.violations().front();

  // Remaps grant the peers too: to the host, then to the peer's own memory.
  memory.remap(p, Location::host());
  EXPECT_TRUE(all_pages(fake, p, 3 * MiB, 1, Access::read_write));
  EXPECT_EQ(fake.chunk_at(p)->where, Location::host());
  memory.remap(p, Location::gpu(1));
  EXPECT_TRUE(all_pages(fake, p, 3 * MiB, 0, Access::read_write));
  EXPECT_TRUE(all_pages(fake, p, 3 * MiB, 1, Access::read_write));
  memory.deallocate(p);
}

TEST(PeerAccessOnCudaFake, APeerWithoutALinkIsNotGranted) {
  FakeDriver fake(profile(13000));
  fake.set_peer(1, 0, {.access = false});
  fake.set_peer(0, 1, {.access = false});
  auto backend = std::make_shared<cuda::CudaBackend>(fake.api());
  MemoryManager memory(backend);
  const DevicePtr p = memory.allocate({3 * MiB, 0});
  EXPECT_TRUE(all_pages(fake, p, 3 * MiB, 0, Access::read_write));
  EXPECT_TRUE(all_pages(fake, p, 3 * MiB, 1, Access::none));
  // Host pages are within every device's reach, link or not.
  memory.remap(p, Location::host());
  EXPECT_TRUE(all_pages(fake, p, 3 * MiB, 1, Access::read_write));
  memory.deallocate(p);
}

TEST(HostTierOnCudaFake, Driver12UsesHostNumaNearestTheGpu) {
  // 12.2 takes HOST_NUMA but does not know the attribute that says so (the fake's model): the
  // backend asks the driver for a granularity then.
  for (const auto [version, numa] : {std::pair{12040, 1}, std::pair{12040, -1}, std::pair{12020, 1}}) {
    FakeDriverConfig config = profile(version);
    for (auto& device : config.devices) device.host_numa_id = numa;
    FakeDriver fake(config);
    auto backend = std::make_shared<cuda::CudaBackend>(fake.api());
    const DeviceProperties props = backend->properties(0);
    EXPECT_TRUE(props.host_chunks);
    const int node = numa < 0 ? 0 : numa;  // -1: a system without NUMA
    EXPECT_EQ(props.host_chunk_location, "HOST_NUMA:" + std::to_string(node));
    MemoryManager memory(backend);
    EXPECT_TRUE(memory.stats().host_tier_available);
    const DevicePtr p = memory.allocate({kPage, 0});
    memory.remap(p, Location::host());
    EXPECT_EQ(fake.chunk_at(p)->where, Location::host());
    const auto creates = fake.calls("cuMemCreate");
    ASSERT_FALSE(creates.empty());
    EXPECT_EQ(creates.back().args[1], CU_MEM_LOCATION_TYPE_HOST_NUMA);
    EXPECT_EQ(creates.back().args[2], static_cast<std::uint64_t>(node));
    memory.deallocate(p);
  }
}

TEST(HostTierOnCudaFake, Driver13UsesPlainHostAndOldDriversHaveNone) {
  {
    FakeDriver fake(profile(13000));
    auto backend = std::make_shared<cuda::CudaBackend>(fake.api());
    EXPECT_EQ(backend->properties(0).host_chunk_location, "HOST");
    MemoryManager memory(backend);
    EXPECT_TRUE(memory.stats().host_tier_available);
    const DevicePtr p = memory.allocate({kPage, 0});
    memory.remap(p, Location::host());
    EXPECT_EQ(fake.calls("cuMemCreate").back().args[1], CU_MEM_LOCATION_TYPE_HOST);
    memory.deallocate(p);
  }
  FakeDriver fake(profile(12000));  // before HOST_NUMA
  auto backend = std::make_shared<cuda::CudaBackend>(fake.api());
  EXPECT_FALSE(backend->properties(0).host_chunks);
  EXPECT_FALSE(MemoryManager(backend).stats().host_tier_available);
}

TEST(ShareableChunksOnCudaFake, ChunksAskForWhatTheDeviceSupports) {
  FakeDriverConfig config = profile(13000);
  config.devices[1].gpu_direct_rdma_vmm = false;
  config.devices[1].posix_fd = false;
  FakeDriver fake(config);
  cuda::CudaBackend backend(fake.api());
  EXPECT_TRUE(backend.properties(0).gpu_direct_rdma);
  EXPECT_TRUE(backend.properties(0).shareable_handles);
  EXPECT_FALSE(backend.properties(1).shareable_handles);
  const ChunkHandle capable = backend.create_chunk(Location::gpu(0), kPage);
  const ChunkHandle plain = backend.create_chunk(Location::gpu(1), kPage);
  const auto creates = fake.calls("cuMemCreate");
  ASSERT_EQ(creates.size(), 2u);
  EXPECT_EQ(creates[0].args.at(4), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  EXPECT_EQ(creates[0].args.at(5), 1u);
  EXPECT_EQ(creates[1].args.at(4), CU_MEM_HANDLE_TYPE_NONE);
  EXPECT_EQ(creates[1].args.at(5), 0u);
  backend.release_chunk(capable);
  backend.release_chunk(plain);
}

TEST(OutOfMemoryOnCudaFake, MapAndReserveRefusalsAreOutOfMemory) {
  FakeDriver fake(profile(13000));
  auto backend = std::make_shared<cuda::CudaBackend>(fake.api());
  MemoryManager memory(backend);
  for (const char* call : {"cuMemAddressReserve", "cuMemMap"}) {
    fake.fail_next(call, CUDA_ERROR_OUT_OF_MEMORY);
    try {
      static_cast<void>(memory.allocate({kPage, 0}));
      ADD_FAILURE() << call << ": no error";
    } catch (const OutOfMemory& e) {
      EXPECT_NE(std::string(e.what()).find(call), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << call << ": " << e.what();
    }
  }
  const DevicePtr p = memory.allocate({kPage, 0});  // nothing was left half-done
  memory.deallocate(p);
}

TEST(StickyErrorOnCudaFake, PageMoverDoesNotRetryAStickyError) {
  FakeDriver fake(profile(13000));
  auto backend = std::make_shared<cuda::CudaBackend>(fake.api());
  auto memory = std::make_unique<MemoryManager>(backend);
  const DevicePtr p = memory->allocate({kPage, 0});
  fake.clear_calls();
  // The mover maps the new page into its staging window, then under the block's address: that
  // second map hits a context lost to a kernel fault.
  fake.fail_sticky("cuMemMap", CUDA_ERROR_ILLEGAL_ADDRESS, 1);
  try {
    memory->remap(p, Location::gpu(1));
    ADD_FAILURE() << "no error";
  } catch (const DeviceError& e) {
    EXPECT_EQ(e.status(), "CUDA_ERROR_ILLEGAL_ADDRESS");
  }
  EXPECT_LE(fake.count("cuMemMap"), 3u) << "staging, the failed map, one try to put it back";
  // Every call after a sticky error fails: the page mover's put-back gives up at its first
  // refusal instead of trying 16 times (each try several calls).
  std::size_t refused = 0;
  for (const auto& call : fake.calls()) refused += call.result == CUDA_ERROR_ILLEGAL_ADDRESS;
  EXPECT_LE(refused, 4u);
  memory.reset();  // tearing down after a lost context logs, does not throw
}

TEST(LazyContextsOnCudaFake, OnlyUsedDevicesRetainTheirContext) {
  FakeDriver fake(profile(13000, 4));
  auto backend = std::make_shared<cuda::CudaBackend>(fake.api());
  for (int d = 0; d < 4; ++d) EXPECT_EQ(fake.retained_contexts(d), 0) << d;
  {
    MemoryManager memory(backend);
    const DevicePtr p = memory.allocate({3 * MiB, 0});
    EXPECT_EQ(fake.retained_contexts(0), 1);
    for (int d = 1; d < 4; ++d) EXPECT_EQ(fake.retained_contexts(d), 0) << d;
    EXPECT_TRUE(all_pages(fake, p, 3 * MiB, 3, Access::read_write)) << "granted all the same";
    memory.deallocate(p);
  }
  const Stream stream(backend, 2);
  EXPECT_EQ(fake.retained_contexts(2), 1);
  EXPECT_EQ(fake.retained_contexts(1), 0);
}

}  // namespace
}  // namespace salus::testing
