// The runtime on simulated GPUs: jobs in threads, iterations with simulated kernels as GPU work,
// the switch path, cancellation, attribution, profiling and the trace.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "salus/runtime.hpp"
#include "salus/sim.hpp"

namespace salus::testing {
namespace {

using namespace std::chrono_literals;

std::shared_ptr<DeviceBackend> sim(std::size_t bytes = 512 * MiB) {
  return make_sim_backend(SimConfig::uniform(1, bytes));
}

// Enqueues `duration` of GPU work on the stream: a simulated kernel, which (unlike a host
// function) counts as the job's GPU time.
void gpu_work(DeviceBackend& backend, StreamHandle stream, std::chrono::microseconds duration) {
  launch_sim_kernel(backend, stream, 0, std::chrono::duration<double>(duration).count());
}

JobSpec training(std::string name, std::uint64_t iterations = 0) {
  JobSpec spec;
  spec.name = std::move(name);
  spec.expected_iterations = iterations;
  spec.hints = {
      .persistent_bytes = 16 * MiB, .ephemeral_peak_bytes = 32 * MiB, .iteration_seconds = 0.002};
  return spec;
}

// Records the order in which iterations start.
struct StartLog {
  std::mutex mu;
  std::vector<std::string> starts;
  void add(const std::string& name) {
    std::lock_guard lock(mu);
    starts.push_back(name);
  }
};

TEST(Runtime, UnknownPolicyIsAClearError) {
  try {
    Runtime runtime(sim(), {.policy = "lottery"});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("fair"), std::string::npos) << e.what();
  }
}

TEST(Runtime, FifoRunsJobsExclusivelyInArrivalOrder) {
  Runtime runtime(sim(), {.policy = "fifo"});
  StartLog log;
  std::vector<Job> jobs;
  for (const char* name : {"first", "second", "third"})
    jobs.push_back(runtime.add_job(training(name, 5)));
  auto run = [&](std::size_t j) {
    for (int i = 0; i < 5; ++i) {
      auto it = jobs[j].iteration();
      log.add(jobs[j].name());
      gpu_work(runtime.backend(), it.stream(), 500us);
      // Between iterations the job holds the device: others must not slip in.
      std::this_thread::sleep_for(8ms);
    }
    jobs[j].leave();
  };
  std::thread t0(run, 0);
  while (true) {
    std::lock_guard lock(log.mu);
    if (!log.starts.empty()) break;
  }
  // The third job asks before the second: arrival order, not asking order, decides.
  std::thread t2(run, 2);
  std::this_thread::sleep_for(2ms);
  std::thread t1(run, 1);
  for (std::thread* t : {&t0, &t1, &t2}) t->join();
  const std::vector<std::string> expected = {"first",  "first",  "first",  "first",  "first",
                                             "second", "second", "second", "second", "second",
                                             "third",  "third",  "third",  "third",  "third"};
  EXPECT_EQ(log.starts, expected);
}

TEST(Runtime, SwitchHandsTheNextJobTheLaneBeforeTheGpuDrains) {
  Runtime runtime(sim(), {.policy = "fair"});
  Job a = runtime.add_job(training("a"));
  Job b = runtime.add_job(training("b"));
  const StreamHandle sa = a.begin_iteration();
  std::atomic<bool> a_work_done{false};
  runtime.backend().launch_host_func(sa, [&] {
    std::this_thread::sleep_for(100ms);
    a_work_done = true;
  });
  std::atomic<bool> b_started{false};
  StreamHandle sb{};
  std::thread tb([&] {
    sb = b.begin_iteration();
    b_started = true;
  });
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(b_started.load()) << "b ran while a was inside its iteration";
  a.end_iteration();
  tb.join();
  EXPECT_TRUE(b_started.load());
  EXPECT_FALSE(a_work_done.load()) << "the switch waited for the GPU to drain";
  EXPECT_EQ(sa, sb) << "jobs taking turns share the lane's stream";
  // b's work is ordered behind a's on the GPU.
  std::atomic<bool> a_done_before_b{false};
  runtime.backend().launch_host_func(sb, [&] { a_done_before_b = a_work_done.load(); });
  b.end_iteration();
  runtime.backend().synchronize_stream(sb);
  EXPECT_TRUE(a_done_before_b.load());
}

TEST(Runtime, PackedAndMemoryAwarePlansOverlapIterationsOnSeparateStreams) {
  for (const char* policy : {"pack", "memory_aware"}) {
    SCOPED_TRACE(policy);
    Runtime runtime(sim(), {.policy = policy});
    Job a = runtime.add_job(training("a"));
    Job b = runtime.add_job(training("b"));
    const StreamHandle sa = a.begin_iteration();
    // Both fit in memory together, so b must not wait for a's iteration to end.
    std::thread tb([&] {
      const StreamHandle sb = b.begin_iteration();
      EXPECT_NE(sa, sb) << "overlapping iterations on one stream would run one after the other";
      b.end_iteration();
    });
    tb.join();
    a.end_iteration();
    EXPECT_LT(b.stats().max_wait_seconds, 0.05);
  }
}

TEST(Runtime, SingleLanePoliciesTakeTurns) {
  for (const char* policy : {"fair", "srtf", "priority"}) {
    SCOPED_TRACE(policy);
    Runtime runtime(sim(), {.policy = policy});
    Job a = runtime.add_job(training("a"));
    Job b = runtime.add_job(training("b"));
    (void)a.begin_iteration();
    std::atomic<bool> b_in{false};
    std::thread tb([&] {
      auto it = b.iteration();
      b_in = true;
    });
    std::this_thread::sleep_for(20ms);
    EXPECT_FALSE(b_in.load());
    a.end_iteration();
    tb.join();
    EXPECT_TRUE(b_in.load());
  }
}

TEST(Runtime, JobCancelledMidIterationFreesEverythingAndOthersGoOn) {
  Runtime runtime(sim(), {.policy = "fair"});
  Job a = runtime.add_job(training("victim"));
  Job b = runtime.add_job(training("survivor"));
  const DevicePtr weights = a.allocate(8 * MiB);
  (void)weights;
  const StreamHandle s = a.begin_iteration();
  (void)a.allocate(20 * MiB);  // ephemeral
  gpu_work(runtime.backend(), s, 2ms);
  std::atomic<bool> b_ran{false};
  std::thread tb([&] {
    auto it = b.iteration();
    b_ran = true;
  });
  std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(b_ran.load());
  a.cancel();
  tb.join();
  EXPECT_TRUE(b_ran.load());
  const JobStats st = a.stats();
  EXPECT_EQ(st.state, JobState::cancelled);
  EXPECT_EQ(st.memory.in_use, 0u);
  EXPECT_THROW(a.end_iteration(), JobCancelled);
  EXPECT_THROW((void)a.begin_iteration(), JobCancelled);
  EXPECT_THROW((void)a.allocate(1), JobCancelled);
  EXPECT_NO_THROW(a.cancel()) << "cancel is idempotent";
  // The survivor keeps working.
  auto it = b.iteration();
  const DevicePtr p = b.allocate(MiB);
  b.deallocate(p);
}

TEST(Runtime, JobCancelledWhileWaitingIsWokenWithAnError) {
  Runtime runtime(sim(), {.policy = "fair"});
  Job a = runtime.add_job(training("holder"));
  Job b = runtime.add_job(training("waiter"));
  (void)a.begin_iteration();
  std::atomic<bool> threw{false};
  std::thread tb([&] {
    try {
      (void)b.begin_iteration();
    } catch (const JobCancelled&) {
      threw = true;
    }
  });
  std::this_thread::sleep_for(10ms);
  b.cancel();
  tb.join();
  EXPECT_TRUE(threw.load());
  a.end_iteration();
}

TEST(Runtime, MisuseIsAClearError) {
  Runtime runtime(sim());
  Job a = runtime.add_job(training("a"));
  EXPECT_THROW(a.end_iteration(), InvalidArgument);
  (void)a.begin_iteration();
  EXPECT_THROW((void)a.begin_iteration(), InvalidArgument);
  a.end_iteration();
  a.leave();
  EXPECT_THROW((void)a.begin_iteration(), InvalidArgument);
  EXPECT_THROW((void)runtime.add_job(JobSpec{}), InvalidArgument) << "a job needs a name";
  JobSpec elsewhere = training("elsewhere");
  elsewhere.device = 3;
  EXPECT_THROW((void)runtime.add_job(elsewhere), InvalidArgument);
  Job moved = runtime.add_job(training("m"));
  Job target = std::move(moved);
  EXPECT_THROW((void)moved.begin_iteration(), InvalidArgument);
}

TEST(Runtime, AllocationsAreAttributedByStreamThenByThread) {
  const auto backend = sim();
  Runtime runtime(backend, {.policy = "fair"});
  Job a = runtime.add_job(training("a"));
  const StreamHandle lane = a.begin_iteration();
  // On the lane's stream: the job running there.
  const DevicePtr by_stream = runtime.allocate(MiB, 0, lane);
  EXPECT_EQ(runtime.memory().find(by_stream)->job, a.id());
  EXPECT_EQ(runtime.memory().find(by_stream)->lifetime, Lifetime::ephemeral);
  // On a stream Salus does not own: the calling thread's current job.
  Stream foreign(backend, 0);
  const DevicePtr by_thread = runtime.allocate(MiB, 0, foreign.handle());
  EXPECT_EQ(runtime.memory().find(by_thread)->job, a.id());
  // Another thread with no job: unattributed.
  DevicePtr nobody = 0;
  std::thread([&] { nobody = runtime.allocate(MiB, 0, foreign.handle()); }).join();
  EXPECT_EQ(runtime.memory().find(nobody)->job, kUnattributedJob);
  runtime.deallocate(by_stream);
  runtime.deallocate(nobody);
  a.end_iteration();
  // Both the allocation and the free through the runtime fed the job's memory curve.
  EXPECT_EQ(a.stats().ephemeral_peak_bytes, 2 * MiB);
  EXPECT_EQ(a.stats().memory_curve.peak(), 2 * MiB);
  EXPECT_EQ(a.stats().persistent_bytes, MiB) << "by_thread outlived the iteration";
  // by_thread survived the iteration: promoted to persistent.
  EXPECT_EQ(runtime.memory().find(by_thread)->lifetime, Lifetime::persistent);
  runtime.deallocate(by_thread);
}

TEST(Runtime, ProfilerLearnsTimeAndMemoryOfAnIteration) {
  Runtime runtime(sim(), {.policy = "fair"});
  Job job = runtime.add_job(training("learner"));
  (void)job.allocate(10 * MiB);  // weights, outside any iteration: persistent
  for (int i = 0; i < 3; ++i) {
    auto it = job.iteration();
    std::vector<DevicePtr> activations;
    for (int layer = 0; layer < 4; ++layer) activations.push_back(job.allocate(4 * MiB));
    gpu_work(runtime.backend(), it.stream(), 5ms);
    for (auto p = activations.rbegin(); p != activations.rend(); ++p) job.deallocate(*p);
  }
  runtime.backend().synchronize_stream(job.stream());
  const JobStats st = job.stats();
  EXPECT_EQ(st.iterations, 3u);
  EXPECT_EQ(st.persistent_bytes, 10 * MiB);
  EXPECT_EQ(st.ephemeral_peak_bytes, 16 * MiB);
  EXPECT_GE(st.iteration_seconds, 0.004);
  EXPECT_LT(st.iteration_seconds, 0.5);
  EXPECT_GE(st.attained_seconds, 0.012);
  ASSERT_TRUE(st.memory_curve.known());
  EXPECT_EQ(st.memory_curve.peak(), 16 * MiB);
  EXPECT_EQ(st.memory.in_use, 10 * MiB);
}

TEST(Runtime, TraceHasAnIterationSpanPerIterationAndMemoryCounters) {
  Runtime runtime(sim(), {.policy = "fair"});
  Job a = runtime.add_job(training("alpha"));
  Job b = runtime.add_job(training("beta"));
  for (int i = 0; i < 3; ++i) {
    for (Job* job : {&a, &b}) {
      auto it = job->iteration();
      (void)job->allocate(MiB);
    }
  }
  const auto doc = nlohmann::json::parse(runtime.trace_json());
  int spans = 0, device_counters = 0, tier_counters = 0;
  for (const auto& e : doc.at("traceEvents")) {
    if (e.at("ph") == "X") {
      ++spans;
      EXPECT_TRUE(e.at("name") == "alpha" || e.at("name") == "beta");
      EXPECT_GE(e.at("dur").get<double>(), 0.0);
    }
    if (e.at("ph") != "C") continue;
    if (e.at("name") == "memory gpu0") {
      ++device_counters;
      EXPECT_TRUE(e.at("args").contains("lent_MiB"));
    } else {
      // One per job and iteration: where its bytes live.
      EXPECT_TRUE(e.at("name") == "tiers alpha" || e.at("name") == "tiers beta");
      EXPECT_DOUBLE_EQ(e.at("args").at("host_MiB").get<double>(), 0.0);
      ++tier_counters;
    }
  }
  EXPECT_EQ(spans, 6);
  EXPECT_EQ(device_counters, 6);
  EXPECT_EQ(tier_counters, 6);
  EXPECT_THROW(runtime.write_trace("/nonexistent-dir/trace.json"), InvalidArgument);
}

// Each span says when its job asked for the turn: a job that asked while another held it shows
// the ask before that other's end and its own begin after it (the order fairness is stated in).
TEST(Runtime, TraceSaysWhenEachIterationAskedForItsTurn) {
  Runtime runtime(sim(), {.policy = "fair"});
  Job a = runtime.add_job(training("alpha"));
  Job b = runtime.add_job(training("beta"));
  (void)a.begin_iteration();
  std::thread waiting([&] {
    auto it = b.iteration();
  });
  while (b.stats().state != JobState::waiting) std::this_thread::yield();
  a.end_iteration();
  waiting.join();
  const auto doc = nlohmann::json::parse(runtime.trace_json());
  std::map<std::string, nlohmann::json> span;
  for (const auto& e : doc.at("traceEvents")) {
    if (e.at("ph") == "X") span[e.at("name").get<std::string>()] = e;
  }
  ASSERT_EQ(span.size(), 2u);
  const double a_end = span["alpha"].at("ts").get<double>() + span["alpha"].at("dur").get<double>();
  const double b_asked = span["beta"].at("args").at("asked").get<double>();
  EXPECT_LE(span["alpha"].at("args").at("asked").get<double>(), span["alpha"].at("ts").get<double>());
  EXPECT_LT(b_asked, a_end);                                  // it asked while alpha held the turn
  EXPECT_LE(a_end, span["beta"].at("ts").get<double>() + 1.0);  // and began once alpha ended
}

TEST(RuntimeStress, ManyJobsAndThreadsUnderEveryPolicy) {
  for (const char* policy : {"fifo", "srtf", "fair", "pack", "priority", "memory_aware"}) {
    SCOPED_TRACE(policy);
    Runtime runtime(sim(1 * GiB), {.policy = policy});
    constexpr int kJobs = 8;
    constexpr int kIterations = 12;
    std::vector<Job> jobs;
    for (int j = 0; j < kJobs; ++j) {
      JobSpec spec = training("job" + std::to_string(j), kIterations);
      spec.kind = j % 4 == 0 ? JobKind::inference : JobKind::training;
      jobs.push_back(runtime.add_job(spec));
    }
    std::atomic<int> done{0};
    std::vector<std::thread> threads;
    for (int j = 0; j < kJobs; ++j) {
      threads.emplace_back([&, j] {
        Job& job = jobs[static_cast<std::size_t>(j)];
        try {
          (void)job.allocate(2 * MiB);
          for (int i = 0; i < kIterations; ++i) {
            auto it = job.iteration();
            const DevicePtr p = job.allocate(MiB * static_cast<std::size_t>(1 + i % 3));
            gpu_work(runtime.backend(), it.stream(), 200us);
            job.deallocate(p);
          }
          done.fetch_add(1);
          job.leave();
        } catch (const JobCancelled&) {
        }
      });
    }
    // One job is cancelled part-way, whatever it is doing.
    std::this_thread::sleep_for(5ms);
    jobs[3].cancel();
    for (auto& t : threads) t.join();
    EXPECT_GE(done.load(), kJobs - 1);
    for (const JobStats& s : runtime.job_stats()) EXPECT_EQ(s.memory.in_use, 0u) << s.name;
    EXPECT_EQ(runtime.memory().device_stats(0).allocated, 0u);
  }
}

// A job whose blocks are held by a framework's tensors (PyTorch on the CPU over simulated GPU
// memory computes on the job's thread): a cancel from another thread must not hand its memory to
// anyone while that thread may still write it, nor reuse an address a live tensor holds. Its
// blocks outlive it, charged to nobody, until their holder frees them.
TEST(Runtime, CancelledJobsBlocksOutliveItUntilTheirHolderFreesThem) {
  Runtime runtime(sim(64 * MiB), {.policy = "fair"});
  JobSpec spec = training("cpu");
  spec.blocks_outlive_job = true;
  Job a = runtime.add_job(spec);
  Job b = runtime.add_job(training("other"));
  (void)a.begin_iteration();
  const DevicePtr work = a.allocate(48 * MiB);
  auto* bytes = reinterpret_cast<unsigned char*>(work);
  std::thread([&] { a.cancel(); }).join();
  // The thread still "computes": its bytes stay valid, and the other job cannot have them.
  std::memset(bytes, 0x5a, 48 * MiB);
  EXPECT_THROW((void)b.allocate(48 * MiB), OutOfMemory) << "a's memory was handed on early";
  EXPECT_THROW((void)a.allocate(1 * MiB), JobCancelled);
  EXPECT_THROW(a.end_iteration(), JobCancelled);
  const MemoryStats held = runtime.memory().stats();
  EXPECT_EQ(held.devices[0].allocated, 48 * MiB);
  for (const JobMemoryStats& j : held.jobs) {
    // Charged to nobody now: the unattributed job holds it as persistent memory.
    EXPECT_EQ(j.in_use, j.job == kUnattributedJob ? 48 * MiB : 0u) << j.name;
  }
  EXPECT_EQ(bytes[0], 0x5a);
  // The holder frees it; then b gets the memory.
  runtime.deallocate(work, 48 * MiB, 0);
  EXPECT_EQ(runtime.memory().device_stats(0).allocated, 0u);
  const DevicePtr mine = b.allocate(48 * MiB);
  b.deallocate(mine);
  a.leave();  // nothing left to free
}

// Leaving hands the blocks on the same way, ephemeral ones included; a job without the flag frees
// everything at once.
TEST(Runtime, LeavingJobsBlocksOutliveItOnlyWhenItSaysSo) {
  Runtime runtime(sim(64 * MiB), {.policy = "fair"});
  JobSpec spec = training("tensors");
  spec.blocks_outlive_job = true;
  Job held = runtime.add_job(spec);
  const DevicePtr weights = held.allocate(8 * MiB);
  DevicePtr scratch = 0;
  {
    auto it = held.iteration();
    scratch = held.allocate(4 * MiB, Lifetime::ephemeral);
    held.leave();
  }
  const DeviceMemoryStats d = runtime.memory().device_stats(0);
  EXPECT_EQ(d.allocated, 12 * MiB);
  EXPECT_EQ(d.by_class[static_cast<std::size_t>(Lifetime::persistent)].in_use, 12 * MiB);
  EXPECT_EQ(d.by_class[static_cast<std::size_t>(Lifetime::ephemeral)].in_use, 0u);
  runtime.deallocate(weights);
  runtime.deallocate(scratch);
  EXPECT_EQ(runtime.memory().device_stats(0).allocated, 0u);

  Job plain = runtime.add_job(training("plain"));
  (void)plain.allocate(8 * MiB);
  plain.leave();
  EXPECT_EQ(runtime.memory().device_stats(0).allocated, 0u);
}

}  // namespace
}  // namespace salus::testing
