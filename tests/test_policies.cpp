// Policies as pure functions: the registry, the keys, and the memory-aware start offset (checked
// against hand-computed offsets and a brute-force oracle on random curves).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "iteration_sched/memory_offset.hpp"
#include "salus/error.hpp"
#include "salus/scheduler.hpp"

namespace salus {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

MemoryCurve curve(double seconds, std::vector<std::size_t> bytes) {
  return MemoryCurve{seconds, std::move(bytes)};
}

JobView job_with(const MemoryCurve* c, std::uint32_t id = 1) {
  JobView job;
  job.id = JobId{id};
  job.curve = c;
  if (c != nullptr) job.iteration_seconds = c->duration_seconds;
  return job;
}

TEST(PolicyRegistry, BuiltinsAreAllThereAndNamedAsRegistered) {
  const PolicyRegistry registry = PolicyRegistry::with_builtins();
  const std::vector<std::string> expected = {"fifo", "srtf",     "fair",
                                             "pack", "priority", "memory_aware"};
  EXPECT_EQ(registry.names(), expected);
  for (const std::string& name : expected) EXPECT_EQ(registry.make(name)->name(), name);
  EXPECT_TRUE(registry.make("fifo")->runs_to_completion());
  EXPECT_FALSE(registry.make("fair")->runs_to_completion());
  EXPECT_EQ(registry.make("pack")->lanes(), LanePlan::packed);
  EXPECT_EQ(registry.make("memory_aware")->lanes(), LanePlan::memory_aware);
  EXPECT_EQ(registry.make("srtf")->lanes(), LanePlan::single);
}

TEST(PolicyRegistry, UnknownNameErrorListsKnownNames) {
  const PolicyRegistry registry = PolicyRegistry::with_builtins();
  try {
    (void)registry.make("lottery");
    FAIL() << "make() accepted an unknown name";
  } catch (const InvalidArgument& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("lottery"), std::string::npos) << message;
    for (const std::string& name : registry.names()) {
      EXPECT_NE(message.find(name), std::string::npos) << message;
    }
  }
  EXPECT_THROW((void)PolicyRegistry().make("fifo"), InvalidArgument);
}

TEST(PolicyRegistry, RefusesDuplicatesEmptyNamesAndEmptyFactories) {
  PolicyRegistry registry = PolicyRegistry::with_builtins();
  const auto fifo = [] { return PolicyRegistry::with_builtins().make("fifo"); };
  EXPECT_THROW(registry.add("fair", fifo), InvalidArgument);
  EXPECT_THROW(registry.add("", fifo), InvalidArgument);
  EXPECT_THROW(registry.add("mine", PolicyFactory{}), InvalidArgument);
  registry.add("mine", fifo);
  EXPECT_EQ(registry.names().back(), "mine");
  EXPECT_EQ(registry.make("mine")->name(), "fifo");
}

TEST(PolicyTypes, MemoryCurveSamplesCoverHalfOpenSlices) {
  const MemoryCurve c = curve(2.0, {10, 30, 20, 5});
  EXPECT_EQ(c.at(0.0), 10u);
  EXPECT_EQ(c.at(0.49), 10u);
  EXPECT_EQ(c.at(0.5), 30u);
  EXPECT_EQ(c.at(1.99), 5u);
  EXPECT_EQ(c.at(2.0), 0u);
  EXPECT_EQ(c.at(-0.1), 0u);
  EXPECT_EQ(c.peak(), 30u);
  EXPECT_EQ(MemoryCurve{}.at(0.0), 0u);
  EXPECT_EQ(MemoryCurve{}.peak(), 0u);
  EXPECT_FALSE(curve(0.0, {1}).known());
}

TEST(PolicyTypes, RemainingSecondsAndKindNames) {
  JobView job;
  EXPECT_EQ(job.remaining_seconds(), kInf);
  job.expected_iterations = 10;
  EXPECT_EQ(job.remaining_seconds(), kInf);  // length of an iteration unknown
  job.iteration_seconds = 0.5;
  job.iterations_done = 4;
  EXPECT_DOUBLE_EQ(job.remaining_seconds(), 3.0);
  job.iterations_done = 12;
  EXPECT_DOUBLE_EQ(job.remaining_seconds(), 0.0);
  EXPECT_STREQ(to_string(JobKind::training), "training");
  EXPECT_STREQ(to_string(JobKind::inference), "inference");
}

