// salus_soak's samples and verdicts: resident memory and Salus's statistics over time (a CSV),
// "flat after warm-up" judgements, and the end-of-run checks (every job gone, every block freed,
// a fresh job gets the whole device, no mismatch, no UnknownJob for a cancelled job).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "salus/runtime.hpp"
#include "soak/soak_context.hpp"

namespace salus::soak {

// One row of the CSV.
struct Sample {
  std::string combo;
  double seconds = 0.0;  // since the process started sampling
  std::size_t rss = 0;
  std::size_t rss_anon = 0;
  std::size_t rss_shmem = 0;
  std::size_t reserved = 0;  // device pages held, all devices, plus host spill pages
  std::size_t device_reserved = 0;
  std::size_t host_spill = 0;
  std::size_t allocated = 0;
  std::size_t lent = 0;
  std::size_t borrowed_peer = 0;
  std::size_t borrowed_host = 0;
  std::uint64_t pages_moved = 0;
  std::uint64_t recalled_pages = 0;
  std::uint64_t arrived = 0;
  std::uint64_t iterations = 0;
  std::uint64_t cancelled = 0;
  int live_jobs = 0;
};

[[nodiscard]] Sample take_sample(const std::string& combo, double seconds, Runtime& runtime,
                                 const Counters& counters, int live_jobs);
void write_csv_header(std::FILE* csv);
void write_csv_row(std::FILE* csv, const Sample& s);

// Failed checks, printed at the end; any makes the exit code 1.
struct Report {
  std::string prefix;  // the combination being checked
  std::vector<std::string> failures;
  void check(bool ok, const std::string& what);
};

[[nodiscard]] std::string mib(std::size_t bytes);

// The most bytes lent and borrowed at once (all devices together) over a run.
struct HarvestMaxima {
  std::size_t lent = 0;
  std::size_t borrowed_peer = 0;
  std::size_t borrowed_host = 0;
  void observe(Runtime& runtime);
};

struct FlatnessOptions {
  double warmup_seconds = 10.0;
  double rss_tolerance_mib = 8.0;
  bool judge_rss = true;
  bool require_reserved_verdict = true;  // false: a run too short to judge reports it only
  std::size_t reservable_bytes = 0;      // all device limits and the host spill limit
};
// RSS (without the simulated devices' memory) and anonymous RSS; with `reserved`, Salus's
// reserved bytes too (a series of one runtime).
void judge_series(const std::vector<Sample>& samples, const FlatnessOptions& options, bool reserved,
                  Report& report);

void print_counters(const Counters& c);
// Counters and what they must show: work done, no mismatch, no unexplained error, no
// UnknownJob for a cancelled job; with `spill`, pages moved (all of lending and borrowing with
// `spill_everywhere`).
// `pages_move`: waiting jobs' pages may move between tiers (device compute).
void check_counters(const Counters& c, ErrorLog& log, const HarvestMaxima& harvest,
                    std::uint64_t pages_moved, bool spill, bool spill_everywhere, bool pages_move,
                    Report& report);
// After every job left and every block was freed: nothing allocated, lent or borrowed on any
// device; after trim nothing reserved; then a fresh job gets each whole device, locally.
void check_memory_returned(Runtime& runtime, std::size_t device_limit, Report& report);

}  // namespace salus::soak
