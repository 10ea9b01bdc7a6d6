// salus_soak's command line.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace salus::soak {

// One configuration the soak runs: JobSpec::blocks_outlive_job, the policy, spilling on or off.
struct Combo {
  bool blocks_outlive_job = false;
  std::string policy = "fair";
  bool spill = true;
  // "outlive.pack.spill", "release.fifo.nospill" (as in the ctest names).
  [[nodiscard]] std::string name() const;
};

// Every built-in policy, in both modes, spilling on and off: 24 combinations.
[[nodiscard]] std::vector<Combo> all_combos();

struct Options {
  double seconds = 40.0;  // for all combinations together
  std::optional<std::uint64_t> seed;
  std::string csv;
  double stuck_seconds = 30.0;
  std::optional<double> warmup_seconds;  // default: a quarter of a combination's run, >= 10 s
  int slots = 16;
  int racers = 6;
  int max_iterations_per_job = 24;
  std::vector<Combo> combos{Combo{}};
  std::size_t device_limit_mib = 24;
  std::size_t host_limit_mib = 256;
  int sample_ms = 1000;
  int cancel_interval_ms = 400;
  double rss_tolerance_mib = 8.0;
  bool judge_rss = true;  // --no-rss-verdict: RSS is reported, not judged
  bool kernels = true;
  bool stream_readers = true;
  // RuntimeOptions::host_compute: the jobs touch their blocks on the host as soon as they have
  // them (CPU consumers), so their pages never move. --device-compute turns it off (and the
  // stream readers, which race the host's first touch then): waiting jobs' pages move.
  bool host_compute = true;
  std::optional<double> simulate_hang_after;
};

// Throws std::invalid_argument naming what is wrong.
[[nodiscard]] Options parse_options(int argc, char** argv);

}  // namespace salus::soak
