// salusd forwards a fence only once it has opened it (issue 34, item 7): pages given back behind
// a "fence" that is no event (here, an unsealed copy of a real event's file, which its sender
// could shrink under the next holder: SIGBUS there) are refused, named, and stay the sender's;
// pages behind a real exported event are taken back. On the coordinator over a simulated GPU.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <condition_variable>
#include <mutex>
#include <cstring>
#include <optional>
#include <thread>
#include <future>

#include "daemon/coordinator.hpp"
#include "remote/protocol.hpp"
#include "salus/sim.hpp"

namespace salus {
namespace {

using remote::MessageType;

// A session driven by hand: each call waits for its reply (some are answered by the daemon's
// workers, on another thread).
struct Client {
  explicit Client(daemon::Coordinator& c) : coordinator(c) {}

  daemon::Coordinator& coordinator;
  daemon::SessionId id = 0;
  std::uint64_t seq = 1;
  std::mutex mu;
  std::condition_variable replied;
  std::uint64_t answered = 0;  // the seq of the last reply
  MessageType last_type{};
  std::string last_failure;
  std::vector<remote::PageEntry> granted;
  remote::Welcome welcome;
  std::uint64_t job = 0;
  std::optional<daemon::Coordinator::TurnLink> link;  // the job's turn connection

  void call(MessageType type, std::span<const std::byte> body, std::vector<int> fds = {}) {
    remote::Received r;
    const std::uint64_t mine = seq++;
    const std::vector<std::byte> bytes = remote::encode_body(type, mine, body);
    r.record.header = remote::decode_header(bytes);
    r.record.body.assign(bytes.begin() + sizeof(remote::Header), bytes.end());
    for (const int fd : fds) r.fds.emplace_back(::dup(fd));
    coordinator.handle(id, std::move(r));
    std::unique_lock lock(mu);
    ASSERT_TRUE(replied.wait_for(lock, std::chrono::seconds(30), [&] { return answered == mine; }))
        << "no reply to " << remote::to_string(type);
  }
  void on_reply(std::span<const std::byte> record) {
    remote::Record r;
    r.header = remote::decode_header(record);
    r.body.assign(record.begin() + sizeof(remote::Header), record.end());
    std::lock_guard lock(mu);
    answered = r.header.seq;
    replied.notify_all();
    last_type = r.type();
    if (last_type == MessageType::failure) {
      const auto f = remote::body_as<remote::Failure>(r);
      last_failure = f.message.data();
    } else if (last_type == MessageType::welcome) {
      welcome = remote::body_as<remote::Welcome>(r);
    } else if (last_type == MessageType::job_added) {
      job = remote::body_as<remote::JobAdded>(r).job;
    } else if (last_type == MessageType::pages) {
      std::vector<remote::FenceEntry> fences;
      (void)remote::pages_body(r, granted, fences);
    }
  }
  // Opens the session and greets the daemon.
  void open(const remote::PeerCredentials& peer) {
    id = coordinator.open_session(peer, [this](std::span<const std::byte> record,
                                               std::span<const int>) { on_reply(record); });
    remote::Hello hello;
    remote::set_name(hello.name, "fence-test");
    call(MessageType::hello, std::as_bytes(std::span(&hello, 1)));
  }
  // Adds a job named `name` and attaches its turn connection (as `peer`, the session's).
  void add_job(const remote::PeerCredentials& peer, const char* name) {
    remote::AddJob add;
    remote::set_name(add.name, name);
    call(MessageType::add_job, std::as_bytes(std::span(&add, 1)));
    ASSERT_NE(job, 0u);
    const remote::AttachTurns attach{welcome.session, welcome.token, job};
    remote::Record record;
    const std::vector<std::byte> bytes = remote::encode(MessageType::attach_turns, 1, attach);
    record.header = remote::decode_header(bytes);
    record.body.assign(bytes.begin() + sizeof(remote::Header), bytes.end());
    link = coordinator.attach_turns(peer, record, [] {});
  }
  // A call on the job's turn connection, answered at once (a turn that would wait fails the
  // test), with `fd` (if >= 0) as its descriptor.
  remote::Record turn_call(MessageType type, std::span<const std::byte> body, int fd = -1) {
    remote::Received r;
    const std::vector<std::byte> bytes = remote::encode_body(type, seq++, body);
    r.record.header = remote::decode_header(bytes);
    r.record.body.assign(bytes.begin() + sizeof(remote::Header), bytes.end());
    if (fd >= 0) r.fds.emplace_back(::dup(fd));
    const std::optional<daemon::Coordinator::Reply> answer = coordinator.turn_call(*link, r).reply;
    if (!answer) ADD_FAILURE() << "the call waits (its turn is not there)";
    const std::vector<std::byte> reply = answer ? answer->record : std::vector<std::byte>{};
    remote::Record out;
    out.header = remote::decode_header(reply);
    out.body.assign(reply.begin() + sizeof(remote::Header), reply.end());
    return out;
  }
  // begin_iteration on the turn connection: the turn granted.
  remote::Turn begin() {
    const remote::JobCall call{job, -1, 0, 0};
    const remote::Record answer =
        turn_call(MessageType::begin_iteration, std::as_bytes(std::span(&call, 1)));
    EXPECT_EQ(answer.type(), MessageType::turn);
    return answer.type() == MessageType::turn ? remote::body_as<remote::Turn>(answer)
                                              : remote::Turn{};
  }
  // end_iteration: behind `fence` (an exported event), or saying nothing of its work.
  MessageType end(const SharedEvent* fence) {
    remote::EndIteration e;
    e.call = remote::JobCall{job, -1, 0, 0};
    if (fence != nullptr) {
      e.fenced = remote::kFenced;
      e.fence.handle = fence->handle;
      e.fence.fd_index = 0;
    }
    return turn_call(MessageType::end_iteration, std::as_bytes(std::span(&e, 1)),
                     fence != nullptr ? fence->fd : -1)
        .type();
  }

