// A framework's own CUDA streams (created straight through the driver, unknown to the backend)
// over the fake driver, what only the fake can show: the driver says which context a stream
// belongs to (cuStreamGetCtx), bogus handles and streams of other devices are refused by the
// backend, and a stream retired with work still queued hands its pages on only behind that work.
// What every backend's memory manager does with such streams is the contract in
// contract/test_framework_streams_contract.cpp.
#include <gtest/gtest.h>

#include <bit>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cuda/cuda_backend.hpp"
#include "salus/memory.hpp"
#include "support/fake_driver.hpp"
#include "support/framework_streams.hpp"

namespace salus::testing {
namespace {

using test::FakeDriver;
using test::FakeDriverConfig;

constexpr std::size_t kDevice = 64 * MiB;

class FrameworkStreamsCudaFake : public ::testing::Test {
 protected:
  void build(int devices) {
    fake_.emplace(FakeDriverConfig::uniform(devices, kDevice));
    api_ = fake_->api();
    backend_ = std::make_shared<cuda::CudaBackend>(api_);
    MemoryOptions options;
    options.device_limits.assign(static_cast<std::size_t>(devices), kDevice);
    memory_ = std::make_unique<MemoryManager>(backend_, options);
  }

  ~FrameworkStreamsCudaFake() override {
    if (fake_) fake_->finish_all_work();
    memory_.reset();
    salus_streams_.clear();
    backend_.reset();
  }

  // A stream the way a framework makes it: through the driver, in the device's primary context.
  StreamHandle framework_stream(int device) { return driver_framework_stream(api_, device); }
  void destroy(StreamHandle stream) {
    EXPECT_EQ(api_.cuStreamDestroy(std::bit_cast<CUstream>(stream.value)), CUDA_SUCCESS);
  }

  DevicePtr alloc(std::size_t bytes, StreamHandle stream, int device = 0) {
    return memory_->allocate({bytes, device, stream, kUnattributedJob, Lifetime::persistent});
  }

  // Driver calls since the last clear_calls() that enqueued on, or asked about, `stream`
  // (cuStreamGetCtx, which only looks the handle up, aside).
  [[nodiscard]] std::size_t calls_on(StreamHandle stream) const {
    std::size_t n = 0;
    for (const auto& call : fake_->calls()) {
      const bool first = call.name == "cuStreamQuery" || call.name == "cuStreamSynchronize" ||
                         call.name == "cuStreamWaitEvent" || call.name == "cuLaunchHostFunc";
      if (first && !call.args.empty() && call.args[0] == stream.value) ++n;
      if (call.name == "cuEventRecord" && call.args.size() > 1 && call.args[1] == stream.value) ++n;
      if (call.name == "cuMemcpyAsync" && call.args.back() == stream.value) ++n;
    }
    return n;
  }

  void expect_no_violations() {
    const auto violations = fake_->violations();
    EXPECT_TRUE(violations.empty())
        << violations.size()
        << " violations, first: " << (violations.empty() ? "" : violations.front());
  }

  std::optional<FakeDriver> fake_;
  cuda::DriverApi api_;
  std::shared_ptr<cuda::CudaBackend> backend_;
  std::vector<Stream> salus_streams_;
  std::unique_ptr<MemoryManager> memory_;
};

TEST_F(FrameworkStreamsCudaFake, TheDriverSaysWhichDeviceAStreamBelongsTo) {
  build(2);
  const StreamHandle on0 = framework_stream(0);
  const StreamHandle on1 = framework_stream(1);
  EXPECT_NO_THROW(backend_->validate_stream(on0, 0));
  EXPECT_NO_THROW(backend_->validate_stream(on1, 1));
  EXPECT_NO_THROW(backend_->validate_stream(StreamHandle{0}, 1));
  EXPECT_NO_THROW(backend_->validate_stream(StreamHandle{0x1}, 1)) << "CU_STREAM_LEGACY";
  // The per-thread default stream is another stream on each thread: refused
  // (test_cuda_stream_rules).
  EXPECT_THROW(backend_->validate_stream(StreamHandle{0x2}, 0), InvalidArgument);
  EXPECT_THROW(backend_->validate_stream(on1, 0), InvalidArgument);
  try {
    backend_->validate_stream(StreamHandle{0x1234}, 0);
    ADD_FAILURE() << "a bogus handle passed";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("0x1234"), std::string::npos) << e.what();
  }
  // The driver refusing the handle refuses the stream; another failure is the driver's.
  fake_->fail_next("cuStreamGetCtx", CUDA_ERROR_INVALID_HANDLE);
  EXPECT_THROW(backend_->validate_stream(on0, 0), InvalidArgument);
  fake_->fail_next("cuStreamGetCtx", CUDA_ERROR_LAUNCH_FAILED);
  EXPECT_THROW(backend_->validate_stream(on0, 0), DeviceError);
  EXPECT_NO_THROW(backend_->validate_stream(on0, 0));
  destroy(on0);
  // The application's mistake: a real driver may have reused the handle; the fake says so.
  EXPECT_THROW(backend_->validate_stream(on0, 0), InvalidArgument) << "destroyed";
  ASSERT_EQ(fake_->violations().size(), 1u);
  EXPECT_NE(fake_->violations()[0].find("destroyed"), std::string::npos);
  fake_->clear_violations();

