// Stack dumps without gdb: the watchdog sends SIGUSR2 to each thread of the process in turn (found
// in /proc/self/task), and the handler writes that thread's backtrace to stderr. backtrace() may
// allocate on its first call (it loads the unwinder), so the constructor calls it once up front;
// after that backtrace() and backtrace_symbols_fd() only write, which is what a handler may do.
// The watchdog waits for each thread's handler to finish before it signals the next, so stacks
// do not interleave; a thread that cannot run its handler (stopped in the kernel for good) is
// named and skipped after a timeout.
#include "soak/watchdog.hpp"

#include <dirent.h>
#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

namespace salus::soak {
namespace {

constexpr int kDumpSignal = SIGUSR2;
constexpr int kMaxFrames = 64;

// The tid whose handler finished last; the watchdog waits for it.
std::atomic<pid_t> g_dumped_tid{0};

pid_t current_tid() noexcept {
  return static_cast<pid_t>(::syscall(SYS_gettid));
}

// Async-signal-safe writes: no stdio in the handler.
void write_all(const char* text, std::size_t length) noexcept {
  while (length > 0) {
    const ssize_t n = ::write(STDERR_FILENO, text, length);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return;
    }
    text += n;
    length -= static_cast<std::size_t>(n);
  }
}

void dump_stack_handler(int /*signal*/) {
  const int saved_errno = errno;
  void* frames[kMaxFrames];
  const int count = ::backtrace(frames, kMaxFrames);
  ::backtrace_symbols_fd(frames, count, STDERR_FILENO);
  static constexpr char kEnd[] = "  (end of stack)\n";
  write_all(kEnd, sizeof kEnd - 1);
  g_dumped_tid.store(current_tid(), std::memory_order_release);
  errno = saved_errno;
}

void install_dump_handler() {
  struct sigaction action {};
  action.sa_handler = dump_stack_handler;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  if (::sigaction(kDumpSignal, &action, nullptr) != 0) {
    std::perror("watchdog: sigaction");
    std::exit(2);
  }
  // The first backtrace() may load libgcc_s and allocate: never let that happen in a handler.
  void* frames[4];
  (void)::backtrace(frames, 4);
}

std::string thread_comm(pid_t tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/comm");
  std::string name;
  std::getline(in, name);
  return name;
}

std::vector<pid_t> process_threads() {
  std::vector<pid_t> tids;
  if (DIR* dir = ::opendir("/proc/self/task")) {
    while (const dirent* entry = ::readdir(dir)) {
      if (entry->d_name[0] >= '0' && entry->d_name[0] <= '9') {
        tids.push_back(static_cast<pid_t>(std::atoi(entry->d_name)));
      }
    }
    ::closedir(dir);
  }
  return tids;
}

double seconds_between(std::int64_t earlier_ns, std::int64_t later_ns) {
  return static_cast<double>(later_ns - earlier_ns) / 1e9;
}

// Has `tid` print its stack (see the file comment) and waits up to 2 s for it.
void dump_stack_of(pid_t tid, const std::string& label) {
  std::fprintf(stderr, "WATCHDOG: stack of thread %d (%s):\n", tid, label.c_str());
  std::fflush(stderr);
  g_dumped_tid.store(0, std::memory_order_release);
  if (::syscall(SYS_tgkill, ::getpid(), tid, kDumpSignal) != 0) {
    std::fprintf(stderr, "  (gone)\n");
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (g_dumped_tid.load(std::memory_order_acquire) != tid &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (g_dumped_tid.load(std::memory_order_acquire) != tid) {
    std::fprintf(stderr, "  (its handler did not run within 2 s)\n");
  }
}

}  // namespace

const char* to_string(Phase phase) noexcept {
  switch (phase) {
    case Phase::working:
      return "working";
    case Phase::waiting_turn:
      return "waiting for a turn";
    case Phase::idle:
      return "idle";
    case Phase::done:
      return "done";
  }
  return "unknown";
}

std::int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Watchdog::Watchdog(WatchdogOptions options)
    : options_(options),
      device_progress_ns_(new std::atomic<std::int64_t>[static_cast<std::size_t>(
          options.devices > 0 ? options.devices : 1)]),
      system_progress_ns_(now_ns()) {
  for (int d = 0; d < options_.devices; ++d)
    device_progress_ns_[static_cast<std::size_t>(d)] = now_ns();
  install_dump_handler();
}

Watchdog::~Watchdog() {
  stop();
}

Heartbeat& Watchdog::enroll(const std::string& name) {
  auto beat = std::make_unique<Heartbeat>();
  beat->name = name;
  beat->tid = current_tid();
  beat->beat(Phase::working);
  // Linux limits thread names to 15 characters; longer ones are cut.
  (void)::pthread_setname_np(::pthread_self(), name.substr(0, 15).c_str());
  std::lock_guard lock(mu_);
  beats_.push_back(std::move(beat));
  return *beats_.back();
}

void Watchdog::progress(int device) noexcept {
  const std::int64_t now = now_ns();
  if (device >= 0 && device < options_.devices) {
    device_progress_ns_[static_cast<std::size_t>(device)].store(now, std::memory_order_relaxed);
  }
  system_progress_ns_.store(now, std::memory_order_relaxed);
}

void Watchdog::start() {
  thread_ = std::thread([this] { run(); });
}

void Watchdog::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::run() {
  (void)::pthread_setname_np(::pthread_self(), "soak-watchdog");
  std::unique_lock lock(mu_);
  while (!stopping_) {
    wake_.wait_for(lock, options_.poll);
    if (stopping_) break;
    if (std::optional<std::string> why = find_stuck(now_ns())) {
      lock.unlock();
      fire(*why);
    }
  }
}

// With mu_ held.
std::optional<std::string> Watchdog::find_stuck(std::int64_t now) const {
  const std::int64_t stuck_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(options_.stuck).count();
  const auto starved_ns =
      static_cast<std::int64_t>(static_cast<double>(stuck_ns) * options_.starvation_factor);
  char text[512];
  for (const auto& beat : beats_) {
    const std::int64_t age = now - beat->beat_ns.load(std::memory_order_relaxed);
    const auto phase = static_cast<Phase>(beat->phase.load(std::memory_order_relaxed));
    if (phase == Phase::working && age > stuck_ns) {
      std::snprintf(text, sizeof text, "thread '%s' (tid %d) made no progress for %.1f s while %s",
                    beat->name.c_str(), beat->tid, seconds_between(0, age), to_string(phase));
      return text;
    }
    if (phase != Phase::waiting_turn) continue;
    const int device = beat->device.load(std::memory_order_relaxed);
    const std::int64_t device_age =
        device >= 0 && device < options_.devices
            ? now - device_progress_ns_[static_cast<std::size_t>(device)].load()
            : age;
    if (age > stuck_ns && device_age > stuck_ns) {
      std::snprintf(text, sizeof text,
                    "thread '%s' (tid %d) has waited %.1f s for a turn on device %d, where nothing "
                    "progressed for %.1f s",
                    beat->name.c_str(), beat->tid, seconds_between(0, age), device,
                    seconds_between(0, device_age));
      return text;
    }
    if (age > starved_ns) {
      std::snprintf(text, sizeof text,
                    "thread '%s' (tid %d) has waited %.1f s for a turn on device %d (starved)",
                    beat->name.c_str(), beat->tid, seconds_between(0, age), device);
      return text;
    }
  }
  const std::int64_t system_age = now - system_progress_ns_.load();
  if (expect_system_.load() && system_age > stuck_ns) {
    std::snprintf(text, sizeof text, "no iteration ended and no job finished anywhere for %.1f s",
                  seconds_between(0, system_age));
    return text;
  }
  return std::nullopt;
}

void Watchdog::fire(const std::string& why) const {
  std::fprintf(stderr, "\nWATCHDOG: stuck: %s\nWATCHDOG: heartbeats:\n", why.c_str());
  const std::int64_t now = now_ns();
  {
    std::lock_guard lock(mu_);
    for (const auto& beat : beats_) {
      std::fprintf(stderr, "  %-16s tid %-7d %-20s last beat %.1f s ago, device %d\n",
                   beat->name.c_str(), beat->tid, to_string(static_cast<Phase>(beat->phase.load())),
                   seconds_between(beat->beat_ns.load(), now), beat->device.load());
    }
  }
  // Registered threads first, under their own names; then every other thread of the process
  // (the runtime's and the simulated streams' threads, which inherit their creator's name).
  std::vector<std::pair<pid_t, std::string>> order;
  {
    std::lock_guard lock(mu_);
    for (const auto& beat : beats_) {
      order.emplace_back(beat->tid, "registered as '" + beat->name + "'");
    }
  }
  for (pid_t tid : process_threads()) {
    bool known = false;
    for (const auto& entry : order) known = known || entry.first == tid;
    if (!known) order.emplace_back(tid, "unregistered, named '" + thread_comm(tid) + "'");
  }
  const pid_t self = current_tid();
  for (const auto& [tid, label] : order) {
    if (tid != self) dump_stack_of(tid, label);
  }
  std::fprintf(stderr, "WATCHDOG: exiting with code %d\n", kWatchdogExitCode);
  std::fflush(stderr);
  std::fflush(stdout);
  // No destructors and no leak check: the process is wedged, other threads hold its locks.
  ::_exit(kWatchdogExitCode);
}

}  // namespace salus::soak
