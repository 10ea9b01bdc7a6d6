// Attribution (src/iteration_sched/attribution.*): the one home of the calling thread's current
// job. Runtime::set_current_job, Runtime::JobScope (what salus::torch's JobScope and Python's
// `with job:` are made of) and the job inside an iteration all end up there, and an allocation
// that names no job is charged in one order: the stream's job, the thread's, the iteration's.
// Suite names start with "Runtime" so that ThreadSanitizer runs them (scripts/test.sh).
#include <gtest/gtest.h>

#include <thread>

#include "salus/error.hpp"
#include "salus/runtime.hpp"
#include "salus/sim.hpp"

namespace salus::testing {
namespace {

constexpr std::size_t kBlock = 1 * MiB;

JobSpec spec(std::string name, int device = 0) {
  JobSpec s;
  s.name = std::move(name);
  s.device = device;
  return s;
}

std::size_t in_use(Runtime& runtime, const Job& job) {
  return runtime.memory().job_stats(job.id()).in_use;
}

TEST(RuntimeAttribution, JobScopesNestAndRestoreTheThreadsJob) {
  Runtime runtime(make_sim_backend(SimConfig::uniform(2, 64 * MiB)));
  Job a = runtime.add_job(spec("a", 0));
  Job b = runtime.add_job(spec("b", 1));
  EXPECT_EQ(runtime.current_job(), kUnattributedJob);
  EXPECT_EQ(runtime.current_job_device(), -1);
  {
    const Runtime::JobScope outer(runtime, a.id(), 0);
    EXPECT_EQ(runtime.current_job(), a.id());
    EXPECT_EQ(runtime.current_job_device(), 0);
    {
      const Runtime::JobScope inner(runtime, b.id(), 1);
      EXPECT_EQ(runtime.current_job(), b.id());
      EXPECT_EQ(runtime.current_job_device(), 1);
      const DevicePtr p = runtime.allocate(kBlock, 1, StreamHandle{});
      EXPECT_EQ(in_use(runtime, b), kBlock);
      runtime.deallocate(p);
    }
    EXPECT_EQ(runtime.current_job(), a.id());
    const DevicePtr p = runtime.allocate(kBlock, 0, StreamHandle{});
    EXPECT_EQ(in_use(runtime, a), kBlock);
    EXPECT_EQ(in_use(runtime, b), 0u);
    runtime.deallocate(p);
  }
  EXPECT_EQ(runtime.current_job(), kUnattributedJob);
  const DevicePtr p = runtime.allocate(kBlock, 0, StreamHandle{});
  EXPECT_EQ(in_use(runtime, a), 0u) << "the scope ended: nobody's memory";
  runtime.deallocate(p);
}

// Job ids are per runtime: the same id in another runtime is another job, and must not be
// charged for a choice made in the first.
TEST(RuntimeAttribution, AChoiceInOneRuntimeIsInvisibleToAnother) {
  Runtime first(make_sim_backend(SimConfig::uniform(1, 64 * MiB)));
  Runtime second(make_sim_backend(SimConfig::uniform(1, 64 * MiB)));
  Job mine = first.add_job(spec("mine"));
  Job stranger = second.add_job(spec("stranger"));
  ASSERT_EQ(mine.id(), stranger.id()) << "the test needs the same id in both runtimes";
  first.set_current_job(mine.id());
  EXPECT_EQ(second.current_job(), kUnattributedJob);
  const DevicePtr p = second.allocate(kBlock, 0, StreamHandle{});
  EXPECT_EQ(in_use(second, stranger), 0u);
  second.deallocate(p);
  {
    const Runtime::JobScope scope(second, stranger.id(), 0);
    EXPECT_EQ(first.current_job(), kUnattributedJob);
    EXPECT_EQ(second.current_job(), stranger.id());
  }
  EXPECT_EQ(first.current_job(), mine.id()) << "the first runtime's choice came back";
  first.set_current_job(kUnattributedJob);
}

TEST(RuntimeAttribution, TheStreamsJobComesBeforeTheThreadsJob) {
  auto backend = make_sim_backend(SimConfig::uniform(1, 64 * MiB));
  Runtime runtime(backend);
  Job a = runtime.add_job(spec("a"));
  Job b = runtime.add_job(spec("b"));
  const StreamHandle stream = backend->create_stream(0, 0);
  runtime.bind_stream(0, stream, b.id());
  {
    const Runtime::JobScope scope(runtime, a.id(), 0);
    const DevicePtr on_bound = runtime.allocate(kBlock, 0, stream);
    const DevicePtr on_none = runtime.allocate(kBlock, 0, StreamHandle{});
    EXPECT_EQ(in_use(runtime, b), kBlock) << "the bound stream's job";
    EXPECT_EQ(in_use(runtime, a), kBlock) << "the thread's job";
    runtime.deallocate(on_bound);
    runtime.deallocate(on_none);
  }
  backend->synchronize_stream(stream);
  runtime.retire_stream(0, stream);
  backend->destroy_stream(stream);
}

// Inside an iteration with no choice made, the iteration's job is charged; a choice outranks it.
TEST(RuntimeAttribution, TheIterationsJobIsTheLastResort) {
  Runtime runtime(make_sim_backend(SimConfig::uniform(1, 64 * MiB)));
  Job a = runtime.add_job(spec("a"));
  Job b = runtime.add_job(spec("b"));
  (void)a.begin_iteration();
  const DevicePtr mine = runtime.allocate(kBlock, 0, StreamHandle{});
  EXPECT_EQ(in_use(runtime, a), kBlock);
  {
    const Runtime::JobScope scope(runtime, b.id(), 0);
    const DevicePtr chosen = runtime.allocate(kBlock, 0, StreamHandle{});
    EXPECT_EQ(in_use(runtime, b), kBlock);
    runtime.deallocate(chosen);
  }
  runtime.deallocate(mine);
  a.end_iteration();
  const DevicePtr after = runtime.allocate(kBlock, 0, StreamHandle{});
  EXPECT_EQ(in_use(runtime, a), 0u) << "the iteration ended: the thread works for nobody";
  runtime.deallocate(after);
}

// A scope does not look its job up (a `with job:` may outlive the job); an allocation for a job
// that has left is refused then, typed, and the scope still restores the thread's job.
TEST(RuntimeAttribution, AScopeForAJobThatLeftRefusesItsAllocations) {
  Runtime runtime(make_sim_backend(SimConfig::uniform(1, 64 * MiB)));
  Job a = runtime.add_job(spec("a"));
  const JobId id = a.id();
  a.leave();
  {
    const Runtime::JobScope scope(runtime, id, 0);
    EXPECT_THROW((void)runtime.allocate(kBlock, 0, StreamHandle{}), UnknownJob);
  }
  EXPECT_EQ(runtime.current_job(), kUnattributedJob);
  EXPECT_THROW(runtime.set_current_job(id), UnknownJob) << "set_current_job does look it up";
  EXPECT_EQ(runtime.memory().stats().devices[0].allocated, 0u) << "nothing was charged anywhere";
}

TEST(RuntimeAttribution, EachThreadHasItsOwnJob) {
  Runtime runtime(make_sim_backend(SimConfig::uniform(1, 64 * MiB)));
  Job a = runtime.add_job(spec("a"));
  Job b = runtime.add_job(spec("b"));
  const Runtime::JobScope scope(runtime, a.id(), 0);
  JobId seen_there = a.id();
  std::size_t b_there = 0;
  std::thread other([&] {
    seen_there = runtime.current_job();
    const Runtime::JobScope theirs(runtime, b.id(), 0);
    const DevicePtr p = runtime.allocate(kBlock, 0, StreamHandle{});
    b_there = in_use(runtime, b);
    runtime.deallocate(p);
  });
  other.join();
  EXPECT_EQ(seen_there, kUnattributedJob) << "a new thread works for nobody";
  EXPECT_EQ(b_there, kBlock);
  EXPECT_EQ(runtime.current_job(), a.id()) << "the other thread's scope did not touch this one";
}

}  // namespace
}  // namespace salus::testing
