// The C ABI, linked against the shared libsalus as a user would. Only salus/c_api.h is used.
// Runtimes, options, jobs and the process default; memory attribution and the framework's
// streams are in test_c_api_memory.cpp, bad input in test_c_api_errors.cpp.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "abi/c_api_fixture.hpp"

namespace {

TEST_F(CApi, AllocateWriteFreeAndStats) {
  int devices = 0;
  ASSERT_EQ(salus_runtime_device_count(runtime, &devices), SALUS_OK);
  EXPECT_EQ(devices, 2);
  EXPECT_STREQ(salus_runtime_backend_name(runtime), "sim");
  const uint32_t job = add_job("c-job", 1);
  void* p = nullptr;
  ASSERT_EQ(salus_allocate(runtime, 3 * kMiB, 1, nullptr, job, SALUS_EPHEMERAL, &p), SALUS_OK);
  ASSERT_NE(p, nullptr);
  std::memset(p, 0xAB, 3 * kMiB);  // simulated GPU memory is host memory
  EXPECT_EQ(static_cast<unsigned char*>(p)[3 * kMiB - 1], 0xAB);

  salus_device_stats stats = device_stats(1);
  EXPECT_EQ(stats.allocated, 3 * kMiB);
  EXPECT_EQ(stats.ephemeral.in_use, 3 * kMiB);
  EXPECT_EQ(stats.ephemeral.blocks, 1u);
  EXPECT_EQ(stats.device, 1);
  EXPECT_EQ(stats.limit, 64 * kMiB);
  EXPECT_EQ(job_stats(job).ephemeral_in_use, 3 * kMiB);

  ASSERT_EQ(salus_deallocate(runtime, p, 3 * kMiB, 1), SALUS_OK);
  EXPECT_EQ(device_stats(1).allocated, 0u);
  size_t released = 0;
  ASSERT_EQ(salus_trim(runtime, &released), SALUS_OK);
  EXPECT_GE(released, 4 * kMiB);
  EXPECT_EQ(salus_job_leave(runtime, job), SALUS_OK);
}

TEST_F(CApi, JobStatsCarryTheJobsMemoryAndA11SizedStructStillWorks) {
  const uint32_t job = add_job("sized");
  void* stream = nullptr;
  ASSERT_EQ(salus_job_begin_iteration(runtime, job, &stream), SALUS_OK);
  void* p = nullptr;
  ASSERT_EQ(salus_allocate(runtime, 3 * kMiB, 0, stream, job, SALUS_EPHEMERAL, &p), SALUS_OK);
  const salus_job_stats s = job_stats(job);
  EXPECT_EQ(s.struct_size, sizeof s);
  EXPECT_EQ(s.memory.in_use, 3 * kMiB);
  EXPECT_EQ(s.memory.peak, s.peak);
  EXPECT_EQ(s.memory.quiescent, 0) << "it runs";
  EXPECT_EQ(s.ephemeral.in_use, 3 * kMiB);
  EXPECT_EQ(s.ephemeral.blocks, 1u);
  EXPECT_EQ(s.persistent.in_use, 0u);
  EXPECT_EQ(s.in_use_by_tier[0], 3 * kMiB);
  EXPECT_EQ(s.in_use_by_tier[1] + s.in_use_by_tier[2], 0u);

  // A caller built against 1.1: its struct ends where `memory` begins, and nothing past that is
  // written.
  const size_t old_size = offsetof(salus_job_stats, memory);
  salus_job_stats old;
  std::memset(&old, 0xEE, sizeof old);
  old.struct_size = old_size;
  ASSERT_EQ(salus_job_get_stats(runtime, job, &old), SALUS_OK) << salus_last_error();
  EXPECT_EQ(old.struct_size, old_size);
  EXPECT_EQ(old.job, job);
  EXPECT_EQ(old.ephemeral_in_use, 3 * kMiB);
  EXPECT_EQ(old.in_use, 3 * kMiB);
  EXPECT_EQ(old.on_peer_bytes + old.on_host_bytes, 0u);
  const auto* bytes = reinterpret_cast<const unsigned char*>(&old);
  for (size_t i = old_size; i < sizeof old; ++i) ASSERT_EQ(bytes[i], 0xEE) << "byte " << i;
  old.struct_size = old_size - 8;  // neither this version's size nor an earlier one's
  EXPECT_STATUS(salus_job_get_stats(runtime, job, &old), SALUS_ERROR_INVALID_ARGUMENT,
                "in an earlier version");

  ASSERT_EQ(salus_deallocate(runtime, p, 3 * kMiB, 0), SALUS_OK);
  ASSERT_EQ(salus_job_end_iteration(runtime, job), SALUS_OK);
  EXPECT_EQ(job_stats(job).memory.in_use, 0u);
  EXPECT_GE(salus_c_api_version() & 0xffff, 2u) << "1.2 is the version that fills `memory`";
}

// 1.5's `turns` holds the turn and profile lists, the same numbers as the fields 1.0 had; a
// caller built against 1.2-1.4 (its struct ends where `turns` begins) gets everything before it
// and nothing is written past it.
TEST_F(CApi, JobStatsCarryTheTurnsListAndA14SizedStructStillWorks) {
  const uint32_t job = add_job("turns");
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(salus_job_begin_iteration(runtime, job, nullptr), SALUS_OK);
    ASSERT_EQ(salus_job_end_iteration(runtime, job), SALUS_OK);
  }
  const salus_job_stats s = job_stats(job);
  EXPECT_EQ(s.turns.iterations, 2u);
  EXPECT_EQ(s.turns.iterations, s.iterations);
  EXPECT_EQ(s.turns.attained_seconds, s.attained_seconds);
  EXPECT_EQ(s.turns.waiting_seconds, s.waiting_seconds);
  EXPECT_EQ(s.turns.max_wait_seconds, s.max_wait_seconds);
  EXPECT_EQ(s.turns.iteration_seconds, s.iteration_seconds);
  EXPECT_EQ(s.turns.persistent_bytes, s.profile_persistent_bytes);
  EXPECT_EQ(s.turns.ephemeral_peak_bytes, s.profile_ephemeral_peak_bytes);