TEST(PolicyKeys, EachPolicyOrdersByWhatItPromises) {
  const PolicyRegistry registry = PolicyRegistry::with_builtins();
  JobView early, late;
  early.arrival = 1;
  late.arrival = 2;
  early.attained_seconds = 5.0;
  late.attained_seconds = 1.0;
  early.expected_iterations = late.expected_iterations = 10;
  early.iteration_seconds = 1.0;
  late.iteration_seconds = 0.1;
  EXPECT_LT(registry.make("fifo")->key(early), registry.make("fifo")->key(late));
  // The jobs of a lane take turns: equal keys, so the core's least-recently-served tie-break
  // decides.
  EXPECT_EQ(registry.make("pack")->key(early), registry.make("pack")->key(late));
  EXPECT_LT(registry.make("fair")->key(late), registry.make("fair")->key(early));
  EXPECT_EQ(registry.make("memory_aware")->key(early), registry.make("memory_aware")->key(late));
  EXPECT_LT(registry.make("srtf")->key(late), registry.make("srtf")->key(early));
  JobView unknown;  // unknown length: after every known one
  EXPECT_LT(registry.make("srtf")->key(early), registry.make("srtf")->key(unknown));

  const auto priority = registry.make("priority");
  JobView inference, urgent_training, training;
  inference.kind = JobKind::inference;
  inference.priority = -5;
  urgent_training.priority = 9;
  training.priority = 1;
  EXPECT_LT(priority->key(inference), priority->key(urgent_training));
  EXPECT_LT(priority->key(urgent_training), priority->key(training));
}

TEST(PolicyStartDelay, DefaultOverlapsOnlyWhenAllPeaksFit) {
  const auto fair = PolicyRegistry::with_builtins().make("fair");
  JobView running_job, candidate;
  running_job.ephemeral_peak_bytes = 40;
  candidate.ephemeral_peak_bytes = 30;
  const RunningIteration running[] = {{&running_job, 0.3}};
  EXPECT_EQ(fair->start_delay({100, 30, running, {}}, candidate), std::optional<double>(0.0));
  EXPECT_EQ(fair->start_delay({100, 31, running, {}}, candidate), std::nullopt);
  EXPECT_EQ(fair->start_delay({60, 30, {}, {}}, candidate), std::optional<double>(0.0));
}

TEST(PolicyStartDelay, HeldBytesCountFromWhenTheyAreHeld) {
  const auto fair = PolicyRegistry::with_builtins().make("fair");
  JobView candidate;
  candidate.ephemeral_peak_bytes = 30;
  // The default counts every held byte at once.
  const HeldFrom forty[] = {{5.0, 40}};
  const HeldFrom forty_one[] = {{5.0, 41}};
  EXPECT_EQ(fair->start_delay({100, 30, {}, forty}, candidate), std::optional<double>(0.0));
  EXPECT_EQ(fair->start_delay({100, 30, {}, forty_one}, candidate), std::nullopt);

  // The offset search counts them from when they are held, for good.
  const auto aware = PolicyRegistry::with_builtins().make("memory_aware");
  const MemoryCurve falls = curve(2.0, {6, 2});
  const MemoryCurve heavy = curve(2.0, {7, 7});
  const HeldFrom five_after_one[] = {{1.0, 5}};
  EXPECT_EQ(aware->start_delay({10, 0, {}, five_after_one}, job_with(&falls, 2)),
            std::optional<double>(0.0));
  EXPECT_EQ(aware->start_delay({10, 0, {}, five_after_one}, job_with(&heavy, 2)), std::nullopt);
  EXPECT_EQ(aware->start_delay({10, 0, {}, {}}, job_with(&heavy, 2)), std::optional<double>(0.0));
}

