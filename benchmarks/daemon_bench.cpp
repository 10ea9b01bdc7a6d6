// salusd against the in-process runtime, side by side in one run (issue 22):
//  - BM_TurnPair_*: one round of turns between two jobs that both always want the GPU: A ends its
//    iteration, B (blocked) gets its turn and ends it, A's begin returns. Two switches and B's
//    empty iteration; the time per round is reported. In-process: two threads of one runtime.
//    Processes: A here, B a salus_client process, both connected to a salusd. Pipe: the least
//    two processes can take to hand a turn there and back (a byte each way over two pipes).
//  - BM_PageBatch: a batch of 16 pages from salusd and back (export, SCM_RIGHTS, import not
//    included: the client's link only).
//  - BM_AllocFreePair_*: a 64 KiB block allocated and freed by a job, in a connected runtime and
//    in an in-process one: the fast path, which must make no round trip.
#include <benchmark/benchmark.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "remote/daemon_link.hpp"
#include "salus/runtime.hpp"
#include "salus/remote.hpp"
#include "salus/sim.hpp"

namespace {

pid_t spawn(std::vector<std::string> argv) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  return pid;
}

// A salusd of its own for one benchmark, on a socket of its own; stopped at the end.
class Daemon {
 public:
  Daemon() : socket_("/tmp/salus-bench-" + std::to_string(::getpid()) + ".sock") {
    pid_ = spawn({SALUSD_PATH, "--socket", socket_, "--backend", "sim", "--memory", "1GiB",
                  "--policy", "fair", "--log-level", "error"});
    struct stat st {};
    while (::stat(socket_.c_str(), &st) != 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ~Daemon() {
    ::kill(pid_, SIGTERM);
    ::waitpid(pid_, nullptr, 0);
  }
  const std::string& socket() const { return socket_; }

 private:
  std::string socket_;
  pid_t pid_ = 0;
};

salus::JobSpec job_named(const char* name) {
  salus::JobSpec spec;
  spec.name = name;
  return spec;
}

void BM_TurnPair_inprocess(benchmark::State& state) {
  salus::RuntimeOptions options;
  options.policy = "fair";
  salus::Runtime runtime(salus::make_sim_backend(salus::SimConfig::uniform(1, salus::GiB)),
                         std::move(options));
  salus::Job a = runtime.add_job(job_named("A"));
  salus::Job b = runtime.add_job(job_named("B"));
  std::atomic<bool> stop{false};
  std::thread other([&] {
    while (!stop.load()) {
      try {
        (void)b.begin_iteration();
        b.end_iteration();
      } catch (const salus::Error&) {
        return;  // cancelled at the end
      }
    }
  });
  while (b.stats().state != salus::JobState::waiting) std::this_thread::yield();
  for (auto _ : state) {
    (void)a.begin_iteration();
    a.end_iteration();
  }
  stop.store(true);
  b.cancel();
  other.join();
}

void BM_TurnPair_processes(benchmark::State& state) {
  Daemon daemon;
  auto runtime = salus::connect_runtime(daemon.socket());
  salus::Job a = runtime->add_job(job_named("A"));
  const pid_t b = spawn({SALUS_CLIENT_PATH, "--socket", daemon.socket(), "--name", "B",
                         "--empty", "1", "--iterations", "100000000", "--log", "/dev/null"});
  // B's first turns, until it is there to take them in turn with A.
  for (int warm = 0; warm < 200; ++warm) {
    (void)a.begin_iteration();
    a.end_iteration();
  }
  for (auto _ : state) {
    (void)a.begin_iteration();
    a.end_iteration();
  }
  ::kill(b, SIGKILL);
  ::waitpid(b, nullptr, 0);
}

void BM_TurnPair_pipe(benchmark::State& state) {
  int to_b[2], to_a[2];
  if (::pipe(to_b) != 0 || ::pipe(to_a) != 0) {
    state.SkipWithError("pipe failed");
    return;
  }
  const pid_t b = ::fork();
  if (b == 0) {
    // Each side keeps only its own ends, so that the parent's close is the child's end of file.
    ::close(to_b[1]);
    ::close(to_a[0]);
    char c = 0;
    while (::read(to_b[0], &c, 1) == 1 && ::write(to_a[1], &c, 1) == 1) {
    }
    ::_exit(0);
  }
  ::close(to_b[0]);
  ::close(to_a[1]);
  char c = 1;
  for (auto _ : state) {
    if (::write(to_b[1], &c, 1) != 1 || ::read(to_a[0], &c, 1) != 1) break;
  }
  ::close(to_b[1]);
  ::waitpid(b, nullptr, 0);
  ::close(to_a[0]);
}

void BM_PageBatch(benchmark::State& state) {
  Daemon daemon;
  salus::remote::DaemonLink link(daemon.socket());
  using namespace salus::remote;
  for (auto _ : state) {
    Received got = link.call(MessageType::take_pages, PageCount{0, 16});
    std::vector<PageEntry> entries;
    std::vector<FenceEntry> fences;
    (void)pages_body(got.record, entries, fences);
    std::vector<std::uint64_t> ids;
    for (const PageEntry& e : entries) ids.push_back(e.id);
    const GiveHead head{0, static_cast<std::uint32_t>(ids.size()), GiveFence::settled, 0};
    (void)link.call(MessageType::give_pages, give_pages_body(head, ids, nullptr));
  }
  state.SetItemsProcessed(state.iterations() * 16);
}

void alloc_free_pair(benchmark::State& state, salus::Runtime& runtime) {
  salus::Job job = runtime.add_job(job_named("pairs"));
  constexpr std::size_t kBytes = 64 * 1024;
  job.deallocate(job.allocate(kBytes));  // warm-up: the page is held from here on
  for (auto _ : state) {
    const salus::DevicePtr p = job.allocate(kBytes);
    benchmark::DoNotOptimize(p);
    job.deallocate(p);
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_AllocFreePair_inprocess(benchmark::State& state) {
  salus::Runtime runtime(salus::make_sim_backend(salus::SimConfig::uniform(1, salus::GiB)));
  alloc_free_pair(state, runtime);
}

void BM_AllocFreePair_client(benchmark::State& state) {
  Daemon daemon;
  auto runtime = salus::connect_runtime(daemon.socket());
  alloc_free_pair(state, *runtime);
}

}  // namespace

BENCHMARK(BM_TurnPair_inprocess)->UseRealTime();
BENCHMARK(BM_TurnPair_processes)->UseRealTime();
BENCHMARK(BM_TurnPair_pipe)->UseRealTime();
BENCHMARK(BM_PageBatch)->UseRealTime();
BENCHMARK(BM_AllocFreePair_inprocess);
BENCHMARK(BM_AllocFreePair_client);
