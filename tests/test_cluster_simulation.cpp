// The simulator on several devices: placement rules on hand-made cases, independence of devices,
// determinism, the DecisionCore's byte counters that placement reads, bad input, and a
// workload-sized run on 64 GPUs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "iteration_sched/decision.hpp"
#include "salus/error.hpp"
#include "salus/simulation.hpp"

namespace salus::sched {
namespace {

constexpr std::size_t kMiB = 1 << 20;

// A job of `persistent` + a flat ephemeral curve of `ephemeral` bytes.
SimJob job(std::string name, std::size_t persistent, std::size_t ephemeral,
           std::uint64_t iterations = 2, double seconds = 1.0) {
  SimJob j;
  j.name = std::move(name);
  j.iterations = iterations;
  j.iteration_seconds = seconds;
  j.persistent_bytes = persistent;
  j.curve = MemoryCurve{seconds, {ephemeral}};
  return j;
}

ClusterSpec cluster(int machines, int gpus, std::size_t budget, std::string placement) {
  ClusterSpec spec;
  spec.machines = machines;
  spec.gpus_per_machine = gpus;
  spec.device_budget_bytes = budget;
  spec.placement = std::move(placement);
  return spec;
}

std::vector<int> devices_of(const SimResult& result) {
  std::vector<int> out;
  for (const SimJobResult& j : result.jobs) out.push_back(j.device);
  return out;
}

// All arrive at 0 in input order (so each placement sees the earlier ones), and they run long
// enough that none has left when the last is placed.
TEST(ClusterSimPlacement, LeastLoadedCountsUnfinishedJobs) {
  std::vector<SimJob> jobs;
  for (int i = 0; i < 5; ++i) jobs.push_back(job("j" + std::to_string(i), kMiB, kMiB));
  // 3 devices: 0, 1, 2, then 0 and 1 again (ties to the lowest index).
  SimResult r = Simulation("fair", cluster(1, 3, 100 * kMiB, "least_loaded")).run(jobs);
  EXPECT_EQ(devices_of(r), (std::vector<int>{0, 1, 2, 0, 1}));
  EXPECT_EQ(r.devices[0].jobs, 2u);
  EXPECT_EQ(r.devices[2].jobs, 1u);
  // A job that has left no longer counts: j1 and j2 (on device 1) have left by t = 2, j0 runs
  // on device 0 until t = 10; at t = 5 device 1 has no job and device 0 one, so "late" goes to
  // device 1 (to device 0, were left jobs counted).
  jobs = {job("j0", kMiB, kMiB, 10), job("j1", kMiB, kMiB, 1), job("j2", kMiB, kMiB, 1),
          job("late", kMiB, kMiB)};
  jobs[0].device = 0;
  jobs[1].device = 1;
  jobs[2].device = 1;
  jobs[3].arrival_seconds = 5.0;
  r = Simulation("fair", cluster(2, 1, 100 * kMiB, "least_loaded")).run(jobs);
  EXPECT_EQ(devices_of(r), (std::vector<int>{0, 1, 1, 1}));
}

// Budget 100 MiB. Sizes (persistent + peak): a 50, b 10, c 10, d 10.
//  most_free:    a -> 0 (all free); b -> 1 (100 > 50 free); c -> 2; d -> 1 (1 and 2 tie at 90).
//  least_loaded: a, b, c -> 0, 1, 2; d -> 0 (every device has one job).
//  pack_first:   a -> 0; b -> 0 (60); c -> 0 (70); d -> 0 (80).
TEST(ClusterSimPlacement, MostFreeAndPackFirstWeighBytes) {
  const std::vector<SimJob> jobs = {job("a", 10 * kMiB, 40 * kMiB), job("b", 2 * kMiB, 8 * kMiB),
                                    job("c", 2 * kMiB, 8 * kMiB), job("d", 2 * kMiB, 8 * kMiB)};
  const auto placed = [&](const char* rule) {
    return devices_of(Simulation("pack", cluster(1, 3, 100 * kMiB, rule)).run(jobs));
  };
  EXPECT_EQ(placed("most_free"), (std::vector<int>{0, 1, 2, 1}));
  EXPECT_EQ(placed("least_loaded"), (std::vector<int>{0, 1, 2, 0}));
  EXPECT_EQ(placed("pack_first"), (std::vector<int>{0, 0, 0, 0}));
}

// Pending bytes count. Budget 100 MiB, "pack" lanes. On device 0, x (50 + 10) is admitted and
// y (50 + 10) waits for admission (a lane of its own: 120; joining x's: 110). On device 1, w
// (10 + 60) is admitted. z (10 + 20 = 30) then finds device 0 spoken for up to 120 MiB and
// device 1 up to 70: most_free picks device 1 (device 0, with only the committed 60 counted) and
// pack_first device 1 (100 <= 100; device 0, were y not counted).
TEST(ClusterSimPlacement, PendingJobsCountAgainstTheirDevice) {
  std::vector<SimJob> jobs = {job("x", 50 * kMiB, 10 * kMiB), job("y", 50 * kMiB, 10 * kMiB),
                              job("w", 10 * kMiB, 60 * kMiB), job("z", 10 * kMiB, 20 * kMiB)};
  jobs[0].device = 0;
  jobs[1].device = 0;
  jobs[2].device = 1;
  for (const char* rule : {"most_free", "pack_first"}) {
    const SimResult r = Simulation("pack", cluster(2, 1, 100 * kMiB, rule)).run(jobs);
    EXPECT_EQ(devices_of(r), (std::vector<int>{0, 0, 1, 1})) << rule;
    EXPECT_GE(r.jobs[1].first_start_seconds, r.jobs[0].finish_seconds) << rule;  // y waited
  }
}

// pack_first: the lowest-index device with room, else the least loaded. a and b (50 each) fill
// device 0 exactly; c (60) goes to device 1; d (45 + 5) fits neither (150, 110): least loaded
// is device 1 (one job against two), where it waits for c (joining c's lane would need 105).
TEST(ClusterSimPlacement, PackFirstFallsBackToLeastLoaded) {
  const std::vector<SimJob> jobs = {job("a", 10 * kMiB, 40 * kMiB), job("b", 10 * kMiB, 40 * kMiB),
                                    job("c", 20 * kMiB, 40 * kMiB), job("d", 45 * kMiB, 5 * kMiB)};
  const SimResult r = Simulation("pack", cluster(1, 2, 100 * kMiB, "pack_first")).run(jobs);
  EXPECT_EQ(devices_of(r), (std::vector<int>{0, 0, 1, 1}));
  EXPECT_GE(r.jobs[3].first_start_seconds, r.jobs[2].finish_seconds);  // d waited for c
}

TEST(ClusterSimPlacement, DecisionCoreReportsPersistentAndPendingBytes) {
  const auto policy = PolicyRegistry::with_builtins().make("pack");
  DecisionCore core(*policy, 100);
  MemoryCurve curve{1.0, {40}};
  JobView a;
  a.id = JobId{1};
  a.arrival = 0;
  a.iteration_seconds = 1.0;
  a.persistent_bytes = 20;
  a.curve = &curve;
  JobView b = a;
  b.id = JobId{2};
  b.arrival = 1;
  b.persistent_bytes = 50;
  core.add(a);
  core.add(b);  // a lane of its own: 60 + 90; joining a's: 60 + 50: waits for admission
  EXPECT_EQ(core.persistent_bytes(), 20u);
  EXPECT_EQ(core.pending_bytes(), 90u);
  b.persistent_bytes = 60;  // a pending job's estimate grows
  core.update(b);
  EXPECT_EQ(core.pending_bytes(), 100u);
  core.remove(JobId{1});  // b is admitted now, alone
  EXPECT_EQ(core.pending_bytes(), 0u);
  EXPECT_EQ(core.persistent_bytes(), 60u);
  EXPECT_EQ(core.committed_bytes(), 100u);
  core.remove(JobId{2});
  EXPECT_EQ(core.persistent_bytes(), 0u);
}

// Random jobs with arrivals, think times, occupancies and memory curves.
std::vector<SimJob> random_jobs(std::uint64_t seed, int count, int devices) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<SimJob> jobs;
  for (int i = 0; i < count; ++i) {
    const double seconds = 0.05 + 0.3 * unit(rng);
    SimJob j;
    j.name = "r" + std::to_string(i);
    j.kind = unit(rng) < 0.2 ? JobKind::inference : JobKind::training;
    j.priority = static_cast<int>(3 * unit(rng));
    j.iterations = 3 + static_cast<std::uint64_t>(15 * unit(rng));
    j.iteration_seconds = seconds;
    j.persistent_bytes = kMiB * static_cast<std::size_t>(1 + 4 * unit(rng));
    j.curve = training_curve(seconds, kMiB * static_cast<std::size_t>(4 + 20 * unit(rng)),
                             4 + static_cast<std::size_t>(16 * unit(rng)), 0.3 + 0.5 * unit(rng));
    j.arrival_seconds = 2.0 * unit(rng);
    j.think_seconds = unit(rng) < 0.5 ? 0.0 : 0.05 * unit(rng);
    j.occupancy = 0.2 + 0.8 * unit(rng);
    j.device = devices > 0 && unit(rng) < 0.2 ? static_cast<int>(devices * unit(rng)) : -1;
    jobs.push_back(std::move(j));
  }
  return jobs;
}

void expect_identical(const SimResult& a, const SimResult& b, const std::string& what) {
  ASSERT_EQ(a.jobs.size(), b.jobs.size()) << what;
  for (std::size_t i = 0; i < a.jobs.size(); ++i) {
    const SimJobResult& x = a.jobs[i];
    const SimJobResult& y = b.jobs[i];
    EXPECT_TRUE(x.device == y.device && x.first_start_seconds == y.first_start_seconds &&
                x.finish_seconds == y.finish_seconds && x.attained_seconds == y.attained_seconds &&
                x.work_seconds == y.work_seconds && x.waiting_seconds == y.waiting_seconds &&
                x.max_wait_seconds == y.max_wait_seconds && x.iterations == y.iterations)
        << what << ": job " << i;
  }
  ASSERT_EQ(a.iterations.size(), b.iterations.size()) << what;
  for (std::size_t i = 0; i < a.iterations.size(); ++i) {
    const SimIteration& x = a.iterations[i];
    const SimIteration& y = b.iterations[i];
    EXPECT_TRUE(x.job == y.job && x.device == y.device && x.lane == y.lane && x.asked == y.asked &&
                x.start == y.start && x.end == y.end)
        << what << ": iteration " << i;
  }
  ASSERT_EQ(a.devices.size(), b.devices.size()) << what;
  for (std::size_t d = 0; d < a.devices.size(); ++d) {
    const SimDeviceResult& x = a.devices[d];
    const SimDeviceResult& y = b.devices[d];
    EXPECT_TRUE(
        x.busy_seconds == y.busy_seconds && x.utilization_seconds == y.utilization_seconds &&
        x.work_seconds == y.work_seconds && x.peak_combined_bytes == y.peak_combined_bytes &&
        x.peak_committed_bytes == y.peak_committed_bytes &&
        x.over_budget_seconds == y.over_budget_seconds && x.jobs == y.jobs)
        << what << ": device " << d;
  }
  ASSERT_EQ(a.timelines.size(), b.timelines.size()) << what;
  for (std::size_t d = 0; d < a.timelines.size(); ++d) {
    EXPECT_TRUE(a.timelines[d].time == b.timelines[d].time &&
                a.timelines[d].utilization == b.timelines[d].utilization &&
                a.timelines[d].memory_bytes == b.timelines[d].memory_bytes &&
                a.timelines[d].running == b.timelines[d].running &&
                a.timelines[d].waiting == b.timelines[d].waiting)
        << what << ": timeline " << d;
  }
  EXPECT_TRUE(a.makespan_seconds == b.makespan_seconds && a.throughput == b.throughput) << what;
}

TEST(ClusterSimDeterminism, SameInputsGiveIdenticalResults) {
  const std::vector<SimJob> jobs = random_jobs(42, 40, 4);
  for (const std::string& policy : PolicyRegistry::with_builtins().names()) {
    for (const std::string& placement : placement_names()) {
      const Simulation sim(policy, cluster(2, 2, 48 * kMiB, placement),
                           {.record_waiting = true, .timeline_step_seconds = 0.1});
      const SimResult first = sim.run(jobs);
      const SimResult again = sim.run(jobs);  // the same Simulation, reused
      const SimResult fresh = Simulation(policy, cluster(2, 2, 48 * kMiB, placement),
                                         {.record_waiting = true, .timeline_step_seconds = 0.1})
                                  .run(jobs);
      expect_identical(first, again, policy + "/" + placement);
      expect_identical(first, fresh, policy + "/" + placement + " (fresh)");
      std::uint64_t done = 0;
      for (const SimJobResult& j : first.jobs) done += j.iterations;
      EXPECT_EQ(done, first.iterations.size());
    }
  }
}

// Devices share nothing but the clock: jobs pinned to devices 0 and 1 of a two-device cluster
// get exactly the results each device's jobs get alone on one device.
TEST(ClusterSimIndependence, PinnedDevicesMatchSingleDeviceRuns) {
  std::vector<SimJob> jobs = random_jobs(5, 16, 0);
  std::vector<SimJob> on[2];
  std::vector<std::size_t> index[2];
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    jobs[i].device = static_cast<int>(i % 2);
    on[i % 2].push_back(jobs[i]);
    on[i % 2].back().device = -1;
    index[i % 2].push_back(i);
  }
  for (const std::string& policy : PolicyRegistry::with_builtins().names()) {
    const SimResult both = Simulation(policy, cluster(1, 2, 40 * kMiB, "least_loaded")).run(jobs);
    for (int d = 0; d < 2; ++d) {
      const SimResult alone = Simulation(policy, 40 * kMiB).run(on[d]);
      for (std::size_t k = 0; k < on[d].size(); ++k) {
        const SimJobResult& x = both.jobs[index[d][k]];
        const SimJobResult& y = alone.jobs[k];
        EXPECT_EQ(x.device, d);
        EXPECT_EQ(x.finish_seconds, y.finish_seconds) << policy << " " << x.name;
        EXPECT_EQ(x.attained_seconds, y.attained_seconds) << policy << " " << x.name;
        EXPECT_EQ(x.waiting_seconds, y.waiting_seconds) << policy << " " << x.name;
      }
      const SimDeviceResult& x = both.devices[static_cast<std::size_t>(d)];
      const SimDeviceResult& y = alone.devices[0];
      EXPECT_EQ(x.busy_seconds, y.busy_seconds) << policy;
      EXPECT_EQ(x.peak_combined_bytes, y.peak_combined_bytes) << policy;
      EXPECT_EQ(x.peak_committed_bytes, y.peak_committed_bytes) << policy;
      EXPECT_EQ(x.over_budget_seconds, y.over_budget_seconds) << policy;
    }
  }
}

