// A simulated runtime (two 64 MiB GPUs) for the C ABI tests, with helpers that fill the
// size-carrying structs. Only salus/c_api.h is used.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "salus/c_api.h"

// The call's status, and its message containing `needle`.
#define EXPECT_STATUS(call, status, needle)                                      \
  do {                                                                           \
    EXPECT_EQ((call), (status)) << #call;                                        \
    EXPECT_NE(std::string(salus_last_error()).find(needle), std::string::npos)   \
        << #call << " said: " << salus_last_error();                             \
  } while (0)

inline constexpr size_t kMiB = size_t{1} << 20;

// `devices` simulated GPUs of `bytes` each in an NVLink mesh that spill to peers first, each
// lending all its free memory.
inline salus_runtime_options spilling_mesh(int devices, size_t bytes) {
  salus_runtime_options o;
  salus_runtime_options_init(&o);
  o.backend = SALUS_BACKEND_SIM;
  o.sim_device_count = devices;
  o.sim_device_memory_bytes = bytes;
  o.sim_topology = SALUS_SIM_NVLINK_MESH;
  o.spill = SALUS_SPILL_PEER_THEN_HOST;
  o.lend_reserve_bytes = 0;
  return o;
}

// A zeroed struct with its struct_size set.
template <class T>
T sized() {
  T value{};
  value.struct_size = sizeof(T);
  return value;
}

// Statistics of a job and a device, with the size-carrying structs filled in.
inline salus_job_stats job_stats_of(salus_runtime* runtime, uint32_t job) {
  salus_job_stats s{};
  s.struct_size = sizeof s;
  EXPECT_EQ(salus_job_get_stats(runtime, job, &s), SALUS_OK) << salus_last_error();
  return s;
}

inline salus_device_stats device_stats_of(const salus_runtime* runtime, int device) {
  salus_device_stats s{};
  s.struct_size = sizeof s;
  EXPECT_EQ(salus_get_device_stats(runtime, device, &s), SALUS_OK) << salus_last_error();
  return s;
}

class CApi : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(salus_runtime_create_sim(2, 64 * kMiB, &runtime), SALUS_OK) << salus_last_error();
  }
  void TearDown() override { salus_runtime_destroy(runtime); }

  uint32_t add_job(const char* name, int device = 0, salus_job_kind kind = SALUS_JOB_TRAINING,
                   int priority = 0) {
    salus_job_spec spec;
    salus_job_spec_init(&spec);
    spec.name = name;
    spec.device = device;
    spec.kind = kind;
    spec.priority = priority;
    uint32_t job = 0;
    EXPECT_EQ(salus_job_add(runtime, &spec, &job), SALUS_OK) << salus_last_error();
    return job;
  }

  salus_job_stats job_stats(uint32_t job) { return job_stats_of(runtime, job); }
  salus_device_stats device_stats(int device) { return device_stats_of(runtime, device); }

  salus_runtime* runtime = nullptr;
  salus_job_stats stats_out = sized<salus_job_stats>();
  salus_device_stats stats_device_ = sized<salus_device_stats>();
};
