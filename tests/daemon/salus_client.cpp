// A client process for the salusd tests: connects, adds one job, runs iterations that allocate,
// write a pattern through work queued on its stream, free on the host while that work is still
// queued, and check every byte afterwards. It writes one line per event to --log, so that the test
// can tell when its iterations ran (and kill it at a chosen moment).
//
//   salus_client --socket S --name N [--iterations K] [--persistent-mib P] [--ephemeral-mib E]
//                [--priority Q] [--iteration-ms T] [--late-fill-ms L] [--gpu-log 1] --log FILE
// --late-fill-ms: each iteration ends with a block freed while its fill is still queued behind an
// L ms pause, so that its pages go to the next process under work (behind an interprocess fence).
// --check-at-begin 0: the weights are checked at the end only, so that an iteration's first
// allocations come before its stream has drained (the turn's wait for the previous process's
// work included).
// --gpu-log 1: also "gpu-begin K" and "gpu-end K" lines, written when the iteration's stream
// reaches its start and its end (host functions queued there).
// --linger-on-error-ms: after an error, waits this long before exiting, holding its memory.
// Exit status: 0 all iterations done and every byte checked; 2 a byte was wrong; 3 an error
// (its message on stderr and in the log as "error <code> <text>").
#include <fmt/format.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>
#include <deque>
#include <algorithm>

#include "salus/runtime.hpp"
#include "salus/remote.hpp"
#include "salus/sim.hpp"

namespace {

struct Args {
  std::string socket, name = "client", log;
  int iterations = 5, priority = 0, iteration_ms = 20;
  std::size_t persistent_mib = 4, ephemeral_mib = 8;
  bool weights_in_iteration = false;  // made in the first iteration (as optimizer state is)
  bool empty = false;  // iterations that do nothing: turns only (the switch benchmark's partner)
  int late_fill_ms = 0;
  bool gpu_log = false;  // also log when each iteration's work starts and ends on its stream
  int hold_ms = 0;
  // A simulated kernel this long ends each iteration's work on its stream. With --empty 1 it is
  // an iteration's only work, and the client waits for it after the turn has gone back.
  int kernel_ms = 0;  // after the last iteration, before leaving: the job stays in salusd's table
  bool check_at_begin = true;  // check the weights as each iteration begins (waits for its stream)
  // After an error, this long before exiting, holding what it holds (as a Python script unwinds).
  int linger_on_error_ms = 0;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--socket") a.socket = v;
    else if (k == "--name") a.name = v;
    else if (k == "--log") a.log = v;
    else if (k == "--iterations") a.iterations = std::stoi(v);
    else if (k == "--priority") a.priority = std::stoi(v);
    else if (k == "--iteration-ms") a.iteration_ms = std::stoi(v);
    else if (k == "--persistent-mib") a.persistent_mib = std::stoul(v);
    else if (k == "--ephemeral-mib") a.ephemeral_mib = std::stoul(v);
    else if (k == "--weights-in-iteration") a.weights_in_iteration = v == "1";
    else if (k == "--empty") a.empty = v == "1";
    else if (k == "--late-fill-ms") a.late_fill_ms = std::stoi(v);
    else if (k == "--gpu-log") a.gpu_log = v == "1";
    else if (k == "--check-at-begin") a.check_at_begin = v == "1";
    else if (k == "--hold-ms") a.hold_ms = std::stoi(v);
    else if (k == "--kernel-ms") a.kernel_ms = std::stoi(v);
    else if (k == "--linger-on-error-ms") a.linger_on_error_ms = std::stoi(v);
  }
  return a;
}

double now_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

std::FILE* g_log = nullptr;
void note(const std::string& line) {
  std::fprintf(g_log, "%.6f %s\n", now_seconds(), line.c_str());
  std::fflush(g_log);
}

// The pattern repeats every kTile bytes: a fill writes one tile and copies it across the block.
constexpr std::size_t kTile = 64 * 1024;

unsigned char pattern(unsigned seed, std::size_t i) {
  return static_cast<unsigned char>((seed * 131u + (i % kTile) * 7u) & 0xff);
}

