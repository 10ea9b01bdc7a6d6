// The CUDA backend's own logic, run against the fake driver (no GPU needed), plus the loader and
// factory behaviour on a machine without a driver.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/cuda_backend.hpp"
#include "cuda/driver_api.hpp"
#include "salus/cuda.hpp"
#include "support/fake_driver.hpp"

namespace salus {
namespace {

using cuda::CudaBackend;
using test::FakeCall;
using test::FakeDriver;
using test::FakeDriverConfig;

constexpr std::size_t kPage = 2 * MiB;

class CudaBackendFake : public ::testing::Test {
 protected:
  FakeDriver fake_{FakeDriverConfig::uniform(3, 8 * GiB)};
  CudaBackend backend_{fake_.api()};
};

// --- the table and the loader --------------------------------------------------------------

TEST(CudaDriverApi, FakeFillsEveryEntry) {
  FakeDriver fake;
  const cuda::DriverApi api = fake.api();
#define SALUS_EXPECT_FILLED(name) EXPECT_NE(api.name, nullptr) << #name;
  SALUS_CUDA_DRIVER_ENTRIES(SALUS_EXPECT_FILLED)
  SALUS_CUDA_OPTIONAL_DRIVER_ENTRIES(SALUS_EXPECT_FILLED)
#undef SALUS_EXPECT_FILLED
}

struct ProcRequest {
  std::string symbol;
  int version;
  cuuint64_t flags;
};
std::vector<ProcRequest> g_requests;
std::string g_missing;

CUresult fake_get_proc(const char* symbol, void** pfn, int version, cuuint64_t flags,
                       CUdriverProcAddressQueryResult* status) {
  g_requests.push_back({symbol, version, flags});
  if (symbol == g_missing) {
    *pfn = nullptr;
    *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_ERROR_NOT_FOUND;
  }
  // Any non-null address: resolve_driver_api only stores it.
  *pfn = reinterpret_cast<void*>(&fake_get_proc);
  *status = CU_GET_PROC_ADDRESS_SUCCESS;
  return CUDA_SUCCESS;
}

TEST(CudaDriverApi, ResolvesBaseNamesAtOneVersion) {
  g_requests.clear();
  g_missing.clear();
  const cuda::DriverApi api = cuda::resolve_driver_api(&fake_get_proc, nullptr);
  ASSERT_EQ(g_requests.size(), cuda::kDriverEntryNames.size());
  for (std::size_t i = 0; i < g_requests.size(); ++i) {
    // Base names only: the driver picks _v2/_ptsz for the version, never the caller.
    EXPECT_EQ(g_requests[i].symbol, cuda::kDriverEntryNames[i]);
    EXPECT_EQ(g_requests[i].version, cuda::kDriverApiVersion);
    EXPECT_EQ(g_requests[i].flags, CU_GET_PROC_ADDRESS_DEFAULT);
  }
  EXPECT_NE(std::find_if(g_requests.begin(), g_requests.end(),
                         [](const ProcRequest& r) { return r.symbol == "cuStreamDestroy"; }),
            g_requests.end());
  EXPECT_NE(api.cuMemMap, nullptr);
}

TEST(CudaDriverApi, MissingSymbolIsNotSupportedNamingIt) {
  g_requests.clear();
  g_missing = "cuMemSetAccess";
  try {
    static_cast<void>(cuda::resolve_driver_api(&fake_get_proc, nullptr));
    FAIL() << "expected NotSupported";
  } catch (const NotSupported& e) {
    EXPECT_NE(std::string(e.what()).find("cuMemSetAccess"), std::string::npos) << e.what();
  }
  g_missing.clear();
}

TEST(CudaDriverApi, MissingOptionalSymbolsStayNull) {
  for (const char* optional : cuda::kOptionalDriverEntryNames) {
    g_requests.clear();
    g_missing = optional;
    cuda::DriverApi api;
    ASSERT_NO_THROW(api = cuda::resolve_driver_api(&fake_get_proc, nullptr)) << optional;
    EXPECT_EQ(g_requests.size(), cuda::kDriverEntryNames.size()) << "every entry was asked for";
    // Only the missing one is null.
    const std::string missing = optional;
    EXPECT_EQ(api.cuMemExportToShareableHandle == nullptr,
              missing == "cuMemExportToShareableHandle");
    EXPECT_EQ(api.cuMemImportFromShareableHandle == nullptr,
              missing == "cuMemImportFromShareableHandle");
    EXPECT_EQ(api.cuIpcGetEventHandle == nullptr, missing == "cuIpcGetEventHandle");
    EXPECT_EQ(api.cuIpcOpenEventHandle == nullptr, missing == "cuIpcOpenEventHandle");
    EXPECT_NE(api.cuMemMap, nullptr);
  }
  g_missing.clear();
}

TEST(CudaDriverApi, ErrorNames) {
  FakeDriver fake;
  cuda::DriverApi api = fake.api();
  EXPECT_EQ(cuda::error_name(api, CUDA_ERROR_OUT_OF_MEMORY), "CUDA_ERROR_OUT_OF_MEMORY");
  // A code this header does not name (a newer driver's), within CUresult's range of values
  // (0..1023, from CUDA_ERROR_UNKNOWN = 999): beyond it the cast itself is undefined.
  EXPECT_EQ(cuda::error_name(api, static_cast<CUresult>(777)), "CUDA_ERROR_777");
  api.cuGetErrorName = nullptr;
  EXPECT_EQ(cuda::error_name(api, CUDA_ERROR_INVALID_VALUE), "CUDA_ERROR_1");
  const DeviceError e = cuda::driver_error(fake.api(), "cuMemMap", CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(e.call(), "cuMemMap");
  EXPECT_EQ(e.status(), "CUDA_ERROR_INVALID_VALUE");
  EXPECT_EQ(e.status_code(), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(e.code(), Errc::device_error);
  EXPECT_FALSE(e.is_out_of_memory());
  // Out of memory is told by the driver's code, whatever name the error carries.
  EXPECT_TRUE(cuda::driver_error(api, "cuMemCreate", CUDA_ERROR_OUT_OF_MEMORY).is_out_of_memory());
  EXPECT_TRUE(DeviceError("cuMemCreate", "renamed", CUDA_ERROR_OUT_OF_MEMORY).is_out_of_memory());
  EXPECT_FALSE(DeviceError("cuMemCreate", "CUDA_ERROR_OUT_OF_MEMORY", 1).is_out_of_memory());
}

TEST(CudaLoader, NoGpuHereMeansNotSupportedAndSimulatorFallback) {
  // This machine has no driver (at most the toolkit's link stub, which is not on the loader's
  // path): loading must fail cleanly, never crash or throw anything untyped.
  bool loaded = false;
  try {
    const cuda::DriverApi api = cuda::load_driver_api();
    loaded = true;
  } catch (const NotSupported& e) {
    // No library at all, or (with the toolkit's stub on the path) a library that resolves nothing.
    EXPECT_NE(std::string(e.what()).find("CUDA driver"), std::string::npos) << e.what();
  }
  if (loaded) GTEST_SKIP() << "a CUDA driver is installed here";
  EXPECT_FALSE(cuda_available());
  EXPECT_THROW(static_cast<void>(make_cuda_backend()), NotSupported);
  const auto backend = make_default_backend(SimConfig::uniform(2, 64 * MiB));
  ASSERT_NE(backend, nullptr);
  EXPECT_EQ(backend->name(), "sim");
  EXPECT_EQ(backend->device_count(), 2);
}

TEST(CudaLinkage, LibsalusDoesNotLinkLibcuda) {
  const char* path = std::getenv("SALUS_LIBSALUS_PATH");
  if (path == nullptr || *path == '\0') GTEST_SKIP() << "SALUS_LIBSALUS_PATH is not set";
  const std::string command = std::string("ldd '") + path + "' 2>&1";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(command.c_str(), "r"), &::pclose);
  ASSERT_NE(pipe, nullptr);
  std::string output;
  std::array<char, 512> buffer{};
  while (std::fgets(buffer.data(), static_cast<int>(buffer.size()), pipe.get()) != nullptr) {
    output += buffer.data();
  }
  EXPECT_NE(output.find("lib"), std::string::npos) << "ldd printed nothing useful: " << output;
  EXPECT_EQ(output.find("libcuda"), std::string::npos) << output;
}

// --- construction and properties -------------------------------------------------------------

TEST_F(CudaBackendFake, PropertiesComeFromTheDriver) {
  EXPECT_EQ(backend_.name(), "cuda");
  ASSERT_EQ(backend_.device_count(), 3);
  const DeviceProperties props = backend_.properties(1);
  EXPECT_EQ(props.name, "Salus Fake GPU");
  EXPECT_EQ(props.total_memory, 8 * GiB);
  EXPECT_EQ(props.granularity, kPage);
  EXPECT_EQ(backend_.granularity(Location::gpu(2)), kPage);
  EXPECT_EQ(backend_.granularity(Location::host()), kPage);
  // Properties and granularities need no context: none is retained before a device is used.
  for (int d = 0; d < 3; ++d) EXPECT_EQ(fake_.retained_contexts(d), 0);
}

TEST(CudaBackendFakeConfig, GranularityIsReadNotAssumed) {
  FakeDriverConfig config = FakeDriverConfig::uniform(2);
  config.devices[1].granularity = 4 * MiB;
  config.host_chunks = false;
  FakeDriver fake(config);
  CudaBackend backend(fake.api());
  EXPECT_EQ(backend.granularity(Location::gpu(0)), 2 * MiB);
  EXPECT_EQ(backend.granularity(Location::gpu(1)), 4 * MiB);
  EXPECT_THROW(static_cast<void>(backend.granularity(Location::host())), NotSupported);
  EXPECT_THROW(static_cast<void>(backend.create_chunk(Location::host(), 2 * MiB)), NotSupported);
  EXPECT_THROW(static_cast<void>(backend.create_chunk(Location::gpu(1), 2 * MiB)), InvalidArgument);
  const auto granularity_queries = fake.calls("cuMemGetAllocationGranularity");
  // Once per device; not for the host, whose support attributes already said no.
  ASSERT_EQ(granularity_queries.size(), 2u);
  EXPECT_EQ(granularity_queries[1].args[0], CU_MEM_LOCATION_TYPE_DEVICE);
}

// cuMemGetInfo answers for the current context's device (the fake refuses it without one, as
// CUDA does): the backend binds the device's context first, and reads what other processes hold.
TEST(CudaBackendFakeConfig, FreeMemoryIsTheDevicesAsTheDriverSeesItNow) {
  FakeDriverConfig config = FakeDriverConfig::uniform(2, 1 * GiB);
  config.devices[1].used_elsewhere = 300 * MiB;
  FakeDriver fake(config);
  CudaBackend backend(fake.api());
  EXPECT_EQ(backend.free_memory(0), 1 * GiB);
  EXPECT_EQ(backend.free_memory(1), 1 * GiB - 300 * MiB);
  const ChunkHandle chunk = backend.create_chunk(Location::gpu(1), 2 * MiB);
  EXPECT_EQ(backend.free_memory(1), 1 * GiB - 302 * MiB);
  backend.release_chunk(chunk);
  const auto queries = fake.calls("cuMemGetInfo");
  ASSERT_EQ(queries.size(), 3u);
  EXPECT_EQ(queries[1].context_device, 1) << "asked with device 1's context current";
  EXPECT_THROW(static_cast<void>(backend.free_memory(2)), InvalidArgument);
}

TEST(CudaBackendFakeConfig, NoDeviceIsNotSupported) {
  FakeDriverConfig config;
  config.devices.clear();
  FakeDriver fake(config);
  EXPECT_THROW(CudaBackend{fake.api()}, NotSupported);
}

TEST(CudaBackendFakeConfig, ContextsAreReleasedEvenWhenTheDriverRefuses) {
  FakeDriver fake(FakeDriverConfig::uniform(2));
  {
    CudaBackend backend(fake.api());
    backend.destroy_stream(backend.create_stream(0, 0));  // both devices used: both retained
    backend.destroy_stream(backend.create_stream(1, 0));
    EXPECT_EQ(fake.retained_contexts(0), 1);
    EXPECT_EQ(fake.retained_contexts(1), 1);
    fake.fail_next("cuDevicePrimaryCtxRelease", CUDA_ERROR_INVALID_CONTEXT);
  }  // a failing release is logged; the destructor does not throw
  EXPECT_EQ(fake.count("cuDevicePrimaryCtxRelease"), 2u);
  EXPECT_EQ(fake.retained_contexts(0) + fake.retained_contexts(1), 1);
  {
    CudaBackend backend(fake.api());
    backend.destroy_stream(backend.create_stream(1, 0));
  }
  EXPECT_EQ(fake.retained_contexts(0) + fake.retained_contexts(1), 1);
}

// --- memory ----------------------------------------------------------------------------------

// Bad sizes never reach the driver (DeviceBackend refuses them first, in the words
// contract/test_backend_arguments.cpp checks on every backend).
TEST_F(CudaBackendFake, ChunksAskTheDriverForTheirLocationAndHandleType) {
  fake_.clear_calls();
  const ChunkHandle chunk = backend_.create_chunk(Location::gpu(1), 3 * kPage);
  const auto creates = fake_.calls("cuMemCreate");
  ASSERT_EQ(creates.size(), 1u);
  EXPECT_EQ(creates[0].args,
            (std::vector<std::uint64_t>{3 * kPage, CU_MEM_LOCATION_TYPE_DEVICE, 1, 0,
                                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 1}));
  EXPECT_EQ(fake_.used_bytes(Location::gpu(1)), 3 * kPage);
  const ChunkHandle host = backend_.create_chunk(Location::host(), kPage);
  EXPECT_EQ(fake_.calls("cuMemCreate")[1].args[1], CU_MEM_LOCATION_TYPE_HOST);
  EXPECT_EQ(fake_.live_chunks(), 2u);
  backend_.release_chunk(chunk);
  backend_.release_chunk(host);
  EXPECT_EQ(fake_.live_chunks(), 0u);
  EXPECT_THROW(backend_.release_chunk(chunk), InvalidArgument);  // double release
}

// Alignment, sizes, devices and the chunk's bounds: contract/test_backend_arguments.cpp. Here,
// that none of the refusals the backend makes itself reaches the driver.
TEST_F(CudaBackendFake, RejectsBadRangesBeforeTheDriver) {
  const ChunkHandle chunk = backend_.create_chunk(Location::gpu(0), 2 * kPage);
  const DevicePtr va = backend_.reserve_address(4 * kPage, 0);
  EXPECT_EQ(va % kPage, 0u);
  fake_.clear_calls();
  EXPECT_THROW(backend_.map(va, 2 * kPage, chunk, kPage), InvalidArgument);  // past the chunk
  EXPECT_THROW(backend_.map(va, kPage, ChunkHandle{0xdead}, 0), InvalidArgument);
  EXPECT_TRUE(fake_.call_names().empty());
}

TEST_F(CudaBackendFake, SetAccessSendsOneDescriptorPerGrant) {
  const ChunkHandle chunk = backend_.create_chunk(Location::gpu(0), kPage);
  const DevicePtr va = backend_.reserve_address(kPage, 0);
  backend_.map(va, kPage, chunk, 0);
  fake_.clear_calls();
  const std::array<AccessGrant, 3> grants{
      {{0, Access::read_write}, {1, Access::read}, {2, Access::none}}};
  backend_.set_access(va, kPage, grants);
  const auto calls = fake_.calls("cuMemSetAccess");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].args, (std::vector<std::uint64_t>{
                               va, kPage, 3,  //
                               CU_MEM_LOCATION_TYPE_DEVICE, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
                               CU_MEM_LOCATION_TYPE_DEVICE, 1, CU_MEM_ACCESS_FLAGS_PROT_READ,
                               CU_MEM_LOCATION_TYPE_DEVICE, 2, CU_MEM_ACCESS_FLAGS_PROT_NONE}));
  EXPECT_EQ(fake_.access_of(va, 0), Access::read_write);
  EXPECT_EQ(fake_.access_of(va, 1), Access::read);
  EXPECT_EQ(fake_.access_of(va, 2), Access::none);
  backend_.set_access(va, kPage, {});  // nothing to replace: no driver call
  EXPECT_EQ(fake_.count("cuMemSetAccess"), 1u);
}

TEST_F(CudaBackendFake, MapThenGrantEveryDeviceThenTearDown) {
  const DevicePtr va = backend_.reserve_address(3 * kPage, 0);
  std::vector<ChunkHandle> chunks;
  for (int d = 0; d < 3; ++d) chunks.push_back(backend_.create_chunk(Location::gpu(d), kPage));
  fake_.clear_calls();
  // Stitch one page from each device into one range, and let every device use all of it.
  const std::array<AccessGrant, 3> all{
      {{0, Access::read_write}, {1, Access::read_write}, {2, Access::read_write}}};
  for (int d = 0; d < 3; ++d) {
    backend_.map(va + static_cast<DevicePtr>(d) * kPage, kPage, chunks[static_cast<std::size_t>(d)],
                 0);
    backend_.set_access(va + static_cast<DevicePtr>(d) * kPage, kPage, all);
  }
  EXPECT_EQ(fake_.call_names(),
            (std::vector<std::string>{"cuMemMap", "cuMemSetAccess", "cuMemMap", "cuMemSetAccess",
                                      "cuMemMap", "cuMemSetAccess"}));
  EXPECT_EQ(fake_.mapped_bytes(), 3 * kPage);
  for (int d = 0; d < 3; ++d) {
    EXPECT_EQ(fake_.access_of(va + 2 * kPage + 100, d), Access::read_write);
  }
  const auto maps = fake_.calls("cuMemMap");
  EXPECT_EQ(maps[1].args, (std::vector<std::uint64_t>{va + kPage, kPage, 0, chunks[1].value, 0}));
  EXPECT_EQ(maps[1].context_device, 1);  // bound to the chunk's device

  backend_.unmap(va, 3 * kPage);
  EXPECT_EQ(fake_.mapped_bytes(), 0u);
  EXPECT_EQ(fake_.access_of(va, 0), Access::none);  // access goes with the mapping
  for (const ChunkHandle chunk : chunks) backend_.release_chunk(chunk);
  backend_.free_address(va, 3 * kPage);
  EXPECT_EQ(fake_.live_chunks(), 0u);
  EXPECT_EQ(fake_.reserved_bytes(), 0u);
}

TEST_F(CudaBackendFake, PeerLinkClassification) {
  fake_.set_peer(0, 1, {true, 0, true});
  fake_.set_peer(0, 2, {true, 1, false});
  fake_.set_peer(1, 2, {false, 0, false});
  const PeerLink self = backend_.peer_link(1, 1);
  EXPECT_EQ(self.kind, LinkKind::self);
  EXPECT_TRUE(self.can_access);
  const PeerLink nvlink = backend_.peer_link(0, 1);
  EXPECT_EQ(nvlink.kind, LinkKind::nvlink);
  EXPECT_TRUE(nvlink.can_access);
  EXPECT_EQ(nvlink.bandwidth_gbps, 0.0);
  const PeerLink pcie = backend_.peer_link(0, 2);
  EXPECT_EQ(pcie.kind, LinkKind::pcie);
  EXPECT_EQ(pcie.performance_rank, 1);
  const PeerLink none = backend_.peer_link(1, 2);
  EXPECT_EQ(none.kind, LinkKind::none);
  EXPECT_FALSE(none.can_access);
}

// --- streams and events ----------------------------------------------------------------------

TEST_F(CudaBackendFake, StreamsRunInTheirDeviceContextAndRestoreTheCallers) {
  const StreamPriorityRange range = backend_.stream_priority_range(0);
  EXPECT_EQ(range.least, 0);
  EXPECT_EQ(range.greatest, -5);
  fake_.clear_calls();
  const StreamHandle stream = backend_.create_stream(2, range.greatest);
  EXPECT_NE(stream.value, 0u);
  const auto creates = fake_.calls("cuStreamCreateWithPriority");
  ASSERT_EQ(creates.size(), 1u);
  EXPECT_EQ(creates[0].context_device, 2);
  EXPECT_EQ(creates[0].args[0], CU_STREAM_NON_BLOCKING);
  EXPECT_EQ(static_cast<int>(creates[0].args[1]), -5);
  // A created stream names its context: the call runs in the thread's (none here).
  backend_.synchronize_stream(stream);
  EXPECT_EQ(fake_.calls("cuStreamSynchronize")[0].context_device, -1);
  backend_.synchronize_stream(StreamHandle{0});  // the legacy default stream: device 0's
  EXPECT_EQ(fake_.calls("cuStreamSynchronize")[1].args[0], 0u);
  EXPECT_EQ(fake_.calls("cuStreamSynchronize")[1].context_device, 0);
  // The thread's context is restored after every call (none was current in this test thread).
  const auto all = fake_.calls();
  EXPECT_EQ(all.back().name, "cuCtxSetCurrent");
  EXPECT_EQ(all.back().args[0], 0u);
  backend_.destroy_stream(stream);
  EXPECT_EQ(fake_.live_streams(), 0u);
  EXPECT_THROW(backend_.destroy_stream(stream), InvalidArgument);
}

TEST_F(CudaBackendFake, EventsQueryNotReadyAsFalse) {
  const StreamHandle stream = backend_.create_stream(1, 0);
  const EventHandle event = backend_.create_event(1);
  EXPECT_EQ(fake_.calls("cuEventCreate")[0].args[0], CU_EVENT_DISABLE_TIMING);
  EXPECT_TRUE(backend_.query_event(event));  // never recorded
  fake_.hold_events(true);
  backend_.record_event(event, stream);
  EXPECT_FALSE(backend_.query_event(event));
  const StreamHandle other = backend_.create_stream(0, 0);
  backend_.stream_wait_event(other, event, 0);
  EXPECT_EQ(fake_.calls("cuStreamWaitEvent")[0].context_device, -1);  // the handles name theirs
  // The default stream (handle 0) of the named device waits, not the event's device's.
  backend_.stream_wait_event(StreamHandle{0}, event, 0);
  EXPECT_EQ(fake_.calls("cuStreamWaitEvent")[1].context_device, 0);
  EXPECT_FALSE(backend_.query_stream(StreamHandle{0}, 0));
  EXPECT_EQ(fake_.calls("cuStreamQuery").back().context_device, 0);
  backend_.synchronize_event(event);
  EXPECT_TRUE(backend_.query_event(event));
  backend_.record_event(event, StreamHandle{0});
  EXPECT_FALSE(backend_.query_event(event));
  fake_.complete_events();
  EXPECT_TRUE(backend_.query_event(event));
  backend_.destroy_event(event);
  EXPECT_THROW(static_cast<void>(backend_.query_event(event)), InvalidArgument);
  backend_.destroy_stream(stream);
  backend_.destroy_stream(other);
  EXPECT_EQ(fake_.live_events(), 0u);
}

// Calls on stream and event handles cost one driver call each: no cuCtxGetCurrent, no
// cuCtxSetCurrent (the hot path's fences and queries). A driver that wanted a current context
// for them would answer CUDA_ERROR_INVALID_CONTEXT: then, and only then, the device's context is
// bound for a second try, and the caller's is restored.
TEST(CudaBackendContexts, HandleCallsBindAContextOnlyWhenTheDriverAsks) {
  for (const bool need : {false, true}) {
    FakeDriverConfig config = FakeDriverConfig::uniform(2, 8 * GiB);
    config.handle_calls_need_context = need;
    FakeDriver fake(config);
    CudaBackend backend(fake.api());
    const StreamHandle stream = backend.create_stream(1, 0);
    const EventHandle event = backend.create_event(1);
    fake.clear_calls();
    backend.record_event(event, stream);
    EXPECT_TRUE(backend.query_event(event));
    EXPECT_TRUE(backend.query_stream(stream, 1));
    backend.stream_wait_event(stream, event, 1);
    EXPECT_FALSE(backend.stream_capturing(stream));
    backend.synchronize_event(event);
    const std::vector<std::string> names = fake.call_names(true);
    const std::vector<std::string> calls = {"cuEventRecord", "cuEventQuery", "cuStreamQuery",
                                            "cuStreamWaitEvent", "cuStreamIsCapturing",
                                            "cuEventSynchronize"};
    if (!need) {
      EXPECT_EQ(names, calls);
    } else {
      // Each: refused, then the context saved, bound, the call again, the caller's restored.
      std::vector<std::string> expected;
      for (const auto& call : calls) {
        expected.insert(expected.end(),
                        {call, "cuCtxGetCurrent", "cuCtxSetCurrent", call, "cuCtxSetCurrent"});
      }
      EXPECT_EQ(names, expected);
      for (const FakeCall& c : fake.calls()) {
        if (c.name == "cuEventRecord" && c.result == CUDA_SUCCESS) EXPECT_EQ(c.context_device, 1);
      }
    }
    backend.destroy_event(event);
    backend.destroy_stream(stream);
  }
}

TEST_F(CudaBackendFake, HostFunctionsRunAndTheirExceptionsStayOut) {
  const StreamHandle stream = backend_.create_stream(0, 0);
  int runs = 0;
  backend_.launch_host_func(stream, [&] { ++runs; });
  backend_.synchronize_stream(stream);  // they run on the driver's thread, in stream order
  EXPECT_EQ(runs, 1);
  EXPECT_NO_THROW(backend_.launch_host_func(stream, [&] {
    ++runs;
    throw std::runtime_error("boom");
  }));
  backend_.synchronize_stream(stream);
  EXPECT_EQ(runs, 2);
  EXPECT_NO_THROW(backend_.launch_host_func(stream, [] { throw 42; }));
  // A refused launch keeps (and frees) the closure: nothing runs, nothing leaks (ASan checks).
  fake_.fail_next("cuLaunchHostFunc", CUDA_ERROR_INVALID_VALUE);
  auto shared = std::make_shared<int>(0);
  EXPECT_THROW(backend_.launch_host_func(stream, [shared, &runs] { ++runs; }), DeviceError);
  backend_.synchronize_stream(stream);
  EXPECT_EQ(runs, 2);
  EXPECT_EQ(shared.use_count(), 1);
  backend_.destroy_stream(stream);
}

TEST_F(CudaBackendFake, CopiesAreOrderedOnTheStream) {
  const ChunkHandle chunk = backend_.create_chunk(Location::gpu(0), 2 * kPage);
  const DevicePtr va = backend_.reserve_address(2 * kPage, 0);
  backend_.map(va, 2 * kPage, chunk, 0);
  const StreamHandle stream = backend_.create_stream(0, 0);
  backend_.copy_async(va + kPage, va, kPage, stream);
  const auto copies = fake_.calls("cuMemcpyAsync");
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].args, (std::vector<std::uint64_t>{va + kPage, va, kPage, stream.value}));
  EXPECT_THROW(backend_.copy_async(va, va + 8 * kPage, kPage, stream), DeviceError);  // unmapped
  backend_.destroy_stream(stream);
}

}  // namespace
}  // namespace salus