  const size_t old_size = offsetof(salus_job_stats, turns);
  salus_job_stats old;
  std::memset(&old, 0xEE, sizeof old);
  old.struct_size = old_size;
  ASSERT_EQ(salus_job_get_stats(runtime, job, &old), SALUS_OK) << salus_last_error();
  EXPECT_EQ(old.iterations, 2u);
  const auto* bytes = reinterpret_cast<const unsigned char*>(&old);
  for (size_t i = old_size; i < sizeof old; ++i) ASSERT_EQ(bytes[i], 0xEE) << "byte " << i;
  EXPECT_GE(salus_c_api_version() & 0xffff, 5u) << "1.5 is the version that fills `turns`";
}

TEST(CApiRuntime, OptionsChooseTopologyPolicyAndLimits) {
  salus_runtime_options o;
  salus_runtime_options_init(&o);
  o.backend = SALUS_BACKEND_SIM;
  o.sim_device_count = 4;
  o.sim_device_memory_bytes = 64 * kMiB;
  o.sim_topology = SALUS_SIM_NVLINK_MESH;
  o.policy = "priority";
  o.device_limits[1] = 32 * kMiB;
  o.spill = SALUS_SPILL_PEER_THEN_HOST;
  o.lend_reserve_bytes = 8 * kMiB;
  o.host_limit_bytes = 64 * kMiB;
  salus_runtime* runtime = nullptr;
  ASSERT_EQ(salus_runtime_create(&o, &runtime), SALUS_OK) << salus_last_error();
  int n = 0;
  ASSERT_EQ(salus_runtime_device_count(runtime, &n), SALUS_OK);
  EXPECT_EQ(n, 4);
  salus_device_stats s{};
  s.struct_size = sizeof s;
  ASSERT_EQ(salus_get_device_stats(runtime, 1, &s), SALUS_OK);
  EXPECT_EQ(s.limit, 32 * kMiB);
  ASSERT_EQ(salus_get_device_stats(runtime, 0, &s), SALUS_OK);
  EXPECT_EQ(s.limit, 64 * kMiB);
  // With spilling, device 0 holds more than its own memory: peers lend beyond their reserves.
  void* big = nullptr;
  ASSERT_EQ(salus_allocate(runtime, 96 * kMiB, 0, nullptr, SALUS_JOB_AUTO, SALUS_PERSISTENT, &big),
            SALUS_OK)
      << salus_last_error();
  std::memset(big, 0x5A, 96 * kMiB);
  ASSERT_EQ(salus_get_device_stats(runtime, 0, &s), SALUS_OK);
  EXPECT_GT(s.borrowed_peer, 0u);
  EXPECT_EQ(salus_deallocate(runtime, big, 96 * kMiB, 0), SALUS_OK);
  salus_runtime_destroy(runtime);

  for (salus_sim_topology topology : {SALUS_SIM_TWO_ISLANDS, SALUS_SIM_PCIE_ONLY}) {
    o.sim_topology = topology;
    ASSERT_EQ(salus_runtime_create(&o, &runtime), SALUS_OK) << salus_last_error();
    salus_runtime_destroy(runtime);
  }
  o.sim_device_count = 3;
  o.sim_topology = SALUS_SIM_TWO_ISLANDS;
  EXPECT_EQ(salus_runtime_create(&o, &runtime), SALUS_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(salus_last_error()).find("even"), std::string::npos);
  EXPECT_EQ(runtime, nullptr);
  salus_runtime_options_init(&o);
  o.backend = SALUS_BACKEND_SIM;
  o.policy = "lottery";
  EXPECT_EQ(salus_runtime_create(&o, &runtime), SALUS_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(salus_last_error()).find("lottery"), std::string::npos);
}

