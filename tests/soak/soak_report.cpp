#include "soak/soak_report.hpp"

#include <algorithm>
#include <fstream>
#include <limits>

#include "salus/sim.hpp"
#include "soak/flatness.hpp"

namespace salus::soak {
namespace {

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

unsigned long long n(const std::atomic<std::uint64_t>& v) {
  return static_cast<unsigned long long>(v.load());
}

// A fresh job on each device allocates the whole device limit, without borrowing: nothing the
// soak's jobs held is left behind (a leaked block would make it fail or borrow).
void check_whole_device(Runtime& runtime, std::size_t device_limit, Report& report) {
  for (int device = 0; device < runtime.device_count(); ++device) {
    JobSpec spec;
    spec.name = "whole-device" + std::to_string(device);
    spec.device = device;
    Job job = runtime.add_job(spec);
    std::string why;
    try {
      const DevicePtr ptr = job.allocate(device_limit);
      const DeviceMemoryStats s = runtime.memory().device_stats(device);
      if (s.borrowed_peer + s.borrowed_host > 0) {
        why = "it had to borrow " + mib(s.borrowed_peer + s.borrowed_host);
      }
      job.deallocate(ptr);
    } catch (const std::exception& e) {
      why = e.what();
    }
    report.check(why.empty(), "a fresh job gets the whole of device " + std::to_string(device) +
                                  " (" + mib(device_limit) + ")" + (why.empty() ? "" : ": " + why));
    job.leave();
  }
}

}  // namespace

Sample take_sample(const std::string& combo, double seconds, Runtime& runtime,
                   const Counters& counters, int live_jobs) {
  Sample s;
  s.combo = combo;
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
  s.arrived = counters.arrived.load();
  s.iterations = counters.iterations.load();
  s.cancelled = counters.cancelled.load();
  s.live_jobs = live_jobs;
  return s;
}

void write_csv_header(std::FILE* csv) {
  std::fprintf(csv,
               "combo,seconds,rss_bytes,rss_anon_bytes,rss_shmem_bytes,reserved_bytes,"
               "device_reserved_bytes,host_spill_bytes,"
               "allocated_bytes,lent_bytes,borrowed_peer_bytes,borrowed_host_bytes,"
               "pages_moved,recalled_pages,jobs_arrived,iterations,jobs_cancelled,live_jobs\n");
}

void write_csv_row(std::FILE* csv, const Sample& s) {
  std::fprintf(csv, "%s,%.3f,%zu,%zu,%zu,%zu,%zu,%zu,%zu,%zu,%zu,%zu,%llu,%llu,%llu,%llu,%llu,%d\n",
               s.combo.c_str(), s.seconds, s.rss, s.rss_anon, s.rss_shmem, s.reserved,
               s.device_reserved, s.host_spill, s.allocated, s.lent, s.borrowed_peer,
               s.borrowed_host, static_cast<unsigned long long>(s.pages_moved),
               static_cast<unsigned long long>(s.recalled_pages),
               static_cast<unsigned long long>(s.arrived),
               static_cast<unsigned long long>(s.iterations),
               static_cast<unsigned long long>(s.cancelled), s.live_jobs);
  std::fflush(csv);
}

void Report::check(bool ok, const std::string& what) {
  std::printf("  [%s] %s\n", ok ? "ok" : "FAIL", what.c_str());
  if (!ok) failures.push_back(prefix.empty() ? what : prefix + ": " + what);
}

std::string mib(std::size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / double(MiB));
  return text;
}