// The job's bytes, written and read the same way on both backends. A fill is work queued on the
// stream (a 2 ms pause, the pattern's first tile, then copies that double it across the block),
// so that the host can free a block while its fill is still queued. Only the first tile crosses
// from the host: on the simulated GPU, whose memory is the host's, a host function writes it; on
// CUDA a copy from a host buffer does (small, so the driver stages it at once). A check reads the
// block back once its stream has drained.
class Bytes {
 public:
  explicit Bytes(salus::Runtime& rt) : rt_(rt), host_view_(rt.backend().name() == "sim") {}

  void fill(salus::StreamHandle s, salus::DevicePtr p, std::size_t n, unsigned seed) {
    salus::DeviceBackend& b = rt_.backend();
    const std::size_t first = std::min(n, kTile);
    b.launch_host_func(s, [] { std::this_thread::sleep_for(std::chrono::milliseconds(2)); });
    if (host_view_) {
      b.launch_host_func(s, [p, first, seed] {
        auto* bytes = reinterpret_cast<unsigned char*>(p);
        for (std::size_t i = 0; i < first; ++i) bytes[i] = pattern(seed, i);
      });
    } else {
      auto& tile = tiles_.emplace_back(first);
      for (std::size_t i = 0; i < first; ++i) tile[i] = pattern(seed, i);
      b.copy_async(p, reinterpret_cast<salus::DevicePtr>(tile.data()), first, s);
    }
    for (std::size_t done = first; done < n; done *= 2) {
      b.copy_async(p + done, p, std::min(done, n - done), s);
    }
  }

  // Waits for the stream, then compares [p, p + n) with the pattern.
  bool check(salus::StreamHandle s, salus::DevicePtr p, std::size_t n, unsigned seed) {
    salus::DeviceBackend& b = rt_.backend();
    b.synchronize_stream(s);
    tiles_.clear();  // no copy reads them any more
    const unsigned char* bytes = reinterpret_cast<const unsigned char*>(p);
    std::vector<unsigned char> back;
    if (!host_view_) {
      back.resize(n);
      b.copy_async(reinterpret_cast<salus::DevicePtr>(back.data()), p, n, s);
      b.synchronize_stream(s);
      bytes = back.data();
    }
    for (std::size_t i = 0; i < n; ++i) {
      if (bytes[i] != pattern(seed, i)) return false;
    }
    return true;
  }

