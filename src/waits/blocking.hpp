// Internal side of salus/blocking.hpp: every place where a Salus call may block the calling
// thread calls before_blocking() first (backend synchronizations, memory waits, turn waits, the
// daemon's answers). It reads one atomic pointer; nothing when no hook is set.
#pragma once

#include "salus/blocking.hpp"

namespace salus::waits {

void before_blocking() noexcept;

}  // namespace salus::waits
