#include "remote/turn_rings.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <new>

namespace salus::remote {

// Both processes map this; its atomics must work across processes, so they must be lock-free
// (address-free).
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);

static_assert(sizeof(Header) + sizeof(EndIteration) <= TurnRings::kSlotBytes);
static_assert(sizeof(Header) + sizeof(Failure) <= TurnRings::kSlotBytes);
static_assert(sizeof(Header) + sizeof(Turn) <= TurnRings::kSlotBytes);

namespace {

constexpr std::size_t kBytes = sizeof(TurnRings::Memory);
constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

TurnRings::Memory* map(int fd) {
  void* p = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) sim::throw_errno("mmap", errno, "a turn connection's shared memory");
  return static_cast<TurnRings::Memory*>(p);
}

}  // namespace

TurnRings::TurnRings(UniqueFd fd, Side side) : fd_(std::move(fd)), side_(side) {
  memory_ = map(fd_.get());
}

TurnRings::TurnRings(TurnRings&& other) noexcept
    : fd_(std::move(other.fd_)), memory_(std::exchange(other.memory_, nullptr)),
      side_(other.side_) {}

TurnRings::~TurnRings() {
  if (memory_ != nullptr) ::munmap(memory_, kBytes);
}

TurnRings TurnRings::make() {
  UniqueFd fd(::memfd_create("salus-turns", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (fd.get() < 0) sim::throw_errno("memfd_create", errno, "a turn connection's shared memory");
  // Sealed at its size: a process that shrank it would crash salusd with SIGBUS at its next read.
  if (::ftruncate(fd.get(), static_cast<off_t>(kBytes)) != 0 ||
      ::fcntl(fd.get(), F_ADD_SEALS, kSeals) != 0) {
    sim::throw_errno("ftruncate", errno, "a turn connection's shared memory");
  }
  TurnRings rings(std::move(fd), Side::daemon);
  new (rings.memory_) Memory();  // a new memfd reads zero: the same state, said once
  return rings;
}

TurnRings TurnRings::adopt(UniqueFd fd) {
  struct stat st {};
  if (fd.get() < 0 || ::fstat(fd.get(), &st) != 0 || st.st_size != static_cast<off_t>(kBytes)) {
    throw ProtocolError(fmt::format("a turn connection's shared memory is not {} bytes", kBytes));
  }
  const int seals = ::fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    throw ProtocolError("a turn connection's shared memory could shrink: it is refused");
  }
  return TurnRings(std::move(fd), Side::process);
}

TurnRings::Ring& TurnRings::inbound() const noexcept {
  return side_ == Side::daemon ? memory_->to_daemon : memory_->to_process;
}

TurnRings::Ring& TurnRings::outbound() const noexcept {
  return side_ == Side::daemon ? memory_->to_process : memory_->to_daemon;
}

bool TurnRings::push(std::span<const std::byte> record, bool on_socket) {
  Ring& r = outbound();
  if (record.size() > kSlotBytes) {
    throw ProtocolError(fmt::format("a turn record of {} bytes does not fit a slot of {}",
                                    record.size(), kSlotBytes));
  }
  const std::uint64_t head = r.head.load(std::memory_order_relaxed);  // this side's own
  const std::uint64_t tail = r.tail.load(std::memory_order_acquire);
  if (head - tail >= kSlots) {  // full, or a count the consumer could not have written
    throw ProtocolError(fmt::format(
        "the turn connection's peer has read {} of {} records: it reads none (stopped, stuck "
        "or broken)", tail, head));
  }
  Ring::Slot& slot = r.slots[head % kSlots];
  slot.size = on_socket ? 0 : static_cast<std::uint32_t>(record.size());
  slot.on_socket = on_socket ? 1 : 0;
  if (!on_socket) std::memcpy(slot.bytes.data(), record.data(), record.size());
  // Sequentially consistent, with the consumer's asleep/head pair (sleep_if_empty): either it
  // sees this record before it sleeps, or this side sees it asleep and wakes it.
  r.head.store(head + 1, std::memory_order_seq_cst);
  return r.asleep.load(std::memory_order_seq_cst) != 0;
}

std::optional<TurnRings::Entry> TurnRings::pop() {
  Ring& r = inbound();
  const std::uint64_t tail = r.tail.load(std::memory_order_relaxed);  // this side's own
  const std::uint64_t head = r.head.load(std::memory_order_acquire);
  if (head == tail) return std::nullopt;
  if (head - tail > kSlots) {
    throw ProtocolError(fmt::format("the turn connection's peer says it wrote {} records, {} "
                                    "past the {} read: more than a ring holds",
                                    head, head - tail, tail));
  }
  const Ring::Slot& slot = r.slots[tail % kSlots];
  Entry e;
  // Read once: the peer may change the slot meanwhile, so what is checked is what is used.
  const std::uint32_t size = slot.size;
  const std::uint32_t on_socket = slot.on_socket;
  if (size > kSlotBytes || (on_socket != 0 && size != 0) || on_socket > 1) {
    throw ProtocolError(fmt::format("a turn record's slot says {} bytes (on the socket: {})",
                                    size, on_socket));
  }
  std::memcpy(e.bytes.data(), slot.bytes.data(), size);
  e.size = size;
  e.on_socket = on_socket != 0;
  r.tail.store(tail + 1, std::memory_order_release);
  return e;
}

bool TurnRings::ready() const noexcept {
  const Ring& r = inbound();
  return r.head.load(std::memory_order_acquire) != r.tail.load(std::memory_order_relaxed);
}

bool TurnRings::sleep_if_empty() noexcept {
  Ring& r = inbound();
  r.asleep.store(1, std::memory_order_seq_cst);
  if (r.head.load(std::memory_order_seq_cst) == r.tail.load(std::memory_order_relaxed)) return true;
  r.asleep.store(0, std::memory_order_relaxed);
  return false;
}

void TurnRings::wake() noexcept {
  inbound().asleep.store(0, std::memory_order_relaxed);
}

void TurnRings::set_due(std::optional<std::chrono::steady_clock::time_point> at) noexcept {
  const std::int64_t ns =
      at ? std::max<std::int64_t>(1, std::chrono::duration_cast<std::chrono::nanoseconds>(
                                         at->time_since_epoch()).count())
         : 0;
  outbound().due_ns.store(ns, std::memory_order_relaxed);
}

bool TurnRings::peer_asleep() const noexcept {
  return outbound().asleep.load(std::memory_order_seq_cst) != 0;
}

std::optional<std::chrono::steady_clock::time_point> TurnRings::due() const noexcept {
  const std::int64_t ns = inbound().due_ns.load(std::memory_order_relaxed);
  if (ns <= 0) return std::nullopt;
  return std::chrono::steady_clock::time_point(
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::nanoseconds(ns)));
}

}  // namespace salus::remote
