// Enums given by value or in a struct, out of range as a C caller may give them (-1, a large
// value, the *_FORCE_INT value itself): each call refuses them with SALUS_ERROR_INVALID_ARGUMENT
// and a message naming the parameter and the value, and changes nothing. Under UBSan (CI's
// ASan+UBSan build halts on the first error) they also show that the library never holds such a
// value as a C++ enum: it reads each enum as an int at the boundary.
#include <gtest/gtest.h>

#include <climits>
#include <string>

#include "abi/c_api_fixture.hpp"
#include "abi/enum_callers.h"

namespace {

constexpr int kOutOfRange[] = {-1, 1000, INT_MAX};

TEST_F(CApi, OutOfRangeLifetimesAreRefused) {
  for (int bad : kOutOfRange) {
    void* p = nullptr;
    EXPECT_STATUS(allocate_with_lifetime(runtime, bad, &p), SALUS_ERROR_INVALID_ARGUMENT,
                  "salus_allocate: lifetime " + std::to_string(bad));
    EXPECT_EQ(p, nullptr);
  }
  EXPECT_EQ(device_stats(0).allocations, 0u);
  void* p = nullptr;
  ASSERT_EQ(allocate_with_lifetime(runtime, SALUS_LIFETIME_AUTO, &p), SALUS_OK);
  EXPECT_EQ(salus_deallocate(runtime, p, 4096, 0), SALUS_OK);
}

TEST_F(CApi, OutOfRangeJobKindsAreRefused) {
  for (int bad : kOutOfRange) {
    uint32_t job = 0;
    EXPECT_STATUS(add_job_of_kind(runtime, bad, &job), SALUS_ERROR_INVALID_ARGUMENT,
                  "salus_job_add: kind " + std::to_string(bad));
    EXPECT_EQ(job, 0u);
  }
  uint32_t job = 0;
  ASSERT_EQ(add_job_of_kind(runtime, SALUS_JOB_INFERENCE, &job), SALUS_OK);
  EXPECT_EQ(job_stats(job).job, job);
}

TEST(CApiEnums, OutOfRangeRuntimeOptionsAreRefused) {
  for (int as_default : {0, 1}) {
    for (int bad : kOutOfRange) {
      const std::string value = " " + std::to_string(bad);
      salus_runtime* runtime = nullptr;
      EXPECT_STATUS(create_runtime_with(bad, SALUS_SIM_NO_LINKS, SALUS_SPILL_NONE, as_default,
                                        &runtime),
                    SALUS_ERROR_INVALID_ARGUMENT, "backend" + value);
      EXPECT_STATUS(create_runtime_with(SALUS_BACKEND_SIM, bad, SALUS_SPILL_NONE, as_default,
                                        &runtime),
                    SALUS_ERROR_INVALID_ARGUMENT, "sim_topology" + value);
      EXPECT_STATUS(create_runtime_with(SALUS_BACKEND_SIM, SALUS_SIM_NO_LINKS, bad, as_default,
                                        &runtime),
                    SALUS_ERROR_INVALID_ARGUMENT, "spill" + value);
      EXPECT_EQ(runtime, nullptr);
    }
  }
  salus_runtime* runtime = nullptr;
  ASSERT_EQ(create_runtime_with(SALUS_BACKEND_SIM, SALUS_SIM_TWO_ISLANDS,
                                SALUS_SPILL_PEER_THEN_HOST, 0, &runtime),
            SALUS_OK)
      << salus_last_error();
  salus_runtime_destroy(runtime);
}

TEST(CApiEnums, OutOfRangeLogLevelsAreRefused) {
  salus_log_level before = SALUS_LOG_TRACE;
  ASSERT_EQ(salus_get_log_level(&before), SALUS_OK);
  for (int bad : kOutOfRange) {
    EXPECT_STATUS(set_log_level_to(bad), SALUS_ERROR_INVALID_ARGUMENT,
                  "salus_set_log_level: level " + std::to_string(bad));
  }
  salus_log_level after = SALUS_LOG_TRACE;
  ASSERT_EQ(salus_get_log_level(&after), SALUS_OK);
  EXPECT_EQ(after, before);
}

TEST(CApiEnums, OutOfRangeStatusesHaveAName) {
  for (int bad : kOutOfRange) EXPECT_STREQ(status_name_of(bad), "SALUS_ERROR_UNKNOWN_STATUS");
  EXPECT_STREQ(status_name_of(SALUS_ERROR_CANCELLED), "SALUS_ERROR_CANCELLED");
}

}  // namespace
