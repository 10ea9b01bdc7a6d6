// Allocation traces recorded from PyTorch training loops (benchmarks/traces/record_alloc_trace.py,
// whose docstring gives the format), and their replay through Salus on one simulated GPU: through
// a MemoryManager (one job, the default stream), or through a Runtime the way a framework does it
// (one job, one Salus iteration per training step). Shared by benchmarks/trace_replay.cpp and
// tests/test_alloc_traces.cpp; header-only, so that neither needs a library of its own.
//
// A replay reports what issue 19 asks of a trace: peak reserved over peak live, and the driver
// calls (page maps and unmaps, chunk creates and releases) of each iteration, so that a steady
// state that churns shows up. The steady state is the second half of the iterations (the last 4
// of 8): the first makes the optimizer state, the second frees the first gradients, and what
// pages move settles within a few more.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "salus/device.hpp"
#include "salus/memory.hpp"
#include "salus/runtime.hpp"

namespace salus::alloc_trace {

namespace fs = std::filesystem;

struct Op {
  enum class Kind : std::uint8_t { allocate, free, end_setup, end_iteration };
  Kind kind = Kind::allocate;
  // Allocations that outlive the iteration they were made in, and those of the setup.
  bool persistent = false;
  std::uint32_t id = 0;
  std::size_t bytes = 0;
};

struct Trace {
  std::vector<Op> ops;
  std::size_t ids = 0;
  std::size_t allocations = 0;
  std::size_t frees = 0;
  std::size_t iterations = 0;
  std::size_t peak_live = 0;  // requested bytes
};

// $SALUS_TRACE_DIR if set, else `beside` (benchmarks/traces, found by the caller from its own
// __FILE__ at compile time) when it exists, else ./benchmarks/traces.
inline fs::path trace_dir(const fs::path& beside) {
  if (const char* env = std::getenv("SALUS_TRACE_DIR"); env != nullptr && *env != '\0') {
    return env;
  }
  if (fs::is_directory(beside)) return beside;
  return fs::path("benchmarks") / "traces";
}

// Parses a trace; returns an error message instead when the file is missing or malformed.
inline std::variant<Trace, std::string> load(const fs::path& path) {
  std::ifstream in(path);
  if (!in) {
    return "trace file " + path.string() +
           " not found; record it with benchmarks/traces/record_alloc_trace.py or set "
           "SALUS_TRACE_DIR";
  }
  Trace trace;
  // The iteration each allocation was made in (-1: the setup) and its op.
  std::vector<std::ptrdiff_t> alloc_iteration;
  std::vector<std::size_t> alloc_op;
  std::vector<std::size_t> bytes_of;
  std::vector<bool> live;
  std::size_t live_bytes = 0;
  std::ptrdiff_t iteration = 0;
  bool setup_ended = false;
  std::string line;
  std::size_t line_no = 0;
  auto bad = [&](const std::string& why) {
    return path.string() + ":" + std::to_string(line_no) + ": " + why;
  };
  // A trace with an 's' line starts in its setup; one without starts in its first iteration.
  {
    std::ifstream scan(path);
    std::string l;
    while (std::getline(scan, l)) {
      if (l == "s") {
        iteration = -1;
        break;
      }
    }
  }
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    char kind = 0;
    fields >> kind;
    if (kind == 's') {
      if (setup_ended || iteration != -1) return bad("'s' must come once, before any 'i'");
      setup_ended = true;
      iteration = 0;
      trace.ops.push_back({.kind = Op::Kind::end_setup});
      continue;
    }
    if (kind == 'i') {
      if (iteration < 0) return bad("'i' before the end of the setup");
      trace.ops.push_back({.kind = Op::Kind::end_iteration});
      ++trace.iterations;
      ++iteration;
      continue;
    }
    std::uint64_t id = 0;
    if (!(fields >> id)) return bad("expected an id");
    if (kind == 'a') {
      std::size_t bytes = 0;
      if (!(fields >> bytes) || bytes == 0) return bad("expected a positive size");
      if (id != alloc_op.size()) return bad("ids must be dense, in allocation order");
      alloc_iteration.push_back(iteration);
      alloc_op.push_back(trace.ops.size());
      bytes_of.push_back(bytes);
      live.push_back(true);
      trace.ops.push_back({.kind = Op::Kind::allocate,
                           .persistent = true,  // until a free in the same iteration says not
                           .id = static_cast<std::uint32_t>(id),
                           .bytes = bytes});
      ++trace.allocations;
      live_bytes += bytes;
      trace.peak_live = std::max(trace.peak_live, live_bytes);
    } else if (kind == 'f') {
      if (id >= live.size() || !live[id]) return bad("free of an id that is not live");
      live[id] = false;
      live_bytes -= bytes_of[id];
      if (iteration >= 0 && alloc_iteration[id] == iteration) {
        trace.ops[alloc_op[id]].persistent = false;
      }
      trace.ops.push_back(
          {.kind = Op::Kind::free, .id = static_cast<std::uint32_t>(id), .bytes = bytes_of[id]});
      ++trace.frees;
    } else {
      return bad("unknown event '" + std::string(1, kind) + "'");
    }
  }
  trace.ids = alloc_op.size();
  if (trace.allocations == 0) return path.string() + ": no allocations";
  return trace;
}

