// salus_harvest_study: memory harvesting with two co-located training jobs (issue 4).
//
//   salus_harvest_study [--iterations 10] [--warmup 2] [--gpu-mib 256] [--scale 50]
//                       [--compute-scale 1] [--configs no-spill host-only peer-first]
//                       [--json out.json] [--trace prefix] [--verbose]
//
// A four-GPU NVLink mesh on the simulated backend with throttled copies. Job X, whose working set
// is 1.3x GPU 0 (persistent 0.6x, ephemeral peak 0.7x), shares GPU 0 with a smaller job Y
// (0.2x + 0.2x) under the "fair" policy: one lane, the two take turns, iteration by iteration.
// GPUs 1-3 run nothing; their memory is what peer-first spilling harvests. Three configurations
// run one after the other in this process, each on a fresh backend and runtime:
//   no-spill   GPU 0 twice as large, no spilling: the time the workload takes with room enough;
//   host-only  GPU 0 at --gpu-mib, SpillPolicy::host_only;
//   peer-first GPU 0 at --gpu-mib, SpillPolicy::peer_then_host.
//
// Where pages live has to cost time, so an iteration's GPU work is modelled with copies: for every
// buffer a layer touches (its weights, its activation) the job's stream copies the buffer, page by
// page, into a scratch page on GPU 0. The simulator times each copy by the link between the two
// pages (local: unthrottled host memcpy; peer: NVLink; host: the host link), so a page that lives
// on a peer or in host memory makes the iteration slower. Each layer adds fixed compute (a host
// function sleeping on the stream), and the host thread waits for the stream after every layer, so
// allocations in forward and frees in backward happen at GPU pace and memory falls during
// backward, as it does in a framework.
//
// Link bandwidths are the real ones (--nvlink-gbps 50, --host-gbps 16) divided by --scale, so that
// the simulator's throttle, not this machine's memcpy, sets copy times (see RESULTS.md: with fresh
// mappings the simulator copies at about 1.7 GB/s, so the scaled NVLink must stay below that).
//
// Measurement: after --warmup iterations of each job, a window opens; it closes once each job has
// finished --iterations iterations inside it (the jobs keep taking turns until then, so neither
// ever runs alone). An iteration's time is its turn on the lane: from the moment the lane was
// handed to it (or it asked, if later) to the end of its last layer, so the time it waited for
// pages to come home is included. Page moves and the jobs' memory counters are taken over the
// window.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "salus/memory.hpp"
#include "salus/runtime.hpp"
#include "salus/sim.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using salus::DevicePtr;
using salus::kTierCount;
using salus::Location;
using salus::MiB;
using salus::Tier;
using Json = nlohmann::json;

constexpr std::size_t kPage = 2 * MiB;  // device and host page size
constexpr int kGpus = 4;
constexpr int kStudyGpu = 0;

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}
double mib(double bytes) {
  return bytes / static_cast<double>(MiB);
}

// A job's shape, as fractions of GPU 0's memory (--gpu-mib), and its per-layer compute.
struct Shape {
  std::string name;
  double persistent = 0.0;  // weights and optimizer state, allocated once
  double ephemeral = 0.0;   // activations at the peak (end of forward)
  int layers = 1;
  double forward_ms = 0.0;  // compute per layer; backward takes twice as long
};

// One page of GPU 0 memory outside Salus's accounting: the destination of the copies that model
// a layer reading its buffers, so that it always is local and only the source's tier matters.
class ScratchPage {
 public:
  ScratchPage(std::shared_ptr<salus::DeviceBackend> backend, int device)
      : backend_(std::move(backend)) {
    chunk_ = backend_->create_chunk(Location::gpu(device), kPage);
    try {
      va_ = backend_->reserve_address(kPage, kPage);
      backend_->map(va_, kPage, chunk_, 0);
      mapped_ = true;
      const salus::AccessGrant grant{device, salus::Access::read_write};
      backend_->set_access(va_, kPage, std::span(&grant, 1));
    } catch (...) {
      release();
      throw;
    }
  }
  ScratchPage(const ScratchPage&) = delete;
  ScratchPage& operator=(const ScratchPage&) = delete;
  ~ScratchPage() { release(); }
  [[nodiscard]] DevicePtr ptr() const { return va_; }

