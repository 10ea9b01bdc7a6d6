// SharedEventMemory: the page of shared memory behind an event another process can wait for
// (SimStreams::create_shareable_event, export_event, import_event).
//
// A shareable event's generation counters live in a page of shared memory (a memfd) as well as in
// the event: recording publishes `recorded`, the marker's task publishes `completed`. Exporting
// hands out a duplicate of the memfd; importing maps it and makes an event of this backend that
// reads only the shared counters. The importing process has no condition variable to sleep on
// (the exporter's threads notify their own), so its waits poll, backing off to a millisecond: a
// simulator's price, where CUDA's interprocess event is waited for by the GPU. The page also names
// the exporting process: once that has exited, its queued work is gone with it, and waits end
// rather than hang (salusd takes a dead client's pages back only after its exit too). Exited
// means what a pidfd says, so a process that has exited but was not reaped yet (a zombie, which
// kill(pid, 0) still finds) counts as gone: a process can exit with a record still queued, when
// its last owner of the runtime lets go on a thread that the exit ends.
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <new>
#include <thread>

#include "cuda/os_handles.hpp"
#include "cuda/sim_stream.hpp"

namespace salus::sim {
namespace {

constexpr std::uint64_t kMagic = 0x5341'4C55'5345'5645;  // "SALUSEVE"
constexpr std::size_t kBytes = 4096;

}  // namespace

struct SharedEventMemory::State {
  std::uint64_t magic = kMagic;
  std::atomic<std::uint64_t> recorded{0};
  std::atomic<std::uint64_t> completed{0};
  std::int32_t exporter_pid = 0;
  std::uint64_t serial = 0;  // the exporter's count of shareable events: with the pid, its name
};
SharedEventMemory::SharedEventMemory(int fd_value, void* mapping)
    : fd(fd_value), state(static_cast<State*>(mapping)) {
  static_assert(std::atomic<std::uint64_t>::is_always_lock_free,
                "the shared counters must be address-free atomics");
  static_assert(sizeof(State) <= kBytes);
}

SharedEventMemory::~SharedEventMemory() {
  ::munmap(state, kBytes);
  ::close(fd);
}

void SharedEventMemory::publish_recorded(std::uint64_t generation) {
  state->recorded.store(generation, std::memory_order_release);
}

void SharedEventMemory::publish_completed(std::uint64_t generation) {
  // Records on different streams may complete out of order; the newest one counts.
  std::uint64_t now = state->completed.load(std::memory_order_relaxed);
  while (now < generation &&
         !state->completed.compare_exchange_weak(now, generation, std::memory_order_release)) {
  }
}

std::uint64_t SharedEventMemory::recorded() const {
  return state->recorded.load(std::memory_order_acquire);
}

bool SharedEventMemory::reached(std::uint64_t generation) const {
  if (state->completed.load(std::memory_order_acquire) >= generation) return true;
  const pid_t exporter = state->exporter_pid;
  if (exporter <= 0 || exporter == ::getpid()) return false;
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, exporter, 0));
  if (pidfd < 0) return errno == ESRCH;  // reaped: gone
  pollfd p{pidfd, POLLIN, 0};
  const bool exited = ::poll(&p, 1, 0) > 0;  // a pidfd is readable once its process has exited
  ::close(pidfd);
  return exited;
}

void SharedEventMemory::wait(std::uint64_t generation, const std::stop_token& st) const {
  auto pause = std::chrono::microseconds(20);
  while (!reached(generation) && !st.stop_requested()) {
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

std::shared_ptr<SharedEventMemory> SharedEventMemory::create() {
  const int fd = ::memfd_create("salus-sim-event", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) throw_errno("memfd_create", errno, "cuEventCreate");
  // Sealed at its size: a process that imports it maps it, and a sender that could shrink it
  // afterwards would kill that process with SIGBUS (issue 34, item 7). open refuses an event
  // without these seals.
  if (::ftruncate(fd, kBytes) != 0 ||
      ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    const int err = errno;
    ::close(fd);
    throw_errno("ftruncate", err, "cuEventCreate");
  }
  void* mapping = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mapping == MAP_FAILED) {
    const int err = errno;
    ::close(fd);
    throw_errno("mmap", err, "cuEventCreate");
  }
  auto* state = new (mapping) State;
  state->exporter_pid = ::getpid();
  static std::atomic<std::uint64_t> serials{0};
  state->serial = ++serials;
  return std::make_shared<SharedEventMemory>(fd, mapping);
}

SharedEvent SharedEventMemory::exported() const {
  SharedEvent out;
  // The descriptor is the event; the handle's bytes name it (as CUDA's do), so that a process
  // can tell its own fences when they come back to it: the exporter's pid and its serial.
  const std::uint64_t name[3] = {kMagic, static_cast<std::uint64_t>(state->exporter_pid),
                                 state->serial};
  std::memcpy(out.handle.data(), name, sizeof(name));
  out.fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (out.fd < 0) throw_errno("fcntl", errno, "cuIpcGetEventHandle");
  return out;
}

std::shared_ptr<SharedEventMemory> SharedEventMemory::open(const SharedEvent& shared) {
  struct stat st {};
  if (shared.fd < 0 || ::fstat(shared.fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      st.st_size != static_cast<off_t>(kBytes)) {
    throw InvalidArgument(
        fmt::format("import_event: descriptor {} is no exported simulated event", shared.fd));
  }
  // Mapped below and read for as long as the event lives: its size must be sealed, or whoever
  // sent it could shrink it under this process (SIGBUS at the next read).
  const int seals = ::fcntl(shared.fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0 || (seals & F_SEAL_SEAL) == 0) {
    throw InvalidArgument(fmt::format(
        "import_event: descriptor {} is not sealed against shrinking (F_SEAL_SHRINK): its "
        "sender could cut it under this process, so it is refused",
        shared.fd));
  }
  const int fd = ::fcntl(shared.fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) throw_errno("fcntl", errno, "cuIpcOpenEventHandle");
  void* mapping = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mapping == MAP_FAILED) {
    const int err = errno;
    ::close(fd);
    throw_errno("mmap", err, "cuIpcOpenEventHandle");
  }
  auto memory = std::make_shared<SharedEventMemory>(fd, mapping);
  if (static_cast<const std::uint64_t*>(mapping)[0] != kMagic) {
    throw InvalidArgument(
        fmt::format("import_event: descriptor {} is no exported simulated event", shared.fd));
  }
  return memory;
}

}  // namespace salus::sim
