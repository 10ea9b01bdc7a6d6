// Before a Salus call blocks: a hook for language bindings.
//
// A thread about to block inside a Salus call (waiting for memory other iterations hold, for the
// GPU's work, for the daemon's answer) runs the hook first. A binding that holds an interpreter
// lock lets go of it there, so that the calls that do not block (the steady state's allocations
// and frees) never pay for letting go and taking it back, and never hand it to another thread.
// The binding takes its lock back once the Salus call has returned.
//
// The hook runs under Salus's own locks: it must not block, throw or call Salus.
#pragma once

#include "salus/export.hpp"

namespace salus {

using BeforeBlocking = void (*)() noexcept;

// Sets the process's hook (null: none, the default); returns the previous one.
SALUS_API BeforeBlocking set_before_blocking(BeforeBlocking hook) noexcept;

}  // namespace salus
