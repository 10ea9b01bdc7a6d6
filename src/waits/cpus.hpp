// How many CPUs this process may run on: where it is one, a thread that spins for another keeps
// that other from running, so spinning is off (turn waits sleep instead).
#pragma once

#include <sched.h>

#include <algorithm>

namespace salus::waits {

inline int usable_cpus() noexcept {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return std::max(CPU_COUNT(&set), 1);
}

}  // namespace salus::waits
