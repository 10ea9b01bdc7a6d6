// salus_soak: jobs arrive, run, get cancelled and leave at random, for a while, on a simulated
// 4-GPU NVLink mesh with spilling on (peer, then host) and memory small enough that pages really
// move. It samples resident memory and reserved bytes into a CSV, judges "flat after warm-up"
// (flatness.hpp), runs a watchdog over every thread (watchdog.hpp), and at the end checks that
// every job left and all memory came back. Exit codes: 0 all good; 1 a check failed; 2 bad
// command line; 3 the watchdog found a stuck thread (stacks on stderr).
//
//   salus_soak --seconds 40 [--seed N] [--csv PATH] [--stuck-seconds 30] [--warmup-seconds W]
//              [--slots 16] [--max-iterations-per-job 24] [--policy fair] [--device-limit-mib 24]
//              [--host-limit-mib 256]
//              [--sample-ms 1000] [--rss-tolerance-mib 8] [--no-rss-verdict] [--no-kernels]
//              [--simulate-hang S]
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <algorithm>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "salus/runtime.hpp"
#include "salus/sim.hpp"
#include "soak/flatness.hpp"
#include "soak/soak_jobs.hpp"
#include "soak/watchdog.hpp"

namespace salus::soak {
namespace {

constexpr int kDevices = 4;

struct Options {
  double seconds = 40.0;
  std::optional<std::uint64_t> seed;
  std::string csv;
  double stuck_seconds = 30.0;
  std::optional<double> warmup_seconds;  // default: a quarter of the run, at least 10 s
  int slots = 16;
  int max_iterations_per_job = 24;
  std::string policy = "fair";
  std::size_t device_limit_mib = 24;
  std::size_t host_limit_mib = 256;
  int sample_ms = 1000;
  double rss_tolerance_mib = 8.0;
  bool judge_rss = true;  // --no-rss-verdict: RSS is reported, not judged
  bool kernels = true;
  std::optional<double> simulate_hang_after;
};

double parse_number(const std::string& flag, const char* text) {
  char* end = nullptr;
  const double value = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(value >= 0.0)) {
    throw std::invalid_argument(flag + " wants a non-negative number, got '" + text + "'");
  }
  return value;
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--no-kernels" || flag == "--no-rss-verdict") {
      (flag == "--no-kernels" ? o.kernels : o.judge_rss) = false;
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument("missing value after " + flag);
    const char* value = argv[++i];
    if (flag == "--seconds")
      o.seconds = parse_number(flag, value);
    else if (flag == "--seed")
      o.seed = static_cast<std::uint64_t>(std::strtoull(value, nullptr, 0));
    else if (flag == "--csv")
      o.csv = value;
    else if (flag == "--stuck-seconds")
      o.stuck_seconds = parse_number(flag, value);
    else if (flag == "--warmup-seconds")
      o.warmup_seconds = parse_number(flag, value);
    else if (flag == "--slots")
      o.slots = static_cast<int>(parse_number(flag, value));
    else if (flag == "--max-iterations-per-job")
      o.max_iterations_per_job = static_cast<int>(parse_number(flag, value));
    else if (flag == "--policy")
      o.policy = value;
    else if (flag == "--device-limit-mib")
      o.device_limit_mib = static_cast<std::size_t>(parse_number(flag, value));
    else if (flag == "--host-limit-mib")
      o.host_limit_mib = static_cast<std::size_t>(parse_number(flag, value));
    else if (flag == "--sample-ms")
      o.sample_ms = static_cast<int>(parse_number(flag, value));
    else if (flag == "--rss-tolerance-mib")
      o.rss_tolerance_mib = parse_number(flag, value);
    else if (flag == "--simulate-hang")
      o.simulate_hang_after = parse_number(flag, value);
    else
      throw std::invalid_argument("unknown option " + flag);
  }
  if (o.slots < 1) throw std::invalid_argument("--slots wants at least 1");
  if (o.max_iterations_per_job < 1)
    throw std::invalid_argument("--max-iterations-per-job wants at least 1");
  if (o.sample_ms < 10) throw std::invalid_argument("--sample-ms wants at least 10");
  if (o.device_limit_mib < 8) throw std::invalid_argument("--device-limit-mib wants at least 8");
  if (o.stuck_seconds <= 0.0) throw std::invalid_argument("--stuck-seconds wants more than 0");
  return o;
}