TEST(PolicyStartDelay, MemoryAwareFindsTheHandComputedOffset) {
  const auto policy = PolicyRegistry::with_builtins().make("memory_aware");
  const MemoryCurve rising = curve(4.0, {2, 4, 6, 8});
  const JobView running_job = job_with(&rising, 1);
  const MemoryCurve fits_now = curve(2.0, {6, 2});
  const MemoryCurve late_peak = curve(2.0, {2, 7});
  const MemoryCurve heavy = curve(2.0, {7, 7});

  RunningIteration running[] = {{&running_job, 0.0}};
  EXPECT_EQ(policy->start_delay({10, 0, running, {}}, job_with(&fits_now, 2)),
            std::optional<double>(0.0));
  // Its second second needs the running job below 3 bytes: only after that job has ended.
  auto delay = policy->start_delay({10, 0, running, {}}, job_with(&late_peak, 2));
  ASSERT_TRUE(delay.has_value());
  EXPECT_NEAR(*delay, 3.0, 1e-6);
  running[0].elapsed_seconds = 1.5;
  delay = policy->start_delay({10, 0, running, {}}, job_with(&late_peak, 2));
  ASSERT_TRUE(delay.has_value());
  EXPECT_NEAR(*delay, 1.5, 1e-6);
  // Fits only once the running iteration is over: the end event will bring the caller back.
  EXPECT_EQ(policy->start_delay({10, 0, running, {}}, job_with(&heavy, 2)), std::nullopt);
  // Nothing running: fits alone or never.
  EXPECT_EQ(policy->start_delay({10, 3, {}, {}}, job_with(&heavy, 2)), std::optional<double>(0.0));
  EXPECT_EQ(policy->start_delay({10, 4, {}, {}}, job_with(&heavy, 2)), std::nullopt);
  EXPECT_EQ(policy->start_delay({10, 11, {}, {}}, job_with(&fits_now, 2)), std::nullopt);
}

TEST(PolicyStartDelay, MemoryAwareFallsBackToFlatPeaks) {
  const auto policy = PolicyRegistry::with_builtins().make("memory_aware");
  JobView flat_running;  // no curve: its peak for its estimated 2 s
  flat_running.ephemeral_peak_bytes = 6;
  flat_running.iteration_seconds = 2.0;
  JobView small, large;
  small.ephemeral_peak_bytes = 4;
  large.ephemeral_peak_bytes = 5;
  const RunningIteration running[] = {{&flat_running, 0.5}};
  EXPECT_EQ(policy->start_delay({10, 0, running, {}}, small), std::optional<double>(0.0));
  EXPECT_EQ(policy->start_delay({10, 0, running, {}}, large), std::nullopt);

  // A running iteration past its predicted end holds its peak for as long as it runs.
  const MemoryCurve short_curve = curve(1.0, {1, 6});
  const JobView overrun = job_with(&short_curve, 3);
  const RunningIteration late[] = {{&overrun, 3.0}};
  EXPECT_EQ(policy->start_delay({10, 0, late, {}}, large), std::nullopt);
  EXPECT_EQ(policy->start_delay({10, 0, late, {}}, small), std::optional<double>(0.0));

  // Unknown length and curve on the running side: only a candidate that fits beside the peak.
  JobView endless;
  endless.ephemeral_peak_bytes = 6;
  const RunningIteration forever[] = {{&endless, 100.0}};
  EXPECT_EQ(policy->start_delay({10, 0, forever, {}}, small), std::optional<double>(0.0));
  EXPECT_EQ(policy->start_delay({10, 0, forever, {}}, large), std::nullopt);
}

