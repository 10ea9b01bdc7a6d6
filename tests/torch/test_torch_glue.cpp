// The PyTorch glue's CUDA entry points as PyTorch's pluggable allocator calls them, on the
// simulated backend: whatever fails must throw a c10 error (PyTorch checks no pointer it is
// given), never hand back null.
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include "salus/runtime.hpp"
#include "salus/sim.hpp"
#include "salus/torch.hpp"

namespace salus::testing {
namespace {

std::shared_ptr<Runtime> sim_runtime(std::size_t bytes) {
  return std::make_shared<Runtime>(make_sim_backend(SimConfig::uniform(1, bytes)),
                                   RuntimeOptions{});
}

class TorchGlueCuda : public ::testing::Test {
 protected:
  void TearDown() override { salus::torch::disable(); }
};

TEST_F(TorchGlueCuda, AnAllocationBeyondTheDeviceThrowsOutOfMemoryNotNull) {
  auto runtime = sim_runtime(64 * MiB);
  salus::torch::enable_cuda(runtime);
  EXPECT_THROW((void)salus_torch_cuda_malloc(128 * MiB, 0, nullptr), c10::OutOfMemoryError);
  const std::exception_ptr behind = salus::torch::take_last_error();
  ASSERT_TRUE(behind) << "the Salus error behind PyTorch's is kept for the bindings";
  try {
    std::rethrow_exception(behind);
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(e.info().requested_bytes, 128 * MiB);
  }
  // The device is intact: a fitting allocation works and frees.
  void* ptr = salus_torch_cuda_malloc(1 * MiB, 0, nullptr);
  ASSERT_NE(ptr, nullptr);
  salus_torch_cuda_free(ptr, 1 * MiB, 0, nullptr);
}

TEST_F(TorchGlueCuda, AnAllocationAfterDisableThrowsNotNull) {
  auto runtime = sim_runtime(64 * MiB);
  salus::torch::enable_cuda(runtime);
  void* kept = salus_torch_cuda_malloc(1 * MiB, 0, nullptr);
  salus::torch::disable();
  EXPECT_THROW((void)salus_torch_cuda_malloc(1 * MiB, 0, nullptr), c10::Error);
  salus_torch_cuda_free(kept, 1 * MiB, 0, nullptr);  // still Salus's to free
  EXPECT_EQ(salus_torch_cuda_malloc(0, 0, nullptr), nullptr) << "empty storages have no address";
}

}  // namespace
}  // namespace salus::testing