// Resident memory from /proc/self/status: VmRSS (all of it), RssAnon (the heap and stacks: where
// a leak shows) and RssShmem (the simulated devices' memfd pages and host spill pages touched).
struct Resident {
  std::size_t total = 0;
  std::size_t anon = 0;
  std::size_t shmem = 0;
};

Resident resident_memory() {
  std::ifstream status("/proc/self/status");
  Resident r;
  std::string key;
  std::size_t kib = 0;
  while (status >> key) {
    if (key == "VmRSS:" && status >> kib)
      r.total = kib * KiB;
    else if (key == "RssAnon:" && status >> kib)
      r.anon = kib * KiB;
    else if (key == "RssShmem:" && status >> kib)
      r.shmem = kib * KiB;
    status.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return r;
}

// One row of the CSV.
struct Sample {
  double seconds = 0.0;
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

Sample take_sample(double seconds, Runtime& runtime, Population& population) {
  Sample s;
  s.seconds = seconds;
  const Resident resident = resident_memory();
  s.rss = resident.total;
  s.rss_anon = resident.anon;
  s.rss_shmem = resident.shmem;
  const MemoryStats stats = runtime.memory().stats();
  for (const DeviceMemoryStats& d : stats.devices) {
    s.device_reserved += d.reserved;
    s.allocated += d.allocated;
    s.lent += d.lent;
    s.borrowed_peer += d.borrowed_peer;
    s.borrowed_host += d.borrowed_host;
    s.pages_moved += d.pages_moved;
    s.recalled_pages += d.recalled_pages;
  }
  s.host_spill = stats.host_spill_bytes;
  s.reserved = s.device_reserved + s.host_spill;
  const Counters& c = population.counters();
  s.arrived = c.arrived.load();
  s.iterations = c.iterations.load();
  s.cancelled = c.cancelled.load();
  s.live_jobs = population.live_jobs();
  return s;
}

void write_csv_header(std::FILE* csv) {
  std::fprintf(csv,
               "seconds,rss_bytes,rss_anon_bytes,rss_shmem_bytes,reserved_bytes,device_reserved_"
               "bytes,host_spill_bytes,"
               "allocated_bytes,lent_bytes,borrowed_peer_bytes,borrowed_host_bytes,"
               "pages_moved,recalled_pages,jobs_arrived,iterations,jobs_cancelled,live_jobs\n");
}

void write_csv_row(std::FILE* csv, const Sample& s) {
  std::fprintf(
      csv, "%.3f,%zu,%zu,%zu,%zu,%zu,%zu,%zu,%zu,%zu,%zu,%llu,%llu,%llu,%llu,%llu,%d\n", s.seconds,
      s.rss, s.rss_anon, s.rss_shmem, s.reserved, s.device_reserved, s.host_spill, s.allocated,
      s.lent, s.borrowed_peer, s.borrowed_host, static_cast<unsigned long long>(s.pages_moved),
      static_cast<unsigned long long>(s.recalled_pages), static_cast<unsigned long long>(s.arrived),
      static_cast<unsigned long long>(s.iterations), static_cast<unsigned long long>(s.cancelled),
      s.live_jobs);
  std::fflush(csv);
}

// Failed checks, printed at the end; any makes the exit code 1.
struct Report {
  std::vector<std::string> failures;
  void check(bool ok, const std::string& what) {
    std::printf("  [%s] %s\n", ok ? "ok" : "FAIL", what.c_str());
    if (!ok) failures.push_back(what);
  }
};

std::string mib(std::size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / double(MiB));
  return text;
}

// The most bytes lent and borrowed at once (all devices together) over the run.
struct HarvestMaxima {
  std::size_t lent = 0;
  std::size_t borrowed_peer = 0;
  std::size_t borrowed_host = 0;
  void observe(Runtime& runtime) {
    std::size_t l = 0, p = 0, h = 0;
    for (int d = 0; d < runtime.device_count(); ++d) {
      const DeviceMemoryStats s = runtime.memory().device_stats(d);
      l += s.lent;
      p += s.borrowed_peer;
      h += s.borrowed_host;
    }
    lent = std::max(lent, l);
    borrowed_peer = std::max(borrowed_peer, p);
    borrowed_host = std::max(borrowed_host, h);
  }
};

// Runs the population for the configured time, sampling; returns the samples.
std::vector<Sample> run_and_sample(const Options& o, Runtime& runtime, Population& population,
                                   Heartbeat& main_beat, HarvestMaxima& harvest) {
  std::FILE* csv = nullptr;
  if (!o.csv.empty()) {
    csv = std::fopen(o.csv.c_str(), "w");
    if (csv == nullptr) throw std::runtime_error("cannot write " + o.csv);
    write_csv_header(csv);
  }
  std::vector<Sample> samples;
  const auto start = std::chrono::steady_clock::now();
  const auto period = std::chrono::milliseconds(o.sample_ms);
  auto next_sample = start + period;
  population.start();
  // Lending and borrowing come and go within a second: their maxima are watched every 100 ms.
  for (auto tick = start;;) {
    tick += std::chrono::milliseconds(100);
    std::this_thread::sleep_until(std::min(tick, next_sample));
    main_beat.beat(Phase::working);
    harvest.observe(runtime);
    if (std::chrono::steady_clock::now() < next_sample) continue;
    next_sample += period;
    const double t =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    samples.push_back(take_sample(t, runtime, population));
    if (csv != nullptr) write_csv_row(csv, samples.back());
    if (t >= o.seconds) break;
  }
  if (csv != nullptr) std::fclose(csv);
  return samples;
}

void judge_series(const Options& o, const std::vector<Sample>& samples, Report& report) {
  const double warmup = o.warmup_seconds.value_or(std::max(10.0, o.seconds / 4.0));
  // VmRSS counts the simulated devices' memfd pages (RssShmem) as they are first touched, which
  // goes on for minutes while reserved stays flat: that is device memory, judged as "reserved".
  // The process's own memory is VmRSS without it.
  std::vector<SeriesPoint> rss, anon, reserved;
  for (const Sample& s : samples) {
    rss.push_back({s.seconds, static_cast<double>(s.rss - std::min(s.rss, s.rss_shmem))});
    anon.push_back({s.seconds, static_cast<double>(s.rss_anon)});
    reserved.push_back({s.seconds, static_cast<double>(s.reserved)});
  }
  // RSS: a few MiB of allocator and sanitizer noise, or 5%. Reserved: pages are pooled, not given
  // back (until trim), so reserved is a high-water mark of demand, and rarer peaks come with time;
  // a tenth of all Salus may hold (device limits and the host spill limit) is allowed for that.
  const FlatnessVerdict rss_verdict =
      judge_flatness(rss, {warmup, o.rss_tolerance_mib * double(MiB), 0.05});
  const FlatnessVerdict anon_verdict =
      judge_flatness(anon, {warmup, o.rss_tolerance_mib * double(MiB), 0.05});
  const double reservable = double((kDevices * o.device_limit_mib + o.host_limit_mib) * MiB);
  const FlatnessVerdict reserved_verdict =
      judge_flatness(reserved, {warmup, 0.10 * reservable, 0.0});
  std::printf("flatness (warm-up %.1f s):\n", warmup);
  // Sanitizer allocators warm up for minutes (quarantine, shadow, per-thread caches): a short run
  // under them reports RSS but cannot judge it (--no-rss-verdict); the long run judges it.
  auto judge_rss = [&](const FlatnessVerdict& verdict, const char* what) {
    const std::string line = describe(what, verdict, double(MiB), "MiB");
    if (o.judge_rss) {
      report.check(verdict.judged && verdict.flat, line);
    } else {
      std::printf("  [not judged: --no-rss-verdict] %s\n", line.c_str());
    }
  };
  judge_rss(rss_verdict, "RSS without simulated device memory (VmRSS - RssShmem)");
  judge_rss(anon_verdict, "RSS anonymous (heap)");
  report.check(reserved_verdict.judged && reserved_verdict.flat,
               describe("reserved (devices + host spill)", reserved_verdict, double(MiB), "MiB"));
}

void print_counters(const Counters& c) {
  auto n = [](const std::atomic<std::uint64_t>& v) {
    return static_cast<unsigned long long>(v.load());
  };
  std::printf(
      "jobs: %llu arrived, %llu left normally, %llu left mid-iteration, %llu dropped "
      "mid-iteration, %llu cancelled (+%llu at shutdown)\n",
      n(c.arrived), n(c.left_normally), n(c.left_mid_iteration), n(c.dropped_mid_iteration),
      n(c.cancelled), n(c.cancelled_at_shutdown));
  std::printf(
      "work: %llu iterations, %llu allocations (%llu out of memory), %llu kernels, %llu "
      "block checks, %llu mismatches, %llu cancel races, %llu errors\n",
      n(c.iterations), n(c.allocations), n(c.out_of_memory), n(c.kernels), n(c.blocks_checked),
      n(c.mismatches), n(c.cancel_races), n(c.errors));
}

// After every job left: nothing allocated, lent or borrowed; after trim nothing reserved.
void check_memory_returned(Runtime& runtime, Report& report) {
  MemoryStats stats = runtime.memory().stats();
  std::size_t allocated = 0, lent = 0, borrowed = 0, alive = 0;
  for (const DeviceMemoryStats& d : stats.devices) {
    allocated += d.allocated;
    lent += d.lent;
    borrowed += d.borrowed_peer + d.borrowed_host;
  }
  for (const JobMemoryStats& j : stats.jobs) alive += j.alive && j.job != kUnattributedJob ? 1 : 0;
  report.check(alive == 0, "no job alive in the memory manager (" + std::to_string(alive) + ")");
  report.check(allocated == 0, "nothing allocated at the end (" + mib(allocated) + ")");
  report.check(lent == 0 && borrowed == 0,
               "nothing lent or borrowed (" + mib(lent) + " lent, " + mib(borrowed) + " borrowed)");
  const std::size_t trimmed = runtime.memory().trim();
  stats = runtime.memory().stats();
  std::size_t reserved = 0, mapped = 0;
  for (const DeviceMemoryStats& d : stats.devices) {
    reserved += d.reserved;
    mapped += d.mapped;
  }
  report.check(reserved == 0 && mapped == 0 && stats.host_spill_bytes == 0,
               "after trim (released " + mib(trimmed) + "): " + mib(reserved) + " reserved, " +
                   mib(mapped) + " mapped, " + mib(stats.host_spill_bytes) + " host spill");
  std::printf("memory manager job records at the end: %zu (retired ones included)\n",
              stats.jobs.size());
}

void check_run(const Options& o, const std::vector<Sample>& samples, const HarvestMaxima& harvest,
               Population& population, Report& report) {
  const Counters& c = population.counters();
  const Sample& last = samples.back();
  std::printf(
      "harvesting: %llu pages moved, %llu recalled; at most %s lent, %s borrowed from "
      "peers, %s borrowed from the host at once (watched every 100 ms)\n",
      static_cast<unsigned long long>(last.pages_moved),
      static_cast<unsigned long long>(last.recalled_pages), mib(harvest.lent).c_str(),
      mib(harvest.borrowed_peer).c_str(), mib(harvest.borrowed_host).c_str());
  report.check(c.iterations.load() > 0, "iterations ran");
  report.check(
      last.pages_moved > 0 && harvest.lent > 0 && harvest.borrowed_peer > 0 &&
          harvest.borrowed_host > 0,
      "spilling happened (pages moved; pages lent, borrowed from peers and from the host)");
  report.check(c.mismatches.load() == 0, "every block read back its stamps");
  report.check(c.errors.load() == 0, "no unexplained errors");
  for (const std::string& m : population.messages()) std::printf("    %s\n", m.c_str());
  judge_series(o, samples, report);
}

// Spilling on, peer first then host, with devices small enough that it happens all the time.
RuntimeOptions runtime_options(const Options& o) {
  RuntimeOptions options;
  options.policy = o.policy;
  options.memory.device_limits.assign(kDevices, o.device_limit_mib * MiB);
  options.memory.harvest.spill = SpillPolicy::peer_then_host;
  options.memory.harvest.host_limit_bytes = o.host_limit_mib * MiB;
  options.memory.harvest.recall_wait = std::chrono::milliseconds(200);
  // One page kept back from lending (the default is an eighth of the device): quiet devices lend.
  options.memory.harvest.lend_reserve_bytes = 2 * MiB;
  return options;
}

PopulationConfig population_config(const Options& o, std::uint64_t seed) {
  PopulationConfig config;
  config.slots = o.slots;
  config.devices = kDevices;
  config.seed = seed;
  config.kernels = o.kernels;
  config.max_iterations_per_job = o.max_iterations_per_job;
  config.simulate_hang_after = o.simulate_hang_after;
  return config;
}

int run(const Options& o) {
  const std::uint64_t seed = o.seed.value_or(
      static_cast<std::uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()));
  std::printf(
      "salus_soak: seed %llu, %.0f s, %d slots, policy %s, %zu MiB per device, host "
      "spill limit %zu MiB, stuck after %.0f s\n",
      static_cast<unsigned long long>(seed), o.seconds, o.slots, o.policy.c_str(),
      o.device_limit_mib, o.host_limit_mib, o.stuck_seconds);
  std::fflush(stdout);
  WatchdogOptions watch;
  watch.stuck = std::chrono::milliseconds(static_cast<std::int64_t>(o.stuck_seconds * 1000));
  watch.devices = kDevices;
  Watchdog watchdog(watch);
  Heartbeat& main_beat = watchdog.enroll("soak-main");
  watchdog.start();
  Report report;
  {
    auto backend = make_sim_backend(SimConfig::nvlink_mesh(kDevices, 256 * MiB));
    Runtime runtime(backend, runtime_options(o));
    Population population(runtime, watchdog, population_config(o, seed));
    HarvestMaxima harvest;
    const std::vector<Sample> samples = run_and_sample(o, runtime, population, main_beat, harvest);
    watchdog.expect_system_progress(false);  // from here on, jobs only leave
    main_beat.beat(Phase::working);
    population.stop(std::chrono::seconds(10));
    main_beat.beat(Phase::working);
    print_counters(population.counters());
    check_run(o, samples, harvest, population, report);
    check_memory_returned(runtime, report);
    main_beat.beat(Phase::working);
  }  // the runtime and the backend are destroyed here (the watchdog still watches)
  main_beat.beat(Phase::done);
  watchdog.stop();
  std::printf("salus_soak: seed %llu: %s\n", static_cast<unsigned long long>(seed),
              report.failures.empty() ? "PASSED" : "FAILED");
  for (const std::string& f : report.failures) std::printf("  failed: %s\n", f.c_str());
  return report.failures.empty() ? 0 : 1;
}

}  // namespace
}  // namespace salus::soak

#if defined(__SANITIZE_ADDRESS__)
// Under AddressSanitizer freed memory waits in a quarantine (256 MiB by default) before reuse, so
// resident memory would climb for minutes whatever Salus does. A small quarantine keeps the RSS
// verdict about Salus; ASAN_OPTIONS=quarantine_size_mb=... still overrides it.
extern "C" const char* __asan_default_options() {
  return "quarantine_size_mb=16";
}
#endif

int main(int argc, char** argv) {
  salus::soak::Options options;
  try {
    options = salus::soak::parse_options(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "salus_soak: %s\n", e.what());
    return 2;
  }
  try {
    return salus::soak::run(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "salus_soak: %s\n", e.what());
    return 1;
  }
}