// allocation_wait_ms (1.4) bounds how long an allocation waits for another thread's iteration to
// free memory; a caller built against 1.3 (its struct ends before the field) gets the default,
// and a negative value other than SALUS_DEFAULT_WAIT is refused by name.
TEST(CApiRuntime, AllocationWaitBoundsTheWaitAndA13SizedStructGetsTheDefault) {
  salus_runtime_options o;
  salus_runtime_options_init(&o);
  EXPECT_EQ(o.allocation_wait_ms, SALUS_DEFAULT_WAIT);
  o.backend = SALUS_BACKEND_SIM;
  o.sim_device_memory_bytes = 64 * kMiB;
  o.policy = "pack";
  o.allocation_wait_ms = 100;
  salus_runtime* runtime = nullptr;
  ASSERT_EQ(salus_runtime_create(&o, &runtime), SALUS_OK) << salus_last_error();
  uint32_t jobs[2] = {0, 0};
  for (uint32_t& job : jobs) {
    salus_job_spec spec;
    salus_job_spec_init(&spec);
    spec.name = &job == jobs ? "holder" : "waiter";
    spec.hint_persistent_bytes = 1 * kMiB;
    spec.hint_ephemeral_peak_bytes = 2 * kMiB;  // both fit as lanes: the refusal comes later
    ASSERT_EQ(salus_job_add(runtime, &spec, &job), SALUS_OK) << salus_last_error();
  }
  std::atomic<bool> holding{false}, release{false};
  std::thread holder([&] {
    void* stream = nullptr;
    void* held = nullptr;
    ASSERT_EQ(salus_job_begin_iteration(runtime, jobs[0], &stream), SALUS_OK);
    ASSERT_EQ(salus_allocate(runtime, 48 * kMiB, 0, stream, jobs[0], SALUS_EPHEMERAL, &held),
              SALUS_OK);
    holding = true;
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_EQ(salus_deallocate(runtime, held, 48 * kMiB, 0), SALUS_OK);
    EXPECT_EQ(salus_job_end_iteration(runtime, jobs[0]), SALUS_OK);
  });
  while (!holding) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const auto start = std::chrono::steady_clock::now();
  void* p = nullptr;
  EXPECT_STATUS(salus_allocate(runtime, 32 * kMiB, 0, nullptr, jobs[1], SALUS_PERSISTENT, &p),
                SALUS_ERROR_OUT_OF_MEMORY, "waited");
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_GE(waited, std::chrono::milliseconds(100));
  EXPECT_LT(waited, std::chrono::seconds(5)) << "the wait did not stop at allocation_wait_ms";
  release = true;
  holder.join();
  salus_runtime_destroy(runtime);

  o.allocation_wait_ms = -2;
  EXPECT_STATUS(salus_runtime_create(&o, &runtime), SALUS_ERROR_INVALID_ARGUMENT,
                "allocation_wait_ms -2");
  EXPECT_EQ(runtime, nullptr);
  // A 1.3 caller: whatever lies past its struct is not read.
  o.struct_size = offsetof(salus_runtime_options, allocation_wait_ms);
  ASSERT_EQ(salus_runtime_create(&o, &runtime), SALUS_OK) << salus_last_error();
  salus_runtime_destroy(runtime);
  o.struct_size = offsetof(salus_runtime_options, allocation_wait_ms) - 8;
  EXPECT_STATUS(salus_runtime_create(&o, &runtime), SALUS_ERROR_INVALID_ARGUMENT,
                "in an earlier version");
  EXPECT_GE(salus_c_api_version() & 0xffff, 4u) << "1.4 is the version of allocation_wait_ms";
}

