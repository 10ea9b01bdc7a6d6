// The policies' promises, checked on a virtual clock: FIFO exclusivity, SRTF order at every
// boundary, FAIR balance, PRIORITY latency, the lane admission rule, and the memory-aware policy
// against the lane rule on random jobs; then hand-computed cases, and iterations sharing a device
// under the contention models (processor sharing by default). The FIFO, SRTF, FAIR and PRIORITY
// tests run one lane, so one iteration at a time: no contention model changes their numbers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "salus/error.hpp"
#include "salus/simulation.hpp"

namespace salus::sched {
namespace {

constexpr std::size_t kMiB = 1 << 20;
constexpr double kEps = 1e-9;

// The model of the tests written before contention was modelled: concurrent iterations run at
// full speed. Tests whose expected values are computed by hand for that model (or that compare
// plans by throughput, which only overlap with spare compute can raise) ask for it explicitly.
std::shared_ptr<const ContentionModel> no_contention() {
  return make_contention_model("none");
}

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
  // No contention: a and b run side by side at full speed (the finish times below).
  const SimResult result = Simulation("pack", 40 * kMiB, {}, no_contention()).run(jobs);
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
  EXPECT_THROW((void)Simulation("pack", 40 * kMiB, {}, no_contention()).run(jobs), InvalidArgument);
  EXPECT_THROW(Simulation("round_robin", 40 * kMiB), InvalidArgument);
}

// A random trial for comparing plans: 3-6 training jobs with random lengths, curves and sizes,
// all admissible at once, whose summed ephemeral peaks do not fit the budget. Every job keeps
// `occupancy` of the device busy.
struct Trial {
  std::vector<SimJob> jobs;
  std::size_t budget = 0;
};

Trial random_trial(std::uint64_t seed, double occupancy = 1.0) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> count(3, 6);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  Trial trial;
  std::size_t persistent = 0, peaks = 0, largest = 0;
  for (int i = count(rng); i > 0; --i) {
    const double seconds = 0.05 + 0.3 * unit(rng);
    const std::size_t peak = kMiB * static_cast<std::size_t>(4 + 28 * unit(rng));
    SimJob job =
        training("j" + std::to_string(trial.jobs.size()), 10 + static_cast<int>(30 * unit(rng)),
                 seconds, kMiB * static_cast<std::size_t>(1 + 4 * unit(rng)), peak);
    job.curve = training_curve(seconds, peak, 4 + static_cast<std::size_t>(28 * unit(rng)),
                               0.3 + 0.5 * unit(rng));
    job.arrival_seconds = unit(rng) < 0.3 ? unit(rng) : 0.0;
    job.occupancy = occupancy;
    persistent += job.persistent_bytes;
    peaks += job.curve.peak();
    largest = std::max(largest, job.curve.peak());
    trial.jobs.push_back(std::move(job));
  }
  trial.budget =
      persistent + largest + static_cast<std::size_t>(unit(rng) * 0.8 * (peaks - largest));
  return trial;
}