 private:
  void release() noexcept {
    try {
      if (va_ != 0) {
        if (mapped_) backend_->unmap(va_, kPage);
        backend_->free_address(va_, kPage);
      }
      backend_->release_chunk(chunk_);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "releasing a scratch page failed: %s\n", e.what());
    }
  }
  std::shared_ptr<salus::DeviceBackend> backend_;
  salus::ChunkHandle chunk_{};
  DevicePtr va_ = 0;
  bool mapped_ = false;
};

struct IterationSample {
  Clock::time_point start;  // the lane was handed to the job (or it asked, if later)
  Clock::time_point end;
  std::array<std::size_t, kTierCount> peak_by_tier{};  // its live bytes by tier, end of forward
};

// Opens the measurement window once every job is warm, closes it once every job has done enough
// iterations inside it, and snapshots the jobs' memory counters at both edges.
class Window {
 public:
  Window(salus::MemoryManager& memory, std::vector<salus::JobId> jobs, int warmup, int iterations)
      : memory_(memory),
        jobs_(std::move(jobs)),
        warmup_(warmup),
        iterations_(iterations),
        done_(jobs_.size(), 0),
        inside_(jobs_.size(), 0) {}

  void iteration_done(std::size_t job, const IterationSample& sample) {
    std::lock_guard lock(mu_);
    ++done_[job];
    if (opened_ && !closed_ && sample.start >= open_at_) ++inside_[job];
    if (!opened_ && std::ranges::all_of(done_, [&](int n) { return n >= warmup_; })) {
      opened_ = true;
      open_at_ = Clock::now();
      at_open_ = snapshot();
    } else if (opened_ && !closed_ &&
               std::ranges::all_of(inside_, [&](int n) { return n >= iterations_; })) {
      closed_ = true;
      close_at_ = Clock::now();
      at_close_ = snapshot();
      stop_.store(true);
    }
  }
  // Also stops the run when a job failed.
  void abort() { stop_.store(true); }
  [[nodiscard]] bool stopping() const { return stop_.load(); }
  [[nodiscard]] bool closed() const {
    std::lock_guard lock(mu_);
    return closed_;
  }
  [[nodiscard]] Clock::time_point open_at() const { return open_at_; }
  [[nodiscard]] Clock::time_point close_at() const { return close_at_; }
  [[nodiscard]] const salus::JobMemoryStats& at_open(std::size_t job) const {
    return at_open_[job];
  }
  [[nodiscard]] const salus::JobMemoryStats& at_close(std::size_t job) const {
    return at_close_[job];
  }

 private:
  std::vector<salus::JobMemoryStats> snapshot() const {
    std::vector<salus::JobMemoryStats> out;
    for (salus::JobId id : jobs_) out.push_back(memory_.job_stats(id));
    return out;
  }

  salus::MemoryManager& memory_;
  const std::vector<salus::JobId> jobs_;
  const int warmup_;
  const int iterations_;
  mutable std::mutex mu_;
  std::vector<int> done_;
  std::vector<int> inside_;
  bool opened_ = false;
  bool closed_ = false;
  Clock::time_point open_at_{};
  Clock::time_point close_at_{};
  std::vector<salus::JobMemoryStats> at_open_;
  std::vector<salus::JobMemoryStats> at_close_;
  std::atomic<bool> stop_{false};
};

// The lane of GPU 0 as the harness sees it: when the job that held it last finished its work.
class LaneClock {
 public:
  void finished(Clock::time_point at) { last_end_.store(at.time_since_epoch().count()); }
  [[nodiscard]] Clock::time_point last_end() const {
    return Clock::time_point(Clock::duration(last_end_.load()));
  }

 private:
  std::atomic<Clock::rep> last_end_{0};
};

struct Options {
  int iterations = 10;
  int warmup = 2;
  std::size_t gpu_mib = 256;
  double scale = 50.0;
  double compute_scale = 1.0;  // multiplies every layer's compute time
  double nvlink_gbps = 50.0;   // real bandwidths, divided by `scale`
  double host_gbps = 16.0;
  std::string json_path;
  std::string trace_prefix;
  std::vector<std::string> configs{"no-spill", "host-only", "peer-first"};
  bool verbose = false;
  bool job_allocate = true;  // activations through Job::allocate (see allocate_activation)
};