TEST(CApiRuntime, VersionAndStatusNames) {
  EXPECT_EQ(salus_c_api_version() >> 16, uint32_t{SALUS_C_API_VERSION_MAJOR});
  EXPECT_STRNE(salus_version_string(), "");
  EXPECT_STREQ(salus_status_name(SALUS_ERROR_OUT_OF_MEMORY), "SALUS_ERROR_OUT_OF_MEMORY");
  EXPECT_STREQ(salus_status_name(SALUS_ERROR_CANCELLED), "SALUS_ERROR_CANCELLED");
  EXPECT_STREQ(salus_status_name(static_cast<salus_status>(99)), "SALUS_ERROR_UNKNOWN_STATUS");
}

TEST(CApiRuntime, CreatingACudaRuntimeWithoutAGpuSaysNotSupported) {
  salus_runtime* runtime = nullptr;
  const salus_status status = salus_runtime_create_cuda(&runtime);
  if (status == SALUS_OK) {
    salus_runtime_destroy(runtime);
    GTEST_SKIP() << "a GPU is present";
  }
  EXPECT_EQ(status, SALUS_ERROR_NOT_SUPPORTED);
  EXPECT_NE(std::string(salus_last_error()).find("not supported"), std::string::npos);
}

TEST_F(CApi, JobsTakeTurnsThroughBeginAndEnd) {
  const uint32_t a = add_job("a");
  const uint32_t b = add_job("b");
  std::atomic<int> inside{0};
  std::atomic<int> overlaps{0};
  auto loop = [&](uint32_t job) {
    for (int i = 0; i < 5; ++i) {
      void* stream = nullptr;
      ASSERT_EQ(salus_job_begin_iteration(runtime, job, &stream), SALUS_OK) << salus_last_error();
      if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);
      void* p = nullptr;
      ASSERT_EQ(salus_allocate(runtime, 2 * kMiB, 0, stream, job, SALUS_LIFETIME_AUTO, &p),
                SALUS_OK);
      std::memset(p, static_cast<int>(job), 2 * kMiB);
      ASSERT_EQ(salus_deallocate(runtime, p, 2 * kMiB, 0), SALUS_OK);
      inside.fetch_sub(1);
      ASSERT_EQ(salus_job_end_iteration(runtime, job), SALUS_OK);
    }
  };
  std::thread ta(loop, a);
  std::thread tb(loop, b);
  ta.join();
  tb.join();
  EXPECT_EQ(overlaps.load(), 0) << "fair keeps one lane: jobs take turns";
  for (uint32_t job : {a, b}) {
    const salus_job_stats s = job_stats(job);
    EXPECT_EQ(s.iterations, 5u);
    EXPECT_EQ(s.state, SALUS_JOB_IDLE);
    EXPECT_EQ(s.in_use, 0u);
    EXPECT_EQ(s.ephemeral_peak, 2 * kMiB);
    EXPECT_EQ(s.persistent_peak, 0u);
  }
}

