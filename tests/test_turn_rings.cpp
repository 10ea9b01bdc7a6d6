// A turn connection's shared memory (remote/turn_rings.hpp) and the channel over it and its
// socket (remote/turn_channel.hpp): records in order both ways, a sleeping consumer told to be
// woken, descriptors over the socket in their place, and nothing a hostile peer writes there
// taken on trust.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <thread>

#include "remote/turn_channel.hpp"
#include "remote/turn_rings.hpp"

namespace salus::remote {
namespace {

using Clock = std::chrono::steady_clock;

UniqueFd dup_of(int fd) { return UniqueFd(::fcntl(fd, F_DUPFD_CLOEXEC, 0)); }

std::vector<std::byte> begin_record(std::uint64_t seq) {
  return encode(MessageType::begin_iteration, seq, JobCall{7, -1, 0, 0});
}

std::uint64_t seq_of(const TurnRings::Entry& e) {
  return decode_header(e.record()).seq;
}

// The memory as a hostile process sees it: mapped by itself, to write what it likes.
struct Scribbler {
  explicit Scribbler(int fd)
      : memory(static_cast<TurnRings::Memory*>(::mmap(nullptr, sizeof(TurnRings::Memory),
                                                      PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0))) {}
  ~Scribbler() { ::munmap(memory, sizeof(TurnRings::Memory)); }
  TurnRings::Memory* memory;
};

TEST(TurnRings, RecordsGoBothWaysInOrder) {
  TurnRings daemon = TurnRings::make();
  TurnRings process = TurnRings::adopt(dup_of(daemon.fd()));
  for (std::uint64_t seq = 1; seq <= 3 * TurnRings::kSlots; ++seq) {
    EXPECT_FALSE(process.push(begin_record(seq), false)) << "nobody sleeps";
    const auto e = daemon.pop();
    ASSERT_TRUE(e);
    EXPECT_EQ(seq_of(*e), seq);
    EXPECT_FALSE(e->on_socket);
    (void)daemon.push(begin_record(100 + seq), false);
    const auto back = process.pop();
    ASSERT_TRUE(back);
    EXPECT_EQ(seq_of(*back), 100 + seq);
  }
  EXPECT_FALSE(daemon.pop());
  EXPECT_FALSE(process.pop());
}

TEST(TurnRings, AConsumerAsleepIsToldToTheProducerUntilItWakes) {
  TurnRings daemon = TurnRings::make();
  TurnRings process = TurnRings::adopt(dup_of(daemon.fd()));
  ASSERT_TRUE(daemon.sleep_if_empty()) << "nothing waits: it may sleep";
  EXPECT_TRUE(process.peer_asleep());
  EXPECT_TRUE(process.push(begin_record(1), false)) << "the producer must wake it";
  daemon.wake();
  EXPECT_FALSE(process.peer_asleep());
  EXPECT_FALSE(process.push(begin_record(2), false));
  // A record that came while it went to sleep keeps it awake.
  EXPECT_FALSE(daemon.sleep_if_empty());
  EXPECT_FALSE(process.peer_asleep());
}

TEST(TurnRings, TheDueTimeTheProducerSetsIsTheConsumers) {
  TurnRings daemon = TurnRings::make();
  TurnRings process = TurnRings::adopt(dup_of(daemon.fd()));
  EXPECT_FALSE(process.due());
  const auto at = Clock::now() + std::chrono::milliseconds(3);
  daemon.set_due(at);
  ASSERT_TRUE(process.due());
  EXPECT_EQ(*process.due(), at);
  EXPECT_FALSE(daemon.due()) << "each direction has its own";
  daemon.set_due(std::nullopt);
  EXPECT_FALSE(process.due());
}

TEST(TurnRings, AFullRingIsRefusedNotWaitedFor) {
  TurnRings daemon = TurnRings::make();
  TurnRings process = TurnRings::adopt(dup_of(daemon.fd()));
  for (std::uint64_t seq = 1; seq <= TurnRings::kSlots; ++seq) {
    (void)daemon.push(begin_record(seq), false);
  }
  EXPECT_THROW((void)daemon.push(begin_record(99), false), ProtocolError);
  EXPECT_TRUE(process.pop()) << "what was written is still there";
}

TEST(TurnRings, CountsAndSizesAHostilePeerWritesAreRefused) {
  TurnRings daemon = TurnRings::make();
  Scribbler peer(daemon.fd());
  TurnRings::Ring& in = peer.memory->to_daemon;
  TurnRings::Ring& out = peer.memory->to_process;

  in.head.store(TurnRings::kSlots + 1);  // more than a ring holds
  EXPECT_THROW((void)daemon.pop(), ProtocolError);
  in.head.store(1);
  in.slots[0].size = TurnRings::kSlotBytes + 1;
  EXPECT_THROW((void)daemon.pop(), ProtocolError);
  in.slots[0].size = 24;
  in.slots[0].on_socket = 1;  // on the socket, yet with bytes here
  EXPECT_THROW((void)daemon.pop(), ProtocolError);
  in.slots[0].on_socket = 7;
  in.slots[0].size = 0;
  EXPECT_THROW((void)daemon.pop(), ProtocolError);

  // What it reads of the daemon's records: a tail ahead of the head is no count either.
  out.tail.store(5);
  EXPECT_THROW((void)daemon.push(begin_record(1), false), ProtocolError);
}

TEST(TurnRings, AMemoryThatCouldShrinkOrIsTheWrongSizeIsRefused) {
  UniqueFd unsealed(::memfd_create("turns", MFD_CLOEXEC));
  ASSERT_EQ(::ftruncate(unsealed.get(), sizeof(TurnRings::Memory)), 0);
  EXPECT_THROW((void)TurnRings::adopt(std::move(unsealed)), ProtocolError);
  UniqueFd small(::memfd_create("turns", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_EQ(::ftruncate(small.get(), 4096), 0);
  ASSERT_EQ(::fcntl(small.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  EXPECT_THROW((void)TurnRings::adopt(std::move(small)), ProtocolError);
  // The daemon's own cannot be shrunk by the process it is handed to.
  TurnRings daemon = TurnRings::make();
  EXPECT_NE(::ftruncate(daemon.fd(), 0), 0);
}

// Both ends of a turn connection, over a socket pair.
struct ChannelPair {
  ChannelPair() {
    int sv[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    daemon_socket = std::make_shared<Channel>(UniqueFd(sv[0]));
    process_socket = std::make_shared<Channel>(UniqueFd(sv[1]));
    TurnRings rings = TurnRings::make();
    UniqueFd fd = dup_of(rings.fd());
    daemon.emplace(daemon_socket, std::move(rings));
    process.emplace(process_socket, TurnRings::adopt(std::move(fd)));
  }
  std::shared_ptr<Channel> daemon_socket, process_socket;
  std::optional<TurnChannel> daemon, process;
};

TEST(TurnChannel, ARecordWithDescriptorsKeepsItsPlaceBetweenThoseWithout) {
  ChannelPair p;
  UniqueFd fd(::memfd_create("fence", MFD_CLOEXEC));
  const int fds[1] = {fd.get()};
  p.daemon->send(begin_record(1));
  p.daemon->send(begin_record(2), fds);
  p.daemon->send(begin_record(3));
  for (std::uint64_t seq = 1; seq <= 3; ++seq) {
    std::optional<Received> r = p.process->receive(Clock::now(), {});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->record.header.seq, seq);
    EXPECT_EQ(r->fds.size(), seq == 2 ? 1u : 0u);
  }
}

TEST(TurnChannel, ASleepingReceiverIsWokenByARecordInSharedMemory) {
  ChannelPair p;
  std::optional<Received> got;
  std::thread receiver([&] { got = p.process->receive(Clock::now(), {}); });  // no spin: sleeps
  // It sleeps once it has marked its ring (the sender then wakes it over the socket); a record
  // sent before that is seen before it sleeps. Either way it comes.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  p.daemon->send(begin_record(5));
  receiver.join();
  ASSERT_TRUE(got);
  EXPECT_EQ(got->record.header.seq, 5u);
}

TEST(TurnChannel, ARecordSaidToBeOnTheSocketThatIsNotThereIsRefused) {
  ChannelPair p;
  // The peer claims its record went over the socket, and sent nothing there.
  ASSERT_FALSE(p.process->rings().push(begin_record(1), true));
  EXPECT_THROW((void)p.daemon->try_receive(), ProtocolError);
}

TEST(TurnChannel, APeerThatHangsUpEndsAWait) {
  ChannelPair p;
  std::optional<Received> got = Received{};
  std::thread receiver([&] { got = p.process->receive(Clock::now(), {}); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  p.daemon_socket->shutdown();
  receiver.join();
  EXPECT_FALSE(got);
}

}  // namespace
}  // namespace salus::remote
