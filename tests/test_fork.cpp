// fork(): a child has only the thread that forked. A runtime (and its jobs, backend, default
// runtime and C handles) made before fork() refuses every use there with NotSupported instead of
// hanging, and destroying it there returns at once (it is leaked); a runtime made in the child
// works; the parent goes on unaffected. Each child runs under a time limit, so a regression fails
// instead of hanging. (Not under TSan: it refuses threads in a child of a threaded process.)
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "salus/c_api.h"
#include "salus/runtime.hpp"
#include "salus/sim.hpp"
#include "support/sim_runtime.hpp"

namespace salus::testing {
namespace {

using namespace std::chrono_literals;

std::shared_ptr<DeviceBackend> sim() {
  return one_sim_gpu(256 * MiB);
}

// In a child, gtest's assertions would go nowhere: a failed check exits with its line number.
#define CHILD_CHECK(cond)         \
  do {                            \
    if (!(cond)) return __LINE__; \
  } while (false)

// True when `call` throws NotSupported whose message says the object came from before fork().
template <class F>
bool says_forked(F&& call) {
  try {
    call();
  } catch (const NotSupported& e) {
    return std::string(e.what()).find("before fork()") != std::string::npos;
  } catch (...) {
  }
  return false;
}

// Runs `child` in a forked child and returns its exit code; a child that does not finish within
// `limit` is killed and fails the test.
int in_child(const std::function<int()>& child, std::chrono::seconds limit = 20s) {
  const pid_t pid = ::fork();
  if (pid < 0) {
    ADD_FAILURE() << "fork failed";
    return -1;
  }
  if (pid == 0) {
    int code = 255;
    try {
      code = child();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child threw: %s\n", e.what());
      code = 254;
    }
    ::_exit(code);  // no static destructors, no gtest: the child is done
  }
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      ADD_FAILURE() << "the child hung (killed after " << limit.count() << " s)";
      return -1;
    }
    std::this_thread::sleep_for(5ms);
  }
  if (!WIFEXITED(status)) {
    ADD_FAILURE() << "the child died of signal " << WTERMSIG(status);
    return -1;
  }
  return WEXITSTATUS(status);
}

// The parent's runtime after its child: still whole.
void one_iteration(Job& job, Runtime& runtime) {
  const StreamHandle stream = job.begin_iteration();
  launch_sim_kernel(runtime.backend(), stream, 0, 0.001);
  job.end_iteration();
  runtime.backend().synchronize_stream(stream);
}

TEST(ForkedChild, InheritedObjectsSayNotSupportedAndAreDestroyedWithoutHanging) {
  auto runtime = std::make_unique<Runtime>(sim());
  auto job = std::make_unique<Job>(runtime->add_job(job_named("trainer")));
  auto waiter = std::make_unique<Job>(runtime->add_job(job_named("waiter")));
  one_iteration(*job, *runtime);
  const StreamHandle lane = job->stream();
  // A thread of the parent waits for its turn as the process forks.
  const StreamHandle held = job->begin_iteration();
  std::thread blocked([&] { (void)waiter->begin_iteration(); });
  while (waiter->stats().state != JobState::waiting) std::this_thread::yield();

  EXPECT_EQ(
      in_child([&] {
        CHILD_CHECK(says_forked([&] { (void)job->stats(); }));
        CHILD_CHECK(says_forked([&] { job->end_iteration(); }));
        CHILD_CHECK(says_forked([&] { (void)waiter->try_begin_iteration(1ms); }));
        CHILD_CHECK(says_forked([&] { (void)runtime->add_job(job_named("child")); }));
        CHILD_CHECK(says_forked([&] { (void)runtime->allocate(MiB, 0, {}); }));
        CHILD_CHECK(says_forked([&] { (void)runtime->job_stats(); }));
        CHILD_CHECK(says_forked([&] { (void)runtime->memory(); }));
        // The backend itself: its stream threads are not here, nothing would run this.
        CHILD_CHECK(says_forked([&] { runtime->backend().synchronize_stream(lane); }));
        CHILD_CHECK(says_forked([&] { launch_sim_kernel(runtime->backend(), held, 0, 1.0); }));
        // Destroying everything returns (leaks) instead of joining absent threads.
        waiter.reset();
        job.reset();
        runtime.reset();
        return 0;
      }),
      0);

  // The parent is untouched.
  job->end_iteration();
  blocked.join();
  waiter->end_iteration();
  one_iteration(*job, *runtime);
  EXPECT_EQ(job->stats().iterations, 3u);
  EXPECT_EQ(waiter->stats().iterations, 1u);
}