// A training job: the harness thread that drives it, its buffers and its samples.
class Trainer {
 public:
  Trainer(salus::Runtime& runtime, const Shape& shape, std::size_t gpu_bytes, unsigned char tag)
      : backend_(runtime.backend()),
        memory_(runtime.memory()),
        shape_(shape),
        tag_(tag),
        weight_bytes_(layer_bytes(shape.persistent, gpu_bytes, shape.layers)),
        activation_bytes_(layer_bytes(shape.ephemeral, gpu_bytes, shape.layers)),
        job_(runtime.add_job(spec(shape, weight_bytes_))) {
    // Weights are allocated outside any iteration: persistent.
    for (int l = 0; l < shape_.layers; ++l) {
      weights_.push_back(job_.allocate(weight_bytes_));
      std::memset(reinterpret_cast<void*>(weights_.back()), tag_, weight_bytes_);
    }
  }

  [[nodiscard]] salus::Job& job() { return job_; }
  [[nodiscard]] const Shape& shape() const { return shape_; }
  [[nodiscard]] std::size_t persistent_bytes() const { return weights_.size() * weight_bytes_; }
  [[nodiscard]] std::size_t ephemeral_bytes() const {
    return static_cast<std::size_t>(shape_.layers) * activation_bytes_;
  }
  [[nodiscard]] const std::vector<IterationSample>& samples() const { return samples_; }
  [[nodiscard]] bool weights_intact() const { return intact_; }

  // Runs iterations until the window closes; stream and scratch live on GPU 0.
  void run(std::size_t index, Window& window, LaneClock& lane, const ScratchPage& scratch,
           const Options& options) {
    while (!window.stopping()) {
      IterationSample sample;
      const Clock::time_point asked = Clock::now();
      const salus::StreamHandle stream = job_.begin_iteration();
      sample.start = std::max(asked, lane.last_end());
      std::vector<DevicePtr> activations;
      const auto forward = std::chrono::duration<double, std::milli>(shape_.forward_ms);
      for (int l = 0; l < shape_.layers; ++l) {
        activations.push_back(options.job_allocate ? job_.allocate(activation_bytes_)
                                                   : allocate_activation(stream));
        touch(stream, scratch, weights_[static_cast<std::size_t>(l)], weight_bytes_);
        touch(stream, scratch, activations.back(), activation_bytes_);
        compute(stream, forward);
        backend_.synchronize_stream(stream);
      }
      const salus::JobMemoryStats peak = job_.stats().memory;
      std::copy(std::begin(peak.in_use_by_tier), std::end(peak.in_use_by_tier),
                sample.peak_by_tier.begin());
      for (int l = shape_.layers - 1; l >= 0; --l) {
        touch(stream, scratch, weights_[static_cast<std::size_t>(l)], weight_bytes_);
        touch(stream, scratch, activations[static_cast<std::size_t>(l)], activation_bytes_);
        compute(stream, 2 * forward);
        backend_.synchronize_stream(stream);
        if (options.job_allocate) {
          job_.deallocate(activations[static_cast<std::size_t>(l)]);
        } else {
          memory_.deallocate(activations[static_cast<std::size_t>(l)]);
        }
      }
      sample.end = Clock::now();
      lane.finished(sample.end);
      job_.end_iteration();
      samples_.push_back(sample);
      window.iteration_done(index, sample);
      if (options.verbose) {
        std::fprintf(stderr, "%s #%zu: %.1f ms, live MiB at forward end %.0f / %.0f / %.0f\n",
                     shape_.name.c_str(), samples_.size(), seconds(sample.end - sample.start) * 1e3,
                     mib(static_cast<double>(sample.peak_by_tier[0])),
                     mib(static_cast<double>(sample.peak_by_tier[1])),
                     mib(static_cast<double>(sample.peak_by_tier[2])));
      }
    }
    // Idle now (not quiescent): its pages stay put while they are checked.
    intact_ = std::ranges::all_of(weights_, [&](DevicePtr w) {
      const auto* p = reinterpret_cast<const unsigned char*>(w);
      return std::all_of(p, p + weight_bytes_, [&](unsigned char b) { return b == tag_; });
    });
  }

 private:
  static std::size_t layer_bytes(double fraction, std::size_t gpu_bytes, int layers) {
    const auto bytes = static_cast<std::size_t>(fraction * static_cast<double>(gpu_bytes) / layers);
    return std::max<std::size_t>(bytes / 4096 * 4096, 4096);
  }
  // Activations are not hinted: see allocate_activation.
  static salus::JobSpec spec(const Shape& shape, std::size_t weight_bytes) {
    salus::JobSpec spec;
    spec.name = shape.name;
    spec.device = kStudyGpu;
    spec.hints.persistent_bytes = weight_bytes * static_cast<std::size_t>(shape.layers);
    return spec;
  }