TEST_F(CApi, CancelWakesAWaiterAndLaterCallsSayCancelled) {
  const uint32_t holder = add_job("holder");
  const uint32_t waiter = add_job("waiter");
  void* stream = nullptr;
  ASSERT_EQ(salus_job_begin_iteration(runtime, holder, &stream), SALUS_OK);
  void* kept = nullptr;
  ASSERT_EQ(salus_allocate(runtime, kMiB, 0, nullptr, waiter, SALUS_PERSISTENT, &kept), SALUS_OK);
  std::atomic<salus_status> waited{SALUS_OK};
  std::thread t([&] { waited = salus_job_begin_iteration(runtime, waiter, nullptr); });
  while (job_stats(waiter).state != SALUS_JOB_WAITING) std::this_thread::yield();
  ASSERT_EQ(salus_job_cancel(runtime, waiter), SALUS_OK);
  t.join();
  EXPECT_EQ(waited.load(), SALUS_ERROR_CANCELLED);
  EXPECT_EQ(job_stats(waiter).state, SALUS_JOB_CANCELLED);
  EXPECT_EQ(job_stats(waiter).in_use, 0u) << "cancel frees what the job held";
  EXPECT_EQ(device_stats(0).allocated, 0u);
  void* p = nullptr;
  EXPECT_EQ(salus_allocate(runtime, kMiB, 0, nullptr, waiter, SALUS_PERSISTENT, &p),
            SALUS_ERROR_CANCELLED);
  EXPECT_NE(std::string(salus_last_error()).find("waiter"), std::string::npos);
  EXPECT_EQ(salus_job_begin_iteration(runtime, waiter, nullptr), SALUS_ERROR_CANCELLED);
  EXPECT_EQ(salus_job_leave(runtime, waiter), SALUS_OK);
  EXPECT_EQ(salus_job_get_stats(runtime, waiter, &stats_out), SALUS_ERROR_UNKNOWN_JOB);
  EXPECT_EQ(salus_job_end_iteration(runtime, holder), SALUS_OK);
}

// A framework's tensors may outlive their job: with blocks_outlive_job, a cancel frees nothing
// they hold; the blocks stay valid, charged to nobody, until the framework frees them.
TEST_F(CApi, BlocksOutliveACancelledJobUntilTheFrameworkFreesThem) {
  salus_job_spec spec;
  salus_job_spec_init(&spec);
  spec.name = "tensors";
  spec.blocks_outlive_job = 1;
  uint32_t job = 0;
  ASSERT_EQ(salus_job_add(runtime, &spec, &job), SALUS_OK) << salus_last_error();
  void* p = nullptr;
  ASSERT_EQ(salus_allocate(runtime, 2 * kMiB, 0, nullptr, job, SALUS_PERSISTENT, &p), SALUS_OK);
  std::memset(p, 0x3c, 2 * kMiB);
  ASSERT_EQ(salus_job_cancel(runtime, job), SALUS_OK);
  EXPECT_EQ(job_stats(job).in_use, 0u) << "charged to nobody";
  EXPECT_EQ(device_stats(0).allocated, 2 * kMiB) << "but still there";
  EXPECT_EQ(static_cast<unsigned char*>(p)[2 * kMiB - 1], 0x3c);
  EXPECT_EQ(salus_deallocate(runtime, p, 2 * kMiB, 0), SALUS_OK) << salus_last_error();
  EXPECT_EQ(device_stats(0).allocated, 0u);
  EXPECT_EQ(salus_job_leave(runtime, job), SALUS_OK);
}