TEST(ForkedChild, WhatTheChildMakesItselfWorks) {
  Runtime parent(sim());
  Job job = parent.add_job(job_named("parent"));
  one_iteration(job, parent);
  EXPECT_EQ(in_child([] {
              auto backend = sim();
              Runtime runtime(backend, {.policy = "fifo"});
              Job a = runtime.add_job(job_named("a"));
              for (int i = 0; i < 3; ++i) one_iteration(a, runtime);
              CHILD_CHECK(a.stats().iterations == 3);
              const DevicePtr p = a.allocate(MiB);
              a.deallocate(p);
              return 0;  // and everything is destroyed normally: the child's own threads join
            }),
            0);
  one_iteration(job, parent);
}

TEST(ForkedChild, TheDefaultIsANewOneInTheChild) {
  Runtime& inherited = Runtime::default_runtime();
  salus_runtime* const inherited_c = salus_default_runtime();
  ASSERT_NE(inherited_c, nullptr);
  EXPECT_EQ(in_child([&] {
              Runtime& fresh = Runtime::default_runtime();
              CHILD_CHECK(&fresh != &inherited);
              Job a = fresh.add_job(job_named("child"));
              one_iteration(a, fresh);
              // The C ABI's default is that same new runtime.
              salus_runtime* c = salus_default_runtime();
              CHILD_CHECK(c != nullptr && c != inherited_c);
              void* p = salus_malloc(4096, 0, nullptr);
              CHILD_CHECK(p != nullptr);
              salus_free(p, 4096, 0, nullptr);
              salus_default_runtime_shutdown();  // destroys the child's own: its threads join
              return 0;
            }),
            0);
  Job after = inherited.add_job(job_named("parent"));
  one_iteration(after, inherited);
}

TEST(ForkedChild, CAbiCallsOnInheritedHandlesSayNotSupported) {
  salus_runtime* runtime = nullptr;
  ASSERT_EQ(salus_runtime_create_sim(1, 64 * MiB, &runtime), SALUS_OK);
  salus_job_spec s;
  salus_job_spec_init(&s);
  s.name = "c";
  uint32_t job = 0;
  ASSERT_EQ(salus_job_add(runtime, &s, &job), SALUS_OK);
  EXPECT_EQ(
      in_child([&] {
        CHILD_CHECK(salus_job_begin_iteration(runtime, job, nullptr) == SALUS_ERROR_NOT_SUPPORTED);
        CHILD_CHECK(std::string(salus_last_error()).find("fork") != std::string::npos);
        int begun = 0;
        CHILD_CHECK(salus_job_try_begin_iteration(runtime, job, 0.0, nullptr, &begun) ==
                    SALUS_ERROR_NOT_SUPPORTED);
        void* p = nullptr;
        CHILD_CHECK(salus_allocate(runtime, 4096, 0, nullptr, job, SALUS_LIFETIME_AUTO, &p) ==
                    SALUS_ERROR_NOT_SUPPORTED);
        salus_runtime_destroy(runtime);  // returns: the jobs' cancel fails, leaving frees nothing
        return 0;
      }),
      0);
  void* stream = nullptr;
  ASSERT_EQ(salus_job_begin_iteration(runtime, job, &stream), SALUS_OK);
  ASSERT_EQ(salus_job_end_iteration(runtime, job), SALUS_OK);
  salus_runtime_destroy(runtime);
}

}  // namespace
}  // namespace salus::testing