TEST(SchedSimMemoryAware, NeverExceedsTheBudgetNorLosesToTheLaneRule) {
  constexpr std::uint64_t kSeeds = 50;
  int strictly_faster = 0;
  double ratio_sum = 0.0;
  double worst = 1e300;
  for (std::uint64_t seed = 1; seed <= kSeeds; ++seed) {
    const auto [jobs, budget] = random_trial(seed);
    std::size_t all_at_once = 0;
    for (const SimJob& job : jobs) all_at_once += job.persistent_bytes + job.curve.peak();
    ASSERT_GT(all_at_once, budget);
    // No contention: this compares how well the plans overlap iterations in memory; with every
    // occupancy at 1 processor sharing would make any overlap worthless for throughput.
    const SimResult aware = Simulation("memory_aware", budget, {}, no_contention()).run(jobs);
    const SimResult pack = Simulation("pack", budget, {}, no_contention()).run(jobs);
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

// The same trials under processor sharing, at three occupancies: what remains of the claim when
// concurrent iterations share the device's compute.
TEST(SchedSimMemoryAware, UnderProcessorSharing) {
  constexpr std::uint64_t kSeeds = 50;
  for (const double occupancy : {0.25, 0.5, 1.0}) {
    double ratio_sum = 0.0, worst = 1e300, best = 0.0;
    int over_budget = 0, pack_over_budget = 0;
    for (std::uint64_t seed = 1; seed <= kSeeds; ++seed) {
      const auto [jobs, budget] = random_trial(seed, occupancy);
      const SimResult aware = Simulation("memory_aware", budget).run(jobs);
      const SimResult pack = Simulation("pack", budget).run(jobs);
      const double ratio = aware.throughput / pack.throughput;
      ratio_sum += ratio;
      worst = std::min(worst, ratio);
      best = std::max(best, ratio);
      over_budget += aware.devices[0].over_budget_seconds > 0.0;
      pack_over_budget += pack.devices[0].over_budget_seconds > 0.0;
    }
    // What holds (measured, see benchmarks/RESULTS.md): the plan never exceeds the budget; at
    // full occupancy every plan that keeps the device busy delivers the same throughput.
    EXPECT_EQ(over_budget, 0) << "occupancy " << occupancy;
    EXPECT_EQ(pack_over_budget, 0) << "occupancy " << occupancy;
    if (occupancy == 1.0) {
      EXPECT_NEAR(worst, 1.0, 1e-6);
      EXPECT_NEAR(best, 1.0, 1e-6);
    } else {
      EXPECT_GT(ratio_sum / kSeeds, 1.1) << "occupancy " << occupancy;
    }
    std::printf(
        "processor sharing, occupancy %.2f: memory_aware / pack throughput over %d seeds: worst "
        "%.3f, mean %.3f, best %.3f; memory_aware over budget in %d, pack in %d\n",
        occupancy, static_cast<int>(kSeeds), worst, ratio_sum / kSeeds, best, over_budget,
        pack_over_budget);
  }
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
  // No contention: the plan predicts memory from wall time, which is the iterations' progress
  // only when nothing slows them (see SchedSimContention for what happens otherwise).
  const SimResult result = Simulation("memory_aware", 16ull << 30, {}, no_contention()).run(four);
  EXPECT_LE(result.peak_combined_bytes, 16ull << 30);
  EXPECT_GT(result.throughput, 0.0);
}

// Two jobs on one device, JCTs by hand. a: 3 iterations of 1 s from t = 0; b: 2 of 0.5 s from
// t = 0.5. One lane, so one iteration runs at a time and the contention model plays no part.
//  FIFO: a holds the device to the end: a runs 0..3, b 3..4. JCT a = 3, b = 4 - 0.5 = 3.5.
//  SRTF: at t = 1 a has 2 s left, b 1 s: b runs 1..1.5 and 1.5..2 (then 0.5 s < 2 s), a 2..4.
//        JCT a = 4, b = 2 - 0.5 = 1.5; a waited 1 s (asked at 1, ran at 2), b 0.5 s.
TEST(SchedSimHandComputed, TwoJobsUnderFifoAndSrtf) {
  std::vector<SimJob> jobs = {training("a", 3, 1.0), training("b", 2, 0.5)};
  jobs[1].arrival_seconds = 0.5;
  const SimResult fifo = Simulation("fifo", 64 * kMiB).run(jobs);
  EXPECT_DOUBLE_EQ(fifo.jobs[0].finish_seconds - fifo.jobs[0].arrival_seconds, 3.0);
  EXPECT_DOUBLE_EQ(fifo.jobs[1].finish_seconds - fifo.jobs[1].arrival_seconds, 3.5);
  EXPECT_DOUBLE_EQ(fifo.jobs[1].first_start_seconds, 3.0);
  EXPECT_DOUBLE_EQ(fifo.jobs[1].waiting_seconds, 2.5);
  EXPECT_DOUBLE_EQ(fifo.makespan_seconds, 4.0);

  const SimResult srtf = Simulation("srtf", 64 * kMiB).run(jobs);
  EXPECT_DOUBLE_EQ(srtf.jobs[0].finish_seconds - srtf.jobs[0].arrival_seconds, 4.0);
  EXPECT_DOUBLE_EQ(srtf.jobs[1].finish_seconds - srtf.jobs[1].arrival_seconds, 1.5);
  EXPECT_DOUBLE_EQ(srtf.jobs[0].waiting_seconds, 1.0);
  EXPECT_DOUBLE_EQ(srtf.jobs[0].max_wait_seconds, 1.0);
  EXPECT_DOUBLE_EQ(srtf.jobs[1].waiting_seconds, 0.5);
  EXPECT_DOUBLE_EQ(srtf.jobs[1].first_start_seconds, 1.0);
  for (const SimJobResult& job : srtf.jobs) {
    EXPECT_DOUBLE_EQ(job.attained_seconds, job.work_seconds) << job.name;  // never slowed
  }
  EXPECT_DOUBLE_EQ(srtf.devices.at(0).busy_seconds, 4.0);
}

// One iteration each of `work` seconds alone, with the given occupancies and arrivals, each job
// in a lane of its own ("pack" with room for both).
SimResult two_iterations(double work, double occupancy_a, double occupancy_b, double b_arrival,
                         const char* contention = "processor_sharing") {
  std::vector<SimJob> jobs = {training("a", 1, work), training("b", 1, work)};
  jobs[0].occupancy = occupancy_a;
  jobs[1].occupancy = occupancy_b;
  jobs[1].arrival_seconds = b_arrival;
  return Simulation("pack", 64 * kMiB, {}, make_contention_model(contention)).run(jobs);
}

TEST(SchedSimContention, TwoConcurrentIterationsUnderProcessorSharing) {
  constexpr double w = 2.0;
  // 1 + 1 = 2 > 1: each progresses at 1/2, both end at 2w.
  SimResult r = two_iterations(w, 1.0, 1.0, 0.0);
  EXPECT_NEAR(r.jobs[0].finish_seconds, 2 * w, kEps);
  EXPECT_NEAR(r.jobs[1].finish_seconds, 2 * w, kEps);
  EXPECT_NEAR(r.jobs[0].attained_seconds, 2 * w, kEps);
  EXPECT_DOUBLE_EQ(r.jobs[0].work_seconds, w);
  // 0.6 + 0.6 = 1.2: each at 1/1.2, both end at 1.2w.
  r = two_iterations(w, 0.6, 0.6, 0.0);
  EXPECT_NEAR(r.jobs[0].finish_seconds, 1.2 * w, kEps);
  EXPECT_NEAR(r.jobs[1].finish_seconds, 1.2 * w, kEps);
  EXPECT_NEAR(r.devices[0].utilization_seconds, 1.2 * w, kEps);  // saturated throughout
  // 0.4 + 0.4 fits: full speed, both end at w.
  r = two_iterations(w, 0.4, 0.4, 0.0);
  EXPECT_DOUBLE_EQ(r.jobs[0].finish_seconds, w);
  EXPECT_DOUBLE_EQ(r.jobs[1].finish_seconds, w);
  EXPECT_NEAR(r.devices[0].utilization_seconds, 0.8 * w, kEps);
  // 1 + 1, b from w/2: a alone does w/2 of work; then both at 1/2, a's last w/2 takes w, so a
  // ends at 1.5w with b at w/2 done; b alone does its last w/2 by 2w.
  r = two_iterations(w, 1.0, 1.0, w / 2);
  EXPECT_NEAR(r.jobs[0].finish_seconds, 1.5 * w, kEps);
  EXPECT_NEAR(r.jobs[1].finish_seconds, 2.0 * w, kEps);
  EXPECT_NEAR(r.jobs[1].attained_seconds, 1.5 * w, kEps);
  EXPECT_NEAR(r.devices[0].busy_seconds, 2.0 * w, kEps);
  // 0.6 + 0.6, b from w/2: a has w/2 left at 1/1.2: 0.6w, ends at 1.1w; b did 0.5w by then and
  // ends alone at 1.6w.
  r = two_iterations(w, 0.6, 0.6, w / 2);
  EXPECT_NEAR(r.jobs[0].finish_seconds, 1.1 * w, kEps);
  EXPECT_NEAR(r.jobs[1].finish_seconds, 1.6 * w, kEps);
  EXPECT_NEAR(r.devices[0].utilization_seconds, 1.2 * w, kEps);  // work x occupancy, summed
  // The other models: time slicing halves both whatever the occupancy; none leaves them alone.
  r = two_iterations(w, 0.4, 0.4, 0.0, "time_slicing");
  EXPECT_NEAR(r.jobs[0].finish_seconds, 2 * w, kEps);
  r = two_iterations(w, 1.0, 1.0, 0.0, "none");
  EXPECT_DOUBLE_EQ(r.jobs[1].finish_seconds, w);
}

// An iteration's memory follows its progress: slowed to half speed, its curve takes twice as
// long. a: 2 samples (10 MiB, then 20 MiB) over 1 s of work, 1 MiB persistent; b: no ephemeral
// memory, 1 MiB persistent; both occupancy 1 from t = 0, so each runs at 1/2 and a reaches its
// second sample at t = 1 (t = 0.5 without contention).
TEST(SchedSimContention, MemoryFollowsProgressNotWallTime) {
  std::vector<SimJob> jobs = {training("a", 1, 1.0), training("b", 1, 1.0)};
  jobs[0].curve = MemoryCurve{1.0, {10 * kMiB, 20 * kMiB}};
  jobs[1].curve = MemoryCurve{};
  const SimOptions options{.timeline_step_seconds = 0.25};
  const SimResult slowed = Simulation("pack", 64 * kMiB, options).run(jobs);
  ASSERT_EQ(slowed.timelines.size(), 1u);
  const SimTimeline& t = slowed.timelines[0];
  ASSERT_EQ(t.time.size(), 9u);             // 0, 0.25, ..., 2.0 (the makespan)
  EXPECT_EQ(t.memory_bytes[3], 12 * kMiB);  // t = 0.75: a is a quarter through its work
  EXPECT_EQ(t.memory_bytes[5], 22 * kMiB);  // t = 1.25: past the middle
  EXPECT_EQ(t.memory_bytes[8], 0u);         // both left
  EXPECT_EQ(t.running[3], 2u);
  EXPECT_DOUBLE_EQ(t.utilization[3], 1.0);
  EXPECT_EQ(t.running[8], 0u);
  EXPECT_EQ(slowed.peak_combined_bytes, 22 * kMiB);

  const SimResult alone = Simulation("pack", 64 * kMiB, options, no_contention()).run(jobs);
  ASSERT_EQ(alone.timelines.at(0).time.size(), 5u);          // makespan 1
  EXPECT_EQ(alone.timelines[0].memory_bytes[2], 22 * kMiB);  // t = 0.5: already the second sample
  EXPECT_EQ(alone.timelines[0].utilization[2], 1.0);  // "none" caps the reported utilization at 1
}

// Conservation: whatever the arrivals, a device delivers its jobs' occupancy-weighted work; with
// every occupancy 1 it is busy at least as long as that work, exactly as long under processor
// sharing (the saturated device always delivers one work-second per second).
TEST(SchedSimContention, WorkIsConservedOnASharedDevice) {
  for (const char* model : {"processor_sharing", "time_slicing"}) {
    for (const bool full : {false, true}) {
      std::mt19937_64 rng(full ? 7 : 11);
      std::uniform_real_distribution<double> unit(0.0, 1.0);
      std::vector<SimJob> jobs;
      for (int i = 0; i < 8; ++i) {
        SimJob job = training("j" + std::to_string(i), 5 + static_cast<int>(10 * unit(rng)),
                              0.05 + 0.2 * unit(rng), kMiB, 2 * kMiB);
        job.arrival_seconds = unit(rng);
        job.think_seconds = unit(rng) < 0.5 ? 0.0 : 0.1 * unit(rng);
        job.occupancy = full ? 1.0 : 0.1 + 0.9 * unit(rng);
        jobs.push_back(std::move(job));
      }
      const SimResult r = Simulation("pack", 64 * kMiB, {}, make_contention_model(model)).run(jobs);
      double weighted = 0.0, work = 0.0;
      for (std::size_t i = 0; i < jobs.size(); ++i) {
        weighted += r.jobs[i].work_seconds * jobs[i].occupancy;
        work += r.jobs[i].work_seconds;
        EXPECT_GE(r.jobs[i].attained_seconds, r.jobs[i].work_seconds - 1e-9);
      }
      const SimDeviceResult& d = r.devices.at(0);
      EXPECT_NEAR(d.utilization_seconds, weighted, 1e-9 * weighted) << model;
      EXPECT_NEAR(d.work_seconds, work, 1e-9 * work) << model;
      if (full) {
        EXPECT_GE(d.busy_seconds, work - 1e-9) << model;
      }
      if (full && std::string(model) == "processor_sharing") {
        EXPECT_NEAR(d.busy_seconds, work, 1e-9 * work);
      }
    }
  }
}

// The memory-aware plan predicts each running curve from the iteration's progress, which the
// simulator tells the core (DecisionCore::progressed). Under processor sharing and time slicing
// every running iteration slows alike, so the plan's offsets hold and the budget is never
// exceeded. (Predicting from wall time instead, as the core does when nobody tells it, went over
// the budget in 22 of these 30 seeds under processor sharing: slowed iterations hold their memory
// longer than their wall time says.)
TEST(SchedSimContention, MemoryAwarePlanFollowsProgressAndKeepsTheBudget) {
  for (const char* model : {"processor_sharing", "time_slicing"}) {
    for (std::uint64_t seed = 1; seed <= 30; ++seed) {
      std::mt19937_64 rng(seed);
      std::uniform_real_distribution<double> unit(0.0, 1.0);
      std::vector<SimJob> jobs;
      for (int i = 0; i < 5; ++i) {
        const double seconds = 0.05 + 0.3 * unit(rng);
        SimJob job = training("j" + std::to_string(i), 10 + static_cast<int>(20 * unit(rng)),
                              seconds, kMiB, kMiB * static_cast<std::size_t>(4 + 28 * unit(rng)));
        job.occupancy = 0.3 + 0.7 * unit(rng);
        jobs.push_back(std::move(job));
      }
      const std::size_t budget = 5 * kMiB + 40 * kMiB;
      const SimResult shared =
          Simulation("memory_aware", budget, {}, make_contention_model(model)).run(jobs);
      const SimDeviceResult& d = shared.devices[0];
      EXPECT_EQ(d.over_budget_seconds, 0.0) << model << " seed " << seed;
      EXPECT_LE(d.peak_combined_bytes, budget) << model << " seed " << seed;
      EXPECT_LE(d.peak_committed_bytes, budget);
      // It did overlap iterations (else the check above would be empty).
      EXPECT_GT(d.busy_seconds, 0.0);
    }
  }
}

}  // namespace
}  // namespace salus::sched
