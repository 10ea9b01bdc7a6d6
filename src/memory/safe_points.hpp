// Safe points: the runtime's controls over when a job's pages may move between tiers.
//
// Internal: the per-device scheduler (src/iteration_sched/) marks its jobs at safe points, and
// tests drive them directly; users of the public API never call these (the Runtime does it for
// them). They are an interface of the memory manager, SafePoints, which its Impl implements
// (src/memory/safe_points.cpp); safe_points(MemoryManager&) hands it out. That accessor is all
// include/salus/memory.hpp says of them: a friend declaration, not exported, which ordinary
// lookup finds only through the declaration below (a private pimpl is reachable no other way).
//
// A job is active when registered: its pages never move behind its back. Once marked quiescent it
// promises to enqueue no GPU work until activate_job, and Salus may move its pages between tiers
// (after the work it already enqueued has finished, on the GPU). The runtime marks its jobs
// quiescent between iterations (while they wait in begin_iteration for their turn).
#pragma once

#include <cstddef>

#include "salus/memory.hpp"

namespace salus {

namespace memory {

class SafePoints {
 public:
  // Marks the job quiescent: from now on Salus may move its pages. Throws InvalidArgument for the
  // unattributed job (never quiescent), UnknownJob for an unknown or released one.
  virtual void set_job_quiescent(JobId job) = 0;

  // Marks the job active again: waits for a move of its pages in flight, then brings its pages
  // on other tiers home as far as room allows (other quiescent jobs' pages may go down a tier for
  // them). Returns the bytes it brought home (what the caller waited for).
  virtual std::size_t activate_job(JobId job) = 0;

  // Starts bringing a quiescent job's pages home in the background (the job that runs next),
  // into free room only (nothing is pushed down for it), as that room appears. Several jobs may
  // be targets; a job stops being one once its pages are home or it is activated.
  virtual void prefetch(JobId job) = 0;

  // Moves the pages of a quiescent job's live blocks on `device`'s ranges down a tier (to peers
  // or the host, by the spill policy); returns the bytes moved. For studies and tests. Throws
  // NotSupported when the spill policy is none.
  virtual std::size_t demote(JobId job, int device) = 0;

  // Up to `pages` pages of the quiescent jobs on `device` go down a tier, each job held quiescent
  // while its pages move; returns the pages moved (0 when the spill policy is none). Room for
  // another process (salusd asked this one for pages back).
  virtual std::size_t demote_quiescent(int device, std::size_t pages) = 0;

 protected:
  SafePoints() = default;
  ~SafePoints() = default;  // not owned through this interface
  SafePoints(const SafePoints&) = default;
  SafePoints& operator=(const SafePoints&) = default;
};

}  // namespace memory

// The memory manager's safe points (its Impl). Declared a friend in include/salus/memory.hpp,
// visible to lookup only here.
memory::SafePoints& safe_points(MemoryManager& memory) noexcept;

namespace memory {

// The calls the scheduler and tests make, one line each.
inline void set_job_quiescent(MemoryManager& memory, JobId job) {
  safe_points(memory).set_job_quiescent(job);
}
inline std::size_t activate_job(MemoryManager& memory, JobId job) {
  return safe_points(memory).activate_job(job);
}
inline void prefetch(MemoryManager& memory, JobId job) {
  safe_points(memory).prefetch(job);
}
inline std::size_t demote(MemoryManager& memory, JobId job, int device) {
  return safe_points(memory).demote(job, device);
}
inline std::size_t demote_quiescent(MemoryManager& memory, int device, std::size_t pages) {
  return safe_points(memory).demote_quiescent(device, pages);
}

}  // namespace memory

}  // namespace salus
