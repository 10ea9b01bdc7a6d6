// Safe points: the runtime's controls over when a job's pages may move between tiers.
//
// Internal: the per-device scheduler (src/iteration_sched/device_scheduler.cpp) marks its jobs at
// safe points, and tests drive them directly; users of the public API never call these (the
// Runtime does it for them). They reach MemoryManager's pimpl through its one friend,
// SafePointAccess, defined with them in memory_manager.cpp.
//
// A job is active when registered: its pages never move behind its back. Once marked quiescent it
// promises to enqueue no GPU work until activate_job, and Salus may move its pages between tiers
// (after the work it already enqueued has finished, on the GPU). The runtime marks its jobs
// quiescent between iterations (while they wait in begin_iteration for their turn).
#pragma once

#include <cstddef>

#include "salus/memory.hpp"

namespace salus::memory {

// Marks the job quiescent: from now on Salus may move its pages. Throws InvalidArgument for the
// unattributed job (never quiescent), UnknownJob for an unknown or released one.
void set_job_quiescent(MemoryManager& memory, JobId job);

// Marks the job active again: waits for a move of its pages in flight, then brings its pages on
// other tiers home as far as room allows (other quiescent jobs' pages may go down a tier for
// them). Returns the bytes it brought home (what the caller waited for).
std::size_t activate_job(MemoryManager& memory, JobId job);

// Starts bringing a quiescent job's pages home in the background (the job that runs next), into
// free room only (nothing is pushed down for it), as that room appears. Several jobs may be
// targets; a job stops being one once its pages are home or it is activated.
void prefetch(MemoryManager& memory, JobId job);

// Moves the pages of a quiescent job's live blocks on `device`'s ranges down a tier (to peers or
// the host, by the spill policy); returns the bytes moved. For studies and tests. Throws
// NotSupported when the spill policy is none.
std::size_t demote(MemoryManager& memory, JobId job, int device);

}  // namespace salus::memory