  void give_back(const remote::FenceEntry& fence, int fd) {
    remote::GiveHead head;
    head.count = 1;
    head.fence = remote::GiveFence::fenced;
    const std::uint64_t ids[1] = {granted.front().id};
    call(MessageType::give_pages, remote::give_pages_body(head, ids, &fence), {fd});
  }
};

daemon::CoordinatorOptions options() {
  daemon::CoordinatorOptions o;
  o.exit_wait = std::chrono::milliseconds(0);  // its pages come back when the test closes it
  return o;
}

// A copy of an exported event's file, byte for byte, but unsealed (its sender could shrink it);
// -1 on failure.
int unsealed_copy(int event_fd) {
  const int copy = ::memfd_create("forged-fence", MFD_CLOEXEC);
  std::array<char, 4096> bytes{};
  if (copy < 0 || ::pread(event_fd, bytes.data(), bytes.size(), 0) != 4096 ||
      ::pwrite(copy, bytes.data(), bytes.size(), 0) != 4096) {
    if (copy >= 0) ::close(copy);
    return -1;
  }
  return copy;
}

TEST(SalusdFenceCheck, PagesBehindAFenceThatIsNoSealedEventAreRefusedAndStayTheSenders) {
  const std::shared_ptr<DeviceBackend> backend = make_sim_backend(SimConfig::uniform(1, 64 * MiB));
  daemon::Coordinator coordinator(backend, options());
  Client c(coordinator);
  const remote::PeerCredentials me{::getpid(), ::getuid(), ::getgid()};
  c.open(me);
  const remote::PageCount want{0, 2};
  c.call(MessageType::take_pages, std::as_bytes(std::span(&want, 1)));
  ASSERT_EQ(c.last_type, MessageType::pages);
  ASSERT_EQ(c.granted.size(), 2u);
  const std::size_t granted = coordinator.device_use(0).granted_bytes;

  // A real event's file, and an unsealed copy of its bytes.
  const EventHandle event = backend->create_shareable_event(0);
  const SharedEvent real = backend->export_event(event);
  const int forged = unsealed_copy(real.fd);
  ASSERT_GE(forged, 0);
  remote::FenceEntry entry;
  entry.handle = real.handle;
  entry.fd_index = 0;

  c.give_back(entry, forged);
  EXPECT_EQ(c.last_type, MessageType::failure);
  EXPECT_NE(c.last_failure.find("fence is no event of device 0"), std::string::npos)
      << c.last_failure;
  EXPECT_NE(c.last_failure.find("not sealed"), std::string::npos) << c.last_failure;
  EXPECT_EQ(coordinator.device_use(0).granted_bytes, granted) << "the pages stay the sender's";

  c.give_back(entry, real.fd);
  EXPECT_EQ(c.last_type, MessageType::done) << c.last_failure;
  EXPECT_LT(coordinator.device_use(0).granted_bytes, granted) << "taken back behind the event";
  EXPECT_EQ(coordinator.inconsistency(), "");

  coordinator.close_session(c.id);
  ::close(forged);
  ::close(real.fd);
  backend->destroy_event(event);
}

// The same for a turn's fence: an end_iteration behind a fence that is no sealed event is
// refused, naming it, and the turn stays the job's; behind a real event the turn ends. (The next
// holder of the lane imports the fence: before, a forged one failed or crashed that process.)
TEST(SalusdFenceCheck, AnEndBehindAFenceThatIsNoSealedEventIsRefusedAndTheTurnKept) {
  const std::shared_ptr<DeviceBackend> backend = make_sim_backend(SimConfig::uniform(1, 64 * MiB));
  daemon::Coordinator coordinator(backend, options());
  Client c(coordinator);
  const remote::PeerCredentials me{::getpid(), ::getuid(), ::getgid()};
  c.open(me);
  c.add_job(me, "job");
  (void)c.begin();

  const EventHandle event = backend->create_shareable_event(0);
  const SharedEvent real = backend->export_event(event);
  const int forged = unsealed_copy(real.fd);
  ASSERT_GE(forged, 0);
  remote::EndIteration end;
  end.call = remote::JobCall{c.job, -1, 0, 0};
  end.fenced = remote::kFenced;
  end.fence.handle = real.handle;
  end.fence.fd_index = 0;

  const remote::Record refused =
      c.turn_call(MessageType::end_iteration, std::as_bytes(std::span(&end, 1)), forged);
  ASSERT_EQ(refused.type(), MessageType::failure);
  const std::string why = remote::body_as<remote::Failure>(refused).message.data();
  EXPECT_NE(why.find("end_iteration: its fence is no event of device 0"), std::string::npos)
      << why;
  EXPECT_EQ(coordinator.runtime().job_stats().front().state, JobState::running)
      << "the turn stays the job's";

  const remote::Record ended =
      c.turn_call(MessageType::end_iteration, std::as_bytes(std::span(&end, 1)), real.fd);
  EXPECT_EQ(ended.type(), MessageType::done);
  EXPECT_EQ(coordinator.runtime().job_stats().front().state, JobState::idle);

  coordinator.close_session(c.id);
  ::close(forged);
  ::close(real.fd);
  backend->destroy_event(event);
}

// A turn's fence is bounded as a page's is (issue 34, item 7): the lane's next holder gets the
// last end's fence with what is left of --fence-wait since that end, and once that has passed, or
// the work has completed, its turns come with no fence at all. Before, every later turn of the
// lane carried a fence that never completed, and each next process's stream waited on it for
// ever (its work never ran). The bound is the daemon's, not a timing the test asserts.
TEST(SalusdFenceCheck, ATurnFenceIsHandedOnWithinTheBoundOnlyAndNotOnceItsWorkIsDone) {
  const std::shared_ptr<DeviceBackend> backend = make_sim_backend(SimConfig::uniform(1, 64 * MiB));
  daemon::CoordinatorOptions o = options();
  o.fence_wait = std::chrono::milliseconds(300);
  daemon::Coordinator coordinator(backend, o);
  const remote::PeerCredentials me{::getpid(), ::getuid(), ::getgid()};
  Client a(coordinator), b(coordinator);
  a.open(me);
  a.add_job(me, "a");
  b.open(me);
  b.add_job(me, "b");

  // a's iteration ends behind work that does not complete until the test lets it.
  const StreamHandle stream = backend->create_stream(0, 0);
  std::promise<void> let_go;
  std::shared_future<void> released = let_go.get_future().share();
  backend->launch_host_func(stream, [released] { released.wait(); });
  const EventHandle work = backend->create_shareable_event(0);
  backend->record_event(work, stream);
  const SharedEvent shared = backend->export_event(work);
  (void)a.begin();
  ASSERT_EQ(a.end(&shared), MessageType::done);

  // b's turn comes at once, with the fence and a wait no longer than the bound.
  const remote::Turn fresh = b.begin();
  ASSERT_EQ(fresh.fenced, 1u) << "b's turn is in a's lane, behind a's work";
  EXPECT_GT(fresh.fence_wait_ms, 0u);
  EXPECT_LE(fresh.fence_wait_ms, 300u);
  ASSERT_EQ(b.end(nullptr), MessageType::done);  // b says nothing: the lane's fence is still a's

  // Past the bound, the lane's turns go without it.
  std::this_thread::sleep_for(std::chrono::milliseconds(350));
  const remote::Turn late = b.begin();
  EXPECT_EQ(late.fenced, 0u) << "a fence past --fence-wait was handed on";
  EXPECT_EQ(late.fence_wait_ms, 0u);
  ASSERT_EQ(b.end(nullptr), MessageType::done);

  // And once the work has completed, there is nothing to wait for.
  let_go.set_value();
  backend->synchronize_stream(stream);
  EXPECT_EQ(b.begin().fenced, 0u) << "completed work was handed on as a fence";
  ASSERT_EQ(b.end(nullptr), MessageType::done);
  EXPECT_EQ(coordinator.inconsistency(), "");

  coordinator.close_session(a.id);
  coordinator.close_session(b.id);
  ::close(shared.fd);
  backend->destroy_event(work);
  backend->destroy_stream(stream);
}

}  // namespace
}  // namespace salus
