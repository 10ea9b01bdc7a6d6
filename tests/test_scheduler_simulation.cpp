// The policies' promises, checked on a virtual clock: FIFO exclusivity, SRTF order at every
// boundary, FAIR balance, PRIORITY latency, the lane admission rule, and the memory-aware policy
// against the lane rule on random jobs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "iteration_sched/simulation.hpp"
#include "salus/error.hpp"

namespace salus::sched {
namespace {

constexpr std::size_t kMiB = 1 << 20;
constexpr double kEps = 1e-9;

SimJob training(std::string name, std::uint64_t iterations, double seconds,
                std::size_t persistent = kMiB, std::size_t peak = 4 * kMiB) {
  SimJob job;
  job.name = std::move(name);
  job.iterations = iterations;
  job.iteration_seconds = seconds;
  job.persistent_bytes = persistent;
  job.curve = training_curve(seconds, peak);
  return job;
}

// Attained GPU seconds of `job` by time `t`, from the iteration log.
double attained_by(const SimResult& result, std::uint32_t job, double t) {
  double sum = 0.0;
  for (const SimIteration& it : result.iterations) {
    if (it.job == job && it.end <= t + kEps) sum += it.end - it.start;
  }
  return sum;
}

std::uint64_t done_by(const SimResult& result, std::uint32_t job, double t) {
  std::uint64_t count = 0;
  for (const SimIteration& it : result.iterations) count += it.job == job && it.end <= t + kEps;
  return count;
}

TEST(SchedSimFifo, RunsJobsExclusivelyInArrivalOrder) {
  std::vector<SimJob> jobs = {training("a", 5, 0.2), training("b", 3, 0.1), training("c", 4, 0.3),
                              training("d", 2, 0.05)};
  jobs[1].arrival_seconds = 0.1;  // arrives while a runs
  jobs[2].arrival_seconds = 0.15;
  jobs[3].arrival_seconds = 0.12;                     // arrives before c: runs before c
  for (SimJob& job : jobs) job.think_seconds = 0.02;  // the device idles, but stays the owner's
  const SimResult result = Simulation("fifo", 64 * kMiB).run(jobs);

  const std::vector<std::uint32_t> expected_order = {0, 1, 3, 2};
  std::vector<std::uint32_t> order;
  for (const SimIteration& it : result.iterations) {
    if (order.empty() || order.back() != it.job) {
      order.push_back(it.job);
    }
  }
  EXPECT_EQ(order, expected_order);  // each job's iterations are contiguous
  for (std::size_t k = 1; k < expected_order.size(); ++k) {
    const double previous_left = result.jobs[expected_order[k - 1]].finish_seconds;
    for (const SimIteration& it : result.iterations) {
      if (it.job == expected_order[k]) {
        EXPECT_GE(it.start, previous_left - kEps);
      }
    }
  }
  // Think time after every iteration but each job's last.
  EXPECT_NEAR(result.makespan_seconds, 5 * 0.22 + 3 * 0.12 + 4 * 0.32 + 2 * 0.07 - 4 * 0.02, 1e-6);
}

TEST(SchedSimSrtf, PicksTheLeastRemainingTimeAtEveryBoundary) {
  std::vector<SimJob> jobs = {training("long", 30, 0.1), training("short", 5, 0.1),
                              training("mid", 12, 0.1), training("late_short", 3, 0.1),
                              training("slow_iters", 6, 0.4)};
  jobs[3].arrival_seconds = 0.75;
  jobs[4].arrival_seconds = 0.3;
  const SimResult result = Simulation("srtf", 64 * kMiB, {.record_waiting = true}).run(jobs);
  ASSERT_EQ(result.iterations.size(), 30u + 5 + 12 + 3 + 6);
  const auto remaining = [&](std::uint32_t job, double t) {
    return static_cast<double>(jobs[job].iterations - done_by(result, job, t)) *
           jobs[job].iteration_seconds;
  };
  int contested = 0;
  for (const SimIteration& it : result.iterations) {
    const double mine = remaining(it.job, it.start);
    for (const std::uint32_t other : it.others_waiting) {
      const double theirs = remaining(other, it.start);
      EXPECT_TRUE(mine < theirs - kEps || (std::abs(mine - theirs) < kEps && it.job < other))
          << jobs[it.job].name << " (" << mine << " s left) started at " << it.start << " over "
          << jobs[other].name << " (" << theirs << " s left)";
      ++contested;
    }
  }
  EXPECT_GT(contested, 50);  // there were real choices to make
  // The short jobs finish first.
  EXPECT_LT(result.jobs[1].finish_seconds, result.jobs[2].finish_seconds);
  EXPECT_LT(result.jobs[2].finish_seconds, result.jobs[0].finish_seconds);
}

// The largest relative spread of attained time among `jobs`, at every iteration end after each
// has had `warmup` seconds.
double worst_spread(const SimResult& result, const std::vector<std::uint32_t>& jobs,
                    double warmup) {
  double worst = 0.0;
  for (const SimIteration& it : result.iterations) {
    double low = 1e300, high = 0.0;
    for (const std::uint32_t job : jobs) {
      if (result.jobs[job].finish_seconds < it.end - kEps) return worst;  // one has left
      const double attained = attained_by(result, job, it.end);
      low = std::min(low, attained);
      high = std::max(high, attained);
    }
    if (low >= warmup) worst = std::max(worst, (high - low) / high);
  }
  return worst;
}

TEST(SchedSimFair, EqualJobsStayWithinTenPercentAndNoneStarves) {
  std::vector<SimJob> jobs;
  for (int i = 0; i < 4; ++i) jobs.push_back(training("equal" + std::to_string(i), 200, 0.05));
  jobs[2].think_seconds = 0.01;  // it drops behind while thinking, then catches up
  const SimResult fair = Simulation("fair", 64 * kMiB).run(jobs);
  // After 20 iterations each, one iteration is 5% of anyone's attained time.
  EXPECT_LE(worst_spread(fair, {0, 1, 2, 3}, 1.0), 0.10);
  // Nobody waits more than one turn of the others (3 iterations).
  for (const SimJobResult& job : fair.jobs) {
    EXPECT_EQ(job.iterations, 200u);
    EXPECT_LE(job.max_wait_seconds, 3 * 0.05 + kEps) << job.name;
  }
  // The same check fails under FIFO, so it can tell balance from its absence.
  const SimResult fifo = Simulation("fifo", 64 * kMiB).run(jobs);
  EXPECT_GT(worst_spread(fifo, {0, 1, 2}, 0.0), 0.5);
}

TEST(SchedSimPriority, InferenceWaitsAtMostOneTrainingIteration) {
  std::vector<SimJob> jobs = {training("t1", 60, 0.12), training("t2", 60, 0.3),
                              training("t3", 60, 0.07)};
  SimJob inference = training("serve", 150, 0.01, kMiB, kMiB);
  inference.kind = JobKind::inference;
  inference.priority = -1;  // kind outranks priority
  inference.think_seconds = 0.043;
  inference.arrival_seconds = 0.37;
  jobs.push_back(inference);
  jobs[2].priority = 5;
  const SimResult result = Simulation("priority", 64 * kMiB).run(jobs);
  const SimJobResult& served = result.jobs[3];
  EXPECT_EQ(served.iterations, 150u);
  EXPECT_GT(served.max_wait_seconds, 0.0);  // it did have to wait for boundaries
  EXPECT_LE(served.max_wait_seconds, 0.3 + kEps);
  // Under FAIR the same job would also be picked first here, but under FIFO it waits for all.
  const SimResult fifo = Simulation("fifo", 64 * kMiB).run(jobs);
  EXPECT_GT(fifo.jobs[3].max_wait_seconds, 1.0);
}

TEST(SchedSimLanes, AdmissionRuleHoldsAndWaitingJobIsAdmittedWhenMemoryFrees) {
  // Budget 40 MiB. Lane rule: a = 6 + 12, b = 6 + 12 each in their own lane (36); c = 10 + 8
  // fits neither a new lane (54) nor any existing one (36 + 10 = 46): it waits for a or b.
  std::vector<SimJob> jobs = {training("a", 10, 0.1, 6 * kMiB, 12 * kMiB),
                              training("b", 20, 0.1, 6 * kMiB, 12 * kMiB),
                              training("c", 10, 0.1, 10 * kMiB, 8 * kMiB)};
  const SimResult result = Simulation("pack", 40 * kMiB).run(jobs);
  EXPECT_LE(result.peak_committed_bytes, 40 * kMiB);
  EXPECT_LE(result.peak_combined_bytes, 40 * kMiB);
  double c_first = 1e300;
  for (const SimIteration& it : result.iterations) {
    if (it.job == 2) c_first = std::min(c_first, it.start);
  }
  EXPECT_NEAR(c_first, result.jobs[0].finish_seconds, 1e-9);  // admitted as soon as a left
  // a and b overlapped: two lanes ran concurrently.
  EXPECT_NEAR(result.jobs[0].finish_seconds, 1.0, 1e-6);
  EXPECT_NEAR(result.jobs[1].finish_seconds, 2.0, 1e-6);

  // A job that cannot fit even alone is a clear error rather than a hang.
  jobs.push_back(training("huge", 1, 0.1, 30 * kMiB, 20 * kMiB));
  EXPECT_THROW((void)Simulation("pack", 40 * kMiB).run(jobs), InvalidArgument);
  EXPECT_THROW(Simulation("round_robin", 40 * kMiB), InvalidArgument);
}

TEST(SchedSimMemoryAware, NeverExceedsTheBudgetNorLosesToTheLaneRule) {
  constexpr std::uint64_t kSeeds = 50;
  int strictly_faster = 0;
  double ratio_sum = 0.0;
  double worst = 1e300;
  for (std::uint64_t seed = 1; seed <= kSeeds; ++seed) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int> count(3, 6);
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    std::vector<SimJob> jobs;
    std::size_t persistent = 0, peaks = 0, largest = 0;
    for (int i = count(rng); i > 0; --i) {
      const double seconds = 0.05 + 0.3 * unit(rng);
      const std::size_t peak = kMiB * static_cast<std::size_t>(4 + 28 * unit(rng));
      SimJob job =
          training("j" + std::to_string(jobs.size()), 10 + static_cast<int>(30 * unit(rng)),
                   seconds, kMiB * static_cast<std::size_t>(1 + 4 * unit(rng)), peak);
      job.curve = training_curve(seconds, peak, 4 + static_cast<std::size_t>(28 * unit(rng)),
                                 0.3 + 0.5 * unit(rng));
      job.arrival_seconds = unit(rng) < 0.3 ? unit(rng) : 0.0;
      persistent += job.persistent_bytes;
      peaks += job.curve.peak();
      largest = std::max(largest, job.curve.peak());
      jobs.push_back(std::move(job));
    }
    // Everything admissible at once, but the summed peaks do not fit.
    const std::size_t budget =
        persistent + largest + static_cast<std::size_t>(unit(rng) * 0.8 * (peaks - largest));
    ASSERT_GT(persistent + peaks, budget);
    const SimResult aware = Simulation("memory_aware", budget).run(jobs);
    const SimResult pack = Simulation("pack", budget).run(jobs);
    EXPECT_LE(aware.peak_combined_bytes, budget) << "seed " << seed;
    EXPECT_LE(pack.peak_combined_bytes, budget) << "seed " << seed;
    const double ratio = aware.throughput / pack.throughput;
    // The memory-aware plan is the lane rule plus extras (decision.cpp): its lanes and turns are
    // the lane rule's, and extras only take work off them. The one way back is a newcomer whose
    // admission waits for running extras to leave it room: 5 of seeds 1..5000 lose up to 0.6%
    // that way (seeds 1..1000 and these 50 none).
    EXPECT_GE(ratio, 1.0 - 1e-9) << "seed " << seed;
    ratio_sum += ratio;
    worst = std::min(worst, ratio);
    strictly_faster += ratio > 1.01;
  }
  const double mean = ratio_sum / static_cast<double>(kSeeds);
  RecordProperty("worst_ratio", std::to_string(worst));
  RecordProperty("mean_ratio", std::to_string(mean));
  std::printf("memory_aware / pack throughput over %d seeds: worst %.3f, mean %.3f, %d faster\n",
              static_cast<int>(kSeeds), worst, mean, strictly_faster);
  EXPECT_GT(strictly_faster, 25);
  EXPECT_GE(mean, 1.2);  // 1.30 here, 1.31 over 200 seeds, 1.28 over 5000
}

TEST(SchedSimStats, AccountingAddsUp) {
  std::vector<SimJob> jobs = {training("x", 7, 0.2), training("y", 3, 0.5)};
  jobs[0].think_seconds = 0.1;
  const SimResult result = Simulation("fair", 64 * kMiB).run(jobs);
  EXPECT_NEAR(result.jobs[0].attained_seconds, 1.4, 1e-9);
  EXPECT_NEAR(result.jobs[1].attained_seconds, 1.5, 1e-9);
  EXPECT_EQ(result.iterations.size(), 10u);
  EXPECT_NEAR(result.throughput, 10.0 / result.makespan_seconds, 1e-9);
  double waited = 0.0;
  for (const SimIteration& it : result.iterations) {
    if (it.job == 1) waited += it.start - it.asked;
  }
  EXPECT_NEAR(result.jobs[1].waiting_seconds, waited, 1e-9);
  EXPECT_GT(result.jobs[1].waiting_seconds, 0.0);
  // Single lane: persistent of both + one ephemeral curve at a time.
  EXPECT_LE(result.peak_combined_bytes, 2 * kMiB + 4 * kMiB);
  EXPECT_GE(result.peak_combined_bytes, 2 * kMiB + 4 * kMiB - kMiB / 4);
}

TEST(SchedSimWorkloads, TrainingCurveShapeAndCsvRows) {
  const MemoryCurve curve = training_curve(2.0, 100, 10, 0.6);
  EXPECT_EQ(curve.peak(), 100u);
  EXPECT_EQ(std::max_element(curve.bytes.begin(), curve.bytes.end()) - curve.bytes.begin(), 5);
  EXPECT_TRUE(std::is_sorted(curve.bytes.begin(), curve.bytes.begin() + 6));
  EXPECT_TRUE(std::is_sorted(curve.bytes.rbegin(), curve.bytes.rbegin() + 5));
  const SimJob job = workload_job("w", 60.0, 1000.0, 600);
  EXPECT_DOUBLE_EQ(job.iteration_seconds, 0.1);
  EXPECT_NEAR(static_cast<double>(job.persistent_bytes), 0.3 * 1000 * kMiB, 1.0);
  EXPECT_NEAR(static_cast<double>(job.curve.peak()), 0.7 * 1000 * kMiB, 1.0);
  EXPECT_THROW((void)jobs_from_workloads_csv("/nonexistent/salus.csv"), InvalidArgument);

  const char* env = std::getenv("SALUS_SHARED_DATA");
  const std::filesystem::path dir =
      env != nullptr
          ? std::filesystem::path(env)
          : std::filesystem::path(__FILE__).parent_path().parent_path() / ".." / "shared" / "data";
  const std::filesystem::path csv = dir / "salus_workloads.csv";
  if (!std::filesystem::exists(csv)) GTEST_SKIP() << csv << " is not present";
  const std::vector<SimJob> all = jobs_from_workloads_csv(csv.string(), 20);
  ASSERT_FALSE(all.empty());
  for (const SimJob& w : all) {
    EXPECT_LE(w.iterations, 20u);
    EXPECT_GT(w.iteration_seconds, 0.0);
    EXPECT_GT(w.curve.peak(), w.persistent_bytes);
  }
  // Four of them share a 16 GiB device under the memory-aware policy.
  const std::vector<SimJob> four(all.begin(), all.begin() + std::min<std::size_t>(4, all.size()));
  const SimResult result = Simulation("memory_aware", 16ull << 30).run(four);
  EXPECT_LE(result.peak_combined_bytes, 16ull << 30);
  EXPECT_GT(result.throughput, 0.0);
}

}  // namespace
}  // namespace salus::sched
