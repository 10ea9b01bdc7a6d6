// A job's turn connection in shared memory (protocol 7). Its records go through two rings, one
// each way, in one memfd that salusd makes, sizes and seals at attach_turns and hands the process
// with its answer. The socket stays for what shared memory cannot carry: descriptors (a simulated
// fence's), the wake-up of a side that sleeps, and the connection's end.
//
// Why: through a socket, a record costs its sender and its receiver a system call each, and its
// receiver a wake-up through the kernel whenever it sleeps (20-50 us on a VM, across CPUs); that
// was most of a switch between processes. Through shared memory it is a cache line changing
// hands, where the receiver watches for it: salusd's turn loop watches the end of a turn that is
// due, and a process the turn it asked for, as an in-process waiter watches its signal.
//
// Each ring has one producer and one consumer, which are the two processes (a side's calls are
// made by one thread at a time: its owner serializes them). Nothing the other process writes
// there is trusted: counts are checked, and a record is copied out before it is decoded (the
// protocol's checks then apply to the copy).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "remote/channel.hpp"

namespace salus::remote {

class TurnRings {
 public:
  // Records in flight each way: a process has at most a posted end and a call outstanding.
  static constexpr std::size_t kSlots = 8;
  // The largest record of a turn connection (an EndIteration with its header) fits.
  static constexpr std::size_t kSlotBytes = 1016;

  // Which end of the connection this side is: salusd reads what the process writes, and back.
  enum class Side : std::uint8_t { daemon, process };

  // A record as taken from a ring: a copy. `on_socket`: its bytes went over the socket (it
  // carries descriptors), which its sender wrote before this slot; the slot keeps its order.
  struct Entry {
    std::array<std::byte, kSlotBytes> bytes{};
    std::size_t size = 0;
    bool on_socket = false;
    [[nodiscard]] std::span<const std::byte> record() const { return {bytes.data(), size}; }
  };

  // salusd's side: a new, sealed memfd (what the process is handed at attach) mapped here.
  static TurnRings make();
  // The process's side: the memfd from the attach's answer. Throws ProtocolError when it is not
  // a sealed memfd of the expected size.
  static TurnRings adopt(UniqueFd fd);

  TurnRings(TurnRings&& other) noexcept;
  TurnRings& operator=(TurnRings&&) = delete;
  TurnRings(const TurnRings&) = delete;
  ~TurnRings();

  [[nodiscard]] int fd() const noexcept { return fd_.get(); }

  // Producer: appends a record (`on_socket`: its bytes went over the socket just before; see
  // Entry). Returns whether the consumer sleeps, and so must be woken over the socket. Throws
  // ProtocolError when the ring is full (the consumer reads nothing) or its count is impossible:
  // the connection is then broken, and nothing waits for its peer.
  bool push(std::span<const std::byte> record, bool on_socket);
  // Consumer: the next record, copied out; nullopt when there is none. Throws ProtocolError when
  // the producer's count or the slot's size is impossible.
  std::optional<Entry> pop();
  // Consumer: whether a record waits (never throws: pop says what is wrong).
  [[nodiscard]] bool ready() const noexcept;
  // Consumer, before it sleeps on the socket: marks itself asleep, then looks once more. True
  // when nothing waits (sleep: a producer that writes from now on sends a wake); false when a
  // record came meanwhile (it stays awake, unmarked).
  bool sleep_if_empty() noexcept;
  // Consumer: awake again (after sleeping on the socket).
  void wake() noexcept;

  // Producer: when the consumer's next record is expected (salusd: the turn its process waits
  // for; steady clock, which is the whole machine's), nullopt when nobody can say. The consumer
  // reads it (due) to watch for the record then, not before. Whether the consumer sleeps on the
  // socket now (to wake it ahead of a due record).
  void set_due(std::optional<std::chrono::steady_clock::time_point> at) noexcept;
  [[nodiscard]] bool peer_asleep() const noexcept;
  // Consumer: what the producer said of its next record (set_due); nullopt when unknown.
  [[nodiscard]] std::optional<std::chrono::steady_clock::time_point> due() const noexcept;

  // The shared memory's layout, both processes' (a format, as the protocol's structs are).
  struct Ring {
    alignas(64) std::atomic<std::uint64_t> head{0};    // records written (the producer's)
    alignas(64) std::atomic<std::uint64_t> tail{0};    // records read (the consumer's)
    alignas(64) std::atomic<std::uint32_t> asleep{0};  // the consumer sleeps on the socket
    std::atomic<std::int64_t> due_ns{0};  // the producer's: its next record's expected time; 0: none
    struct Slot {
      std::uint32_t size = 0;
      std::uint32_t on_socket = 0;
      std::array<std::byte, kSlotBytes> bytes{};
    };
    std::array<Slot, kSlots> slots{};
  };
  struct Memory {
    Ring to_daemon;
    Ring to_process;
  };

 private:
  TurnRings(UniqueFd fd, Side side);
  Ring& inbound() const noexcept;   // this side consumes
  Ring& outbound() const noexcept;  // this side produces

  UniqueFd fd_;
  Memory* memory_ = nullptr;
  Side side_;
};

}  // namespace salus::remote