// Driver calls the device saw: page maps and unmaps, chunk creates and releases.
struct DriverCalls {
  std::uint64_t maps = 0;
  std::uint64_t unmaps = 0;
  std::uint64_t creates = 0;
  std::uint64_t releases = 0;

  static DriverCalls of(const DeviceMemoryStats& s) {
    return {s.page_maps, s.page_unmaps, s.chunk_creates, s.chunk_releases};
  }
  [[nodiscard]] DriverCalls since(const DriverCalls& before) const {
    return {maps - before.maps, unmaps - before.unmaps, creates - before.creates,
            releases - before.releases};
  }
  [[nodiscard]] std::uint64_t total() const { return maps + unmaps + creates + releases; }
};

struct Report {
  std::size_t peak_live = 0;       // requested bytes, from the trace
  std::size_t peak_allocated = 0;  // block bytes (requests rounded up)
  std::size_t peak_reserved = 0;   // physical pages held
  std::size_t granularity = 0;
  std::vector<DriverCalls> per_iteration;  // each iteration's calls (the setup's are not in any)
  double seconds = 0.0;                    // the replay alone, not building the manager

  [[nodiscard]] double reserved_over_live() const {
    return static_cast<double>(peak_reserved) / static_cast<double>(peak_live);
  }
  // The best any 2 MiB-page allocator can do: ceil(peak live / page) pages over peak live.
  [[nodiscard]] double page_floor() const {
    const std::size_t pages = (peak_live + granularity - 1) / granularity;
    return static_cast<double>(pages * granularity) / static_cast<double>(peak_live);
  }
  // The most driver calls of any iteration of the steady state: the last half (rounded down).
  [[nodiscard]] DriverCalls steady_state_max() const {
    DriverCalls most;
    for (std::size_t i = (per_iteration.size() + 1) / 2; i < per_iteration.size(); ++i) {
      const DriverCalls& c = per_iteration[i];
      most.maps = std::max(most.maps, c.maps);
      most.unmaps = std::max(most.unmaps, c.unmaps);
      most.creates = std::max(most.creates, c.creates);
      most.releases = std::max(most.releases, c.releases);
    }
    return most;
  }
};

