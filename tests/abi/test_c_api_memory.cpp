// Memory through the C ABI: who is charged (an explicit job, a bound stream, the thread's
// current job, a helper thread on a job's iteration stream), promotion at iteration end, and the
// framework's own streams (made outside the scheduler, more than 64 of them, destroyed and
// retired) under memory pressure. Only salus/c_api.h is used.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "abi/c_api_fixture.hpp"

namespace {

// Fills a block with a pattern of its own and checks it later.
struct Written {
  void* ptr = nullptr;
  size_t bytes = 0;
  unsigned char seed = 0;

  void write() const {
    auto* p = static_cast<unsigned char*>(ptr);
    for (size_t i = 0; i < bytes; i += 4096) p[i] = static_cast<unsigned char>(seed + i / 4096);
    p[bytes - 1] = seed;
  }
  [[nodiscard]] bool intact() const {
    const auto* p = static_cast<const unsigned char*>(ptr);
    for (size_t i = 0; i < bytes; i += 4096) {
      if (p[i] != static_cast<unsigned char>(seed + i / 4096) && i != bytes - 1) return false;
    }
    return p[bytes - 1] == seed;
  }
};

TEST_F(CApi, AnExplicitJobIsChargedPerClass) {
  const uint32_t job = add_job("explicit");
  void* p = nullptr;
  void* q = nullptr;
  ASSERT_EQ(salus_allocate(runtime, 3 * kMiB, 0, nullptr, job, SALUS_LIFETIME_AUTO, &p), SALUS_OK);
  ASSERT_EQ(salus_allocate(runtime, kMiB, 0, nullptr, job, SALUS_EPHEMERAL, &q), SALUS_OK);
  salus_job_stats s = job_stats(job);
  EXPECT_EQ(s.persistent_in_use, 3 * kMiB) << "outside an iteration, AUTO is persistent";
  EXPECT_EQ(s.ephemeral_in_use, kMiB);
  EXPECT_EQ(s.persistent_blocks, 1u);
  EXPECT_EQ(device_stats(0).allocated, 4 * kMiB);
  EXPECT_EQ(salus_deallocate(runtime, p, 3 * kMiB, 0), SALUS_OK);
  EXPECT_EQ(salus_deallocate(runtime, q, 0, 0), SALUS_OK);
  EXPECT_EQ(job_stats(job).in_use, 0u);
}

TEST_F(CApi, ABoundStreamChargesItsJobUntilUnbound) {
  const uint32_t a = add_job("a");
  const uint32_t b = add_job("b");
  void* stream = nullptr;
  ASSERT_EQ(salus_stream_create(runtime, 0, 0, &stream), SALUS_OK) << salus_last_error();
  ASSERT_EQ(salus_stream_bind(runtime, 0, stream, b), SALUS_OK) << salus_last_error();
  void* p = nullptr;
  ASSERT_EQ(salus_allocate(runtime, 2 * kMiB, 0, stream, SALUS_JOB_AUTO, SALUS_LIFETIME_AUTO, &p),
            SALUS_OK);
  EXPECT_EQ(job_stats(b).persistent_in_use, 2 * kMiB);
  EXPECT_EQ(job_stats(a).in_use, 0u);
  // An explicit job wins over the binding.
  void* q = nullptr;
  ASSERT_EQ(salus_allocate(runtime, kMiB, 0, stream, a, SALUS_LIFETIME_AUTO, &q), SALUS_OK);
  EXPECT_EQ(job_stats(a).in_use, kMiB);
  ASSERT_EQ(salus_stream_unbind(runtime, 0, stream), SALUS_OK);
  EXPECT_EQ(salus_stream_unbind(runtime, 0, stream), SALUS_ERROR_INVALID_ARGUMENT);
  void* r = nullptr;
  ASSERT_EQ(salus_allocate(runtime, kMiB, 0, stream, SALUS_JOB_AUTO, SALUS_LIFETIME_AUTO, &r),
            SALUS_OK);
  EXPECT_EQ(job_stats(b).in_use, 2 * kMiB) << "unbound: no longer b's";
  EXPECT_EQ(device_stats(0).allocated, 4 * kMiB);
  for (void* ptr : {p, q, r}) EXPECT_EQ(salus_deallocate(runtime, ptr, 0, 0), SALUS_OK);
  // A binding ends with its job.
  ASSERT_EQ(salus_stream_bind(runtime, 0, stream, b), SALUS_OK);
  ASSERT_EQ(salus_job_leave(runtime, b), SALUS_OK);
  ASSERT_EQ(salus_allocate(runtime, kMiB, 0, stream, SALUS_JOB_AUTO, SALUS_LIFETIME_AUTO, &r),
            SALUS_OK);
  EXPECT_EQ(device_stats(0).allocated, kMiB);
  EXPECT_EQ(salus_deallocate(runtime, r, 0, 0), SALUS_OK);
  EXPECT_EQ(salus_stream_destroy(runtime, 0, stream), SALUS_OK) << salus_last_error();
}

TEST_F(CApi, TheThreadsCurrentJobIsChargedAndIsPerThread) {
  const uint32_t job = add_job("current");
  ASSERT_EQ(salus_set_current_job(runtime, job), SALUS_OK);
  uint32_t current = 0;
  ASSERT_EQ(salus_get_current_job(runtime, &current), SALUS_OK);
  EXPECT_EQ(current, job);
  void* p = nullptr;
  ASSERT_EQ(salus_allocate(runtime, kMiB, 0, nullptr, SALUS_JOB_AUTO, SALUS_LIFETIME_AUTO, &p),
            SALUS_OK);
  EXPECT_EQ(job_stats(job).persistent_in_use, kMiB);
  // Another thread has no current job: its memory is unattributed.
  void* other = nullptr;
  std::thread([&] {
    uint32_t seen = 99;
    EXPECT_EQ(salus_get_current_job(runtime, &seen), SALUS_OK);
    EXPECT_EQ(seen, SALUS_JOB_AUTO);
    EXPECT_EQ(salus_allocate(runtime, kMiB, 0, nullptr, SALUS_JOB_AUTO, SALUS_LIFETIME_AUTO,
                             &other),
              SALUS_OK);
  }).join();
  EXPECT_EQ(job_stats(job).in_use, kMiB);
  EXPECT_EQ(device_stats(0).allocated, 2 * kMiB);
  ASSERT_EQ(salus_set_current_job(runtime, SALUS_JOB_AUTO), SALUS_OK);
  EXPECT_EQ(salus_set_current_job(runtime, 4242), SALUS_ERROR_UNKNOWN_JOB);
  EXPECT_EQ(salus_deallocate(runtime, p, kMiB, 0), SALUS_OK);
  EXPECT_EQ(salus_deallocate(runtime, other, kMiB, 0), SALUS_OK);
}

TEST_F(CApi, AHelperThreadOnAJobsStreamIsChargedToTheJobAndSurvivorsArePromoted) {
  const uint32_t job = add_job("autograd");
  void* stream = nullptr;
  ASSERT_EQ(salus_job_begin_iteration(runtime, job, &stream), SALUS_OK);
  // PyTorch's autograd threads allocate on the job's stream, not on the thread that began.
  void* kept = nullptr;
  void* dropped = nullptr;
  std::thread([&] {
    ASSERT_EQ(salus_allocate(runtime, 2 * kMiB, 0, stream, SALUS_JOB_AUTO, SALUS_LIFETIME_AUTO,
                             &kept),
              SALUS_OK);
    ASSERT_EQ(salus_allocate(runtime, 3 * kMiB, 0, stream, SALUS_JOB_AUTO, SALUS_LIFETIME_AUTO,
                             &dropped),
              SALUS_OK);
  }).join();
  salus_job_stats s = job_stats(job);
  EXPECT_EQ(s.ephemeral_in_use, 5 * kMiB) << "inside an iteration, AUTO is ephemeral";
  EXPECT_EQ(s.persistent_in_use, 0u);
  ASSERT_EQ(salus_deallocate(runtime, dropped, 3 * kMiB, 0), SALUS_OK);
  ASSERT_EQ(salus_job_end_iteration(runtime, job), SALUS_OK);
  s = job_stats(job);
  EXPECT_EQ(s.ephemeral_in_use, 0u);
  EXPECT_EQ(s.persistent_in_use, 2 * kMiB) << "what survived the iteration is persistent";
  EXPECT_EQ(s.promoted_bytes, 2 * kMiB);
  EXPECT_EQ(s.profile_ephemeral_peak_bytes, 5 * kMiB);
  // After the iteration the stream is no longer the job's: a helper's memory is unattributed.
  void* late = nullptr;
  ASSERT_EQ(salus_allocate(runtime, kMiB, 0, stream, SALUS_JOB_AUTO, SALUS_LIFETIME_AUTO, &late),
            SALUS_OK);
  EXPECT_EQ(job_stats(job).in_use, 2 * kMiB);
  EXPECT_EQ(salus_deallocate(runtime, late, 0, 0), SALUS_OK);
  EXPECT_EQ(salus_deallocate(runtime, kept, 0, 0), SALUS_OK);
}

TEST(CApiDefault, MallocIsChargedToTheJobWhoseStreamItNames) {
  salus_runtime_options o;
  salus_runtime_options_init(&o);
  o.backend = SALUS_BACKEND_SIM;
  o.sim_device_memory_bytes = 64 * kMiB;
  ASSERT_EQ(salus_default_runtime_init(&o), SALUS_OK) << salus_last_error();
  salus_runtime* runtime = salus_default_runtime();
  salus_job_spec spec;
  salus_job_spec_init(&spec);
  spec.name = "torch-job";
  uint32_t job = 0;
  ASSERT_EQ(salus_job_add(runtime, &spec, &job), SALUS_OK);
  void* stream = nullptr;
  ASSERT_EQ(salus_job_begin_iteration(runtime, job, &stream), SALUS_OK);
  void* p = salus_malloc(4 * kMiB, 0, stream);
  ASSERT_NE(p, nullptr) << salus_last_error();
  salus_job_stats s{};
  s.struct_size = sizeof s;
  ASSERT_EQ(salus_job_get_stats(runtime, job, &s), SALUS_OK);
  EXPECT_EQ(s.ephemeral_in_use, 4 * kMiB);
  salus_free(p, 4 * kMiB, 0, stream);
  ASSERT_EQ(salus_job_get_stats(runtime, job, &s), SALUS_OK);
  EXPECT_EQ(s.in_use, 0u);
  ASSERT_EQ(salus_job_end_iteration(runtime, job), SALUS_OK);
  salus_default_runtime_shutdown();
}

// The scenario: a stream Salus did not create allocates and frees most of the device;
// then another stream must be able to fill the device, and trim must work.
void fill_after_framework_stream(salus_runtime* runtime, size_t device_bytes) {
  void* framework = nullptr;
  ASSERT_EQ(salus_stream_create(runtime, 0, 0, &framework), SALUS_OK) << salus_last_error();
  constexpr size_t kBlock = 4 * kMiB;
  std::vector<Written> blocks;
  for (int i = 0; i < 60; ++i) {
    Written w{nullptr, kBlock, static_cast<unsigned char>(i)};
    ASSERT_EQ(salus_allocate(runtime, kBlock, 0, framework, SALUS_JOB_AUTO, SALUS_PERSISTENT,
                             &w.ptr),
              SALUS_OK)
        << i << ": " << salus_last_error();
    w.write();
    blocks.push_back(w);
  }
  for (const Written& w : blocks) ASSERT_TRUE(w.intact());
  for (const Written& w : blocks) ASSERT_EQ(salus_deallocate(runtime, w.ptr, kBlock, 0), SALUS_OK);
  blocks.clear();

  // The default stream takes the framework stream's cached pages.
  for (int i = 0;; ++i) {
    Written w{nullptr, kBlock, static_cast<unsigned char>(100 + i)};
    const salus_status st =
        salus_allocate(runtime, kBlock, 0, nullptr, SALUS_JOB_AUTO, SALUS_PERSISTENT, &w.ptr);
    if (st != SALUS_OK) {
      EXPECT_EQ(st, SALUS_ERROR_OUT_OF_MEMORY) << salus_last_error();
      break;
    }
    w.write();
    blocks.push_back(w);
  }
  EXPECT_GE(blocks.size() * kBlock, device_bytes - 8 * kMiB) << "nearly all the device is usable";
  salus_device_stats s{};
  s.struct_size = sizeof s;
  ASSERT_EQ(salus_get_device_stats(runtime, 0, &s), SALUS_OK);
  EXPECT_EQ(s.allocated, blocks.size() * kBlock);
  size_t released = 0;
  EXPECT_EQ(salus_trim(runtime, &released), SALUS_OK) << salus_last_error();
  for (const Written& w : blocks) ASSERT_TRUE(w.intact()) << "after trim";
  for (const Written& w : blocks) ASSERT_EQ(salus_deallocate(runtime, w.ptr, kBlock, 0), SALUS_OK);
  EXPECT_EQ(salus_trim(runtime, &released), SALUS_OK) << salus_last_error();
  ASSERT_EQ(salus_get_device_stats(runtime, 0, &s), SALUS_OK);
  EXPECT_EQ(s.allocated, 0u);
  EXPECT_EQ(s.reserved, 0u) << "trim gave every page back";
  EXPECT_EQ(salus_stream_destroy(runtime, 0, framework), SALUS_OK) << salus_last_error();
}

TEST(CApiFrameworkStreams, AStreamSalusDidNotCreateDoesNotPoisonTheDevice) {
  salus_runtime* runtime = nullptr;
  ASSERT_EQ(salus_runtime_create_sim(1, 256 * kMiB, &runtime), SALUS_OK);
  fill_after_framework_stream(runtime, 256 * kMiB);
  // A handle that is no stream at all is refused at the first call, and changes nothing.
  void* p = nullptr;
  void* bogus = reinterpret_cast<void*>(uintptr_t{0x1234});
  EXPECT_EQ(salus_allocate(runtime, kMiB, 0, bogus, SALUS_JOB_AUTO, SALUS_PERSISTENT, &p),
            SALUS_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(salus_last_error()).find("0x1234"), std::string::npos)
      << salus_last_error();
  EXPECT_EQ(salus_trim(runtime, nullptr), SALUS_OK) << salus_last_error();
  fill_after_framework_stream(runtime, 256 * kMiB);
  salus_runtime_destroy(runtime);
}

TEST(CApiFrameworkStreams, TheSameOnAMeshWithSpilling) {
  salus_runtime_options o = spilling_mesh(4, 64 * kMiB);
  o.host_limit_bytes = 0;  // peers only: the device can reach exactly 4 x 64 MiB
  salus_runtime* runtime = nullptr;
  ASSERT_EQ(salus_runtime_create(&o, &runtime), SALUS_OK) << salus_last_error();
  fill_after_framework_stream(runtime, 4 * 64 * kMiB);
  salus_runtime_destroy(runtime);
}

TEST(CApiFrameworkStreams, AQuiescentJobsPagesMoveAndComeHomeOnAFrameworkStream) {
  const salus_runtime_options o = spilling_mesh(2, 64 * kMiB);
  salus_runtime* runtime = nullptr;
  ASSERT_EQ(salus_runtime_create(&o, &runtime), SALUS_OK) << salus_last_error();
  salus_job_spec spec;
  salus_job_spec_init(&spec);
  spec.name = "resident";
  uint32_t a = 0;
  uint32_t b = 0;
  ASSERT_EQ(salus_job_add(runtime, &spec, &a), SALUS_OK);
  spec.name = "newcomer";
  ASSERT_EQ(salus_job_add(runtime, &spec, &b), SALUS_OK);
  void* framework = nullptr;
  ASSERT_EQ(salus_stream_create(runtime, 0, 0, &framework), SALUS_OK);
  ASSERT_EQ(salus_stream_bind(runtime, 0, framework, a), SALUS_OK);
  Written weights{nullptr, 40 * kMiB, 7};
  ASSERT_EQ(salus_allocate(runtime, weights.bytes, 0, framework, SALUS_JOB_AUTO, SALUS_PERSISTENT,
                           &weights.ptr),
            SALUS_OK);
  weights.write();

  // b takes the lane; a waits for its turn in another thread, and waiting is its safe point.
  void* stream = nullptr;
  ASSERT_EQ(salus_job_begin_iteration(runtime, b, &stream), SALUS_OK);
  std::atomic<bool> intact_at_home{false};
  std::atomic<size_t> borrowed_at_home{~size_t{0}};
  std::thread resident([&] {
    ASSERT_EQ(salus_job_begin_iteration(runtime, a, nullptr), SALUS_OK) << salus_last_error();
    // Its pages came home before begin returned; their bytes never changed address or value.
    intact_at_home = weights.intact();
    salus_device_stats home{};
    home.struct_size = sizeof home;
    EXPECT_EQ(salus_get_device_stats(runtime, 0, &home), SALUS_OK);
    borrowed_at_home = home.borrowed_peer;
    ASSERT_EQ(salus_job_end_iteration(runtime, a), SALUS_OK);
  });
  salus_job_stats js{};
  js.struct_size = sizeof js;
  // (The state and the safe point are read one after the other, not as one snapshot: wait for
  // both. The job turns waiting first, then quiescent.)
  do {
    ASSERT_EQ(salus_job_get_stats(runtime, a, &js), SALUS_OK);
  } while (js.quiescent == 0 || js.state != SALUS_JOB_WAITING);
  EXPECT_EQ(js.on_peer_bytes, 0u);

  // b needs more than what is left on device 0: a's pages go to device 1 for it.
  Written act{nullptr, 48 * kMiB, 9};
  ASSERT_EQ(salus_allocate(runtime, act.bytes, 0, stream, b, SALUS_LIFETIME_AUTO, &act.ptr),
            SALUS_OK)
      << salus_last_error();
  act.write();
  salus_device_stats s{};
  s.struct_size = sizeof s;
  ASSERT_EQ(salus_get_device_stats(runtime, 0, &s), SALUS_OK);
  EXPECT_GT(s.borrowed_peer, 0u);
  EXPECT_GT(s.pages_moved, 0u) << "a's pages moved down a tier";
  ASSERT_EQ(salus_job_get_stats(runtime, a, &js), SALUS_OK);
  EXPECT_GT(js.on_peer_bytes, 0u);
  EXPECT_EQ(js.in_use_by_tier[1], js.on_peer_bytes);
  EXPECT_EQ(js.memory.quiescent, 1);
  EXPECT_TRUE(act.intact());
  ASSERT_EQ(salus_deallocate(runtime, act.ptr, act.bytes, 0), SALUS_OK);
  ASSERT_EQ(salus_job_end_iteration(runtime, b), SALUS_OK);
  ASSERT_EQ(salus_job_leave(runtime, b), SALUS_OK);
  resident.join();
  EXPECT_TRUE(intact_at_home.load());
  EXPECT_EQ(borrowed_at_home.load(), 0u) << "home again";
  ASSERT_EQ(salus_job_get_stats(runtime, a, &js), SALUS_OK);
  EXPECT_EQ(js.persistent_in_use, weights.bytes);
  EXPECT_EQ(js.in_use_by_tier[0], weights.bytes) << "home again";
  EXPECT_GE(js.memory.activations_after_move, 1u) << "it became active after its pages moved";
  EXPECT_TRUE(weights.intact());
  ASSERT_EQ(salus_deallocate(runtime, weights.ptr, weights.bytes, 0), SALUS_OK);
  EXPECT_EQ(salus_stream_destroy(runtime, 0, framework), SALUS_OK) << salus_last_error();
  salus_runtime_destroy(runtime);
}

TEST(CApiFrameworkStreams, ManyStreamsComeAndGoWithoutGrowth) {
  salus_runtime* runtime = nullptr;
  // Each stream's blocks come from pages of its own (a small block takes one 2 MiB page).
  ASSERT_EQ(salus_runtime_create_sim(1, 512 * kMiB, &runtime), SALUS_OK);
  // More streams at once than the old cap of 64.
  std::vector<void*> streams(100);
  std::vector<void*> blocks(100);
  for (size_t i = 0; i < streams.size(); ++i) {
    ASSERT_EQ(salus_stream_create(runtime, 0, 0, &streams[i]), SALUS_OK);
    ASSERT_EQ(salus_allocate(runtime, 64 * 1024, 0, streams[i], SALUS_JOB_AUTO, SALUS_PERSISTENT,
                             &blocks[i]),
              SALUS_OK)
        << i << ": " << salus_last_error();
  }
  for (size_t i = 0; i < streams.size(); ++i) {
    ASSERT_EQ(salus_deallocate(runtime, blocks[i], 0, 0), SALUS_OK);
    ASSERT_EQ(salus_stream_destroy(runtime, 0, streams[i]), SALUS_OK) << salus_last_error();
  }
  salus_device_stats s{};
  s.struct_size = sizeof s;
  ASSERT_EQ(salus_get_device_stats(runtime, 0, &s), SALUS_OK);
  const size_t reserved_after_100 = s.reserved;
  const size_t heaps_after_100 = s.stream_heaps;
  EXPECT_GE(heaps_after_100, 100u);
  // Streams made and destroyed one after another reuse the retired heaps' room.
  for (int i = 0; i < 500; ++i) {
    void* stream = nullptr;
    void* p = nullptr;
    ASSERT_EQ(salus_stream_create(runtime, 0, 0, &stream), SALUS_OK);
    ASSERT_EQ(salus_allocate(runtime, 3 * kMiB, 0, stream, SALUS_JOB_AUTO, SALUS_PERSISTENT, &p),
              SALUS_OK)
        << i << ": " << salus_last_error();
    std::memset(p, i & 0xff, 3 * kMiB);
    ASSERT_EQ(salus_deallocate(runtime, p, 0, 0), SALUS_OK);
    ASSERT_EQ(salus_stream_destroy(runtime, 0, stream), SALUS_OK) << salus_last_error();
  }
  ASSERT_EQ(salus_get_device_stats(runtime, 0, &s), SALUS_OK);
  EXPECT_LE(s.reserved, reserved_after_100 + 4 * kMiB);
  EXPECT_LE(s.stream_heaps, heaps_after_100) << "retired heaps serve the new streams";
  EXPECT_EQ(s.allocated, 0u);
  salus_runtime_destroy(runtime);
}

}  // namespace
