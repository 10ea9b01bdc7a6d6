// A process's own fence coming back to it through salusd. The daemon's free list is
// last-in-first-out, so pages given back behind this process's queued work are the first it is
// granted again, with its own interprocess event: CUDA opens no event in the process that
// exported it, and the fence used to be dropped on that refusal (the page then reused under the
// queued work). The process answers its own fence with its own event (remote/fence_pool.hpp; the
// CUDA rule itself, on the fake driver: tests/test_fence_pool.cpp).
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <sstream>
#include <cstdlib>
#include <string>
#include <memory>
#include <vector>

#include "remote/remote_backend.hpp"
#include "salus/cuda.hpp"
#include "salus/sim.hpp"
#include "support/stream_gate.hpp"

#include "daemon/salusd_fixture.hpp"

namespace salusd_test {
namespace {

using salus::ChunkHandle;
using SalusEvent = salus::Event;
using salus::Location;
using salus::MiB;

TEST_F(Salusd, AProcessGrantedItsOwnFencedPagesWaitsForItsOwnWork) {
  start_daemon({"--memory", "32MiB"});  // 16 pages: one batch takes them all
  auto link = std::make_shared<salus::remote::DaemonLink>(socket_);
  // This process's own backend of the daemon's kind (gpu_check.sh runs the suite on CUDA).
  const char* kind = std::getenv("SALUS_TEST_DAEMON_BACKEND");
  auto local = kind != nullptr && std::string(kind) == "cuda"
                   ? salus::make_cuda_backend()
                   : salus::make_sim_backend(salus::SimConfig::uniform(1, 1 * salus::GiB));
  auto backend = std::make_shared<salus::remote::RemoteBackend>(std::move(local), link);
  const Location gpu = Location::gpu(0);
  const ChunkHandle page = backend->create_chunk(gpu, 2 * MiB);
  const salus::StreamHandle stream = backend->create_stream(0, 0);
  std::atomic<bool> done{false};
  auto gate = salus::test_support::block_stream(*backend, stream, done);
  auto work = std::make_shared<const SalusEvent>(backend, 0);
  backend->record_event(work->handle(), stream);
  const std::vector<std::shared_ptr<const SalusEvent>> pending{work};
  backend->release_chunks_after(std::vector<ChunkHandle>{page}, pending);  // behind our fence
  (void)backend->give_back(0);  // the batch's other pages: now the daemon has all 16 free

  std::vector<ChunkHandle> again;
  std::vector<std::shared_ptr<const SalusEvent>> arrivals;
  for (int i = 0; i < 16; ++i) {
    again.push_back(backend->create_chunk(gpu, 2 * MiB));
    if (auto arrival = backend->take_arrival(again.back())) arrivals.push_back(arrival);
  }
  ASSERT_EQ(arrivals.size(), 1u) << "the fenced page came back with its fence";
  EXPECT_EQ(backend->fences().own_opened(), 1u) << "answered with our own event";
  EXPECT_EQ(backend->unopened_fences(), 0u) << "no fence was taken as passed";
  EXPECT_FALSE(arrivals[0]->query()) << "it holds while our work is queued";
  gate.set_value();
  arrivals[0]->synchronize();  // returns once our work has run
  EXPECT_TRUE(done.load());
  for (const ChunkHandle chunk : again) backend->release_chunk(chunk);
  backend->destroy_stream(stream);
}

// A turn between processes is the GPU's too: the next process's work starts on the GPU after the
// previous one's queued tail, not beside it. The giver ends each iteration with 150 ms of work
// still queued (a late fill); each turn's first work (logged when the stream reaches it) must
// come after the previous turn's last (logged when its stream got there).
TEST_F(Salusd, TheNextProcesssWorkStartsAfterThePreviousOnesTail) {
  start_daemon({"--policy", "fair", "--memory", "64MiB"});
  const std::vector<std::string> common = {"--iterations", "4", "--iteration-ms", "5",
                                           "--persistent-mib", "2", "--ephemeral-mib", "4",
                                           "--gpu-log", "1"};
  std::vector<std::string> giver = common;
  giver.insert(giver.end(), {"--late-fill-ms", "150"});
  const pid_t a = client("a", giver);
  const pid_t b = client("b", common);
  ASSERT_EQ(wait_for(a), 0) << read_file(log("a"));
  ASSERT_EQ(wait_for(b), 0) << read_file(log("b"));
  struct Turn {
    double begin = 0, gpu_begin = -1, gpu_end = -1;
    std::string who;
  };
  std::vector<Turn> turns;
  for (const std::string name : {"a", "b"}) {
    std::map<int, Turn> of;
    for (const salusd_test::Event& e : events(log(name))) {
      std::istringstream words(e.what);
      std::string what;
      int it = -1;
      words >> what >> it;
      if (what == "begin") of[it].begin = e.t;
      if (what == "gpu-begin") of[it].gpu_begin = e.t;
      if (what == "gpu-end") of[it].gpu_end = e.t;
    }
    for (auto& [it, turn] : of) {
      turn.who = name + " " + std::to_string(it);
      turns.push_back(turn);
    }
  }
  ASSERT_EQ(turns.size(), 8u);
  std::sort(turns.begin(), turns.end(),
            [](const Turn& x, const Turn& y) { return x.begin < y.begin; });
  int handovers = 0;
  for (std::size_t i = 1; i < turns.size(); ++i) {
    const Turn& before = turns[i - 1];
    const Turn& after = turns[i];
    ASSERT_GE(before.gpu_end, 0) << before.who;
    ASSERT_GE(after.gpu_begin, 0) << after.who;
    if (before.who[0] == after.who[0]) continue;  // one process's stream keeps its own order
    ++handovers;
    EXPECT_GE(after.gpu_begin, before.gpu_end)
        << after.who << "'s work started on the GPU before " << before.who << "'s had ended";
  }
  EXPECT_GE(handovers, 1);
}

// A turn's fence that never completes (issue 34, item 7) stalls the lane's next process for
// --fence-wait at most. a's only iteration ends with ten minutes of work still queued (a hung or
// hostile process's tail); b, granted the next turn in a's lane, waits for that work at most
// the bound and then runs all its iterations while a's work is still queued. Before, b's stream
// waited for a's event itself, and none of b's work ran while a's tail did.
TEST_F(Salusd, ATurnFenceThatNeverCompletesHoldsTheNextProcessForTheBoundOnly) {
  start_daemon({"--policy", "fair", "--memory", "64MiB", "--fence-wait", "0.3"});
  const std::vector<std::string> common = {"--iteration-ms", "5", "--persistent-mib", "2",
                                           "--ephemeral-mib", "4", "--gpu-log", "1"};
  std::vector<std::string> hung = common;
  hung.insert(hung.end(), {"--iterations", "1", "--late-fill-ms", "600000"});
  const pid_t a = client("a", hung);
  ASSERT_TRUE(wait_log("a", "end 0")) << read_file(log("a")) << read_file(dir_ + "/a.err");
  std::vector<std::string> next = common;
  next.insert(next.end(), {"--iterations", "3"});
  const pid_t b = client("b", next);
  EXPECT_EQ(wait_for(b), 0) << read_file(log("b")) << read_file(dir_ + "/b.err");
  EXPECT_TRUE(wait_log("b", "gpu-end 2", 1s)) << read_file(log("b"));
  bool a_work_ran = false;
  for (const salusd_test::Event& e : events(log("a"))) a_work_ran |= e.what == "gpu-end 0";
  EXPECT_FALSE(a_work_ran) << "a's work was meant to be still queued";
  EXPECT_NE(read_file(dir_ + "/b.err").find("has not completed within salusd's --fence-wait"),
            std::string::npos)
      << "b's first turn was not behind a's work: " << read_file(dir_ + "/b.err");
  ::kill(a, SIGKILL);
  (void)wait_for(a);
}

// The job's row of salusd's job table: the seconds its turns were charged ("held s"); -1 when the
// table has no row for it.
double held_seconds(const std::string& table, const std::string& job) {
  std::istringstream in(table);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream row(line);
    std::string name, process, state;
    long turns = 0;
    double held = 0;
    if (row >> name >> process >> state >> turns >> held && name == job) return held;
  }
  return -1;
}

// A turn between processes is charged the GPU time of its work, measured with timing events in
// its process, not the host time between its begin and end: a process that queues work and
// hands its turn back at once has taken the GPU for as long as that work runs. Each iteration
// here queues a 100 ms (simulated) kernel and ends its turn at once; the client waits for the
// kernel after the turn, so each iteration's GPU time has been measured by the next one's end,
// and of 5 iterations at least 4 are charged 100 ms or more. With the host time between begin
// and end charged, the job was charged next to nothing.
TEST_F(Salusd, ATurnIsChargedTheGpuTimeOfItsWork) {
  start_daemon({"--policy", "fair", "--memory", "64MiB"});
  const pid_t a = client("a", {"--iterations", "5", "--empty", "1", "--kernel-ms", "100",
                               "--hold-ms", "20000"});
  ASSERT_TRUE(wait_log("a", "holding")) << read_file(log("a")) << read_file(dir_ + "/a.err");
  const std::string table = status();
  ::kill(a, SIGTERM);
  (void)wait_for(a);
  EXPECT_GE(held_seconds(table, "a"), 0.4) << table;
}

}  // namespace
}  // namespace salusd_test