TEST(ClusterSimTimeline, SamplesEveryDeviceOnOneGrid) {
  const std::vector<SimJob> jobs = random_jobs(9, 12, 3);
  const SimResult r =
      Simulation("fair", cluster(1, 3, 40 * kMiB, "most_free"), {.timeline_step_seconds = 0.5})
          .run(jobs);
  ASSERT_EQ(r.timelines.size(), 3u);
  const auto samples = static_cast<std::size_t>(r.makespan_seconds / 0.5) + 1;
  for (const SimTimeline& t : r.timelines) {
    ASSERT_EQ(t.time.size(), samples);
    ASSERT_EQ(t.memory_bytes.size(), samples);
    double last_left = 0.0;  // when the device's last job left
    for (const SimJobResult& j : r.jobs) {
      if (j.device == t.device) last_left = std::max(last_left, j.finish_seconds);
    }
    int busy = 0;
    for (std::size_t k = 0; k < samples; ++k) {
      EXPECT_DOUBLE_EQ(t.time[k], 0.5 * static_cast<double>(k));
      EXPECT_LE(t.memory_bytes[k],
                r.devices[static_cast<std::size_t>(t.device)].peak_combined_bytes);
      EXPECT_EQ(t.running[k] == 0, t.utilization[k] == 0.0);
      if (t.time[k] >= last_left) {  // the state after its last event: empty
        EXPECT_EQ(t.running[k] + t.waiting[k], 0u);
        EXPECT_EQ(t.memory_bytes[k], 0u);
      }
      busy += t.running[k] > 0;
    }
    EXPECT_GT(busy, 0);
  }
  // Without a step, no timelines.
  EXPECT_TRUE(
      Simulation("fair", cluster(1, 3, 40 * kMiB, "most_free")).run(jobs).timelines.empty());
}