  // What the memory manager makes of these (refusing before any change, working on the good
  // stream) is the contract in contract/test_framework_streams_contract.cpp.
  destroy(on1);
  expect_no_violations();
}

// The framework frees a block with its kernel still queued, retires and destroys its stream; a
// Salus stream then needs every page of the device.
TEST_F(FrameworkStreamsCudaFake, RetireWithWorkQueuedHandsPagesOnOnlyBehindIt) {
  build(1);
  const StreamHandle fw = framework_stream(0);
  const DevicePtr p = alloc(kDevice, fw);
  const std::uint64_t old_work = fake_->enqueue_work(fw, p, kDevice);
  memory_->deallocate(p);
  fake_->clear_calls();
  memory_->retire_stream(0, fw);
  destroy(fw);
  const std::size_t on_fw = calls_on(fw);

  const StreamHandle s2 = salus_streams_.emplace_back(backend_, 0).handle();
  const DevicePtr q = alloc(kDevice, s2);
  EXPECT_NE(p, q);
  EXPECT_FALSE(fake_->work_finished(old_work));
  EXPECT_TRUE(fake_->chunk_at(p).has_value()) << "the old address keeps its pages meanwhile";
  expect_no_violations();
  // The new user's work is ordered after the old work on the GPU.
  const std::uint64_t new_work = fake_->enqueue_work(s2, q, kDevice);
  fake_->finish_work(new_work);
  EXPECT_TRUE(fake_->work_finished(old_work));
  EXPECT_EQ(calls_on(fw), on_fw) << "nothing named the stream after retirement";
  EXPECT_GE(on_fw, 1u) << "the retire fence was recorded on it";

  memory_->deallocate(q);
  memory_->trim();
  EXPECT_FALSE(fake_->chunk_at(p).has_value());
  EXPECT_EQ(fake_->mapped_bytes(), 0u);
  EXPECT_EQ(fake_->live_chunks(), 0u);
  expect_no_violations();
}

// A block live when its stream retires, freed later while work is still queued on it: nothing is
// recorded on the destroyed stream, and its pages serve another stream without a violation
// (without queued work: the contract in contract/test_framework_streams_contract.cpp).
TEST_F(FrameworkStreamsCudaFake, ALiveBlockOnARetiredStreamIsFreedSafelyBehindQueuedWork) {
  build(1);
  const StreamHandle fw = framework_stream(0);
  const DevicePtr p = alloc(kDevice, fw);
  const std::uint64_t old_work = fake_->enqueue_work(fw, p, kDevice);
  memory_->retire_stream(0, fw);
  destroy(fw);
  fake_->clear_calls();
  memory_->deallocate(p);
  const StreamHandle s2 = salus_streams_.emplace_back(backend_, 0).handle();
  const DevicePtr q = alloc(kDevice, s2);
  expect_no_violations();
  EXPECT_EQ(calls_on(fw), 0u) << "nothing recorded on the destroyed stream";
  EXPECT_FALSE(fake_->work_finished(old_work));
  fake_->finish_work(old_work);
  memory_->deallocate(q);
  memory_->trim();
  EXPECT_EQ(fake_->mapped_bytes(), 0u);
  expect_no_violations();
}

}  // namespace
}  // namespace salus::testing