 private:
  salus::Runtime& rt_;
  const bool host_view_;
  std::deque<std::vector<unsigned char>> tiles_;  // host tiles that queued copies may still read
};

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  g_log = std::fopen(a.log.c_str(), "a");
  if (g_log == nullptr) return 3;
  constexpr std::size_t MiB = 1 << 20;
  try {
    auto rt = salus::connect_runtime(a.socket);
    note("connected");
    salus::JobSpec spec;
    spec.name = a.name;
    spec.priority = a.priority;
    salus::Job job = rt->add_job(spec);
    // An error from here on is caught while the job and its runtime still hold their memory.
    try {
    if (a.empty) {
      for (int it = 0; it < a.iterations; ++it) {
        const salus::StreamHandle s = job.begin_iteration();
        if (a.kernel_ms > 0) salus::launch_sim_kernel(rt->backend(), s, 0, a.kernel_ms / 1000.0);
        job.end_iteration();
        if (a.kernel_ms > 0) rt->backend().synchronize_stream(s);
      }
      if (a.hold_ms > 0) {
        note("holding");
        std::this_thread::sleep_for(std::chrono::milliseconds(a.hold_ms));
      }
      note("done");
      return 0;
    }
    // Persistent state, filled once and checked at the end: made before the first iteration, or
    // in it (where it takes a turn: memory the other processes give up for it).
    unsigned seed = static_cast<unsigned>(::getpid());
    const std::size_t weight_bytes = a.persistent_mib * MiB;
    Bytes bytes(*rt);
    // Outside iterations the client's own stream fills and checks the weights.
    const salus::StreamHandle side = rt->backend().create_stream(0, 0);
    salus::DevicePtr weights = 0;
    auto make_weights = [&] {
      weights = job.allocate(weight_bytes, salus::Lifetime::persistent);
      bytes.fill(side, weights, weight_bytes, seed);
      rt->backend().synchronize_stream(side);
    };
    if (!a.weights_in_iteration) make_weights();
    for (int it = 0; it < a.iterations; ++it) {
      const salus::StreamHandle s = job.begin_iteration();
      note(fmt::format("begin {}", it));
      if (a.gpu_log) rt->backend().launch_host_func(s, [it] { note(fmt::format("gpu-begin {}", it)); });
      if (weights == 0) make_weights();
      // The weights must be intact at every turn, wherever their pages spent the wait.
      if (a.check_at_begin && !bytes.check(s, weights, weight_bytes, seed)) {
        note(fmt::format("corrupt weights at {}", it));
        return 2;
      }
      // Ephemeral: two halves live at once (the iteration's peak); the first is freed with its
      // fill still queued and its space taken again at once by a third block, whose fill is
      // ordered behind the first's on the stream. Both survivors are checked once it has run.
      const std::size_t half = a.ephemeral_mib * MiB / 2;
      note(fmt::format("weights checked {}", it));
      const salus::DevicePtr first = job.allocate(half);
      bytes.fill(s, first, half, seed + 1000);
      const salus::DevicePtr act = job.allocate(half);
      bytes.fill(s, act, half, seed + it);
      job.deallocate(first);  // its fill is still queued
      const salus::DevicePtr again = job.allocate(half);
      bytes.fill(s, again, half, seed + 2000 + it);
      bytes.fill(s, weights, weight_bytes, seed);
      note(fmt::format("filled {}", it));
      std::this_thread::sleep_for(std::chrono::milliseconds(a.iteration_ms));
      if (!bytes.check(s, act, half, seed + it) || !bytes.check(s, again, half, seed + 2000 + it)) {
        note("corrupt activation");
        return 2;
      }
      job.deallocate(act);
      job.deallocate(again);
      if (a.late_fill_ms > 0) {
        // Freed with its fill still queued, and the turn ends without waiting for it.
        const salus::DevicePtr late = job.allocate(half);
        rt->backend().launch_host_func(s, [ms = a.late_fill_ms] {
          std::this_thread::sleep_for(std::chrono::milliseconds(ms));
        });
        bytes.fill(s, late, half, seed + 3000 + it);
        job.deallocate(late);
      }
      if (a.kernel_ms > 0) salus::launch_sim_kernel(rt->backend(), s, 0, a.kernel_ms / 1000.0);
      if (a.gpu_log) rt->backend().launch_host_func(s, [it] { note(fmt::format("gpu-end {}", it)); });
      note(fmt::format("end {}", it));
      job.end_iteration();
    }
    if (!bytes.check(side, weights, weight_bytes, seed)) {
      note("corrupt weights");
      return 2;
    }
    if (a.hold_ms > 0) {
      note("holding");
      std::this_thread::sleep_for(std::chrono::milliseconds(a.hold_ms));
    }
    const salus::JobStats stats = job.stats();
    note(fmt::format("moves fetched {} activations_after_move {}", stats.memory.fetched_bytes,
                     stats.memory.activations_after_move));
    job.deallocate(weights);
    rt->backend().destroy_stream(side);
    note("done");
    return 0;
    } catch (const salus::Error& e) {
      note(fmt::format("error {} {}", salus::to_string(e.code()), e.what()));
      std::fprintf(stderr, "salus_client %s: %s\n", a.name.c_str(), e.what());
      std::this_thread::sleep_for(std::chrono::milliseconds(a.linger_on_error_ms));
      return 3;
    }
  } catch (const salus::Error& e) {
    note(fmt::format("error {} {}", salus::to_string(e.code()), e.what()));
    std::fprintf(stderr, "salus_client %s: %s\n", a.name.c_str(), e.what());
    return 3;
  }
}
