// Internal: what survives fork(). A forked child has only the thread that called fork(): the
// simulated GPUs' stream threads, the CUDA driver's context and any lock another thread held at
// that moment are not there. So every object that owns threads, a context or such locks records
// the fork generation it was made in; in a child (a newer generation, bumped by a pthread_atfork
// handler) it refuses every use with NotSupported, and its destructor leaks it instead of joining
// threads that do not exist or taking locks nobody will release.
//
// Here, in the lowest layer, because every layer above needs it.
#pragma once

#include <cstdint>
#include <future>
#include <stop_token>
#include <thread>
#include <utility>

namespace salus::process {

// Where an object was made: the fork generation and the process.
struct Birth {
  std::uint64_t generation = 0;
  int pid = 0;
};

// How many fork()s lie between the start of this library's first process and this one: one
// relaxed atomic load, cheap enough for every call that matters.
[[nodiscard]] std::uint64_t fork_generation() noexcept;
// The generation and process id now (one getpid: call it when an object is made).
[[nodiscard]] Birth birth_now() noexcept;
// True in a process forked since `birth` (the object was inherited from a parent).
[[nodiscard]] inline bool inherited(const Birth& birth) noexcept {
  return birth.generation != fork_generation();
}
// Throws NotSupported saying that `what` (e.g. "this runtime") was made in process `birth.pid`
// before fork(), and what to do instead, when `birth` is not this process's.
void check_not_inherited(const Birth& birth, const char* what);

// Starts `body(stop_token)` on a new thread and returns once that thread has begun running it.
// Why wait: a thread that is still starting holds, for a moment, locks of the C library or of a
// sanitizer's allocator; a fork() in that moment leaves them held for ever in the child. GCC 12's
// AddressSanitizer has no fork handlers for its allocator, so a child forked right after a runtime
// was made hung making its own threads (ForkedChild.TheDefaultIsANewOneInTheChild, 1 run in 4).
template <class Body>
[[nodiscard]] std::jthread running_thread(Body body) {
  std::promise<void> started;  // a promise, not a latch: safe to destroy once the wait returns
  std::future<void> begun = started.get_future();
  std::jthread thread([started = std::move(started), body = std::move(body)](
                          std::stop_token stop) mutable {
    started.set_value();
    body(std::move(stop));
  });
  begun.wait();
  return thread;
}

}  // namespace salus::process