namespace detail {

// Replays `trace` with `alloc(op)`, `free(ptr)`, `end_setup()`, `end_iteration()` and
// `stats()`, counting driver calls per iteration.
template <class Alloc, class Free, class EndSetup, class EndIteration, class Stats>
Report replay(const Trace& trace, Alloc&& alloc, Free&& free, EndSetup&& end_setup,
              EndIteration&& end_iteration, Stats&& stats) {
  std::vector<DevicePtr> ptrs(trace.ids, 0);
  Report report;
  report.peak_live = trace.peak_live;
  report.per_iteration.reserve(trace.iterations);
  DriverCalls before = DriverCalls::of(stats());
  const auto start = std::chrono::steady_clock::now();
  std::chrono::steady_clock::duration counting{};  // time spent reading counters, not replaying
  auto mark = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    const DriverCalls now = DriverCalls::of(stats());
    counting += std::chrono::steady_clock::now() - t0;
    return now;
  };
  for (const Op& op : trace.ops) {
    switch (op.kind) {
      case Op::Kind::allocate:
        ptrs[op.id] = alloc(op);
        break;
      case Op::Kind::free:
        free(ptrs[op.id]);
        ptrs[op.id] = 0;
        break;
      case Op::Kind::end_setup:
        end_setup();
        before = mark();
        break;
      case Op::Kind::end_iteration: {
        end_iteration();
        const DriverCalls now = mark();
        report.per_iteration.push_back(now.since(before));
        before = now;
        break;
      }
    }
  }
  report.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start - counting).count();
  const DeviceMemoryStats s = stats();
  report.peak_allocated = s.peak_allocated;
  report.peak_reserved = s.peak_reserved;
  report.granularity = s.granularity;
  return report;
}

}  // namespace detail

// A GPU that runs one iteration behind the host, as a training loop's GPU does: each iteration's
// work on `stream` is held back by a host function until the host has finished enqueueing it, and
// the next iteration starts once it has run. So while the host is in iteration k, fences taken in
// iteration k are pending and those of iteration k - 1 have completed: reusing a freed page at
// another address must wait for (or keep the old address until) work that has not run yet.
class LaggingStream {
 public:
  LaggingStream(DeviceBackend& backend, StreamHandle stream) : backend_(backend), stream_(stream) {
    hold();
  }
  LaggingStream(const LaggingStream&) = delete;
  LaggingStream& operator=(const LaggingStream&) = delete;
  ~LaggingStream() {
    held_->open();
    backend_.synchronize_stream(stream_);
  }
  // The iteration's work is all enqueued: it runs now, the next one is held back.
  void end_iteration() {
    auto ran = std::make_shared<Gate>();
    backend_.launch_host_func(stream_, [ran] { ran->open(); });
    std::shared_ptr<Gate> previous = held_;
    hold();
    previous->open();
    ran->wait();
  }

 private:
  struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    bool is_open = false;
    void open() {
      {
        std::lock_guard lock(mu);
        is_open = true;
      }
      cv.notify_all();
    }
    void wait() {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return is_open; });
    }
    // The GPU does not wait for the host forever: an allocation that waits on the host for work
    // held back here (DeviceMemoryStats::allocation_waits) goes on after `limit`.
    void wait_at_most(std::chrono::milliseconds limit) {
      std::unique_lock lock(mu);
      cv.wait_for(lock, limit, [&] { return is_open; });
    }
  };
  void hold() {
    held_ = std::make_shared<Gate>();
    backend_.launch_host_func(stream_,
                              [gate = held_] { gate->wait_at_most(std::chrono::seconds(1)); });
  }
  DeviceBackend& backend_;
  StreamHandle stream_;
  std::shared_ptr<Gate> held_;
};

// One job on `stream` (the default stream unless given) of `manager`'s device 0. Allocations
// freed within their iteration are ephemeral, the rest persistent (the trace knows which), with
// promote_ephemeral at each iteration end, as the runtime does. With `lag`, the stream runs one
// iteration behind (LaggingStream). What lives at the end of the trace stays the job's.
inline Report replay_with_manager(const Trace& trace, MemoryManager& manager, JobId job,
                                  StreamHandle stream = {}, LaggingStream* lag = nullptr) {
  return detail::replay(
      trace,
      [&](const Op& op) {
        return manager.allocate(
            {.bytes = op.bytes,
             .device = 0,
             .stream = stream,
             .job = job,
             .lifetime = op.persistent ? Lifetime::persistent : Lifetime::ephemeral});
      },
      [&](DevicePtr ptr) { manager.deallocate(ptr); }, [] {},
      [&] {
        manager.promote_ephemeral(job);
        if (lag != nullptr) lag->end_iteration();
      },
      [&] { return manager.device_stats(0); });
}

