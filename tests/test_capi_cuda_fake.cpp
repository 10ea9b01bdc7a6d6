// The C ABI on the CUDA backend, over the fake driver: the framework's own streams (CUstreams
// Salus did not create) and attribution, with work still queued on the streams behind host-side
// frees. The fake's memory is not host memory, so bytes are not read back here (the simulated
// backend's tests do that); accounting, stream validation and queued-work safety are checked.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "abi/c_api_fixture.hpp"
#include "capi/capi.hpp"
#include "cuda/cuda_backend.hpp"
#include "salus/c_api.h"
#include "salus/runtime.hpp"
#include "support/fake_driver.hpp"

namespace salus::testing {
namespace {

using test::FakeDriver;
using test::FakeDriverConfig;

constexpr std::size_t kDevice = 256 * MiB;
using ::job_stats_of;
using ::device_stats_of;

class CApiCudaFake : public ::testing::Test {
 protected:
  void SetUp() override {
    fake_ = std::make_unique<FakeDriver>(FakeDriverConfig::uniform(2, kDevice));
    RuntimeOptions options;
    options.memory.device_limits = {kDevice, kDevice};
    runtime_ = salus::capi::wrap(
        std::make_shared<Runtime>(std::make_shared<cuda::CudaBackend>(fake_->api()), options));
  }
  void TearDown() override {
    fake_->finish_all_work();
    salus_runtime_destroy(runtime_);
    EXPECT_TRUE(fake_->violations().empty()) << fake_->violations().front();
    fake_.reset();
  }