void HarvestMaxima::observe(Runtime& runtime) {
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

void judge_series(const std::vector<Sample>& samples, const FlatnessOptions& o, bool reserved,
                  Report& report) {
  // VmRSS counts the simulated devices' memfd pages (RssShmem) as they are first touched, which
  // goes on for minutes while reserved stays flat: that is device memory, judged as "reserved".
  // The process's own memory is VmRSS without it.
  std::vector<SeriesPoint> rss, anon, held;
  for (const Sample& s : samples) {
    rss.push_back({s.seconds, static_cast<double>(s.rss - std::min(s.rss, s.rss_shmem))});
    anon.push_back({s.seconds, static_cast<double>(s.rss_anon)});
    held.push_back({s.seconds, static_cast<double>(s.reserved)});
  }
  std::printf("flatness (warm-up %.1f s):\n", o.warmup_seconds);
  // RSS: a few MiB of allocator and sanitizer noise, or 5%. Sanitizer allocators warm up for
  // minutes (quarantine, shadow, per-thread caches): a short run under them reports RSS but
  // cannot judge it (--no-rss-verdict); the long run judges it.
  auto judge = [&](const std::vector<SeriesPoint>& series, const FlatnessRule& rule,
                   const char* what, bool required) {
    const FlatnessVerdict verdict = judge_flatness(series, rule);
    const std::string line = describe(what, verdict, double(MiB), "MiB");
    if (required) {
      report.check(verdict.judged && verdict.flat, line);
    } else {
      std::printf("  [not judged] %s\n", line.c_str());
    }
  };
  const FlatnessRule rss_rule{o.warmup_seconds, o.rss_tolerance_mib * double(MiB), 0.05};
  judge(rss, rss_rule, "RSS without simulated device memory (VmRSS - RssShmem)", o.judge_rss);
  judge(anon, rss_rule, "RSS anonymous (heap)", o.judge_rss);
  if (!reserved) return;
  // Pages are pooled, not given back (until trim), so reserved is a high-water mark of demand,
  // and rarer peaks come with time; a tenth of all Salus may hold is allowed for that.
  judge(held, {o.warmup_seconds, 0.10 * double(o.reservable_bytes), 0.0},
        "reserved (devices + host spill)", o.require_reserved_verdict);
}

void print_counters(const Counters& c) {
  std::printf(
      "jobs: %llu arrived, %llu left normally, %llu left mid-iteration, %llu dropped "
      "mid-iteration, %llu cancelled and %llu left by another thread (+%llu cancelled at "
      "shutdown)\n",
      n(c.arrived), n(c.left_normally), n(c.left_mid_iteration), n(c.dropped_mid_iteration),
      n(c.cancelled), n(c.left_by_other), n(c.cancelled_at_shutdown));
  std::printf(
      "work: %llu iterations, %llu allocations (%llu out of memory), %llu kernels, %llu "
      "block checks, %llu mismatches\n",
      n(c.iterations), n(c.allocations), n(c.out_of_memory), n(c.kernels), n(c.blocks_checked),
      n(c.mismatches));
  std::printf(
      "second streams: %llu readers ran, %llu found foreign bytes; holder: %llu frees, %llu "
      "refused after the job's end\n",
      n(c.stream_reads), n(c.stream_mismatches), n(c.held_frees), n(c.held_frees_refused));
  std::printf(
      "races: %llu jobs ended under racing allocations, %llu allocations, %llu lost the race\n",
      n(c.race_rounds), n(c.race_allocations), n(c.race_lost));
  std::printf(
      "answers after another thread's end: %llu JobCancelled and %llu UnknownJob to cancelled "
      "jobs, %llu after leaves; %llu odd ones; %llu unexplained errors\n",
      n(c.answers_cancelled), n(c.answers_unknown_job), n(c.answers_after_leave), n(c.cancel_races),
      n(c.errors));
}

void check_counters(const Counters& c, ErrorLog& log, const HarvestMaxima& harvest,
                    std::uint64_t pages_moved, bool spill, bool spill_everywhere, bool pages_move,
                    Report& report) {
  std::printf(
      "harvesting: %llu pages moved; at most %s lent, %s borrowed from peers, %s borrowed from "
      "the host at once (watched every 100 ms)\n",
      static_cast<unsigned long long>(pages_moved), mib(harvest.lent).c_str(),
      mib(harvest.borrowed_peer).c_str(), mib(harvest.borrowed_host).c_str());
  report.check(c.iterations.load() > 0, "iterations ran");
  if (spill_everywhere) {
    report.check((pages_moved > 0 || !pages_move) && harvest.lent > 0 &&
                     harvest.borrowed_peer > 0 && harvest.borrowed_host > 0,
                 pages_move ? "spilling happened (pages moved; pages lent, borrowed from peers "
                              "and from the host)"
                            : "spilling happened (pages lent, borrowed from peers and from the "
                              "host; host compute moves no live page)");
  } else if (spill) {
    report.check(pages_moved > 0 || harvest.borrowed_peer + harvest.borrowed_host > 0,
                 "spilling happened (pages moved or borrowed)");
  }
  report.check(c.mismatches.load() == 0 && c.stream_mismatches.load() == 0,
               "every block read back its stamps, on the host and on second streams (" +
                   std::to_string(n(c.mismatches)) + " + " +
                   std::to_string(n(c.stream_mismatches)) + " mismatches)");
  report.check(c.answers_unknown_job.load() == 0,
               "cancelled jobs heard JobCancelled, never UnknownJob (" +
                   std::to_string(n(c.answers_cancelled)) + " vs " +
                   std::to_string(n(c.answers_unknown_job)) + ")");
  report.check(c.errors.load() == 0, "no unexplained errors");
  for (const std::string& m : log.messages()) std::printf("    %s\n", m.c_str());
}

void check_memory_returned(Runtime& runtime, std::size_t device_limit, Report& report) {
  MemoryStats stats = runtime.memory().stats();
  std::size_t alive = 0;
  for (const JobMemoryStats& j : stats.jobs) alive += j.alive && j.job != kUnattributedJob ? 1 : 0;
  report.check(alive == 0, "no job alive in the memory manager (" + std::to_string(alive) + ")");
  std::string allocated, harvest;
  for (const DeviceMemoryStats& d : stats.devices) {
    if (d.allocated > 0)
      allocated += " device " + std::to_string(d.device) + ": " + mib(d.allocated);
    if (d.lent + d.borrowed_peer + d.borrowed_host > 0) {
      harvest += " device " + std::to_string(d.device) + ": " + mib(d.lent) + " lent, " +
                 mib(d.borrowed_peer + d.borrowed_host) + " borrowed";
    }
  }
  report.check(allocated.empty(), "nothing allocated at the end on any device" +
                                      (allocated.empty() ? "" : " (" + allocated + " )"));
  report.check(harvest.empty(), "nothing lent or borrowed" + (harvest.empty() ? "" : harvest));
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
  check_whole_device(runtime, device_limit, report);
}

}  // namespace salus::soak
