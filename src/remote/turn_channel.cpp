#include "remote/turn_channel.hpp"

#include <sched.h>

#include <fmt/format.h>

#include "waits/cpu_relax.hpp"

namespace salus::remote {

namespace {

Received decoded(const TurnRings::Entry& e) {
  Received out;
  const std::span<const std::byte> record = e.record();
  out.record.header = decode_header(record);
  out.record.body.assign(record.begin() + sizeof(Header), record.end());
  return out;
}

}  // namespace

void TurnChannel::send(std::span<const std::byte> record, std::span<const int> fds) {
  if (!fds.empty()) socket_->send(record, fds);
  if (rings_.push(record, !fds.empty())) {
    wake_peer();
  }
}

void TurnChannel::wake_peer() {
  static const std::vector<std::byte> wake = encode_body(MessageType::wake, 0, {});
  (void)socket_->try_send(wake);
}

void TurnChannel::stash(Received received) {
  if (received.record.type() == MessageType::wake) return;
  if (stashed_.size() >= TurnRings::kSlots) {
    throw ProtocolError(fmt::format("a turn connection's peer sent more than {} records over its "
                                    "socket ahead of the ring", TurnRings::kSlots));
  }
  stashed_.push_back(std::move(received));
}

std::optional<Received> TurnChannel::try_receive() {
  const std::optional<TurnRings::Entry> e = rings_.pop();
  if (!e) return std::nullopt;
  if (!e->on_socket) return decoded(*e);
  if (stashed_.empty() && !drain_socket() && stashed_.empty()) {
    throw ProtocolError("a turn record's bytes were to come over the socket, which closed");
  }
  if (stashed_.empty()) {
    throw ProtocolError("a turn record's bytes were to come over the socket first, and did not");
  }
  Received out = std::move(stashed_.front());
  stashed_.pop_front();
  return out;
}

bool TurnChannel::drain_socket() {
  for (;;) {
    bool closed = false;
    std::optional<Received> got = socket_->receive_now(closed);
    if (!got) return !closed;
    stash(std::move(*got));
  }
}

bool TurnChannel::sleep(std::optional<std::chrono::nanoseconds> timeout) {
  if (!rings_.sleep_if_empty()) return true;
  struct Awake {
    TurnRings& rings;
    ~Awake() { rings.wake(); }
  } awake{rings_};
  if (timeout && !socket_->readable(*timeout)) return true;
  std::optional<Received> got = socket_->receive();
  if (!got) return false;
  stash(std::move(*got));
  return true;
}

std::optional<Received> TurnChannel::receive(std::chrono::steady_clock::time_point asked,
                                             std::chrono::nanoseconds spin) {
  using Clock = std::chrono::steady_clock;
  const auto around = std::chrono::duration_cast<Clock::duration>(spin);
  for (;;) {
    if (std::optional<Received> r = try_receive()) return r;
    const auto now = Clock::now();
    const std::optional<Clock::time_point> due = rings_.due();
    const auto from = due ? *due - around : asked;
    const auto until = (due ? *due : asked) + around;
    if (now < from) {
      if (!sleep(from - now)) return std::nullopt;  // until it is near (a record still wakes it)
    } else if (now <= until) {
      for (int i = 0; i < 64 && !rings_.ready(); ++i) waits::cpu_relax();
      if (!rings_.ready()) ::sched_yield();  // the thread it waits for may share this CPU
    } else {
      if (!sleep(std::nullopt)) return std::nullopt;
    }
  }
}

}  // namespace salus::remote