  salus_device_stats device_stats(int device) { return device_stats_of(runtime_, device); }
  salus_job_stats job_stats(uint32_t job) { return job_stats_of(runtime_, job); }
  uint32_t add_job(const char* name) {
    salus_job_spec spec;
    salus_job_spec_init(&spec);
    spec.name = name;
    uint32_t job = 0;
    EXPECT_EQ(salus_job_add(runtime_, &spec, &job), SALUS_OK) << salus_last_error();
    return job;
  }
  // A CUstream made with the driver directly, as PyTorch makes its streams.
  void* framework_stream(int device) {
    CUstream stream = nullptr;
    const cuda::DriverApi api = fake_->api();
    CUcontext ctx = nullptr;
    CUcontext before = nullptr;
    EXPECT_EQ(api.cuCtxGetCurrent(&before), CUDA_SUCCESS);
    EXPECT_EQ(api.cuDevicePrimaryCtxRetain(&ctx, device), CUDA_SUCCESS);
    EXPECT_EQ(api.cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    EXPECT_EQ(api.cuStreamCreateWithPriority(&stream, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
    EXPECT_EQ(api.cuCtxSetCurrent(before), CUDA_SUCCESS);
    // The backend holds the primary context too; this reference is the framework's and stays.
    return stream;
  }

  std::unique_ptr<FakeDriver> fake_;
  salus_runtime* runtime_ = nullptr;
};

TEST_F(CApiCudaFake, AFrameworkStreamsFreedPagesServeAnotherStreamAfterItsWork) {
  void* framework = framework_stream(0);
  constexpr std::size_t kBlock = 4 * MiB;
  std::vector<void*> blocks(60);
  std::uint64_t last_kernel = 0;
  for (void*& p : blocks) {
    ASSERT_EQ(salus_allocate(runtime_, kBlock, 0, framework, SALUS_JOB_AUTO, SALUS_PERSISTENT, &p),
              SALUS_OK)
        << salus_last_error();
    last_kernel = fake_->enqueue_work(static_cast<CUstream>(framework),
                                      reinterpret_cast<DevicePtr>(p), kBlock);
  }
  // Freed on the host while the kernels are still queued.
  for (void* p : blocks) ASSERT_EQ(salus_deallocate(runtime_, p, kBlock, 0), SALUS_OK);
  std::vector<void*> filled;
  for (;;) {
    void* p = nullptr;
    const salus_status st =
        salus_allocate(runtime_, kBlock, 0, nullptr, SALUS_JOB_AUTO, SALUS_PERSISTENT, &p);
    if (st != SALUS_OK) {
      EXPECT_EQ(st, SALUS_ERROR_OUT_OF_MEMORY) << salus_last_error();
      break;
    }
    filled.push_back(p);
  }
  EXPECT_GE(filled.size() * kBlock, kDevice - 8 * MiB) << "the default stream gets nearly all";
  EXPECT_TRUE(fake_->violations().empty()) << fake_->violations().front();
  EXPECT_EQ(device_stats(0).allocated, filled.size() * kBlock);
  fake_->finish_work(last_kernel);
  for (void* p : filled) ASSERT_EQ(salus_deallocate(runtime_, p, kBlock, 0), SALUS_OK);
  size_t released = 0;
  EXPECT_EQ(salus_trim(runtime_, &released), SALUS_OK) << salus_last_error();
  EXPECT_EQ(device_stats(0).reserved, 0u);
  EXPECT_EQ(salus_stream_retire(runtime_, 0, framework), SALUS_OK) << salus_last_error();
  EXPECT_TRUE(fake_->violations().empty()) << fake_->violations().front();
}

TEST_F(CApiCudaFake, HandlesThatAreNoStreamOrAnotherDevicesAreRefused) {
  void* p = nullptr;
  void* bogus = reinterpret_cast<void*>(std::uintptr_t{0x1234});
  EXPECT_EQ(salus_allocate(runtime_, MiB, 0, bogus, SALUS_JOB_AUTO, SALUS_PERSISTENT, &p),
            SALUS_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(salus_last_error()).find("0x1234"), std::string::npos)
      << salus_last_error();
  void* other = framework_stream(1);
  EXPECT_EQ(salus_allocate(runtime_, MiB, 0, other, SALUS_JOB_AUTO, SALUS_PERSISTENT, &p),
            SALUS_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(salus_last_error()).find("device"), std::string::npos);
  ASSERT_EQ(salus_allocate(runtime_, MiB, 1, other, SALUS_JOB_AUTO, SALUS_PERSISTENT, &p),
            SALUS_OK)
      << salus_last_error();
  EXPECT_EQ(salus_deallocate(runtime_, p, MiB, 1), SALUS_OK);
  EXPECT_EQ(device_stats(0).allocated, 0u);
  EXPECT_EQ(salus_trim(runtime_, nullptr), SALUS_OK) << salus_last_error();
}

// On CUDA the driver says what a handle is: one that is no CUstream, or another device's, is not
// retired as a no-op but refused; the framework's own streams still retire.
TEST_F(CApiCudaFake, RetiringAHandleThatIsNoStreamIsRefused) {
  void* bogus = reinterpret_cast<void*>(std::uintptr_t{0xdeadbeef});
  EXPECT_EQ(salus_stream_retire(runtime_, 0, bogus), SALUS_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(salus_last_error()).find("0xdeadbeef"), std::string::npos)
      << salus_last_error();
  void* on1 = framework_stream(1);
  EXPECT_EQ(salus_stream_retire(runtime_, 0, on1), SALUS_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(salus_last_error()).find("device 1"), std::string::npos)
      << salus_last_error();
  EXPECT_EQ(salus_stream_retire(runtime_, 1, on1), SALUS_OK) << salus_last_error();

  void* framework = framework_stream(0);
  void* p = nullptr;
  ASSERT_EQ(salus_allocate(runtime_, MiB, 0, framework, SALUS_JOB_AUTO, SALUS_PERSISTENT, &p),
            SALUS_OK)
      << salus_last_error();
  EXPECT_EQ(device_stats(0).stream_heaps, 1u);
  EXPECT_EQ(salus_stream_retire(runtime_, 0, framework), SALUS_OK) << salus_last_error();
  EXPECT_EQ(salus_deallocate(runtime_, p, MiB, 0), SALUS_OK) << salus_last_error();
  EXPECT_EQ(device_stats(0).allocated, 0u);
  EXPECT_TRUE(fake_->violations().empty()) << fake_->violations().front();
}

TEST_F(CApiCudaFake, AttributionOnCuStreams) {
  const uint32_t a = add_job("a");
  const uint32_t b = add_job("b");
  void* bound = framework_stream(0);
  ASSERT_EQ(salus_stream_bind(runtime_, 0, bound, b), SALUS_OK) << salus_last_error();
  void* lane = nullptr;
  ASSERT_EQ(salus_job_begin_iteration(runtime_, a, &lane), SALUS_OK) << salus_last_error();
  void* on_lane = nullptr;
  void* on_bound = nullptr;
  void* explicit_b = nullptr;
  std::thread([&] {  // a helper thread, as PyTorch's autograd threads
    ASSERT_EQ(salus_allocate(runtime_, 2 * MiB, 0, lane, SALUS_JOB_AUTO, SALUS_LIFETIME_AUTO,
                             &on_lane),
              SALUS_OK);
    ASSERT_EQ(salus_allocate(runtime_, 3 * MiB, 0, bound, SALUS_JOB_AUTO, SALUS_LIFETIME_AUTO,
                             &on_bound),
              SALUS_OK);
  }).join();
  ASSERT_EQ(salus_allocate(runtime_, MiB, 0, lane, b, SALUS_EPHEMERAL, &explicit_b), SALUS_OK);
  EXPECT_EQ(job_stats(a).ephemeral_in_use, 2 * MiB);
  EXPECT_EQ(job_stats(b).persistent_in_use, 3 * MiB);
  EXPECT_EQ(job_stats(b).ephemeral_in_use, MiB);
  ASSERT_EQ(salus_job_end_iteration(runtime_, a), SALUS_OK);
  EXPECT_EQ(job_stats(a).persistent_in_use, 2 * MiB) << "promoted at iteration end";
  for (void* p : {on_lane, on_bound, explicit_b}) {
    EXPECT_EQ(salus_deallocate(runtime_, p, 0, 0), SALUS_OK) << salus_last_error();
  }
  EXPECT_EQ(device_stats(0).allocated, 0u);
}

}  // namespace
}  // namespace salus::testing
