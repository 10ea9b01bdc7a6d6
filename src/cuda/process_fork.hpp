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

}  // namespace salus::process