// The way a framework replays a trace through the runtime (the C ABI's salus_job_begin_iteration
// and salus_job_allocate do the same): one job, the setup outside any iteration (persistent),
// each training step one Salus iteration whose allocations are ephemeral; survivors are promoted
// at its end. The job's blocks live on its lane's stream.
inline Report replay_with_runtime(const Trace& trace, Runtime& runtime, Job& job) {
  bool in_iteration = false;
  auto begin = [&] {
    if (!in_iteration) {
      (void)job.begin_iteration();
      in_iteration = true;
    }
  };
  // The setup runs outside any iteration; each step's first event opens its iteration.
  bool setup = std::any_of(trace.ops.begin(), trace.ops.end(),
                           [](const Op& op) { return op.kind == Op::Kind::end_setup; });
  Report report = detail::replay(
      trace,
      [&](const Op& op) {
        if (!setup) begin();
        return job.allocate(op.bytes);
      },
      [&](DevicePtr ptr) {
        if (!setup) begin();
        job.deallocate(ptr);
      },
      [&] { setup = false; },
      [&] {
        begin();  // an iteration with no event is still one
        job.end_iteration();
        in_iteration = false;
      },
      [&] { return runtime.memory().device_stats(0); });
  return report;
}

// What the last pass of replay_passes shows a caller: the span of each steady iteration's
// allocations and frees, between its begin_iteration and its end_iteration.
struct SteadyHooks {
  std::function<void()> inside_begins;  // an iteration has begun: its allocations come next
  std::function<void()> inside_ends;    // its last free is done: end_iteration comes next
  // Iterations of the last pass left uncounted: they make the weights and the optimizer's
  // state again (the steady state begins after them).
  std::size_t skip_iterations = 2;
};

// Runs `trace` through `job` `passes` times, as the same training program run again in one
// process: each pass makes its setup and iterations anew, and what a pass left live is freed
// before the next one. The earlier passes map what the job needs; `hooks` see the steady
// iterations of the last one.
inline void replay_passes(const Trace& trace, Job& job, int passes, const SteadyHooks& hooks) {
  const bool has_setup = std::any_of(trace.ops.begin(), trace.ops.end(),
                                     [](const Op& op) { return op.kind == Op::Kind::end_setup; });
  for (int pass = 0; pass < passes; ++pass) {
    const bool last = pass + 1 == passes;
    std::vector<DevicePtr> ptrs(trace.ids, 0);
    bool setup = has_setup;
    bool inside = false;
    std::size_t iteration = 0;
    const auto counted = [&] { return last && iteration >= hooks.skip_iterations; };
    const auto begin = [&] {
      if (inside) return;
      (void)job.begin_iteration();
      inside = true;
      if (counted() && hooks.inside_begins) hooks.inside_begins();
    };
    for (const Op& op : trace.ops) {
      switch (op.kind) {
        case Op::Kind::allocate:
          if (!setup) begin();
          ptrs[op.id] = job.allocate(op.bytes);
          break;
        case Op::Kind::free:
          if (!setup) begin();
          job.deallocate(std::exchange(ptrs[op.id], 0));
          break;
        case Op::Kind::end_setup:
          setup = false;
          break;
        case Op::Kind::end_iteration:
          begin();  // an iteration with no event is still one
          if (counted() && hooks.inside_ends) hooks.inside_ends();
          job.end_iteration();
          inside = false;
          ++iteration;
          break;
      }
    }
    for (DevicePtr& ptr : ptrs) {
      if (ptr != 0) job.deallocate(std::exchange(ptr, 0));
    }
  }
}

}  // namespace salus::alloc_trace