// Combined memory when `candidate` starts at `offset`, checked at the midpoint of every interval
// between curve-sample boundaries (where every function is unambiguous).
bool fits_at(const std::vector<MemoryCurve>& running, const std::vector<double>& elapsed,
             const MemoryCurve& candidate, double offset, std::size_t limit) {
  std::vector<double> cuts = {0.0, candidate.duration_seconds};
  const auto add_cuts = [&](const MemoryCurve& c, double shift) {
    for (std::size_t k = 0; k <= c.bytes.size(); ++k) {
      const double at =
          shift + c.duration_seconds * static_cast<double>(k) / static_cast<double>(c.bytes.size());
      if (at > 0.0 && at < candidate.duration_seconds) cuts.push_back(at);
    }
  };
  add_cuts(candidate, 0.0);
  for (std::size_t r = 0; r < running.size(); ++r) add_cuts(running[r], -(elapsed[r] + offset));
  std::sort(cuts.begin(), cuts.end());
  for (std::size_t i = 0; i + 1 < cuts.size(); ++i) {
    if (cuts[i + 1] - cuts[i] < 1e-7) continue;
    const double t = 0.5 * (cuts[i] + cuts[i + 1]);
    std::size_t total = candidate.at(t);
    for (std::size_t r = 0; r < running.size(); ++r)
      total += running[r].at(elapsed[r] + offset + t);
    if (total > limit) return false;
  }
  return true;
}

TEST(PolicyStartDelay, MemoryAwareOffsetIsFeasibleAndLeastOnRandomCurves) {
  const auto policy = PolicyRegistry::with_builtins().make("memory_aware");
  std::mt19937_64 rng(42);
  std::uniform_int_distribution<std::size_t> bytes(0, 60);
  std::uniform_int_distribution<int> samples(1, 6);
  std::uniform_real_distribution<double> seconds(0.5, 3.0);
  int started_late = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const std::size_t running_count = 1 + trial % 3;
    std::vector<MemoryCurve> curves;
    std::vector<double> elapsed;
    for (std::size_t r = 0; r < running_count; ++r) {
      MemoryCurve c{seconds(rng), {}};
      for (int k = samples(rng); k > 0; --k) c.bytes.push_back(bytes(rng));
      elapsed.push_back(std::uniform_real_distribution<double>(0.0, c.duration_seconds)(rng));
      curves.push_back(std::move(c));
    }
    MemoryCurve candidate{seconds(rng), {}};
    for (int k = samples(rng); k > 0; --k) candidate.bytes.push_back(bytes(rng));
    const std::size_t budget = 120;

    std::vector<JobView> views;
    for (const MemoryCurve& c : curves) views.push_back(job_with(&c));
    std::vector<RunningIteration> running;
    for (std::size_t r = 0; r < running_count; ++r) running.push_back({&views[r], elapsed[r]});
    const auto delay = policy->start_delay({budget, 0, running, {}}, job_with(&candidate, 9));

    // Oracle: the least feasible offset is 0 or a running piece's end minus a candidate piece's
    // start; try them all.
    std::vector<double> offsets = {0.0};
    double last_end = 0.0;
    for (std::size_t r = 0; r < running_count; ++r) {
      const MemoryCurve& c = curves[r];
      last_end = std::max(last_end, c.duration_seconds - elapsed[r]);
      for (std::size_t k = 1; k <= c.bytes.size(); ++k) {
        const double end =
            c.duration_seconds * static_cast<double>(k) / static_cast<double>(c.bytes.size()) -
            elapsed[r];
        for (std::size_t j = 0; j < candidate.bytes.size(); ++j) {
          const double start = candidate.duration_seconds * static_cast<double>(j) /
                               static_cast<double>(candidate.bytes.size());
          if (end - start > 0.0) offsets.push_back(end - start);
        }
      }
    }
    std::sort(offsets.begin(), offsets.end());
    std::optional<double> least;
    for (const double d : offsets) {
      if (fits_at(curves, elapsed, candidate, d, budget)) {
        least = d;
        break;
      }
    }
    if (least && *least >= last_end - 1e-7 && *least > 0.0) least.reset();
    ASSERT_EQ(delay.has_value(), least.has_value()) << "trial " << trial;
    if (delay) {
      EXPECT_NEAR(*delay, *least, 1e-6) << "trial " << trial;
      EXPECT_TRUE(fits_at(curves, elapsed, candidate, *delay, budget)) << "trial " << trial;
      if (*delay > 0.0) ++started_late;
    }
  }
  EXPECT_GT(started_late, 10);  // the trials exercise real offsets, not only 0 or nullopt
}

}  // namespace
}  // namespace salus