  // Activations are charged to the job, ephemeral, on its lane stream, exactly as Job::allocate
  // would, but straight through the memory manager, so the scheduler's profiler does not see
  // them. Its admission budget is GPU 0's limit and knows nothing of harvested memory: once it
  // learned that X's working set exceeds the GPU, X would never be admitted again (it then waits
  // forever in begin_iteration). The runtime still sees the persistent bytes, which fit.
  DevicePtr allocate_activation(salus::StreamHandle stream) {
    return memory_.allocate({.bytes = activation_bytes_,
                             .device = kStudyGpu,
                             .stream = stream,
                             .job = job_.id(),
                             .lifetime = salus::Lifetime::ephemeral});
  }

  // Reads [ptr, ptr + bytes) into the scratch page, one copy per page: the simulator times a copy
  // by the link of its first byte, so a copy must not span pages that may live on different
  // tiers.
  void touch(salus::StreamHandle stream, const ScratchPage& scratch, DevicePtr ptr,
             std::size_t bytes) {
    const DevicePtr end = ptr + bytes;
    for (DevicePtr p = ptr; p < end;) {
      const DevicePtr next = std::min(end, (p / kPage + 1) * kPage);
      backend_.copy_async(scratch.ptr(), p, next - p, stream);
      p = next;
    }
  }
  void compute(salus::StreamHandle stream, std::chrono::duration<double, std::milli> busy) {
    backend_.launch_host_func(stream, [busy] { std::this_thread::sleep_for(busy); });
  }

  salus::DeviceBackend& backend_;
  salus::MemoryManager& memory_;
  const Shape shape_;
  const unsigned char tag_;
  const std::size_t weight_bytes_;
  const std::size_t activation_bytes_;
  salus::Job job_;
  std::vector<DevicePtr> weights_;
  std::vector<IterationSample> samples_;
  bool intact_ = false;
};

struct Config {
  std::string name;
  salus::SpillPolicy spill = salus::SpillPolicy::none;
  std::size_t gpu0_bytes = 0;  // Salus's limit on GPU 0
};

Tier tier_of(Location where, int device) {
  if (where.is_host()) return Tier::host;
  return where.index == device ? Tier::local : Tier::peer;
}

struct JobResult {
  std::string name;
  std::vector<double> iteration_ms;  // inside the window
  std::array<double, kTierCount> peak_by_tier_mib{};
  salus::JobMemoryStats delta;  // counters over the window
  salus::JobStats stats;        // at the end
  std::size_t persistent_bytes = 0;
  std::size_t ephemeral_bytes = 0;
  bool intact = false;

  [[nodiscard]] double mean_ms() const {
    double sum = 0.0;
    for (double t : iteration_ms) sum += t;
    return iteration_ms.empty() ? 0.0 : sum / static_cast<double>(iteration_ms.size());
  }
  [[nodiscard]] double stddev_ms() const {
    if (iteration_ms.size() < 2) return 0.0;
    const double mean = mean_ms();
    double sum = 0.0;
    for (double t : iteration_ms) sum += (t - mean) * (t - mean);
    return std::sqrt(sum / static_cast<double>(iteration_ms.size() - 1));
  }
  // Of the bytes that came home, the share the prefetcher brought before the job was admitted.
  [[nodiscard]] std::optional<double> prefetched_share() const {
    const double total =
        static_cast<double>(delta.prefetched_bytes) + static_cast<double>(delta.fetched_bytes);
    if (total == 0.0) return std::nullopt;
    return static_cast<double>(delta.prefetched_bytes) / total;
  }
  // Of the admissions that followed a demotion, the share that waited for no page at all (a
  // prefetch still in flight counts as a wait).
  [[nodiscard]] std::optional<double> hit_rate() const {
    if (delta.activations_after_move == 0) return std::nullopt;
    return 1.0 - static_cast<double>(delta.activations_waited) /
                     static_cast<double>(delta.activations_after_move);
  }
};

struct RouteTotal {
  std::uint64_t bytes = 0;
  double seconds = 0.0;
  std::uint64_t rounds = 0;
  std::map<std::string, std::uint64_t> bytes_by_reason;
};

struct ConfigResult {
  Config config;
  double window_seconds = 0.0;
  std::vector<JobResult> jobs;
  std::map<std::string, RouteTotal> routes;  // "local->peer" ...
};

