// salusd's turn loop (daemon/turn_loop.hpp): the turn connections' records go through shared
// memory, one thread answers them all and no begin holds a thread of the daemon while it waits,
// a waiting process is told when its turn is due, and a process that scribbles on its shared
// memory loses its own turn connection only.
#include <dirent.h>
#include <sys/mman.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "daemon/salusd_fixture.hpp"
#include "remote/daemon_link.hpp"
#include "remote/turn_channel.hpp"
#include "salus/runtime.hpp"
#include "salus/remote.hpp"

namespace salusd_test {
namespace {

using namespace salus::remote;
using Clock = std::chrono::steady_clock;

std::size_t threads_of(pid_t pid) {
  std::size_t n = 0;
  DIR* d = ::opendir(("/proc/" + std::to_string(pid) + "/task").c_str());
  if (d == nullptr) return 0;
  while (const dirent* e = ::readdir(d)) n += e->d_name[0] != '.' ? 1 : 0;
  ::closedir(d);
  return n;
}

salus::JobSpec named(std::string name) {
  salus::JobSpec spec;
  spec.name = std::move(name);
  return spec;
}

// A job's turn connection made by hand, on a session of its own in this process.
struct RawTurns {
  RawTurns(const std::string& socket, const std::string& name) : link(socket) {
    AddJob add;
    set_name(add.name, name);
    job = body_as<JobAdded>(link.call(MessageType::add_job, add).record).job;
    socket_ = std::make_shared<Channel>(connect_to(socket));
    socket_->send(encode(MessageType::attach_turns, 1,
                         AttachTurns{link.welcome().session, link.welcome().token, job}));
    std::optional<Received> attached = socket_->receive();
    if (!attached || attached->record.type() != MessageType::done || attached->fds.size() != 1) {
      throw std::runtime_error("attach_turns was not answered with its shared memory");
    }
    memory_fd = ::dup(attached->fds.front().get());
    channel.emplace(socket_, TurnRings::adopt(std::move(attached->fds.front())));
  }
  ~RawTurns() { ::close(memory_fd); }

  DaemonLink link;
  std::uint64_t job = 0;
  std::shared_ptr<Channel> socket_;
  std::optional<TurnChannel> channel;
  int memory_fd = -1;
};

// The old daemon gave every turn connection a thread, which waited in the daemon's scheduler for
// the job's turn; the loop serves them all from one thread.
TEST_F(Salusd, JobsWaitingForTheirTurnHoldNoThreadOfTheDaemon) {
  start_daemon({"--policy", "fair", "--memory", "64MiB"});
  auto runtime = salus::connect_runtime(socket_);
  salus::Job holder = runtime->add_job(named("holder"));
  (void)holder.begin_iteration();
  const std::size_t before = threads_of(daemon_);
  ASSERT_GT(before, 0u);
  constexpr int kWaiting = 12;
  std::vector<salus::Job> jobs;
  for (int i = 0; i < kWaiting; ++i) jobs.push_back(runtime->add_job(named("w" + std::to_string(i))));
  std::atomic<int> done{0};
  std::vector<std::thread> threads;
  for (salus::Job& job : jobs) {
    threads.emplace_back([&job, &done] {
      (void)job.begin_iteration();
      job.end_iteration();
      ++done;
    });
  }
  // Each job's turn connection is attached by add_job; the thread that read its attach hands it
  // to the loop and ends (at once, but on its own time: hence the wait).
  std::size_t now = 0;
  for (const auto until = Clock::now() + 20s; Clock::now() < until; std::this_thread::sleep_for(20ms)) {
    now = threads_of(daemon_);
    if (now <= before + 2) break;
  }
  EXPECT_LE(now, before + 2) << kWaiting
                             << " jobs wait for their turn: the daemon's threads grew with them";
  EXPECT_EQ(done.load(), 0) << "a job took the turn the holder holds";
  holder.end_iteration();
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(done.load(), kWaiting);
}

// The daemon writes into a waiting process's shared memory when its turn is expected (the
// holder's iterations have lasted about 20 ms), so that the process watches for it then instead
// of being woken through the kernel; the turn, once given, clears it.
TEST_F(Salusd, AWaitingProcessIsToldWhenItsTurnIsDue) {
  start_daemon({"--policy", "fair", "--memory", "64MiB"});
  auto runtime = salus::connect_runtime(socket_);
  salus::Job holder = runtime->add_job(named("holder"));
  RawTurns b(socket_, "b");
  for (int i = 0; i < 3; ++i) {  // its iterations' length becomes known
    (void)holder.begin_iteration();
    std::this_thread::sleep_for(20ms);
    holder.end_iteration();
  }
  (void)holder.begin_iteration();
  const auto held = Clock::now();
  b.channel->send(encode(MessageType::begin_iteration, 2, JobCall{b.job, -1, 0, 0}));
  std::optional<Clock::time_point> due;
  for (const auto until = Clock::now() + 10s; !due && Clock::now() < until;) {
    std::this_thread::sleep_for(1ms);
    due = b.channel->rings().due();
  }
  ASSERT_TRUE(due) << "the daemon never said when the waiting job's turn is expected";
  EXPECT_GT(*due, held - 1s);
  EXPECT_LT(*due, held + 10s);
  holder.end_iteration();
  std::optional<Received> turn = b.channel->receive(Clock::now(), {});
  ASSERT_TRUE(turn);
  ASSERT_EQ(turn->record.type(), MessageType::turn);
  EXPECT_EQ(body_as<Turn>(turn->record).admitted, 1u);
  EXPECT_FALSE(b.channel->rings().due()) << "a turn given is no longer due";
  b.channel->send(encode(MessageType::end_iteration, 3, EndIteration{JobCall{b.job, -1, 0, 0}, {}}));
  std::optional<Received> ended = b.channel->receive(Clock::now(), {});
  ASSERT_TRUE(ended);
  EXPECT_EQ(ended->record.type(), MessageType::done);
}

// The shared memory is the process's to write too: counts it makes impossible end its own turn
// connection (its socket is closed), and the daemon and the other processes' turns go on.
TEST_F(Salusd, AProcessThatScribblesOnItsTurnMemoryLosesOnlyItsTurnConnection) {
  start_daemon({"--policy", "fair", "--memory", "64MiB"});
  auto runtime = salus::connect_runtime(socket_);
  salus::Job other = runtime->add_job(named("other"));
  RawTurns hostile(socket_, "hostile");
  void* p = ::mmap(nullptr, sizeof(TurnRings::Memory), PROT_READ | PROT_WRITE, MAP_SHARED,
                   hostile.memory_fd, 0);
  ASSERT_NE(p, MAP_FAILED);
  auto* memory = static_cast<TurnRings::Memory*>(p);
  memory->to_daemon.head.store(1'000'000);  // a million records, in a ring of eight
  hostile.socket_->send(encode_body(MessageType::wake, 0, {}));
  bool closed = false;
  for (const auto until = Clock::now() + 10s; !closed && Clock::now() < until;) {
    if (hostile.socket_->readable(std::chrono::milliseconds(50))) {
      bool eof = false;
      while (hostile.socket_->receive_now(eof)) {
      }
      closed = eof;
    }
  }
  EXPECT_TRUE(closed) << "the daemon kept a turn connection whose counts are impossible";
  for (int i = 0; i < 3; ++i) {
    (void)other.begin_iteration();
    other.end_iteration();
  }
  EXPECT_EQ(other.stats().iterations, 3u);
  ::munmap(p, sizeof(TurnRings::Memory));
}

}  // namespace
}  // namespace salusd_test