TEST(ClusterSimErrors, BadClustersAndJobsAreNamed) {
  const auto message = [](auto&& f) {
    try {
      f();
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  EXPECT_NE(message([] {
              Simulation("fair", cluster(1, 2, kMiB, "round_robin"));
            }).find("least_loaded, most_free, pack_first"),
            std::string::npos);
  EXPECT_NE(message([] { (void)make_contention_model("mps"); }).find("processor_sharing"),
            std::string::npos);
  EXPECT_NE(
      message([] { Simulation("fair", cluster(0, 2, kMiB, "least_loaded")); }).find("machines"),
      std::string::npos);
  EXPECT_THROW(Simulation("fair", cluster(2, -1, kMiB, "least_loaded")), InvalidArgument);
  EXPECT_THROW(Simulation("fair", cluster(2, 2, 0, "least_loaded")), InvalidArgument);
  EXPECT_THROW(Simulation("fair", kMiB, {.timeline_step_seconds = -1.0}), InvalidArgument);
  EXPECT_THROW(Simulation("no_such_policy", cluster(1, 1, kMiB, "least_loaded")), InvalidArgument);

  const Simulation sim("fair", cluster(1, 2, 10 * kMiB, "least_loaded"));
  const auto run_with = [&](auto&& change) {
    std::vector<SimJob> jobs = {job("fine", kMiB, kMiB), job("bad", kMiB, kMiB)};
    change(jobs[1]);
    return message([&] { (void)sim.run(jobs); });
  };
  for (const std::string& text :
       {run_with([](SimJob& j) { j.arrival_seconds = -1.0; }),
        run_with([](SimJob& j) { j.think_seconds = -0.5; }),
        run_with([](SimJob& j) { j.iteration_seconds = 0.0; }),
        run_with([](SimJob& j) { j.iterations = 0; }),
        run_with([](SimJob& j) { j.occupancy = 0.0; }),
        run_with([](SimJob& j) { j.occupancy = 1.5; }), run_with([](SimJob& j) { j.device = 2; }),
        run_with([](SimJob& j) { j.device = -2; }), run_with([](SimJob& j) {
          j.persistent_bytes = 6 * kMiB;
          j.curve.bytes = {5 * kMiB};
        })}) {
    EXPECT_NE(text.find("'bad'"), std::string::npos) << text;
  }
  EXPECT_NE(run_with([](SimJob& j) { j.curve.bytes = {20 * kMiB}; }).find("fits no device"),
            std::string::npos);
}

// The scale the studies run at, kept small enough for a test: workload jobs coarsened to at most
// 50 steps, Poisson arrivals, 64 GPUs, every policy. Each finishes every job, and the devices
// deliver exactly the occupancy-weighted work their jobs asked for.
TEST(ClusterSimScale, WorkloadsOnSixtyFourGpusUnderEveryPolicy) {
  const char* env = std::getenv("SALUS_SHARED_DATA");
  const std::filesystem::path dir =
      env != nullptr
          ? std::filesystem::path(env)
          : std::filesystem::path(__FILE__).parent_path().parent_path() / ".." / "shared" / "data";
  const std::filesystem::path csv = dir / "salus_workloads.csv";
  if (!std::filesystem::exists(csv)) GTEST_SKIP() << csv << " is not present";
  const std::vector<SimJob> rows = jobs_from_workloads_csv(csv.string());
  std::mt19937_64 rng(3);
  std::exponential_distribution<double> gap(1.0);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<SimJob> jobs;
  double t = 0.0;
  for (std::size_t i = 0; i < 400; ++i) {
    SimJob j = coarsened(rows[i % rows.size()], 50);
    j.name += "#" + std::to_string(i);
    j.arrival_seconds = t += gap(rng);
    j.occupancy = 0.25 + 0.75 * unit(rng);
    jobs.push_back(std::move(j));
  }
  for (const std::string& policy : PolicyRegistry::with_builtins().names()) {
    const SimResult r =
        Simulation(policy, cluster(8, 8, 16ull << 30, "least_loaded"), {.record_iterations = false})
            .run(jobs);
    EXPECT_TRUE(r.iterations.empty());
    ASSERT_EQ(r.devices.size(), 64u);
    double weighted = 0.0, used = 0.0;
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      EXPECT_EQ(r.jobs[i].iterations, jobs[i].iterations) << policy;
      weighted += r.jobs[i].work_seconds * jobs[i].occupancy;
    }
    for (const SimDeviceResult& d : r.devices) used += d.utilization_seconds;
    EXPECT_NEAR(used, weighted, 1e-9 * weighted) << policy;
  }
}

}  // namespace
}  // namespace salus::sched