std::string route_name(const salus::MoveRecord& record) {
  return std::string(salus::to_string(tier_of(record.from, record.device))) + "->" +
         salus::to_string(tier_of(record.to, record.device));
}

ConfigResult run_config(const Options& options, const Config& config,
                        const std::vector<Shape>& shapes) {
  const std::size_t gpu_bytes = options.gpu_mib * MiB;
  salus::SimConfig sim =
      salus::SimConfig::nvlink_mesh(kGpus, gpu_bytes, options.nvlink_gbps / options.scale);
  // GPU 0 has room for the no-spill limit and the scratch pages, whatever Salus may use of it.
  sim.devices[kStudyGpu].memory_bytes = 2 * gpu_bytes + 8 * MiB;
  for (auto& device : sim.devices) device.granularity = kPage;
  sim.host_granularity = kPage;
  sim.host_memory_bytes = 4 * salus::GiB;
  sim.host_link_bandwidth_gbps = options.host_gbps / options.scale;
  sim.local_bandwidth_gbps = 0.0;  // see RESULTS.md: device-local copies run at memcpy speed
  sim.throttle_copies = true;

  salus::RuntimeOptions runtime_options;
  runtime_options.policy = "fair";
  runtime_options.memory.device_limits.assign(kGpus, 0);  // 0: the device's whole memory
  runtime_options.memory.device_limits[kStudyGpu] = config.gpu0_bytes;
  runtime_options.memory.harvest.spill = config.spill;
  auto backend = salus::make_sim_backend(sim);
  salus::Runtime runtime(backend, std::move(runtime_options));

  std::mutex moves_mu;
  std::vector<salus::MoveRecord> moves;
  runtime.memory().set_move_observer([&](const salus::MoveRecord& record) {
    std::lock_guard lock(moves_mu);
    moves.push_back(record);
  });

  std::vector<std::unique_ptr<Trainer>> trainers;
  std::vector<std::unique_ptr<ScratchPage>> scratch;
  std::vector<salus::JobId> ids;
  unsigned char tag = 0x41;
  for (const Shape& shape : shapes) {
    trainers.push_back(std::make_unique<Trainer>(runtime, shape, gpu_bytes, tag++));
    scratch.push_back(std::make_unique<ScratchPage>(backend, kStudyGpu));
    ids.push_back(trainers.back()->job().id());
  }
  Window window(runtime.memory(), ids, options.warmup, options.iterations);
  LaneClock lane;
  std::vector<std::exception_ptr> failures(trainers.size());
  {
    std::vector<std::jthread> threads;
    for (std::size_t i = 0; i < trainers.size(); ++i) {
      threads.emplace_back([&, i] {
        try {
          trainers[i]->run(i, window, lane, *scratch[i], options);
        } catch (...) {
          failures[i] = std::current_exception();
          window.abort();
        }
        // Leaving lets the other job finish its last turn without waiting for this one.
        try {
          trainers[i]->job().leave();
        } catch (...) {
          if (!failures[i]) failures[i] = std::current_exception();
        }
      });
    }
  }
  runtime.memory().set_move_observer(nullptr);
  for (const auto& failure : failures) {
    if (failure) std::rethrow_exception(failure);
  }
  if (!window.closed()) throw std::runtime_error("the measurement window never closed");
  if (!options.trace_prefix.empty()) {
    runtime.write_trace(options.trace_prefix + config.name + ".json");
  }

  ConfigResult result;
  result.config = config;
  result.window_seconds = seconds(window.close_at() - window.open_at());
  for (std::size_t i = 0; i < trainers.size(); ++i) {
    const Trainer& trainer = *trainers[i];
    JobResult job;
    job.name = trainer.shape().name;
    job.persistent_bytes = trainer.persistent_bytes();
    job.ephemeral_bytes = trainer.ephemeral_bytes();
    job.intact = trainer.weights_intact();
    std::array<double, kTierCount> peak_sum{};
    for (const IterationSample& sample : trainer.samples()) {
      if (sample.start < window.open_at() || sample.end > window.close_at()) continue;
      job.iteration_ms.push_back(seconds(sample.end - sample.start) * 1e3);
      for (std::size_t t = 0; t < kTierCount; ++t) {
        peak_sum[t] += static_cast<double>(sample.peak_by_tier[t]);
      }
    }
    for (std::size_t t = 0; t < kTierCount; ++t) {
      job.peak_by_tier_mib[t] = mib(peak_sum[t] / static_cast<double>(job.iteration_ms.size()));
    }
    const salus::JobMemoryStats& a = window.at_open(i);
    const salus::JobMemoryStats& b = window.at_close(i);
    job.delta = b;
    job.delta.activations = b.activations - a.activations;
    job.delta.activations_after_move = b.activations_after_move - a.activations_after_move;
    job.delta.activations_waited = b.activations_waited - a.activations_waited;
    job.delta.fetched_bytes = b.fetched_bytes - a.fetched_bytes;
    job.delta.prefetched_bytes = b.prefetched_bytes - a.prefetched_bytes;
    job.stats = trainers[i]->job().stats();
    result.jobs.push_back(std::move(job));
  }
  for (const salus::MoveRecord& record : moves) {
    if (record.finished < window.open_at() || record.finished > window.close_at()) continue;
    RouteTotal& route = result.routes[route_name(record)];
    route.bytes += record.bytes;
    route.seconds += record.seconds;
    ++route.rounds;
    route.bytes_by_reason[salus::to_string(record.reason)] += record.bytes;
  }
  return result;
}

