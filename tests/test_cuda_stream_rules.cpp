// What a real driver does with streams that the fake did not model before a GPU run: host
// functions on a serialized driver thread (no driver call inside), destroyed streams' handles,
// the per-thread default stream, and graph capture. First the fake's own rules, then Salus under
// them.
#include <gtest/gtest.h>

#include <atomic>
#include <bit>
#include <memory>
#include <thread>

#include "cuda/cuda_backend.hpp"
#include "salus/c_api.h"
#include "salus/memory.hpp"
#include "salus/runtime.hpp"
#include "support/expect_throw.hpp"
#include "support/fake_driver.hpp"

namespace salus::testing {
namespace {

using test::FakeDriver;
using test::FakeDriverConfig;
using test_support::expect_throw_with;

JobSpec spec_named(const char* name, bool outlive = false) {
  JobSpec spec;
  spec.name = name;
  spec.blocks_outlive_job = outlive;
  return spec;
}

constexpr std::size_t kDevice = 128 * MiB;
const StreamHandle kPerThread{std::bit_cast<std::uint64_t>(CU_STREAM_PER_THREAD)};

class CudaStreamRules : public ::testing::Test {
 protected:
  void TearDown() override { fake_.finish_all_work(); }

  FakeDriver fake_{FakeDriverConfig::uniform(1, kDevice)};
  std::shared_ptr<cuda::CudaBackend> backend_ = std::make_shared<cuda::CudaBackend>(fake_.api());
};

// --- the fake's rules --------------------------------------------------------------------------

TEST_F(CudaStreamRules, HostFunctionsRunInStreamOrderOnTheDriversThread) {
  const StreamHandle stream = backend_->create_stream(0, 0);
  const ChunkHandle chunk = backend_->create_chunk(Location::gpu(0), 2 * MiB);
  const DevicePtr va = backend_->reserve_address(2 * MiB, 0);
  backend_->map(va, 2 * MiB, chunk, 0);
  const AccessGrant rw{0, Access::read_write};
  backend_->set_access(va, 2 * MiB, std::span(&rw, 1));

  const std::uint64_t kernel = fake_.enqueue_work(stream, va, 2 * MiB);
  std::atomic<bool> ran{false};
  std::thread::id where{};
  backend_->launch_host_func(stream, [&] {
    where = std::this_thread::get_id();
    ran.store(true);
  });
  fake_.drain_host_functions();
  EXPECT_FALSE(ran.load()) << "a host function ran before the kernel ahead of it";
  const std::uint64_t after = fake_.enqueue_work(stream, va, 2 * MiB);
  fake_.finish_work(kernel);
  backend_->synchronize_stream(stream);  // waits for the host function too
  EXPECT_TRUE(ran.load());
  EXPECT_NE(where, std::this_thread::get_id());
  EXPECT_TRUE(fake_.work_finished(after));

  backend_->unmap(va, 2 * MiB);
  backend_->free_address(va, 2 * MiB);
  backend_->release_chunk(chunk);
  backend_->destroy_stream(stream);
  EXPECT_TRUE(fake_.violations().empty());
}

TEST_F(CudaStreamRules, ADriverCallInsideAHostFunctionIsAViolation) {
  const StreamHandle stream = backend_->create_stream(0, 0);
  std::atomic<bool> threw{false};
  backend_->launch_host_func(stream, [&] {
    try {
      (void)backend_->query_stream(stream, 0);
    } catch (const DeviceError& e) {
      threw.store(e.status() == "CUDA_ERROR_NOT_PERMITTED");
    }
  });
  backend_->synchronize_stream(stream);
  EXPECT_TRUE(threw.load());
  ASSERT_FALSE(fake_.violations().empty());
  EXPECT_NE(fake_.violations().front().find("inside a host function"), std::string::npos);
  backend_->destroy_stream(stream);
}

TEST_F(CudaStreamRules, UsingADestroyedStreamsHandleIsAViolation) {
  const StreamHandle stream = backend_->create_stream(0, 0);
  backend_->destroy_stream(stream);
  EXPECT_EQ(fake_.api().cuStreamQuery(std::bit_cast<CUstream>(stream.value)),
            CUDA_ERROR_INVALID_HANDLE);
  ASSERT_EQ(fake_.violations().size(), 1u);
  EXPECT_NE(fake_.violations()[0].find("destroyed"), std::string::npos);
}

TEST_F(CudaStreamRules, QueryingACapturingStreamInvalidatesItsCapture) {
  const StreamHandle stream = backend_->create_stream(0, 0);
  fake_.begin_capture(stream);
  EXPECT_TRUE(backend_->stream_capturing(stream));
  EXPECT_THROW((void)backend_->query_stream(stream, 0), DeviceError);
  EXPECT_FALSE(fake_.end_capture(stream));
  EXPECT_FALSE(backend_->stream_capturing(stream));
  EXPECT_EQ(fake_.violations().size(), 1u);
  backend_->destroy_stream(stream);
}

// --- Salus under them --------------------------------------------------------------------------

// Item 5: an allocation on a capturing stream is refused before Salus touches the stream, so the
// application's capture survives; after the capture, the stream allocates as before.
TEST_F(CudaStreamRules, AnAllocationDuringGraphCaptureIsRefusedAndTheCaptureSurvives) {
  MemoryManager memory(backend_);
  const StreamHandle stream = backend_->create_stream(0, 0);
  const DevicePtr before = memory.allocate({1 * MiB, 0, stream});
  fake_.begin_capture(stream);
  expect_throw_with<NotSupported>([&] { (void)memory.allocate({1 * MiB, 0, stream}); },
                                  "capturing a CUDA graph");
  EXPECT_TRUE(fake_.end_capture(stream)) << fake_.violations().front();
  const DevicePtr after = memory.allocate({1 * MiB, 0, stream});
  memory.deallocate(before);
  memory.deallocate(after);
  memory.retire_stream(0, stream);
  backend_->destroy_stream(stream);
  EXPECT_TRUE(fake_.violations().empty());
}

// Item 10: the per-thread default stream names another stream on each thread, so a fence that a
// free or a cancel records from another thread would order nothing. It is refused by name.
TEST_F(CudaStreamRules, ThePerThreadDefaultStreamIsRefused) {
  expect_throw_with<InvalidArgument>([&] { backend_->validate_stream(kPerThread, 0); },
                                     "per-thread default stream");
  MemoryManager memory(backend_);
  expect_throw_with<InvalidArgument>([&] { (void)memory.allocate({1 * MiB, 0, kPerThread}); },
                                     "per-thread default stream");
  EXPECT_EQ(memory.stats().devices.at(0).allocated, 0u);
  Runtime runtime(backend_, {});
  Job job = runtime.add_job(spec_named("j"));
  expect_throw_with<InvalidArgument>([&] { runtime.bind_stream(0, kPerThread, job.id()); },
                                     "per-thread default stream");
}

// Item 9: a stream the application destroys after retiring it is never named again: its blocks'
// fences, its job binding and its heap all stop using the handle (a real driver may give the
// handle to a new stream). The fake records any use of the destroyed handle.
TEST_F(CudaStreamRules, ARetiredAndDestroyedStreamIsNeverUsedAgain) {
  RuntimeOptions options;
  options.memory.device_limits = {kDevice};
  Runtime runtime(backend_, options);
  Job job = runtime.add_job(spec_named("framework", true));
  const StreamHandle own = backend_->create_stream(0, 0);
  const StreamHandle other = backend_->create_stream(0, 0);
  runtime.bind_stream(0, own, job.id());
  const DevicePtr a = runtime.allocate(8 * MiB, 0, own);
  const DevicePtr b = runtime.allocate(8 * MiB, 0, other);
  runtime.record_stream(b, own);
  const std::uint64_t reader = fake_.enqueue_work(own, b, 8 * MiB);

  runtime.retire_stream(0, own);
  backend_->destroy_stream(own);  // its queued kernel still runs, as on a GPU
  // The binding ended with the stream.
  expect_throw_with<InvalidArgument>([&] { runtime.unbind_stream(0, own); }, "bound to no job");
  runtime.deallocate(a);
  runtime.deallocate(b);
  // b's pages wait for the reader, not for a query of the destroyed stream.
  const DevicePtr c = runtime.allocate(8 * MiB, 0, other);
  fake_.finish_work(reader);
  (void)runtime.memory().trim();
  runtime.deallocate(c);
  job.leave();
  for (const std::string& v : fake_.violations()) ADD_FAILURE() << v;
  runtime.memory().retire_stream(0, other);
  backend_->destroy_stream(other);
}

}  // namespace
}  // namespace salus::testing
