// Every driver entry point the CUDA backend calls, made to fail once: the backend method that
// calls it throws DeviceError naming the entry point and the driver's error, and the backend (or,
// for construction-time calls, a new backend) works afterwards.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cuda/cuda_backend.hpp"
#include "cuda/driver_api.hpp"
#include "support/fake_driver.hpp"

namespace salus {
namespace {

using cuda::CudaBackend;
using test::FakeDriver;
using test::FakeDriverConfig;

constexpr std::size_t kPage = 2 * MiB;

// Live objects for the actions to use. Every action must succeed when run a second time.
struct Env {
  FakeDriver& fake;
  CudaBackend& backend;
  DevicePtr va = 0;  // two pages mapped, read-write for both devices
  StreamHandle stream{};
  EventHandle event{};
  EventHandle timed_start{};  // timing events, both recorded (and so complete) on `stream`
  EventHandle timed_end{};
};

struct FailureCase {
  const char* call;
  CUresult code;
  std::function<void(Env&)> action;
};

void map_fresh_page(Env& env, bool grant) {
  const ChunkHandle chunk = env.backend.create_chunk(Location::gpu(0), kPage);
  const DevicePtr va = env.backend.reserve_address(kPage, 0);
  env.backend.map(va, kPage, chunk, 0);
  if (grant) {
    const std::array<AccessGrant, 2> grants{{{0, Access::read_write}, {1, Access::read}}};
    env.backend.set_access(va, kPage, grants);
  }
  env.backend.unmap(va, kPage);
  env.backend.free_address(va, kPage);
  env.backend.release_chunk(chunk);
}

// Checks a stream made straight through the driver (as a framework makes it), so that the
// backend must ask the driver which device it belongs to.
void validate_framework_stream(Env& env) {
  const cuda::DriverApi api = env.fake.api();
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  CUstream stream = nullptr;
  ASSERT_EQ(api.cuDeviceGet(&dev, 0), CUDA_SUCCESS);
  ASSERT_EQ(api.cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
  ASSERT_EQ(api.cuCtxSetCurrent(ctx), CUDA_SUCCESS);
  ASSERT_EQ(api.cuStreamCreateWithPriority(&stream, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
  ASSERT_EQ(api.cuCtxSetCurrent(nullptr), CUDA_SUCCESS);
  ASSERT_EQ(api.cuDevicePrimaryCtxRelease(dev), CUDA_SUCCESS);
  struct Destroy {
    const cuda::DriverApi& api;
    CUstream stream;
    ~Destroy() { api.cuStreamDestroy(stream); }
  } destroy{api, stream};
  env.backend.validate_stream(StreamHandle{std::bit_cast<std::uint64_t>(stream)}, 0);
}

// Exports a fresh chunk and imports it again; the chunks and the descriptor go even when a call
// fails, so that the second run finds the backend as the first did.
void share_fresh_chunk(Env& env) {
  const ChunkHandle chunk = env.backend.create_chunk(Location::gpu(0), kPage);
  SharedChunk shared;
  ChunkHandle imported{};
  try {
    shared = env.backend.export_chunk(chunk);
    imported = env.backend.import_chunk(Location::gpu(0), shared);
  } catch (...) {
    if (shared.fd >= 0) ::close(shared.fd);
    env.backend.release_chunk(chunk);
    throw;
  }
  ::close(shared.fd);
  env.backend.release_chunk(imported);
  env.backend.release_chunk(chunk);
}

// Makes a shareable event, exports and opens it (the fake opens its own exports); every event goes
// even when a call fails.
void share_fresh_event(Env& env) {
  const EventHandle made = env.backend.create_shareable_event(0);
  try {
    const EventHandle opened = env.backend.import_event(0, env.backend.export_event(made));
    env.backend.destroy_event(opened);
  } catch (...) {
    env.backend.destroy_event(made);
    throw;
  }
  env.backend.destroy_event(made);
}

void construct(Env& env) {
  CudaBackend another(env.fake.api());
}

std::vector<FailureCase> failure_cases() {
  return {
      {"cuInit", CUDA_ERROR_INVALID_VALUE, construct},
      {"cuDeviceGetCount", CUDA_ERROR_INVALID_VALUE, construct},
      {"cuDeviceGet", CUDA_ERROR_INVALID_DEVICE, construct},
      // Contexts are retained on a device's first use, not at construction.
      {"cuDevicePrimaryCtxRetain", CUDA_ERROR_OUT_OF_MEMORY,
       [](Env& e) {
         CudaBackend another(e.fake.api());
         another.destroy_stream(another.create_stream(1, 0));
       }},
      {"cuMemGetAllocationGranularity", CUDA_ERROR_INVALID_VALUE, construct},
      {"cuCtxGetCurrent", CUDA_ERROR_INVALID_CONTEXT,
       [](Env& e) { static_cast<void>(e.backend.stream_priority_range(1)); }},
      {"cuCtxSetCurrent", CUDA_ERROR_INVALID_CONTEXT,
       [](Env& e) { static_cast<void>(e.backend.stream_priority_range(1)); }},
      {"cuCtxGetStreamPriorityRange", CUDA_ERROR_INVALID_VALUE,
       [](Env& e) { static_cast<void>(e.backend.stream_priority_range(0)); }},
      {"cuDeviceGetName", CUDA_ERROR_INVALID_VALUE,
       [](Env& e) { static_cast<void>(e.backend.properties(0)); }},
      {"cuDeviceTotalMem", CUDA_ERROR_INVALID_VALUE,
       [](Env& e) { static_cast<void>(e.backend.properties(1)); }},
      {"cuMemGetInfo", CUDA_ERROR_INVALID_CONTEXT,
       [](Env& e) { static_cast<void>(e.backend.free_memory(1)); }},
      {"cuDeviceGetUuid", CUDA_ERROR_INVALID_DEVICE,
       [](Env& e) { static_cast<void>(e.backend.properties(0)); }},
      {"cuDeviceGetP2PAttribute", CUDA_ERROR_INVALID_DEVICE,
       [](Env& e) { static_cast<void>(e.backend.peer_link(0, 1)); }},
      {"cuMemCreate", CUDA_ERROR_OUT_OF_MEMORY, [](Env& e) { map_fresh_page(e, false); }},
      {"cuMemRelease", CUDA_ERROR_INVALID_VALUE,
       [](Env& e) { e.backend.release_chunk(e.backend.create_chunk(Location::gpu(1), kPage)); }},
      {"cuMemAddressReserve", CUDA_ERROR_OUT_OF_MEMORY, [](Env& e) { map_fresh_page(e, false); }},
      {"cuMemAddressFree", CUDA_ERROR_INVALID_VALUE,
       [](Env& e) { e.backend.free_address(e.backend.reserve_address(kPage, 0), kPage); }},
      {"cuMemMap", CUDA_ERROR_OUT_OF_MEMORY, [](Env& e) { map_fresh_page(e, true); }},
      {"cuMemUnmap", CUDA_ERROR_INVALID_VALUE, [](Env& e) { map_fresh_page(e, true); }},
      {"cuMemSetAccess", CUDA_ERROR_INVALID_VALUE, [](Env& e) { map_fresh_page(e, true); }},
      {"cuStreamCreateWithPriority", CUDA_ERROR_OUT_OF_MEMORY,
       [](Env& e) { e.backend.destroy_stream(e.backend.create_stream(1, -1)); }},
      {"cuStreamDestroy", CUDA_ERROR_INVALID_HANDLE,
       [](Env& e) { e.backend.destroy_stream(e.backend.create_stream(1, 0)); }},
      {"cuStreamQuery", CUDA_ERROR_ILLEGAL_ADDRESS,
       [](Env& e) { static_cast<void>(e.backend.query_stream(e.stream, 0)); }},
      {"cuStreamSynchronize", CUDA_ERROR_LAUNCH_FAILED,
       [](Env& e) { e.backend.synchronize_stream(e.stream); }},
      {"cuStreamWaitEvent", CUDA_ERROR_INVALID_HANDLE,
       [](Env& e) { e.backend.stream_wait_event(e.stream, e.event, 0); }},
      {"cuEventCreate", CUDA_ERROR_OUT_OF_MEMORY,
       [](Env& e) { e.backend.destroy_event(e.backend.create_event(0)); }},
      {"cuEventDestroy", CUDA_ERROR_INVALID_HANDLE,
       [](Env& e) { e.backend.destroy_event(e.backend.create_event(0)); }},
      {"cuEventRecord", CUDA_ERROR_INVALID_HANDLE,
       [](Env& e) { e.backend.record_event(e.event, e.stream); }},
      {"cuEventQuery", CUDA_ERROR_ILLEGAL_ADDRESS,
       [](Env& e) { static_cast<void>(e.backend.query_event(e.event)); }},
      {"cuEventSynchronize", CUDA_ERROR_LAUNCH_FAILED,
       [](Env& e) { e.backend.synchronize_event(e.event); }},
      {"cuEventElapsedTime", CUDA_ERROR_LAUNCH_FAILED,
       [](Env& e) { static_cast<void>(e.backend.elapsed_seconds(e.timed_start, e.timed_end)); }},
      {"cuLaunchHostFunc", CUDA_ERROR_INVALID_VALUE,
       [](Env& e) { e.backend.launch_host_func(e.stream, [] {}); }},
      {"cuStreamGetCtx", CUDA_ERROR_LAUNCH_FAILED, validate_framework_stream},
      {"cuMemcpyAsync", CUDA_ERROR_INVALID_VALUE,
       [](Env& e) { e.backend.copy_async(e.va + kPage, e.va, kPage, e.stream); }},
      {"cuMemsetD8Async", CUDA_ERROR_INVALID_VALUE,
       [](Env& e) { e.backend.fill_async(e.va, 0, kPage, e.stream); }},
      {"cuStreamIsCapturing", CUDA_ERROR_INVALID_HANDLE,
       [](Env& e) { static_cast<void>(e.backend.stream_capturing(e.stream)); }},
      {"cuMemExportToShareableHandle", CUDA_ERROR_INVALID_VALUE, share_fresh_chunk},
      {"cuMemImportFromShareableHandle", CUDA_ERROR_INVALID_VALUE, share_fresh_chunk},
      {"cuIpcGetEventHandle", CUDA_ERROR_INVALID_VALUE, share_fresh_event},
      {"cuIpcOpenEventHandle", CUDA_ERROR_INVALID_VALUE, share_fresh_event},
  };
}

class CudaDriverFailure : public ::testing::TestWithParam<FailureCase> {
 protected:
  void SetUp() override {
    chunk_ = backend_.create_chunk(Location::gpu(0), 2 * kPage);
    env_.va = backend_.reserve_address(2 * kPage, 0);
    backend_.map(env_.va, 2 * kPage, chunk_, 0);
    const std::array<AccessGrant, 2> grants{{{0, Access::read_write}, {1, Access::read_write}}};
    backend_.set_access(env_.va, 2 * kPage, grants);
    env_.stream = backend_.create_stream(0, 0);
    env_.event = backend_.create_event(0);
    env_.timed_start = backend_.create_timing_event(0);
    env_.timed_end = backend_.create_timing_event(0);
    backend_.record_event(env_.timed_start, env_.stream);
    backend_.record_event(env_.timed_end, env_.stream);
  }

  // The actions open the events they export: the one fake plays both processes.
  static FakeDriverConfig config() {
    FakeDriverConfig c = FakeDriverConfig::uniform(2, 1 * GiB);
    c.ipc_open_own_events = true;
    return c;
  }
  FakeDriver fake_{config()};
  CudaBackend backend_{fake_.api()};
  ChunkHandle chunk_{};
  Env env_{fake_, backend_};
};

TEST_P(CudaDriverFailure, ThrowsDeviceErrorNamingTheCallAndStaysUsable) {
  const FailureCase& c = GetParam();
  fake_.fail_next(c.call, c.code);
  try {
    c.action(env_);
    FAIL() << c.call << " was injected to fail but the action succeeded";
  } catch (const DeviceError& e) {
    EXPECT_EQ(e.call(), c.call) << e.what();
    EXPECT_EQ(e.status(), test::fake_error_name(c.code)) << e.what();
    EXPECT_EQ(e.status_code(), static_cast<int>(c.code));
    EXPECT_NE(std::string(e.what()).find(c.call), std::string::npos) << e.what();
  }
  // The failure was injected into exactly the call the case names.
  const auto calls = fake_.calls(c.call);
  EXPECT_TRUE(std::any_of(calls.begin(), calls.end(),
                          [&](const test::FakeCall& call) { return call.result == c.code; }));
  EXPECT_NO_THROW(c.action(env_)) << "the backend is unusable after a failed " << c.call;
  // Nothing stays bound to this thread (the caller's context, none here, is restored).
  CUcontext current = nullptr;
  ASSERT_EQ(backend_.driver().cuCtxGetCurrent(&current), CUDA_SUCCESS);
  EXPECT_EQ(current, nullptr);
}

INSTANTIATE_TEST_SUITE_P(CudaEntryPoints, CudaDriverFailure, ::testing::ValuesIn(failure_cases()),
                         [](const ::testing::TestParamInfo<FailureCase>& info) {
                           return std::string(info.param.call);
                         });

TEST(CudaDriverFailureCoverage, EveryEntryPointHasAFailureCase) {
  const std::vector<FailureCase> cases = failure_cases();
  for (const char* name : cuda::kDriverEntryNames) {
    const std::string entry = name;
    // cuGetErrorName only names errors; cuDevicePrimaryCtxRelease runs in the destructor, which
    // must not throw (CudaBackendFakeConfig.ContextsAreReleasedEvenWhenTheDriverRefuses).
    // cuDriverGetVersion is read once, for the log, and a failure there is not an error; a
    // device attribute the driver does not answer is one it does not have (older drivers answer
    // CUDA_ERROR_INVALID_VALUE for attributes newer than they are).
    if (entry == "cuGetErrorName" || entry == "cuDevicePrimaryCtxRelease" ||
        entry == "cuDriverGetVersion" || entry == "cuDeviceGetAttribute") {
      continue;
    }
    EXPECT_TRUE(std::any_of(cases.begin(), cases.end(),
                            [&](const FailureCase& c) { return entry == c.call; }))
        << entry << " has no failure case";
  }
}

}  // namespace
}  // namespace salus