// The run the others are compared with, when it was run.
const ConfigResult* no_spill(const std::vector<ConfigResult>& results) {
  for (const ConfigResult& r : results) {
    if (r.config.spill == salus::SpillPolicy::none) return &r;
  }
  return nullptr;
}

std::string fmt_share(std::optional<double> rate) {
  if (!rate) return "n/a";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f%%", *rate * 100.0);
  return buf;
}

void print(const std::vector<ConfigResult>& results, const Options& options) {
  const ConfigResult* base = no_spill(results);
  std::printf(
      "\nIteration time (a job's turn on GPU 0's lane, ms; window after %d warm-up "
      "iterations;\nround = window / the job's iterations in it)\n",
      options.warmup);
  std::printf("%-10s %-3s %6s %9s %8s %8s %10s   %s\n", "config", "job", "iters", "mean", "sd",
              "vs none", "round", "live MiB at fwd end (local/peer/host)");
  for (const ConfigResult& r : results) {
    for (std::size_t j = 0; j < r.jobs.size(); ++j) {
      const JobResult& job = r.jobs[j];
      const double ratio = base ? job.mean_ms() / base->jobs[j].mean_ms() : std::nan("");
      std::printf("%-10s %-3s %6zu %9.1f %8.1f %8.2f %10.1f   %.0f / %.0f / %.0f\n",
                  r.config.name.c_str(), job.name.c_str(), job.iteration_ms.size(), job.mean_ms(),
                  job.stddev_ms(), ratio,
                  r.window_seconds * 1e3 / static_cast<double>(job.iteration_ms.size()),
                  job.peak_by_tier_mib[0], job.peak_by_tier_mib[1], job.peak_by_tier_mib[2]);
    }
  }
  std::printf("\nPrefetch (activation counters over the window)\n");
  std::printf("%-10s %-3s %11s %10s %7s %9s %15s %13s %11s\n", "config", "job", "activations",
              "after_move", "waited", "hit rate", "prefetched MiB", "fetched MiB", "prefetched%");
  for (const ConfigResult& r : results) {
    for (const JobResult& job : r.jobs) {
      std::printf("%-10s %-3s %11llu %10llu %7llu %9s %15.0f %13.0f %11s\n", r.config.name.c_str(),
                  job.name.c_str(), static_cast<unsigned long long>(job.delta.activations),
                  static_cast<unsigned long long>(job.delta.activations_after_move),
                  static_cast<unsigned long long>(job.delta.activations_waited),
                  fmt_share(job.hit_rate()).c_str(),
                  mib(static_cast<double>(job.delta.prefetched_bytes)),
                  mib(static_cast<double>(job.delta.fetched_bytes)),
                  fmt_share(job.prefetched_share()).c_str());
    }
  }
  std::printf("\nPage moves over the window, by route (tiers seen from GPU 0)\n");
  std::printf("%-10s %-12s %7s %10s %10s %8s   %s\n", "config", "route", "rounds", "MiB",
              "MiB/turn", "GB/s", "MiB by reason");
  for (const ConfigResult& r : results) {
    if (r.routes.empty()) {
      std::printf("%-10s (no moves)\n", r.config.name.c_str());
      continue;
    }
    // Per turn of X, the job whose turns pace the window.
    const double turns = static_cast<double>(r.jobs.front().iteration_ms.size());
    for (const auto& [name, route] : r.routes) {
      std::string reasons;
      for (const auto& [reason, bytes] : route.bytes_by_reason) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%s%s %.0f", reasons.empty() ? "" : ", ", reason.c_str(),
                      mib(static_cast<double>(bytes)));
        reasons += buf;
      }
      std::printf("%-10s %-12s %7llu %10.0f %10.1f %8.3f   %s\n", r.config.name.c_str(),
                  name.c_str(), static_cast<unsigned long long>(route.rounds),
                  mib(static_cast<double>(route.bytes)),
                  mib(static_cast<double>(route.bytes)) / turns,
                  static_cast<double>(route.bytes) / route.seconds / 1e9, reasons.c_str());
    }
  }
  for (const ConfigResult& r : results) {
    for (const JobResult& job : r.jobs) {
      if (!job.intact) {
        std::printf("\nERROR: %s's weights changed in %s\n", job.name.c_str(),
                    r.config.name.c_str());
      }
    }
  }
}

