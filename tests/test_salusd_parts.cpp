// The parts salusd's coordinator composes, each alone, without sockets or a coordinator:
// PageLedger (the pages, their limits, reclaim waits, pages behind work, a process's exit),
// SessionTable (the sessions, their hello, jobs and turn connections), ExitWatch (the wait for a
// hung-up process's exit), over the CUDA backend on the fake driver, whose events can be held
// pending (a busy GPU); and JobTurns (a turn connection's calls) over a simulated runtime.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cuda/cuda_backend.hpp"
#include "daemon/exit_watch.hpp"
#include "daemon/job_turns.hpp"
#include "daemon/page_ledger.hpp"
#include "daemon/session.hpp"
#include "daemon/session_table.hpp"
#include "iteration_sched/trace.hpp"
#include "remote/protocol.hpp"
#include "support/expect_throw.hpp"
#include "support/fake_driver.hpp"
#include "support/sim_runtime.hpp"

namespace salus {
namespace {

using daemon::PageBank;
using daemon::PageLedger;
using daemon::SessionId;
using test_support::expect_throw_with;

std::size_t count_of(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A ledger of `pages` pages on one device of the fake driver.
struct Ledger {
  explicit Ledger(std::size_t pages, daemon::CoordinatorOptions options = quick())
      : page(backend->granularity(Location::gpu(0))),
        ledger(backend, trace, page, {{backend->free_memory(0), pages * page}}, options) {}
  // Waits that end soon: a short ask is refused after a few tens of milliseconds.
  static daemon::CoordinatorOptions quick() {
    daemon::CoordinatorOptions o;
    o.reclaim_wait = std::chrono::milliseconds(20);
    o.fence_wait = std::chrono::milliseconds(20);
    o.exit_wait = std::chrono::milliseconds(20);
    return o;
  }
  // As quick, but a short ask waits as long as another process may still give pages back.
  static daemon::CoordinatorOptions patient() {
    daemon::CoordinatorOptions o = quick();
    o.short_wait_limit = std::chrono::seconds(30);
    return o;
  }
  // Processes 1 and 2 are open; 1 holds one page and is inside a turn of `job` (it may give
  // pages back at the turn's end). Returns the page it holds.
  std::vector<std::uint64_t> holder_in_turn(int* job) {
    open(1);
    open(2);
    std::vector<std::uint64_t> held = take(1, 1);
    ledger.turn_began(1, job);
    return held;
  }
  // A process that counts the reclaims it is sent.
  void open(SessionId id, pid_t pid = 100, uid_t uid = 1000) {
    ledger.open(id, pid + static_cast<pid_t>(id), uid, [this](std::span<const std::byte>) {
      ++reclaims;
      return true;
    });
  }
  std::vector<std::uint64_t> take(SessionId id, std::size_t count) {
    const PageBank::Batch batch = ledger.take(id, 0, count, 0.0);
    std::vector<std::uint64_t> ids;
    for (const auto& e : batch.entries) ids.push_back(e.id);
    last_fences = batch.fences.size();
    return ids;
  }
  // A fence of `from`'s whose work stays pending until the driver completes its events.
  std::shared_ptr<const daemon::PageBank::Fence> pending_fence(SessionId from) {
    const StreamHandle stream = backend->create_stream(0, 0);
    fake.hold_events(true);
    auto event = std::make_shared<Event>(backend, 0);
    event->record(stream);
    fake.hold_events(false);
    auto fence = std::make_shared<daemon::PageBank::Fence>();
    fence->from = from;
    fence->opened = event;
    fence->given_at = std::chrono::steady_clock::now();
    return fence;
  }

  test::FakeDriver fake{test::FakeDriverConfig::uniform(1, 1 * GiB)};
  std::shared_ptr<cuda::CudaBackend> backend = std::make_shared<cuda::CudaBackend>(fake.api());
  std::shared_ptr<TraceRecorder> trace = std::make_shared<TraceRecorder>();
  const std::size_t page;
  PageLedger ledger;
  std::atomic<int> reclaims{0};
  std::size_t last_fences = 0;
};

// --- PageLedger -------------------------------------------------------------------------------

TEST(SalusdPageLedger, AGrantBeyondTheProcessLimitIsRefusedNamingTheLimit) {
  daemon::CoordinatorOptions o = Ledger::quick();
  Ledger l(16, [&] {
    o.process_limit_bytes = 3 * 2 * MiB;
    return o;
  }());
  ASSERT_EQ(l.page, 2 * MiB);
  l.open(1);
  EXPECT_EQ(l.take(1, 2).size(), 2u);
  EXPECT_EQ(l.take(1, 5).size(), 1u) << "an ask beyond the limit gets what the limit leaves";
  try {
    (void)l.take(1, 1);
    ADD_FAILURE() << "a process at its limit gets no page";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::out_of_memory);
    EXPECT_THAT(e.what(), ::testing::HasSubstr(
                              "process 101 holds 6291456 bytes, its limit is 6291456 bytes"));
    EXPECT_THAT(e.what(), ::testing::Not(::testing::HasSubstr("jobs' limits")));
  }
  EXPECT_EQ(l.ledger.device_use(0).granted_bytes, 3 * l.page) << "the refusal took nothing";
}

TEST(SalusdPageLedger, TheSumOfItsJobsLimitsBoundsAProcessOnceEveryJobHasOne) {
  Ledger l(16);
  l.open(1);
  l.ledger.job_added(1, 7, l.page);
  l.ledger.job_added(1, 8, 0);  // no limit: the process is unbounded
  EXPECT_EQ(l.take(1, 3).size(), 3u);
  l.ledger.job_left(1, 8, nullptr);  // now every job has one: 1 page, 3 held
  expect_throw_with<Error>([&] { (void)l.take(1, 1); },
                           "its limit is 2097152 bytes (the sum of its jobs' limits)");
  EXPECT_EQ(l.ledger.holdings().at(1).limit_bytes, l.page);
  EXPECT_EQ(l.ledger.holdings().at(1).pages, 3u);
}

TEST(SalusdPageLedger, PagesGivenBackBehindAFenceAreNotGrantedToAnotherProcessBeforeIt) {
  Ledger l(2);
  l.open(1);
  l.open(2);
  const std::vector<std::uint64_t> ids = l.take(1, 2);
  ASSERT_EQ(ids.size(), 2u);
  l.ledger.give_back(1, 0, ids, remote::GiveFence::fenced, l.pending_fence(1));
  // Its work never completes within fence_wait: the pages are withheld, and the ask is refused
  // once nobody can give any back.
  expect_throw_with<Error>([&] { (void)l.take(2, 2); }, "no page of device 0 is free");
  EXPECT_EQ(l.ledger.device_use(0).withheld_bytes, 2 * l.page);
  EXPECT_EQ(l.ledger.device_use(0).granted_bytes, 0u);
  l.ledger.release_idle_pages();  // the tick: the work is still pending
  EXPECT_EQ(l.ledger.device_use(0).withheld_bytes, 2 * l.page);

  l.fake.complete_events();
  l.ledger.release_idle_pages();  // now it has completed: free, settled
  EXPECT_EQ(l.ledger.device_use(0).withheld_bytes, 0u);
  EXPECT_EQ(l.take(2, 2).size(), 2u);
  EXPECT_EQ(l.last_fences, 0u) << "settled: nothing for the new holder to wait for";
  EXPECT_EQ(l.ledger.inconsistency(), "");
}

TEST(SalusdPageLedger, ItsOwnFencedPagesComeBackToAProcessWithTheFenceAndNoWait) {
  Ledger l(2);
  l.open(1);
  const std::vector<std::uint64_t> ids = l.take(1, 2);
  l.ledger.give_back(1, 0, ids, remote::GiveFence::fenced, l.pending_fence(1));
  EXPECT_EQ(l.take(1, 2).size(), 2u) << "its own stream orders its work: no wait";
  EXPECT_EQ(l.last_fences, 1u) << "the batch names the fence";
  EXPECT_EQ(l.ledger.device_use(0).withheld_bytes, 0u);
}

TEST(SalusdPageLedger, APageNotItsOwnRefusesTheWholeGiveBack) {
  Ledger l(4);
  l.open(1);
  l.open(2);
  const std::vector<std::uint64_t> mine = l.take(1, 2);
  const std::vector<std::uint64_t> theirs = l.take(2, 1);
  expect_throw_with<InvalidArgument>(
      [&] {
        l.ledger.give_back(1, 0, {mine[0], theirs[0]}, remote::GiveFence::settled, nullptr);
      },
      "a page of the batch is not held by this process");
  expect_throw_with<InvalidArgument>(
      [&] { l.ledger.give_back(1, 3, mine, remote::GiveFence::settled, nullptr); },
      "give_pages: device 3 does not exist");
  EXPECT_EQ(l.ledger.held_pages(1), 2u) << "all or nothing";
  EXPECT_EQ(l.ledger.held_pages(2), 1u);
}

TEST(SalusdPageLedger, AProcessExitReturnsItsPagesOnce) {
  Ledger l(4);
  l.open(1);
  l.open(2);
  ASSERT_EQ(l.take(1, 3).size(), 3u);
  ASSERT_EQ(l.take(2, 1).size(), 1u);
  EXPECT_EQ(l.ledger.chunks_held_by(1).size(), 3u);
  l.ledger.hung_up(1);
  EXPECT_TRUE(l.ledger.holdings().at(1).closed_at.has_value());
  EXPECT_EQ(l.ledger.take_back_all(1), 3u);
  EXPECT_EQ(l.ledger.take_back_all(1), 0u) << "its record went with its pages";
  EXPECT_FALSE(l.ledger.holdings().contains(1));
  EXPECT_EQ(l.ledger.device_use(0).granted_bytes, l.page) << "the other's page stays its own";
  EXPECT_EQ(count_of(l.trace->json(), "(gone)"), 1u) << "one take-back in the trace";
  EXPECT_EQ(l.take(2, 3).size(), 3u) << "and the pages are free for the others";
  EXPECT_EQ(l.ledger.inconsistency(), "");
}

TEST(SalusdPageLedger, WithoutReclaimsAnAskGetsOnePageAndAsksNobody) {
  daemon::CoordinatorOptions o = Ledger::quick();
  o.reclaim = false;
  Ledger l(2, o);
  l.open(1);
  l.open(2);
  EXPECT_EQ(l.take(1, 2).size(), 1u);
  EXPECT_EQ(l.take(1, 2).size(), 1u);
  expect_throw_with<Error>([&] { (void)l.take(2, 1); }, "--reclaim never");
  EXPECT_EQ(l.reclaims.load(), 0);
}

// --- Concurrent: short asks wait for the pages others give back ------------------------------

TEST(ConcurrentSalusdPageLedger, AShortAskWaitsForTheTurnOfAHolderAndGetsWhatItGivesBack) {
  Ledger l(1, Ledger::patient());
  int job = 0;
  const std::vector<std::uint64_t> held = l.holder_in_turn(&job);
  auto asked = std::async(std::launch::async, [&] { return l.take(2, 1); });
  // Well past reclaim_wait: the ask still waits, since the holder is inside a turn.
  while (l.reclaims.load() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(asked.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout);
  l.ledger.turn_ended(1, &job);
  l.ledger.give_back(1, 0, held, remote::GiveFence::settled, nullptr);
  EXPECT_EQ(asked.get(), held) << "the page given back goes to the asker";
  EXPECT_EQ(l.ledger.held_pages(1), 0u);
}

TEST(ConcurrentSalusdPageLedger, AHangUpEndsTheWaitOfItsOwnAsk) {
  Ledger l(1, Ledger::patient());
  int job = 0;
  // The asker would wait for the holder as long as it holds the turn.
  ASSERT_EQ(l.holder_in_turn(&job).size(), 1u);
  auto asked = std::async(std::launch::async, [&] { return l.take(2, 1); });
  while (l.reclaims.load() < 1) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  l.ledger.hung_up(2);
  expect_throw_with<Error>([&] { (void)asked.get(); }, "no page of device 0 is free");
  EXPECT_EQ(l.ledger.held_pages(2), 0u);
}

// --- SessionTable ------------------------------------------------------------------------------

std::shared_ptr<daemon::Session> session_of(pid_t pid, std::uint64_t token) {
  auto s = std::make_shared<daemon::Session>();
  s->peer.pid = pid;
  s->peer.uid = 1000;
  s->token = token;
  return s;
}

TEST(SalusdSessionTable, ATurnConnectionAttachesOnlyToAnOpenSessionsJobWithItsToken) {
  daemon::SessionTable table;
  const auto s = session_of(42, 7);
  const SessionId id = table.add(s);
  EXPECT_EQ(table.add(session_of(43, 8)), id + 1) << "ids are never reused";
  table.add_job(*s, 5, nullptr);
  remote::PeerCredentials peer{42, 1000, 1000};
  int hang_ups = 0;
  const auto attach = [&](std::uint64_t session, std::uint64_t token, std::uint64_t job) {
    remote::AttachTurns a{};
    a.session = session;
    a.token = token;
    a.job = job;
    return table.attach(peer, a, [&] { ++hang_ups; });
  };
  expect_throw_with<InvalidArgument>([&] { (void)attach(id, 8, 5); }, "no open session");
  expect_throw_with<UnknownJob>([&] { (void)attach(id, 7, 6); }, "");
  peer.pid = 44;
  expect_throw_with<InvalidArgument>([&] { (void)attach(id, 7, 5); }, "is pid 42's, not pid 44's");
  peer.pid = 42;
  EXPECT_EQ(attach(id, 7, 5).first, s);

  std::optional<daemon::SessionTable::Closing> closing = table.close(id);
  ASSERT_TRUE(closing);
  EXPECT_EQ(closing->jobs.size(), 1u);
  ASSERT_EQ(closing->hang_ups.size(), 1u) << "the attached connection's hang-up is handed over";
  closing->hang_ups.front()();
  EXPECT_EQ(hang_ups, 1);
  expect_throw_with<InvalidArgument>([&] { (void)attach(id, 7, 5); }, "no open session");
  EXPECT_EQ(hang_ups, 1) << "a refused attach leaves no hang-up behind";
  EXPECT_TRUE(table.close(id)->hang_ups.empty()) << "handed over once";
  table.erase(id);
  EXPECT_FALSE(table.close(id));
  expect_throw_with<InvalidArgument>([&] { (void)table.find(id); }, "no session");
}

TEST(SalusdSessionTable, RecordsBeforeTheHelloAndASecondHelloBreakTheProtocol) {
  daemon::SessionTable table;
  const auto s = session_of(42, 7);
  table.add(s);
  expect_throw_with<remote::ProtocolError>(
      [&] { table.check_greeted(*s, remote::MessageType::take_pages); }, "before hello");
  table.check_greeted(*s, remote::MessageType::hello);
  remote::Hello hello{};
  remote::set_name(hello.name, "trainer");
  EXPECT_EQ(table.greet(*s, hello), "trainer");
  EXPECT_EQ(s->name, "trainer");
  table.check_greeted(*s, remote::MessageType::take_pages);
  expect_throw_with<remote::ProtocolError>([&] { (void)table.greet(*s, hello); }, "a second hello");
}

TEST(SalusdSessionTable, AProcessHasABoundedNumberOfJobs) {
  daemon::SessionTable table;
  const auto s = session_of(42, 7);
  table.add(s);
  for (std::uint64_t j = 0; j < daemon::SessionTable::kMaxJobsPerProcess; ++j) {
    table.check_job_room(*s);
    table.add_job(*s, j, nullptr);
  }
  expect_throw_with<InvalidArgument>([&] { table.check_job_room(*s); },
                                     "a process may have 256 jobs at once");
  table.remove_job(*s, 3);
  table.check_job_room(*s);
  expect_throw_with<UnknownJob>([&] { (void)table.job_of(*s, 3); }, "");
}

// --- ExitWatch ---------------------------------------------------------------------------------

TEST(SalusdExitWatch, AWaitEndsAtTheProcessExitAndStopEndsEveryWait) {
  test::FakeDriver fake{test::FakeDriverConfig::uniform(1, 1 * GiB)};
  auto backend = std::make_shared<cuda::CudaBackend>(fake.api());
  daemon::ExitWatch watch(backend, std::chrono::milliseconds(10));
  watch.wait_for_exit(1, ::getpid(), remote::UniqueFd{});  // its own process: nothing to wait for

  const pid_t quick = ::fork();
  if (quick == 0) ::_exit(0);
  std::thread reaper([&] { ::waitpid(quick, nullptr, 0); });
  watch.wait_for_exit(2, quick, remote::UniqueFd{});  // returns: it exited (and was reaped)
  reaper.join();

  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t stays = ::fork();
  if (stays == 0) {
    ::close(pipe_fds[1]);
    char c;
    (void)!::read(pipe_fds[0], &c, 1);  // until the test lets it go
    ::_exit(0);
  }
  ::close(pipe_fds[0]);
  watch.stop();
  watch.wait_for_exit(3, stays, remote::UniqueFd{});  // returns: the daemon stops
  watch.wait_until_unmapped(3, stays, {});
  ::close(pipe_fds[1]);
  ::waitpid(stays, nullptr, 0);
}


// --- JobTurns ----------------------------------------------------------------------------------

template <class T>
remote::Received record_of(remote::MessageType type, std::uint64_t seq, const T& body) {
  remote::Received r;
  const std::vector<std::byte> bytes = remote::encode(type, seq, body);
  r.record.header = remote::decode_header(bytes);
  r.record.body.assign(bytes.begin() + sizeof(remote::Header), bytes.end());
  return r;
}

remote::Turn turn_of(const daemon::JobTurns::Reply& reply) {
  remote::Record r;
  r.header = remote::decode_header(reply.record);
  r.body.assign(reply.record.begin() + sizeof(remote::Header), reply.record.end());
  EXPECT_EQ(r.type(), remote::MessageType::turn);
  return remote::body_as<remote::Turn>(r);
}

// A runtime whose jobs' peaks do not fit side by side: one lane, one turn at a time.
struct Turns {
  Turns() { turns.open(1); }
  Job add(const std::string& name) {
    return runtime.add_job(testing::job_named(
        name, {.persistent_bytes = 16 * MiB, .ephemeral_peak_bytes = 300 * MiB,
               .iteration_seconds = 0.002}));
  }
  daemon::JobTurns::TurnResult call(Job& job, remote::MessageType type, std::int64_t timeout_ns,
                                    std::uint64_t named = 0) {
    const remote::JobCall c{named != 0 ? named : job.id().value, timeout_ns, 0, 0};
    remote::EndIteration end{};
    end.call = c;
    remote::Received r = type == remote::MessageType::end_iteration ? record_of(type, ++seq, end)
                                                                     : record_of(type, ++seq, c);
    return turns.call(1, job, job.id().value, r, {});
  }

  std::shared_ptr<DeviceBackend> backend = testing::one_sim_gpu(512 * MiB);
  std::size_t page = backend->granularity(Location::gpu(0));
  PageLedger ledger{backend, std::make_shared<TraceRecorder>(), page,
                    std::vector<PageLedger::Device>{{backend->free_memory(0), 8 * page}},
                    daemon::CoordinatorOptions{}};
  daemon::JobTurns turns{backend, ledger, std::chrono::milliseconds(20), remote::Spill::none};
  Runtime runtime{backend, [] {
                    RuntimeOptions o;
                    o.policy = "fair";
                    return o;
                  }()};
  std::uint64_t seq = 0;
};

TEST(SalusdJobTurns, ATurnConnectionCarriesOnlyItsOwnJobsTurnCalls) {
  Turns t;
  Job a = t.add("a");
  expect_throw_with<remote::ProtocolError>(
      [&] { (void)t.call(a, remote::MessageType::finish_job, -1); },
      "a turn connection may not carry finish_job");
  expect_throw_with<remote::ProtocolError>(
      [&] { (void)t.call(a, remote::MessageType::begin_iteration, -1, a.id().value + 7); },
      "named job");
  remote::Received withdraw = record_of(remote::MessageType::withdraw, 9,
                                        remote::JobCall{a.id().value, -1, 0, 0});
  withdraw.fds.emplace_back(::dup(0));
  expect_throw_with<remote::ProtocolError>(
      [&] { (void)t.turns.call(1, a, a.id().value, withdraw, {}); }, "carried 1 descriptors");
}

TEST(SalusdJobTurns, ABeginWaitsWithoutAThreadAndOnePastItsDeadlineIsNotAdmitted) {
  Turns t;
  Job a = t.add("a");
  Job b = t.add("b");
  Job c = t.add("c");
  daemon::JobTurns::TurnResult first = t.call(a, remote::MessageType::begin_iteration, -1);
  ASSERT_TRUE(first.reply);
  EXPECT_EQ(turn_of(*first.reply).admitted, 1u);

  daemon::JobTurns::TurnResult waits = t.call(b, remote::MessageType::begin_iteration, -1);
  ASSERT_FALSE(waits.reply) << "no turn yet, and no thread waits for it";
  ASSERT_TRUE(waits.waiting);
  EXPECT_FALSE(waits.waiting->deadline) << "untimed";
  EXPECT_FALSE(t.turns.retry(1, b, *waits.waiting)) << "asked again: still a's turn";

  daemon::JobTurns::TurnResult late = t.call(c, remote::MessageType::begin_iteration, 0);
  ASSERT_TRUE(late.reply) << "its deadline has passed: answered at once";
  EXPECT_EQ(turn_of(*late.reply).admitted, 0u);
  ASSERT_TRUE(t.call(c, remote::MessageType::withdraw, -1).reply);

  daemon::JobTurns::TurnResult ended = t.call(a, remote::MessageType::end_iteration, -1);
  ASSERT_TRUE(ended.reply);
  EXPECT_EQ(remote::decode_header(ended.reply->record).type,
            static_cast<std::uint16_t>(remote::MessageType::done));
  const std::optional<daemon::JobTurns::Reply> granted = t.turns.retry(1, b, *waits.waiting);
  ASSERT_TRUE(granted) << "a's end handed b the turn";
  const remote::Turn turn = turn_of(*granted);
  EXPECT_EQ(turn.admitted, 1u);
  EXPECT_EQ(turn.job, b.id().value);
  EXPECT_EQ(turn.fenced, 0u) << "a's end named no fence";
  ASSERT_TRUE(t.call(b, remote::MessageType::end_iteration, -1).reply);
}

}  // namespace
}  // namespace salus