TEST_F(CApi, TraceIsWritten) {
  const uint32_t job = add_job("traced");
  ASSERT_EQ(salus_job_begin_iteration(runtime, job, nullptr), SALUS_OK);
  ASSERT_EQ(salus_job_end_iteration(runtime, job), SALUS_OK);
  const std::string path = ::testing::TempDir() + "salus_c_trace.json";
  ASSERT_EQ(salus_runtime_write_trace(runtime, path.c_str()), SALUS_OK) << salus_last_error();
  FILE* f = std::fopen(path.c_str(), "r");
  ASSERT_NE(f, nullptr);
  char head[64] = {};
  EXPECT_GT(std::fread(head, 1, sizeof head - 1, f), 0u);
  std::fclose(f);
  EXPECT_NE(std::string(head).find('{'), std::string::npos);
  EXPECT_EQ(salus_runtime_write_trace(runtime, "/nonexistent-dir/x.json"),
            SALUS_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(salus_last_error()).find("nonexistent-dir"), std::string::npos);
}

TEST(CApiDefault, PluggableAllocatorHooksUseTheOneDefaultRuntime) {
  salus_runtime_options o;
  salus_runtime_options_init(&o);
  o.backend = SALUS_BACKEND_SIM;
  o.sim_device_memory_bytes = 32 * kMiB;
  ASSERT_EQ(salus_default_runtime_init(&o), SALUS_OK) << salus_last_error();
  EXPECT_EQ(salus_default_runtime_init(&o), SALUS_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(salus_last_error()).find("exists already"), std::string::npos);
  salus_runtime* runtime = salus_default_runtime();
  ASSERT_NE(runtime, nullptr);
  EXPECT_EQ(salus_default_runtime(), runtime) << "one default";
  salus_runtime_destroy(runtime);  // refused: the default is shut down, not destroyed
  EXPECT_NE(std::string(salus_last_error()).find("salus_default_runtime_shutdown"),
            std::string::npos);

  void* p = salus_malloc(1 << 16, 0, nullptr);
  ASSERT_NE(p, nullptr);
  std::memset(p, 1, 1 << 16);
  EXPECT_EQ(salus_malloc(-5, 0, nullptr), nullptr);
  EXPECT_NE(std::string(salus_last_error()).find("negative"), std::string::npos);
  EXPECT_EQ(salus_malloc(64 * kMiB, 0, nullptr), nullptr);
  EXPECT_NE(std::string(salus_last_error()).find("can never fit"), std::string::npos);
  salus_free(p, 1 << 16, 0, nullptr);
  salus_device_stats stats{};
  stats.struct_size = sizeof stats;
  ASSERT_EQ(salus_get_device_stats(salus_default_runtime(), 0, &stats), SALUS_OK);
  EXPECT_EQ(stats.allocated, 0u);
  EXPECT_EQ(stats.allocations, 1u);
  EXPECT_EQ(stats.limit, 32 * kMiB);
  salus_default_runtime_shutdown();
  // The next use makes a new default with the defaults (one 1 GiB simulated GPU here).
  ASSERT_NE(salus_default_runtime(), nullptr);
  ASSERT_EQ(salus_get_device_stats(salus_default_runtime(), 0, &stats), SALUS_OK);
  EXPECT_EQ(stats.allocations, 0u);
  salus_default_runtime_shutdown();
}

}  // namespace