Json to_json(const std::vector<ConfigResult>& results, const Options& options,
             const std::vector<Shape>& shapes) {
  Json out;
  out["options"] = {{"iterations", options.iterations},
                    {"warmup", options.warmup},
                    {"gpu_mib", options.gpu_mib},
                    {"scale", options.scale},
                    {"compute_scale", options.compute_scale},
                    {"nvlink_gbps_simulated", options.nvlink_gbps / options.scale},
                    {"host_link_gbps_simulated", options.host_gbps / options.scale},
                    {"page_bytes", kPage}};
  for (const Shape& shape : shapes) {
    out["jobs"].push_back({{"name", shape.name},
                           {"persistent_fraction", shape.persistent},
                           {"ephemeral_fraction", shape.ephemeral},
                           {"layers", shape.layers},
                           {"forward_ms_per_layer", shape.forward_ms}});
  }
  const ConfigResult* base = no_spill(results);
  for (const ConfigResult& r : results) {
    Json config{{"name", r.config.name},
                {"spill", salus::to_string(r.config.spill)},
                {"gpu0_limit_mib", r.config.gpu0_bytes / MiB},
                {"window_seconds", r.window_seconds}};
    for (std::size_t j = 0; j < r.jobs.size(); ++j) {
      const JobResult& job = r.jobs[j];
      const auto rate = job.hit_rate();
      config["jobs"].push_back(
          {{"name", job.name},
           {"persistent_mib", mib(static_cast<double>(job.persistent_bytes))},
           {"ephemeral_peak_mib", mib(static_cast<double>(job.ephemeral_bytes))},
           {"iterations", job.iteration_ms.size()},
           {"iteration_ms", job.iteration_ms},
           {"mean_ms", job.mean_ms()},
           {"stddev_ms", job.stddev_ms()},
           {"ratio_to_no_spill",
            base ? Json(job.mean_ms() / base->jobs[j].mean_ms()) : Json(nullptr)},
           {"live_mib_at_forward_end_by_tier",
            {{"local", job.peak_by_tier_mib[0]},
             {"peer", job.peak_by_tier_mib[1]},
             {"host", job.peak_by_tier_mib[2]}}},
           {"activations", job.delta.activations},
           {"activations_after_move", job.delta.activations_after_move},
           {"activations_waited", job.delta.activations_waited},
           {"prefetch_hit_rate", rate ? Json(*rate) : Json(nullptr)},
           {"prefetched_share_of_bytes_home",
            job.prefetched_share() ? Json(*job.prefetched_share()) : Json(nullptr)},
           {"prefetched_bytes", job.delta.prefetched_bytes},
           {"fetched_bytes", job.delta.fetched_bytes},
           {"attained_seconds_total", job.stats.attained_seconds},
           {"iterations_total", job.stats.iterations},
           {"weights_intact", job.intact}});
    }
    for (const auto& [name, route] : r.routes) {
      config["moves"][name] = {{"bytes", route.bytes},
                               {"seconds", route.seconds},
                               {"rounds", route.rounds},
                               {"gbps", static_cast<double>(route.bytes) / route.seconds / 1e9},
                               {"bytes_by_reason", route.bytes_by_reason}};
    }
    out["configs"].push_back(std::move(config));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app{"Salus memory harvesting study: two co-located jobs, spilling to peers or host"};
  app.add_option("--iterations", options.iterations,
                 "iterations of each job inside the measurement window")
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup", options.warmup, "iterations of each job before the window opens")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--gpu-mib", options.gpu_mib, "GPU 0's memory (MiB) in the spilling runs")
      ->check(CLI::Range(64, 4096));
  app.add_option("--scale", options.scale,
                 "time scale: simulated link bandwidths are the real ones divided by this")
      ->check(CLI::PositiveNumber);
  app.add_option("--compute-scale", options.compute_scale,
                 "multiply every layer's compute time (1: the iteration is mostly memory traffic)")
      ->check(CLI::PositiveNumber);
  app.add_option("--nvlink-gbps", options.nvlink_gbps, "real NVLink bandwidth (GB/s)")
      ->check(CLI::PositiveNumber);
  app.add_option("--host-gbps", options.host_gbps, "real host link bandwidth (GB/s)")
      ->check(CLI::PositiveNumber);
  app.add_option("--json", options.json_path, "write the results as JSON to this path");
  app.add_option("--trace", options.trace_prefix,
                 "write each configuration's Chrome trace to <prefix><config>.json");
  app.add_option("--configs", options.configs,
                 "configurations to run (the others are compared with no-spill)")
      ->check(CLI::IsMember({"no-spill", "host-only", "peer-first"}));
  app.add_flag("--verbose", options.verbose, "print every iteration as it ends");
  app.add_flag("!--direct-allocate", options.job_allocate,
               "allocate activations straight through the MemoryManager (charged to the job but "
               "not seen by the scheduler's profiler) instead of Job::allocate");
  CLI11_PARSE(app, argc, argv);

  // X's working set is 1.3x GPU 0; with Y's, 1.7x. Compute per layer is fixed (simulated time).
  std::vector<Shape> shapes{{"X", 0.6, 0.7, 8, 4.0}, {"Y", 0.2, 0.2, 4, 3.0}};
  for (Shape& shape : shapes) shape.forward_ms *= options.compute_scale;
  const std::size_t gpu_bytes = options.gpu_mib * MiB;
  const std::vector<Config> known{
      {"no-spill", salus::SpillPolicy::none, 2 * gpu_bytes},
      {"host-only", salus::SpillPolicy::host_only, gpu_bytes},
      {"peer-first", salus::SpillPolicy::peer_then_host, gpu_bytes},
  };
  std::vector<Config> configs;
  for (const Config& config : known) {
    if (std::ranges::find(options.configs, config.name) != options.configs.end()) {
      configs.push_back(config);
    }
  }
  std::printf("GPU 0: %zu MiB (no-spill run: %zu MiB); GPUs 1-3 idle lenders of %zu MiB each\n",
              options.gpu_mib, 2 * options.gpu_mib, options.gpu_mib);
  std::printf(
      "links: NVLink %.3f GB/s, host %.3f GB/s (real %.0f and %.0f GB/s / scale %.0f); "
      "local copies unthrottled; pages %zu MiB\n",
      options.nvlink_gbps / options.scale, options.host_gbps / options.scale, options.nvlink_gbps,
      options.host_gbps, options.scale, kPage / MiB);
  for (const Shape& s : shapes) {
    std::printf(
        "job %s: persistent %.2fx, ephemeral peak %.2fx of GPU 0, %d layers, %.1f ms "
        "forward + %.1f ms backward compute per layer\n",
        s.name.c_str(), s.persistent, s.ephemeral, s.layers, s.forward_ms, 2 * s.forward_ms);
  }
  std::vector<ConfigResult> results;
  try {
    for (const Config& config : configs) {
      const auto start = Clock::now();
      results.push_back(run_config(options, config, shapes));
      std::printf("ran %s in %.1f s\n", config.name.c_str(), seconds(Clock::now() - start));
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "salus_harvest_study: %s\n", e.what());
    return 1;
  }
  print(results, options);
  if (!options.json_path.empty()) {
    std::ofstream out(options.json_path);
    out << to_json(results, options, shapes).dump(2) << '\n';
    if (!out) {
      std::fprintf(stderr, "salus_harvest_study: cannot write %s\n", options.json_path.c_str());
      return 1;
    }
  }
  for (const ConfigResult& r : results) {
    for (const JobResult& job : r.jobs) {
      if (!job.intact) return 1;
    }
  }
  return 0;
}
