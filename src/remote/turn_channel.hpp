// One side of a job's turn connection: its socket and its shared-memory rings (turn_rings.hpp)
// as one channel of records, in order. Its calls are made by one thread at a time (its owner's:
// salusd's turn loop, or the process's TurnConnection under its lock).
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <span>

#include "remote/channel.hpp"
#include "remote/turn_rings.hpp"

namespace salus::remote {

class TurnChannel {
 public:
  TurnChannel(std::shared_ptr<Channel> socket, TurnRings rings)
      : socket_(std::move(socket)), rings_(std::move(rings)) {}

  // Sends a record through the ring; one with descriptors goes over the socket first and keeps
  // its place in the ring. A peer that sleeps is woken over the socket, without waiting (a peer
  // whose socket is full has wake-ups waiting already). Throws ProtocolError when the ring is
  // full (the peer reads nothing), DeviceError when the socket fails.
  void send(std::span<const std::byte> record, std::span<const int> fds = {});
  // Wakes the peer, asleep on the socket, without sending it anything (a record is due soon).
  void wake_peer();
  // The next record, without waiting: nullopt when none is there. One whose bytes went over the
  // socket is read from there, where it must be already (its sender put it there first):
  // ProtocolError otherwise.
  std::optional<Received> try_receive();
  // Reads what waits on the socket without waiting: wake-ups are dropped, and a record that came
  // with descriptors is kept for its place in the ring. False when the peer closed its end.
  bool drain_socket();
  // Waits for the next record, asked for at `asked`: watches the ring from `spin` before until
  // `spin` after the time its peer says it is due (TurnRings::due), or for `spin` from `asked`
  // when the peer says nothing; sleeps on the socket before and after (a peer that sees it asleep
  // ahead of a due record wakes it). Yields the CPU now and then while it watches, so that a busy
  // machine's other threads still run. Nullopt when the peer closed the connection.
  std::optional<Received> receive(std::chrono::steady_clock::time_point asked,
                                  std::chrono::nanoseconds spin);

  [[nodiscard]] const Channel& socket() const noexcept { return *socket_; }
  [[nodiscard]] TurnRings& rings() noexcept { return rings_; }

 private:
  void stash(Received received);
  // Sleeps on the socket (the ring marked asleep, so that a record written wakes it) for at most
  // `timeout` (none: until something comes). False when the peer closed the connection.
  bool sleep(std::optional<std::chrono::nanoseconds> timeout);

  std::shared_ptr<Channel> socket_;
  TurnRings rings_;
  std::deque<Received> stashed_;  // records that came over the socket ahead of their ring slot
};

}  // namespace salus::remote
