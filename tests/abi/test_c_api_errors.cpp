// Bad input through the C ABI: every entry point returns a status and a message that names what
// was wrong, and nothing changes (the runtime stays usable, no memory is held afterwards).
#include <gtest/gtest.h>

#include <string>

#include "abi/c_api_fixture.hpp"

namespace {

TEST_F(CApi, NullArgumentsAreNamed) {
  void* p = nullptr;
  uint32_t job = 0;
  salus_job_spec spec;
  salus_job_spec_init(&spec);
  spec.name = "j";
  EXPECT_STATUS(salus_runtime_create(nullptr, nullptr), SALUS_ERROR_INVALID_ARGUMENT, "out");
  EXPECT_STATUS(salus_allocate(nullptr, 64, 0, nullptr, 0, SALUS_PERSISTENT, &p),
                SALUS_ERROR_INVALID_ARGUMENT, "runtime is NULL");
  EXPECT_STATUS(salus_allocate(runtime, 64, 0, nullptr, 0, SALUS_PERSISTENT, nullptr),
                SALUS_ERROR_INVALID_ARGUMENT, "out is NULL");
  EXPECT_STATUS(salus_deallocate(runtime, nullptr, 0, 0), SALUS_ERROR_INVALID_ARGUMENT,
                "ptr is NULL");
  EXPECT_STATUS(salus_job_add(runtime, nullptr, &job), SALUS_ERROR_INVALID_ARGUMENT, "spec");
  EXPECT_STATUS(salus_job_add(runtime, &spec, nullptr), SALUS_ERROR_INVALID_ARGUMENT, "job");
  spec.name = nullptr;
  EXPECT_STATUS(salus_job_add(runtime, &spec, &job), SALUS_ERROR_INVALID_ARGUMENT, "name");
  EXPECT_STATUS(salus_job_get_stats(runtime, 1, nullptr), SALUS_ERROR_INVALID_ARGUMENT, "out");
  EXPECT_STATUS(salus_get_device_stats(nullptr, 0, nullptr), SALUS_ERROR_INVALID_ARGUMENT,
                "runtime");
  EXPECT_STATUS(salus_record_stream(runtime, nullptr, nullptr), SALUS_ERROR_INVALID_ARGUMENT,
                "ptr");
  EXPECT_STATUS(salus_stream_create(runtime, 0, 0, nullptr), SALUS_ERROR_INVALID_ARGUMENT,
                "stream");
  EXPECT_STATUS(salus_stream_destroy(runtime, 0, nullptr), SALUS_ERROR_INVALID_ARGUMENT,
                "default stream");
  EXPECT_STATUS(salus_runtime_write_trace(runtime, nullptr), SALUS_ERROR_INVALID_ARGUMENT, "path");
  EXPECT_STATUS(salus_get_current_job(runtime, nullptr), SALUS_ERROR_INVALID_ARGUMENT, "job");
  EXPECT_STATUS(salus_job_begin_iteration(nullptr, 1, nullptr), SALUS_ERROR_INVALID_ARGUMENT,
                "runtime");
  EXPECT_EQ(salus_runtime_device_count(runtime, nullptr), SALUS_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(salus_runtime_backend_name(nullptr), "");
  salus_runtime_destroy(nullptr);  // accepted and ignored
  salus_runtime_options_init(nullptr);
  salus_job_spec_init(nullptr);
  // A successful call clears the message.
  int n = 0;
  ASSERT_EQ(salus_runtime_device_count(runtime, &n), SALUS_OK);
  EXPECT_STREQ(salus_last_error(), "");
}

TEST_F(CApi, WrongStructSizesAreRefused) {
  salus_job_spec spec;
  salus_job_spec_init(&spec);
  spec.name = "j";
  spec.struct_size = 8;
  uint32_t job = 0;
  EXPECT_STATUS(salus_job_add(runtime, &spec, &job), SALUS_ERROR_INVALID_ARGUMENT,
                "struct_size of the salus_job_spec is 8");
  salus_device_stats ds{};  // struct_size 0
  EXPECT_STATUS(salus_get_device_stats(runtime, 0, &ds), SALUS_ERROR_INVALID_ARGUMENT,
                "salus_device_stats");
  salus_job_stats js{};
  js.struct_size = sizeof js + 8;
  spec.struct_size = sizeof spec;
  ASSERT_EQ(salus_job_add(runtime, &spec, &job), SALUS_OK);
  EXPECT_STATUS(salus_job_get_stats(runtime, job, &js), SALUS_ERROR_INVALID_ARGUMENT,
                "salus_job_stats");
  salus_runtime_options o;
  salus_runtime_options_init(&o);
  o.struct_size = 4;
  salus_runtime* other = nullptr;
  EXPECT_STATUS(salus_runtime_create(&o, &other), SALUS_ERROR_INVALID_ARGUMENT,
                "salus_runtime_options");
  EXPECT_EQ(other, nullptr);
}

TEST_F(CApi, BadValuesAreNamed) {
  void* p = nullptr;
  EXPECT_STATUS(salus_allocate(runtime, 0, 0, nullptr, 0, SALUS_PERSISTENT, &p),
                SALUS_ERROR_INVALID_ARGUMENT, "size 0");
  EXPECT_STATUS(salus_allocate(runtime, 64, 7, nullptr, 0, SALUS_PERSISTENT, &p),
                SALUS_ERROR_INVALID_ARGUMENT, "device 7");
  EXPECT_STATUS(salus_allocate(runtime, 64, 0, nullptr, 0, static_cast<salus_lifetime>(9), &p),
                SALUS_ERROR_INVALID_ARGUMENT, "lifetime 9");
  EXPECT_STATUS(salus_allocate(runtime, 64, 0, nullptr, 12345, SALUS_PERSISTENT, &p),
                SALUS_ERROR_UNKNOWN_JOB, "12345");
  EXPECT_STATUS(salus_get_device_stats(runtime, -1, &stats_device_), SALUS_ERROR_INVALID_ARGUMENT,
                "device -1");
  EXPECT_STATUS(salus_stream_create(runtime, 5, 0, &p), SALUS_ERROR_INVALID_ARGUMENT, "device 5");

  salus_job_spec spec;
  salus_job_spec_init(&spec);
  spec.name = "bad";
  spec.kind = static_cast<salus_job_kind>(3);
  uint32_t job = 0;
  EXPECT_STATUS(salus_job_add(runtime, &spec, &job), SALUS_ERROR_INVALID_ARGUMENT, "kind 3");
  spec.kind = SALUS_JOB_TRAINING;
  spec.device = 9;
  EXPECT_STATUS(salus_job_add(runtime, &spec, &job), SALUS_ERROR_INVALID_ARGUMENT, "device 9");

  salus_runtime_options o;
  salus_runtime_options_init(&o);
  o.backend = static_cast<salus_backend_kind>(7);
  salus_runtime* other = nullptr;
  EXPECT_STATUS(salus_runtime_create(&o, &other), SALUS_ERROR_INVALID_ARGUMENT, "backend 7");
  salus_runtime_options_init(&o);
  o.backend = SALUS_BACKEND_SIM;
  o.spill = static_cast<salus_spill_policy>(5);
  EXPECT_STATUS(salus_runtime_create(&o, &other), SALUS_ERROR_INVALID_ARGUMENT, "spill 5");
  o.spill = SALUS_SPILL_NONE;
  o.sim_device_count = 0;
  EXPECT_STATUS(salus_runtime_create(&o, &other), SALUS_ERROR_INVALID_ARGUMENT,
                "sim_device_count is 0");
  EXPECT_STATUS(salus_runtime_create_sim(0, kMiB, &other), SALUS_ERROR_INVALID_ARGUMENT,
                "sim_device_count");
}

TEST_F(CApi, JobsInTheWrongStateOrGoneAreRefused) {
  const uint32_t job = add_job("stateful");
  EXPECT_STATUS(salus_job_end_iteration(runtime, job), SALUS_ERROR_INVALID_ARGUMENT,
                "not inside an iteration");
  ASSERT_EQ(salus_job_begin_iteration(runtime, job, nullptr), SALUS_OK);
  EXPECT_STATUS(salus_job_begin_iteration(runtime, job, nullptr), SALUS_ERROR_INVALID_ARGUMENT,
                "already running");
  ASSERT_EQ(salus_job_end_iteration(runtime, job), SALUS_OK);
  // A job of device 0 cannot be charged for device 1.
  void* p = nullptr;
  EXPECT_STATUS(salus_allocate(runtime, 64, 1, nullptr, job, SALUS_PERSISTENT, &p),
                SALUS_ERROR_INVALID_ARGUMENT, "runs on device 0, not device 1");
  void* s1 = nullptr;
  ASSERT_EQ(salus_stream_create(runtime, 1, 0, &s1), SALUS_OK);
  EXPECT_STATUS(salus_stream_bind(runtime, 0, s1, job), SALUS_ERROR_INVALID_ARGUMENT, "device");
  EXPECT_STATUS(salus_stream_bind(runtime, 1, s1, job), SALUS_ERROR_INVALID_ARGUMENT,
                "not device 1");
  EXPECT_STATUS(salus_stream_bind(runtime, 0, nullptr, 0), SALUS_ERROR_INVALID_ARGUMENT, "job is 0");
  ASSERT_EQ(salus_stream_destroy(runtime, 1, s1), SALUS_OK);

  ASSERT_EQ(salus_job_leave(runtime, job), SALUS_OK);
  EXPECT_STATUS(salus_job_leave(runtime, job), SALUS_ERROR_UNKNOWN_JOB, "job");
  EXPECT_EQ(salus_job_begin_iteration(runtime, job, nullptr), SALUS_ERROR_UNKNOWN_JOB);
  EXPECT_EQ(salus_job_end_iteration(runtime, job), SALUS_ERROR_UNKNOWN_JOB);
  EXPECT_EQ(salus_job_cancel(runtime, job), SALUS_ERROR_UNKNOWN_JOB);
  EXPECT_EQ(salus_allocate(runtime, 64, 0, nullptr, job, SALUS_PERSISTENT, &p),
            SALUS_ERROR_UNKNOWN_JOB);
  EXPECT_EQ(salus_set_current_job(runtime, job), SALUS_ERROR_UNKNOWN_JOB);
  EXPECT_EQ(salus_job_get_stats(runtime, job, &stats_out), SALUS_ERROR_UNKNOWN_JOB);
  EXPECT_EQ(device_stats(0).allocated, 0u);
}

// Cancelled, the job's calls say so; once it left, its id is retired like any other (found by
// fuzzing, issue 12: it used to stay "cancelled").
TEST_F(CApi, ACancelledJobThatLeftIsUnknown) {
  const uint32_t job = add_job("cancelled");
  void* p = nullptr;
  ASSERT_EQ(salus_job_cancel(runtime, job), SALUS_OK);
  EXPECT_EQ(salus_allocate(runtime, 64, 0, nullptr, job, SALUS_PERSISTENT, &p),
            SALUS_ERROR_CANCELLED);
  EXPECT_EQ(salus_job_begin_iteration(runtime, job, nullptr), SALUS_ERROR_CANCELLED);
  ASSERT_EQ(salus_job_leave(runtime, job), SALUS_OK);
  EXPECT_EQ(salus_allocate(runtime, 64, 0, nullptr, job, SALUS_PERSISTENT, &p),
            SALUS_ERROR_UNKNOWN_JOB);
  EXPECT_EQ(salus_job_begin_iteration(runtime, job, nullptr), SALUS_ERROR_UNKNOWN_JOB);
  EXPECT_EQ(salus_set_current_job(runtime, job), SALUS_ERROR_UNKNOWN_JOB);
  EXPECT_EQ(salus_job_leave(runtime, job), SALUS_ERROR_UNKNOWN_JOB);
}

TEST_F(CApi, BogusStreamsAndPointersChangeNothing) {
  void* bogus = reinterpret_cast<void*>(uintptr_t{0x1234});
  void* p = nullptr;
  const uint32_t job = add_job("streams");
  EXPECT_STATUS(salus_allocate(runtime, kMiB, 0, bogus, SALUS_JOB_AUTO, SALUS_PERSISTENT, &p),
                SALUS_ERROR_INVALID_ARGUMENT, "0x1234");
  EXPECT_STATUS(salus_stream_bind(runtime, 0, bogus, job), SALUS_ERROR_INVALID_ARGUMENT, "0x1234");
  EXPECT_STATUS(salus_stream_destroy(runtime, 0, bogus), SALUS_ERROR_INVALID_ARGUMENT, "0x1234");
  ASSERT_EQ(salus_allocate(runtime, kMiB, 0, nullptr, job, SALUS_PERSISTENT, &p), SALUS_OK);
  EXPECT_STATUS(salus_record_stream(runtime, p, bogus), SALUS_ERROR_INVALID_ARGUMENT, "0x1234");
  EXPECT_STATUS(salus_deallocate(runtime, p, kMiB, 1), SALUS_ERROR_INVALID_ARGUMENT,
                "lives on device 0, not device 1");
  EXPECT_STATUS(salus_deallocate(runtime, p, 3 * kMiB, 0), SALUS_ERROR_INVALID_ARGUMENT,
                "allocated with");
  EXPECT_EQ(salus_deallocate(runtime, p, kMiB, 0), SALUS_OK);
  EXPECT_STATUS(salus_deallocate(runtime, p, kMiB, 0), SALUS_ERROR_INVALID_ARGUMENT,
                "not a live Salus block");
  int local = 0;
  EXPECT_STATUS(salus_deallocate(runtime, &local, 0, 0), SALUS_ERROR_INVALID_ARGUMENT,
                "unknown pointer");
  EXPECT_EQ(device_stats(0).allocated, 0u);
  EXPECT_EQ(job_stats(job).in_use, 0u);
  // Still fully usable.
  ASSERT_EQ(salus_allocate(runtime, 60 * kMiB, 0, nullptr, job, SALUS_PERSISTENT, &p), SALUS_OK)
      << salus_last_error();
  EXPECT_EQ(salus_deallocate(runtime, p, 0, 0), SALUS_OK);
}

// The header promises that a handle that is no stream is refused; retiring one used to pass.
TEST_F(CApi, RetiringAHandleThatIsNoStreamIsRefused) {
  void* bogus = reinterpret_cast<void*>(uintptr_t{0xdeadbeef});
  EXPECT_STATUS(salus_stream_retire(runtime, 0, bogus), SALUS_ERROR_INVALID_ARGUMENT,
                "0xdeadbeef");
  void* on1 = nullptr;
  ASSERT_EQ(salus_stream_create(runtime, 1, 0, &on1), SALUS_OK);
  EXPECT_STATUS(salus_stream_retire(runtime, 0, on1), SALUS_ERROR_INVALID_ARGUMENT,
                "not device 0");
  // A real stream still retires, with a block live on it, and the block stays usable.
  void* s = nullptr;
  ASSERT_EQ(salus_stream_create(runtime, 0, 0, &s), SALUS_OK);
  void* p = nullptr;
  ASSERT_EQ(salus_allocate(runtime, kMiB, 0, s, SALUS_JOB_AUTO, SALUS_PERSISTENT, &p), SALUS_OK);
  EXPECT_EQ(salus_stream_retire(runtime, 0, s), SALUS_OK) << salus_last_error();
  EXPECT_EQ(salus_stream_destroy(runtime, 0, s), SALUS_OK) << salus_last_error();
  EXPECT_EQ(salus_deallocate(runtime, p, kMiB, 0), SALUS_OK) << salus_last_error();
  EXPECT_STATUS(salus_stream_retire(runtime, 0, s), SALUS_ERROR_INVALID_ARGUMENT, "destroyed");
  EXPECT_EQ(salus_stream_destroy(runtime, 1, on1), SALUS_OK);
  EXPECT_EQ(device_stats(0).allocated, 0u);
}

TEST_F(CApi, BudgetsFailCleanlyWithTheJobsName) {
  salus_job_spec spec;
  salus_job_spec_init(&spec);
  spec.name = "small";
  spec.limit_total_bytes = kMiB;
  uint32_t job = 0;
  ASSERT_EQ(salus_job_add(runtime, &spec, &job), SALUS_OK);
  void* p = nullptr;
  EXPECT_STATUS(salus_allocate(runtime, 2 * kMiB, 0, nullptr, job, SALUS_PERSISTENT, &p),
                SALUS_ERROR_OUT_OF_MEMORY, "small");
  EXPECT_EQ(job_stats(job).in_use, 0u);
  ASSERT_EQ(salus_allocate(runtime, 4096, 0, nullptr, job, SALUS_PERSISTENT, &p), SALUS_OK);
  EXPECT_EQ(salus_deallocate(runtime, p, 4096, 0), SALUS_OK);
}

}  // namespace
