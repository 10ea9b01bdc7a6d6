#include "cuda/process_fork.hpp"

#include <fmt/format.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>

#include "salus/error.hpp"

namespace salus::process {
namespace {

std::atomic<std::uint64_t> g_generation{0};

void bump_in_child() noexcept {
  g_generation.fetch_add(1, std::memory_order_relaxed);
}

// Registered when the library loads, before any handler of the layers above (theirs are
// registered on first use), so a child's generation is current before they run.
[[maybe_unused]] const int g_registered = ::pthread_atfork(nullptr, nullptr, &bump_in_child);

}  // namespace

std::uint64_t fork_generation() noexcept {
  return g_generation.load(std::memory_order_relaxed);
}

Birth birth_now() noexcept {
  return {fork_generation(), static_cast<int>(::getpid())};
}

void check_not_inherited(const Birth& birth, const char* what) {
  if (!inherited(birth)) return;
  throw NotSupported(fmt::format(
      "{} was made in process {} before fork(); this process ({}) is a forked child, where its "
      "GPU streams and context do not exist. Make a new runtime in the child (salus.Runtime(...); "
      "the default runtime is a new one there), or start child processes with the 'spawn' or "
      "'forkserver' method (multiprocessing.set_start_method) instead of fork",
      what, birth.pid, ::getpid()));
}

}  // namespace salus::process
