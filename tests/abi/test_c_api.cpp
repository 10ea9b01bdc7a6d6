// The C ABI, linked against the shared libsalus as a user would. Only salus/c_api.h is used.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "salus/c_api.h"

namespace {

constexpr size_t kMiB = size_t{1} << 20;

class CApi : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(salus_runtime_create_sim(2, 64 * kMiB, &runtime), SALUS_OK); }
  void TearDown() override { salus_runtime_destroy(runtime); }
  salus_runtime* runtime = nullptr;
};

TEST_F(CApi, AllocateWriteFreeAndStats) {
  int devices = 0;
  ASSERT_EQ(salus_runtime_device_count(runtime, &devices), SALUS_OK);
  EXPECT_EQ(devices, 2);
  uint32_t job = 0;
  ASSERT_EQ(salus_job_register(runtime, "c-job", 0, &job), SALUS_OK);
  void* p = nullptr;
  ASSERT_EQ(salus_allocate(runtime, 3 * kMiB, 1, nullptr, job, SALUS_EPHEMERAL, &p), SALUS_OK);
  ASSERT_NE(p, nullptr);
  std::memset(p, 0xAB, 3 * kMiB);  // simulated GPU memory is host memory
  EXPECT_EQ(static_cast<unsigned char*>(p)[3 * kMiB - 1], 0xAB);

  salus_device_stats stats{};
  ASSERT_EQ(salus_get_device_stats(runtime, 1, &stats), SALUS_OK);
  EXPECT_EQ(stats.allocated, 3 * kMiB);
  EXPECT_EQ(stats.ephemeral_in_use, 3 * kMiB);
  EXPECT_EQ(stats.limit, 64 * kMiB);

  size_t promoted = 0;
  ASSERT_EQ(salus_job_promote_ephemeral(runtime, job, &promoted), SALUS_OK);
  EXPECT_EQ(promoted, 3 * kMiB);
  ASSERT_EQ(salus_deallocate(runtime, p, 3 * kMiB, 1), SALUS_OK);
  ASSERT_EQ(salus_get_device_stats(runtime, 1, &stats), SALUS_OK);
  EXPECT_EQ(stats.allocated, 0u);
  size_t released = 0;
  ASSERT_EQ(salus_trim(runtime, &released), SALUS_OK);
  EXPECT_GE(released, 4 * kMiB);
  EXPECT_EQ(salus_job_release(runtime, job), SALUS_OK);
}

TEST_F(CApi, ErrorsAreStatusesWithMessages) {
  void* p = nullptr;
  EXPECT_EQ(salus_allocate(runtime, 0, 0, nullptr, 0, SALUS_PERSISTENT, &p),
            SALUS_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(salus_last_error()).find("size 0"), std::string::npos);
  EXPECT_EQ(salus_allocate(runtime, 64, 7, nullptr, 0, SALUS_PERSISTENT, &p),
            SALUS_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(salus_last_error()).find("device 7"), std::string::npos);
  EXPECT_EQ(salus_allocate(runtime, 64, 0, nullptr, 12345, SALUS_PERSISTENT, &p),
            SALUS_ERROR_UNKNOWN_JOB);
  EXPECT_EQ(salus_allocate(runtime, 64, 0, nullptr, 0, static_cast<salus_lifetime>(9), &p),
            SALUS_ERROR_INVALID_ARGUMENT);

  uint32_t job = 0;
  ASSERT_EQ(salus_job_register(runtime, "small", kMiB, &job), SALUS_OK);
  EXPECT_EQ(salus_allocate(runtime, 2 * kMiB, 0, nullptr, job, SALUS_PERSISTENT, &p),
            SALUS_ERROR_OUT_OF_MEMORY);
  EXPECT_NE(std::string(salus_last_error()).find("small"), std::string::npos);

  ASSERT_EQ(salus_allocate(runtime, 4096, 0, nullptr, job, SALUS_PERSISTENT, &p), SALUS_OK);
  EXPECT_EQ(salus_deallocate(runtime, p, 4096, 1), SALUS_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(salus_deallocate(runtime, p, 0, 0), SALUS_OK);
  EXPECT_EQ(salus_deallocate(runtime, p, 0, 0), SALUS_ERROR_INVALID_ARGUMENT) << "double free";
  EXPECT_EQ(salus_deallocate(runtime, nullptr, 0, 0), SALUS_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(salus_allocate(nullptr, 64, 0, nullptr, 0, SALUS_PERSISTENT, &p),
            SALUS_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(salus_runtime_create_sim(0, kMiB, &runtime), SALUS_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(salus_status_name(SALUS_ERROR_OUT_OF_MEMORY), "SALUS_ERROR_OUT_OF_MEMORY");
}

TEST(CApiCuda, CreatingACudaRuntimeWithoutAGpuSaysNotSupported) {
  salus_runtime* runtime = nullptr;
  const salus_status status = salus_runtime_create_cuda(&runtime);
  if (status == SALUS_OK) {
    salus_runtime_destroy(runtime);
    GTEST_SKIP() << "a GPU is present";
  }
  EXPECT_EQ(status, SALUS_ERROR_NOT_SUPPORTED);
  EXPECT_NE(std::string(salus_last_error()).find("not supported"), std::string::npos);
}

TEST(CApiDefault, PluggableAllocatorHooksUseTheDefaultRuntime) {
  ASSERT_EQ(salus_default_runtime_init_sim(1, 32 * kMiB), SALUS_OK);
  EXPECT_EQ(salus_default_runtime_init_sim(1, 32 * kMiB), SALUS_ERROR_INVALID_ARGUMENT);
  void* p = salus_malloc(1 << 16, 0, nullptr);
  ASSERT_NE(p, nullptr);
  std::memset(p, 1, 1 << 16);
  EXPECT_EQ(salus_malloc(-5, 0, nullptr), nullptr);
  EXPECT_EQ(salus_malloc(64 * kMiB, 0, nullptr), nullptr);
  EXPECT_NE(std::string(salus_last_error()).find("can never fit"), std::string::npos);
  salus_free(p, 1 << 16, 0, nullptr);
  salus_device_stats stats{};
  ASSERT_EQ(salus_get_device_stats(salus_default_runtime(), 0, &stats), SALUS_OK);
  EXPECT_EQ(stats.allocated, 0u);
  EXPECT_EQ(stats.allocations, 1u);
  salus_default_runtime_shutdown();
}

}  // namespace
